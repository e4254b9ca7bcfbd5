"""Forged raft traffic on real 3-node clusters (issue 12, item 1): raft messages from a client
connection, or from a node's credentials claiming another node's id, change no epoch and get
nothing acknowledged, on a plaintext cluster (nodes authenticate with the cluster secret) and
on a secure one (TLS + SCRAM node principals)."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest
from quorumlog.replica.client import AuthenticationError
from quorumlog.replica.client.connection import Connection
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey, ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage import encode_batch

from tests.support.cluster import ELECTION_BOUND_S
from tests.support.forge import (
    METADATA_TOPIC,
    connect,
    forged_vote,
    leadership_claims,
    quorum_view,
    send_raft,
    sync,
)
from tests.support.messages import begin_quorum_epoch, end_quorum_epoch, fetch_request
from tests.support.waits import log_text, wait_for_log, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TOPIC = "forged"


def stable_view(cluster: LocalCluster) -> dict[tuple[int, str, int], tuple[int, int]]:
    """Every node agrees on every partition's leader and the metadata quorum has one."""

    def settled() -> dict[tuple[int, str, int], tuple[int, int]] | None:
        view = quorum_view(cluster, TOPIC)
        by_partition: dict[int, set[tuple[int, int]]] = {}
        for (_, topic, p), le in view.items():
            if topic == TOPIC:
                by_partition.setdefault(p, set()).add(le)
        ok = all(len(s) == 1 and next(iter(s))[0] >= 0 for s in by_partition.values())
        has_meta = any(k[1] == METADATA_TOPIC for k in view)
        return view if ok and has_meta and len(by_partition) == 3 else None

    return wait_until(settled, ELECTION_BOUND_S, "a settled quorum view")


def pick_roles(view: dict[tuple[int, str, int], tuple[int, int]]) -> tuple[int, int, int, int]:
    """(partition, leader, epoch, metadata leader): a partition led by node 1 if there is
    one, so that the forger is node 3 and the impersonated node is node 2, as in the issue."""
    leaders = {p: le for (_, t, p), le in view.items() if t == TOPIC}
    part = next((p for p, (ld, _) in sorted(leaders.items()) if ld == 1), 0)
    leader, epoch = leaders[part]
    meta_leader = next(le[0] for k, le in view.items() if k[1] == METADATA_TOPIC)
    return part, leader, epoch, meta_leader


def forged_quorum_messages(
    cluster: LocalCluster, part: int, leader: int, epoch: int, claimed: int, victim: int
) -> list[tuple[int, str, list[object]]]:
    """(target node, topic, messages) that would move leadership if applied: a Vote with a
    higher epoch, a BeginQuorumEpoch naming ``claimed`` as leader, and EndQuorumEpochs."""
    cid = cluster.cluster_id
    high = epoch + 7
    to_victim = {"cluster_id": cid, "dst": victim}
    return [
        (leader, TOPIC, leadership_claims(cid, claimed, leader, epoch, high)),
        (
            victim,
            TOPIC,
            [
                begin_quorum_epoch(
                    **to_victim, src=claimed, leader_id=claimed, leader_epoch=high + 1
                ),
                end_quorum_epoch(
                    **to_victim,
                    src=leader,
                    leader_id=leader,
                    leader_epoch=epoch,
                    preferred_successors=(victim,),
                ),
            ],
        ),
    ]


def forge_and_check(cluster: LocalCluster, as_node: int | None, claimed: int, refusal: str) -> None:
    view = stable_view(cluster)
    part, leader, epoch, meta_leader = pick_roles(view)
    others = [n for n in sorted(cluster.ports) if n != leader]
    victim = next(n for n in others if n != as_node) if as_node in others else others[0]
    plan = forged_quorum_messages(cluster, part, leader, epoch, claimed, victim)
    # The metadata quorum too: a Vote with a higher epoch at its leader.
    meta_epoch = view[(meta_leader, METADATA_TOPIC, 0)][1]
    meta_claimed = claimed if claimed != meta_leader else victim
    meta_vote = forged_vote(cluster.cluster_id, meta_claimed, meta_leader, meta_epoch + 7)
    plan.append((meta_leader, METADATA_TOPIC, [meta_vote]))
    closed: list[tuple[int, int, int]] = []
    for target, topic, msgs in plan:
        conn = connect(cluster, target, as_node=as_node)
        port = conn._sock.getsockname()[1]
        try:
            p = part if topic == TOPIC else 0
            send_raft(conn, topic, p, *msgs)  # type: ignore[arg-type]
            send_raft(conn, topic, p, *msgs)  # twice: counted, still logged once
            sync(conn)
        finally:
            conn.close()
        wait_for_log(cluster, refusal, nodes=[target])
        closed.append((target, port, 2 * len(msgs)))
    # Nothing moved: the same leader and epoch everywhere, and a quorum produce still works
    # in that epoch (an EndQuorumEpoch, had it been applied, starts an election at once).
    assert quorum_view(cluster, TOPIC) == view
    res = cluster.client.produce(TOPIC, part, encode_batch([b"still-here"]), timeout_ms=10000)
    assert res.leader_epoch == epoch
    assert quorum_view(cluster, TOPIC) == view
    # One line when the first forged frame arrived, one with the count when it closed.
    for target, port, n in closed:
        summary = f"{port}) closed after {n} problems: {n} refused raft messages"
        logs = wait_for_log(cluster, summary, nodes=[target])
        assert len([ln for ln in logs.splitlines() if f", {port})" in ln]) == 2, port


def forge_fetch_and_check(cluster: LocalCluster, forger: int) -> None:
    """Both followers stop; replica Fetches claiming they hold the new record arrive from a
    client connection and from ``forger``'s credentials: the acks=quorum produce must not
    be acknowledged."""
    view = stable_view(cluster)
    part, leader, epoch, _ = pick_roles(view)
    followers = [n for n in sorted(cluster.ports) if n != leader]
    impersonated = [n for n in followers if n != forger] or followers

    def caught_up() -> dict[int, int] | None:
        """Every voter's end offset as the leader knows it, once they are all equal (a
        follower's reaches the leader with its next fetch)."""
        probe_conn = connect(cluster, leader)
        try:
            dq = probe_conn.request(
                ApiKey.DESCRIBE_QUORUM,
                m.DescribeQuorumRequest(topic=TOPIC, partition=part),
                m.DescribeQuorumResponse,
            )
        finally:
            probe_conn.close()
        assert dq.error == 0
        ends = {v.replica_id: v.end_offset for v in dq.voters}
        return ends if len(set(ends.values())) == 1 else None

    ends = wait_until(caught_up, ELECTION_BOUND_S, "the replicas to catch up")
    end = ends[leader]
    client_conn = connect(cluster, leader)
    node_conn = connect(cluster, leader, as_node=forger)
    producer = connect(cluster, leader)
    for f in followers:
        cluster.pause(f)
    try:
        req = m.ProduceRequest(
            topic=TOPIC,
            partition=part,
            acks=m.ACKS_QUORUM,
            timeout_ms=2500,
            records=encode_batch([b"not-durable"]),
        )
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(producer.request, ApiKey.PRODUCE, req, m.ProduceResponse)
            rid = 10**6
            for _ in range(400):
                if fut.done():
                    break
                rid += 1
                claims = {"current_leader_epoch": epoch, "fetch_offset": end + 1, "request_id": rid}
                for conn, senders in ((client_conn, followers), (node_conn, impersonated)):
                    for f in senders:
                        fetch = fetch_request(
                            cluster_id=cluster.cluster_id,
                            replica_id=f,
                            dst=leader,
                            last_fetched_epoch=epoch,
                            **claims,
                        )
                        send_raft(conn, TOPIC, part, fetch)
                time.sleep(0.02)
            resp = fut.result(timeout=30)
        assert resp.error in (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_LEADER), (
            f"a produce was acknowledged with both followers stopped: {resp}"
        )
    finally:
        for f in followers:
            cluster.resume(f)
        for c in (client_conn, node_conn, producer):
            c.close()


@pytest.mark.parametrize("secure", [False, True], ids=["plaintext", "secure"])
def test_forged_raft_changes_no_epoch_and_acks_nothing(tmp_path: Path, secure: bool) -> None:
    with LocalCluster(3, tmp_path / "c", secure=secure) as cluster:
        cluster.create_topic(TOPIC, 3)
        # From a client connection: anonymous (plaintext) or the admin principal (secure).
        client_refusal = (
            "denied RAFT to principal 'admin'" if secure else "refused raft traffic from"
        )
        forge_and_check(cluster, None, claimed=2, refusal=client_refusal)
        # From node 3's credentials, claiming to be another node.
        forge_and_check(cluster, 3, claimed=2, refusal="authenticated as node 3")
        forge_fetch_and_check(cluster, forger=3)
        for n in cluster.ports:
            assert cluster.is_running(n), cluster.tail(n)
        logs = "".join(log_text(cluster, n) for n in cluster.ports)
        assert "Traceback" not in logs


def test_node_credentials_need_the_cluster_secret(tmp_path: Path) -> None:
    """Plaintext: a peer proves it holds the cluster secret; a wrong one (for a node of
    the cluster or a new one), another principal, or a replayed exchange gets nowhere,
    and raft after a later AUTHENTICATE is not possible (authentication comes first or
    not at all). A node id the cluster never started with authenticates with the cluster
    secret: that is how a node joins (``serve --join``)."""
    from quorumlog.replica.node.security import node_secret

    with LocalCluster(3, tmp_path / "c") as cluster:
        host, port = cluster.host, cluster.ports[1]
        for principal, secret in [
            ("node-2", node_secret("some-other-cluster-secret", 2)),
            ("node-9", node_secret("some-other-cluster-secret", 9)),
            ("admin", "whatever"),
        ]:
            with pytest.raises(AuthenticationError, match="unknown principal or wrong secret"):
                Connection(host, port, client_id="t", timeout_s=5, credentials=(principal, secret))
        for credentials in (
            cluster.node_credentials(2),
            ("node-9", node_secret(cluster.cluster_secret, 9)),
        ):
            ok = Connection(host, port, client_id="t", timeout_s=5, credentials=credentials)
            sync(ok)
            ok.close()
        # An anonymous client keeps every client API, and may not authenticate later.
        anon = Connection(host, port, client_id="t", timeout_s=5)
        sync(anon)
        with pytest.raises(AuthenticationError, match="ILLEGAL_SASL_STATE"):
            anon.request(
                ApiKey.AUTHENTICATE,
                m.AuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"n,,n=node-2,r=abc"),
                m.AuthenticateResponse,
            )
        sync(anon)
        anon.close()
        logs = log_text(cluster, 1)
        assert cluster.cluster_secret not in logs
