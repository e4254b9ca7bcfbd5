"""The native producer's transactions (``Producer(client, transactional_id=...)``): a
committed transaction is seen whole by read_committed readers, an aborted one never; a
second producer of the id fences the first; a failed batch makes the transaction
abortable only, and the abort that follows fences it; offsets sent with a transaction
count only if it commits; a producer that dies mid-transaction is aborted by its
coordinator's timeout. Real nodes: the coordinator is the nodes' (reached in Kafka
envelopes over the native listener); the group offsets are read back by librdkafka."""

from __future__ import annotations

from collections.abc import Iterator

import confluent_kafka
import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
)
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import iter_batches

from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "ntxn"
PARTITIONS = 2


@pytest.fixture(scope="module")
def tcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("ntxn"), kafka=True) as c:
        c.create_topic(TOPIC, PARTITIONS)
        for p in range(PARTITIONS):
            c.wait_for_leader(TOPIC, p, 60)
        yield c


def _values(client: Client, isolation: str, topic: str = TOPIC) -> list[bytes]:
    out: list[bytes] = []
    for p in range(PARTITIONS):
        r = client.fetch(topic, p, 0, max_bytes=1 << 22, isolation=isolation)
        out += r.to_arrow().column("value").to_pylist()
    return sorted(out)


def _settled(client: Client, topic: str = TOPIC) -> bool:
    """Every partition's last stable offset reached its high watermark (no transaction
    open, every marker written)."""
    for p in range(PARTITIONS):
        r = client.fetch(topic, p, 0, max_bytes=1, isolation="read_committed")
        if r.last_stable_offset < r.high_watermark:
            return False
    return True


def _committed_view(client: Client, topic: str, expected: list[bytes]) -> list[bytes]:
    """What read_committed shows once the markers are written (EndTxn is answered when
    the decision is durable; the markers follow)."""
    wait_until(lambda: _settled(client, topic), 30, f"{topic}: markers written")
    got = _values(client, "read_committed", topic)
    assert got == sorted(expected)
    return got


def test_committed_seen_whole_aborted_never(tcluster: LocalCluster) -> None:
    c = tcluster
    client = Client(c.bootstrap)
    p = Producer(client, transactional_id="n-commit")
    p.begin()
    for i in range(20):
        p.send(TOPIC, f"c{i}".encode(), partition=i % PARTITIONS)
    p.commit()
    p.begin()
    p.send_many(TOPIC, [f"a{i}".encode() for i in range(20)], partition=1)
    p.abort()
    p.begin()
    p.send(TOPIC, b"last", partition=0)
    p.commit()
    p.close()
    committed = [f"c{i}".encode() for i in range(20)] + [b"last"]
    _committed_view(client, TOPIC, committed)
    uncommitted = _values(client, "read_uncommitted")
    assert sorted(committed + [f"a{i}".encode() for i in range(20)]) == uncommitted
    # the batches are transactional; each partition a transaction wrote has its marker
    for partition, markers in ((0, 2), (1, 2)):
        fetched = client.fetch(TOPIC, partition, 0, max_bytes=1 << 22)
        headers = [h for h in iter_batches(fetched.records) if not h.is_quorum_control]
        assert {h.is_transactional for h in headers} == {True}
        assert sum(1 for h in headers if h.marker is not None) == markers


def test_sends_only_inside_a_transaction() -> None:
    client = Client("127.0.0.1:1")  # no call reaches a node below
    p = Producer(client, transactional_id="n-misuse")
    with pytest.raises(TransactionStateError):
        p.send(TOPIC, b"x", partition=0)
    with pytest.raises(TransactionStateError):
        p.send_many(TOPIC, [b"x"])
    with pytest.raises(TransactionStateError):
        p.commit()
    with pytest.raises(TransactionStateError):
        Producer(client).begin()  # not transactional
    with pytest.raises(ValueError, match="idempotent"):
        Producer(client, transactional_id="n-x", idempotent=False)


def test_a_second_producer_of_the_id_fences_the_first(tcluster: LocalCluster) -> None:
    c = tcluster
    c.create_topic("nfence", PARTITIONS)
    client = Client(c.bootstrap)
    old = Producer(client, transactional_id="n-fence")
    old.begin()
    old.send("nfence", b"zombie", partition=0)
    old.flush()
    new = Producer(client, transactional_id="n-fence")
    new.init_transactions()  # aborts the old one's open transaction, bumps the epoch
    new.begin()
    new.send("nfence", b"live", partition=1)
    with pytest.raises(ProducerFencedError):
        old.commit()
    with pytest.raises(ProducerFencedError):
        old.begin()
    new.commit()
    old.close()
    new.close()
    _committed_view(client, "nfence", [b"live"])


def test_a_failed_batch_makes_the_transaction_abortable(tcluster: LocalCluster) -> None:
    c = tcluster
    client = Client(c.bootstrap, request_timeout_ms=3000)
    p = Producer(client, transactional_id="n-abortable")
    p.begin()
    p.send(TOPIC, b"doomed", partition=0)
    p.send(TOPIC, b"nowhere", partition=PARTITIONS + 5)  # no such partition
    with pytest.raises(TransactionAbortableError):
        p.commit()
    pid, epoch = p.producer_id, p.producer_epoch
    assert pid is not None and epoch is not None
    p.abort()  # bumps the epoch: a late copy of the failed batch would be fenced
    assert p.producer_id == pid and (p.producer_epoch or 0) > epoch
    p.begin()
    p.send(TOPIC, b"after-abort", partition=1)
    p.commit()
    p.close()
    wait_until(lambda: _settled(client), 30, "markers written")
    seen = _values(client, "read_committed")
    assert b"after-abort" in seen and b"doomed" not in seen


def test_offsets_count_only_with_their_commit(tcluster: LocalCluster) -> None:
    c = tcluster
    client = Client(c.bootstrap)
    group = "n-ctp"
    p = Producer(client, transactional_id="n-offsets")
    p.begin()
    p.send(TOPIC, b"out-aborted", partition=0)
    p.send_offsets({(TOPIC, 0): 7, (TOPIC, 1): 3}, group)
    p.abort()
    assert _group_offsets(c, group) == {0: -1001, 1: -1001}  # none: the abort dropped them
    p.begin()
    p.send(TOPIC, b"out-committed", partition=0)
    p.send_offsets({(TOPIC, 0): 9, (TOPIC, 1): 4}, group)
    p.commit()
    p.close()
    wait_until(lambda: _group_offsets(c, group) == {0: 9, 1: 4}, 30, "offsets committed")


def _group_offsets(c: LocalCluster, group: str) -> dict[int, int]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        tps = [confluent_kafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=30)}
    finally:
        consumer.close()


def test_a_producer_gone_mid_transaction_is_aborted_by_its_timeout(
    tcluster: LocalCluster,
) -> None:
    c = tcluster
    c.create_topic("nhung", PARTITIONS)
    client = Client(c.bootstrap)
    hung = Producer(client, transactional_id="n-hung", transaction_timeout_ms=2000)
    hung.begin()
    hung.send("nhung", b"never", partition=0)
    hung.flush()
    hung.close()  # gone: its transaction stays open until the coordinator's timeout
    plain = Producer(client)
    plain.send("nhung", b"later", partition=0)
    plain.flush()
    plain.close()
    assert not _settled(client, "nhung")  # the open transaction holds the LSO back
    _committed_view(client, "nhung", [b"later"])


def test_a_zombie_naming_its_old_epoch_does_not_touch_the_live_producer(
    tcluster: LocalCluster,
) -> None:
    """InitProducerId naming an epoch the id has left (KIP-360) is PRODUCER_FENCED before
    anything else: the live producer's open transaction is not aborted by it."""
    c = tcluster
    c.create_topic("nzombie", PARTITIONS)
    client = Client(c.bootstrap)
    zombie = Producer(client, transactional_id="n-zombie")
    zombie.init_transactions()
    live = Producer(client, transactional_id="n-zombie")
    live.begin()
    live.send("nzombie", b"live", partition=0)
    live.flush()
    with pytest.raises(ProducerFencedError):
        zombie.init_transactions()  # names its own, older epoch
    live.commit()
    zombie.close()
    live.close()
    _committed_view(client, "nzombie", [b"live"])
