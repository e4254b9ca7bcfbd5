"""Helpers to speak raft at a node the way an attacker would: raw RAFT frames on a client
connection, or on a connection authenticated with some node's credentials."""

from __future__ import annotations

import time

from quorumlog.replica.client.connection import Connection
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import API_VERSION, ApiKey, encode, encode_frame
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import Message

METADATA_TOPIC = "__cluster_metadata"


def connect(cluster: LocalCluster, node: int, *, as_node: int | None = None) -> Connection:
    """A connection to ``node``: as a client (admin on a secure cluster, anonymous on a
    plaintext one), or authenticated with node ``as_node``'s credentials."""
    sec = cluster.client_security("admin")
    creds = cluster.node_credentials(as_node) if as_node is not None else None
    if creds is None and sec is not None:
        creds = sec.credentials()
    return Connection(
        cluster.host,
        cluster.ports[node],
        client_id="forger",
        timeout_s=10,
        ssl_context=sec.ssl_context() if sec is not None else None,
        credentials=creds,
    )


def raft_frame(topic: str, partition: int, msg: Message) -> bytes:
    """One RAFT frame as a node's PeerLink would send it (see Node._send_raw)."""
    body, payload = encode(msg)
    env, _ = encode(
        m.RaftEnvelope(
            topic=topic, partition=partition, kind=type(msg).__name__, body=body, records=b""
        )
    )
    return b"".join(
        bytes(b) for b in encode_frame(int(ApiKey.RAFT), API_VERSION, 0, "x", env, payload)
    )


def send_raft(conn: Connection, topic: str, partition: int, *msgs: Message) -> None:
    conn._sock.sendall(b"".join(raft_frame(topic, partition, msg) for msg in msgs))


def sync(conn: Connection) -> None:
    """Raft frames are one-way: a request answered after them on the same connection proves
    the node has handled them (a connection's frames are handled in order)."""
    resp = conn.request(ApiKey.API_VERSIONS, m.ApiVersionsRequest(), m.ApiVersionsResponse)
    assert resp.error == 0


def quorum_view(cluster: LocalCluster, topic: str) -> dict[tuple[int, str, int], tuple[int, int]]:
    """(leader, epoch) of every partition of ``topic`` as each node sees it, and of the
    metadata quorum as its leader reports it."""
    out: dict[tuple[int, str, int], tuple[int, int]] = {}
    for n in cluster.ports:
        conn = connect(cluster, n)
        try:
            md = conn.request(
                ApiKey.METADATA, m.MetadataRequest(topics=[topic]), m.MetadataResponse
            )
            for t in md.topics:
                for p in t.partitions:
                    out[(n, topic, p.partition)] = (p.leader_id, p.leader_epoch)
            dq = conn.request(
                ApiKey.DESCRIBE_QUORUM,
                m.DescribeQuorumRequest(topic=METADATA_TOPIC, partition=0),
                m.DescribeQuorumResponse,
            )
            if dq.error == 0:
                out[(n, METADATA_TOPIC, 0)] = (dq.leader_id, dq.leader_epoch)
        finally:
            conn.close()
    return out


def log_text(cluster: LocalCluster, node: int) -> str:
    return cluster.log_path(node).read_text(errors="replace")


def wait_for_log(cluster: LocalCluster, node: int, text: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        logs = log_text(cluster, node)
        if text in logs:
            return logs
        if time.monotonic() >= deadline:
            raise AssertionError(f"node {node} did not log {text!r} within {timeout_s}s")
        time.sleep(0.05)
