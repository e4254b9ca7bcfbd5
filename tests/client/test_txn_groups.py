"""Transaction groups (``Client.txn_group_commit``): the open transactions of many
producers, members ``G#...`` of group ``G``, committed or aborted by one decision, fenced
by the batch number: a batch decided already is never committed again (its replay's
transactions abort), a member fenced meanwhile fails the whole batch (every member
aborts), and a decision whose coordinator is killed right after it is finished by the
next one. Real nodes; read back read_committed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import ProducerFencedError
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.kafka.coordinators import TXN_STATE_TOPIC, partition_for
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol.messages import TxnGroupMember

from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "ngroup"


@pytest.fixture(scope="module")
def gcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("ngroup")) as c:
        c.create_topic(TOPIC, 2)
        for p in range(2):
            c.wait_for_leader(TOPIC, p, 60)
        yield c


def _member(client: Client, group: str, task: int, values: list[bytes]) -> TxnGroupMember:
    """A task: its member's transaction written and left open (as a Spark task leaves it
    for the driver to decide)."""
    p = Producer(client, transactional_id=f"{group}#{task}")
    p.begin()
    for v in values:
        p.send(TOPIC, v, partition=task % 2)
    p.flush()
    assert p.producer_id is not None and p.producer_epoch is not None
    member = TxnGroupMember(
        transactional_id=f"{group}#{task}",
        producer_id=p.producer_id,
        producer_epoch=p.producer_epoch,
    )
    p.close()  # the transaction stays open
    return member


def _committed(client: Client) -> list[bytes]:
    def settled() -> bool:
        for p in range(2):
            r = client.fetch(TOPIC, p, 0, max_bytes=1, isolation="read_committed")
            if r.last_stable_offset < r.high_watermark:
                return False
        return True

    wait_until(settled, 60, "every transaction decided and its markers written")
    out: list[bytes] = []
    for p in range(2):
        r = client.fetch(TOPIC, p, 0, max_bytes=1 << 22, isolation="read_committed")
        out += r.to_arrow().column("value").to_pylist()
    return sorted(out)


def test_one_decision_for_every_member_fenced_by_the_batch(gcluster: LocalCluster) -> None:
    client = Client(gcluster.bootstrap)
    group = "g-batches"
    assert client.txn_group_commit(group, 0, [], commit=False) == -1  # no batch yet
    members = [
        _member(client, group, t, [f"b0-t{t}-{i}".encode() for i in range(5)]) for t in (0, 1)
    ]
    assert client.txn_group_commit(group, 0, members, commit=True) == 0
    batch0 = sorted(f"b0-t{t}-{i}".encode() for t in (0, 1) for i in range(5))
    assert _committed(client) == batch0
    # a replay of batch 0 (a driver restarted before its checkpoint knew of the commit)
    again = [_member(client, group, t, [f"b0-replay-t{t}".encode()]) for t in (0, 1)]
    assert client.txn_group_commit(group, 0, again, commit=True) == 0  # decided already
    assert _committed(client) == batch0
    # batch 1, one of whose members a retried attempt fenced: nothing of it commits
    fenced = [_member(client, group, t, [f"b1-t{t}".encode()]) for t in (0, 1)]
    Producer(client, transactional_id=f"{group}#1").init_transactions()
    with pytest.raises(ProducerFencedError):
        client.txn_group_commit(group, 1, fenced, commit=True)
    assert client.txn_group_commit(group, 1, [], commit=False) == 0
    assert _committed(client) == batch0
    # batch 1 again, both members anew: it commits
    retried = [_member(client, group, t, [f"b1-retry-t{t}".encode()]) for t in (0, 1)]
    assert client.txn_group_commit(group, 1, retried, commit=True) == 1
    assert _committed(client) == sorted([*batch0, b"b1-retry-t0", b"b1-retry-t1"])
    # an abort decides nothing: the fence stays
    aborted = [_member(client, group, t, [f"b2-t{t}".encode()]) for t in (0, 1)]
    assert client.txn_group_commit(group, 2, aborted, commit=False) == 1
    assert b"b2-t0" not in _committed(client)


def test_a_decision_survives_its_coordinator(gcluster: LocalCluster) -> None:
    """The coordinator's node is killed right after it answered: the decision (every
    member's PrepareCommit and the fence, one batch) is durable, and the next leader of
    its partition finishes it, whatever markers were written before the kill."""
    c = gcluster
    client = Client(c.bootstrap)
    group = "g-survives"
    members = [
        _member(client, group, t, [f"s-t{t}-{i}".encode() for i in range(3)]) for t in (0, 1)
    ]
    count = len(client.metadata([TXN_STATE_TOPIC])[TXN_STATE_TOPIC].partitions)
    state = partition_for(group, count)
    leader = c.wait_for_leader(TXN_STATE_TOPIC, state, 60)
    assert client.txn_group_commit(group, 0, members, commit=True) == 0
    c.kill(leader)
    try:
        assert {f"s-t{t}-{i}".encode() for t in (0, 1) for i in range(3)} <= set(_committed(client))
        assert client.txn_group_commit(group, 0, [], commit=False) == 0
    finally:
        c.start_node(leader)
