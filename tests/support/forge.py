"""Helpers to speak raft at a node the way an attacker would: raw RAFT frames on a client
connection, or on a connection authenticated with some node's credentials; and the raft
messages that would move leadership if a node applied them."""

from __future__ import annotations

from quorumlog.replica.client.connection import Connection
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import Message, VoteRequest

from .messages import begin_quorum_epoch, end_quorum_epoch, vote_request
from .wire import raft_frame

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


def forged_vote(
    cluster_id: str, claimed: int, target: int, epoch: int, *, pre_vote: bool = False
) -> VoteRequest:
    """A Vote from ``claimed`` to ``target`` as candidate of ``epoch``, its log ahead of any."""
    log = {"last_offset_epoch": epoch - 1, "last_offset": 10**9}
    head = {"cluster_id": cluster_id, "src": claimed, "dst": target}
    return vote_request(**head, candidate_epoch=epoch, pre_vote=pre_vote, **log)


def leadership_claims(
    cluster_id: str, claimed: int, target: int, epoch: int, high: int, *, pre_vote: bool = False
) -> list[Message]:
    """What ``claimed`` would send ``target`` to take the leadership of ``epoch``: a Vote for
    the higher epoch ``high``, a BeginQuorumEpoch of ``high`` naming itself leader, and an
    EndQuorumEpoch of ``epoch`` naming itself successor."""
    head = {"cluster_id": cluster_id, "src": claimed, "dst": target, "leader_id": claimed}
    return [
        forged_vote(cluster_id, claimed, target, high, pre_vote=pre_vote),
        begin_quorum_epoch(**head, leader_epoch=high),
        end_quorum_epoch(**head, leader_epoch=epoch, preferred_successors=(claimed,)),
    ]


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
