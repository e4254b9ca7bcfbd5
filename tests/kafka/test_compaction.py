"""Compacted topics cleaned by the nodes' cleaners, read by Kafka clients nobody here
wrote, on a 3-node cluster: a topic written with many versions of each key and
tombstones reads, from offset 0, as the latest value of each live key and nothing of a
deleted one, offsets ascending, and every replica's bytes on disk shrink to about that;
20,000 group offset commits leave ``__consumer_offsets`` a few MiB, and after its
coordinator is killed a new member of the group resumes at the last commit."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import confluent_kafka
import confluent_kafka.admin
import pytest
from quorumlog.replica import defaults
from quorumlog.replica.kafka.coordinators import OFFSETS_TOPIC, partition_for
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import iter_batches

from tests.support.kafka import NO_REBALANCE_DELAY
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

WAIT_S = 120.0
KEYS = 200
ROUNDS = 30
VALUE_BYTES = 100
FILLER = b"~filler"


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3,
        tmp_path_factory.mktemp("compaction"),
        kafka=True,
        node_args=["--cleaner-bytes-per-second", "0", *NO_REBALANCE_DELAY],
    ) as c:
        yield c


def _log_bytes(c: LocalCluster, topic: str, partition: int) -> dict[int, int]:
    """Each node's segment bytes of ``topic/partition``."""
    out = {}
    for n in c.ports:
        directory = c.node_dir(n) / f"{topic}-{partition}"
        out[n] = sum(f.stat().st_size for f in directory.glob("*.log") if f.is_file())
    return out


def _segments(c: LocalCluster, topic: str, partition: int) -> dict[int, list[tuple[str, int]]]:
    """Each node's segment files of ``topic/partition`` and their sizes."""
    out = {}
    for n in c.ports:
        directory = c.node_dir(n) / f"{topic}-{partition}"
        out[n] = sorted((f.name, f.stat().st_size) for f in directory.glob("*.log"))
    return out


def _value(key: int, round_: int) -> bytes:
    return f"{key}:{round_}:".encode().ljust(VALUE_BYTES, b".")


def _expected(rounds: int) -> tuple[dict[bytes, bytes], set[bytes]]:
    """The latest value of each live key after ``rounds`` rounds, and the deleted keys:
    round r writes every key, but a tombstone for every 7th key in round 10 (written again
    from round 11 on) and for every 10th key in the last round."""
    live: dict[bytes, bytes] = {}
    deleted: set[bytes] = set()
    for r in range(rounds):
        for k in range(KEYS):
            key = b"key-%04d" % k
            if (r == 10 and k % 7 == 0) or (r == rounds - 1 and k % 10 == 0):
                live.pop(key, None)
                deleted.add(key)
            else:
                live[key] = _value(k, r)
                deleted.discard(key)
    return live, deleted


def _keys_in_log(c: LocalCluster, topic: str) -> list[bytes | None]:
    """The key of every record of ``topic/0``, read by the native client from offset 0."""
    return [k for _, k, _ in _native_read(c, topic)[0]]


def _native_read(
    c: LocalCluster, topic: str
) -> tuple[list[tuple[int, bytes | None, bytes | None]], int]:
    """(offset, key, value) of every record of ``topic/0`` as the native client reads
    them from offset 0, and how many of the batches it fetched are sparse (a clean's,
    with gaps inside)."""
    records: list[tuple[int, bytes | None, bytes | None]] = []
    sparse = 0
    offset = 0
    for _ in range(10_000):
        fetched = c.client.fetch(topic, 0, offset, max_bytes=1 << 20)
        if not fetched.records:
            break
        table = fetched.to_arrow()
        records += zip(
            table.column("offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
        headers = list(iter_batches(fetched.records))
        sparse += sum(h.is_sparse for h in headers)
        offset = headers[-1].next_offset
        if offset >= fetched.high_watermark:
            break
    return records, sparse


def _read_all(c: LocalCluster, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of ``topic/0`` from offset 0 to its end, as a
    librdkafka consumer reads them."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "group.id": f"read-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    break
                raise AssertionError(msg.error())
            out.append((msg.offset(), msg.key(), msg.value()))
        else:
            raise AssertionError(f"no end of {topic} within {WAIT_S} s")
    finally:
        consumer.close()
    return out


def test_a_compacted_topic_reads_as_the_latest_value_of_each_live_key(
    kcluster: LocalCluster,
) -> None:
    c = kcluster
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": c.kafka_bootstrap})
    configs = {
        "cleanup.policy": "compact",
        "segment.bytes": str(16 << 10),
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0",
    }
    new = confluent_kafka.admin.NewTopic("kcdc", 1, 3, config=configs)
    admin.create_topics([new])["kcdc"].result(30)
    c.client.wait_for_leaders("kcdc", 30_000)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": c.kafka_bootstrap, "acks": "all", "linger.ms": 5}
    )
    written = 0  # keys' and values' bytes (the cleaners may start before the last round)
    for r in range(ROUNDS):
        for k in range(KEYS):
            tombstone = (r == 10 and k % 7 == 0) or (r == ROUNDS - 1 and k % 10 == 0)
            value = None if tombstone else _value(k, r)
            key = b"key-%04d" % k
            producer.produce("kcdc", value, key=key, partition=0)
            written += len(key) + len(value or b"")
        assert producer.flush(30) == 0
    live, deleted = _expected(ROUNDS)
    assert len(live) == KEYS - KEYS // 10 and deleted

    def cleaned() -> bool:
        # Filler records of one key push the last round out of the active segment and
        # make the log dirty again, so a second clean drops the tombstones the first kept.
        producer.produce("kcdc", b"f" * VALUE_BYTES * 20, key=FILLER, partition=0)
        producer.flush(30)
        keys = [k for k in _keys_in_log(c, "kcdc") if k != FILLER]
        return len(keys) == len(live) and set(keys) == set(live)

    wait_until(cleaned, WAIT_S, "the cleaners keep only the latest record of each live key")
    records = _read_all(c, "kcdc")
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert offsets[-1] >= ROUNDS * KEYS  # the offsets of what was written, gaps between
    got = {k: v for _, k, v in records if k != FILLER}
    assert got == live
    assert not deleted & {k for _, k, _ in records}
    # The cleaned batches have gaps inside: librdkafka reads each record at the offset
    # the log holds it at (the Fetch conversion's offset deltas), none lost or moved.
    native, sparse = _native_read(c, "kcdc")
    assert sparse
    assert [(o, k, v) for o, k, v in records if k != FILLER] == [
        (o, k, v) for o, k, v in native if k != FILLER
    ]

    # Every replica cleans on its own, down to about the live data (the active segment
    # of filler records aside).
    live_bytes = sum(len(k) + len(v) for k, v in live.items())

    def shrunk() -> bool:
        now = _log_bytes(c, "kcdc", 0)
        return all(b <= 4 * live_bytes + (64 << 10) for b in now.values())

    wait_until(shrunk, WAIT_S, f"every replica's bytes near {live_bytes} live bytes")
    after = _log_bytes(c, "kcdc", 0)
    assert all(b < written / 4 for b in after.values()), (written, after)


#: Commit errors a consumer retries (the coordinator moved, or is loading).
RETRIED = {
    confluent_kafka.KafkaError.NOT_COORDINATOR,
    confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE,
    confluent_kafka.KafkaError.REQUEST_TIMED_OUT,
    confluent_kafka.KafkaError._TRANSPORT,
    confluent_kafka.KafkaError._TIMED_OUT,
    confluent_kafka.KafkaError._WAIT_COORD,
}


def _commit_sync(consumer: confluent_kafka.Consumer, tp: confluent_kafka.TopicPartition) -> None:
    """A synchronous commit, again while the coordinator moves (leaders may change on a
    loaded machine), as an application retries one."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            consumer.commit(offsets=[tp], asynchronous=False)
            return
        except confluent_kafka.KafkaException as exc:
            if exc.args[0].code() not in RETRIED or time.monotonic() > deadline:
                raise


def test_twenty_thousand_offset_commits_stay_a_few_mib_and_resume_after_failover(
    kcluster: LocalCluster,
) -> None:
    c = kcluster
    c.create_topic("kcommits", 1)
    c.produce("kcommits", 0, [b"r%d" % i for i in range(20)])
    group = "committer"
    commits = 20_000
    last = 17

    failures: list[BaseException] = []

    def commit(count: int, final: int | None = None) -> None:
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": c.kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        try:
            for i in range(count):
                tp = confluent_kafka.TopicPartition("kcommits", 0, i % 20)
                # Asynchronous, as an auto-committing consumer's; a synchronous one now
                # and then bounds what librdkafka queues.
                if i % 500 != 499:
                    consumer.commit(offsets=[tp], asynchronous=True)
                else:
                    _commit_sync(consumer, tp)
            if final is not None:
                _commit_sync(consumer, confluent_kafka.TopicPartition("kcommits", 0, final))
        except BaseException as exc:  # the thread's failure fails the test
            failures.append(exc)
        finally:
            consumer.close()

    # Four committers at once (a commit waits for its quorum write; they overlap).
    committers = [threading.Thread(target=commit, args=(commits // 4,)) for _ in range(4)]
    for t in committers:
        t.start()
    for t in committers:
        t.join(WAIT_S * 2)
    assert not any(t.is_alive() for t in committers)
    commit(0, final=last)
    assert not failures, failures

    partitions = len(c.client.metadata([OFFSETS_TOPIC])[OFFSETS_TOPIC].partitions)
    p = partition_for(group, partitions)
    bound = 4 << 20

    def bounded() -> bool:
        return all(b <= bound for b in _log_bytes(c, OFFSETS_TOPIC, p).values())

    wait_until(bounded, WAIT_S, f"{OFFSETS_TOPIC}-{p} within {bound} bytes on every replica")

    # The coordinator dies; the new one loads the cleaned partition.
    coordinator = c.leader_of(OFFSETS_TOPIC, p)
    c.kill(coordinator)
    try:
        resumed = confluent_kafka.Consumer(
            {
                "bootstrap.servers": c.kafka_bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            resumed.subscribe(["kcommits"])
            first = None
            deadline = time.monotonic() + WAIT_S
            while first is None and time.monotonic() < deadline:
                msg = resumed.poll(1.0)
                if msg is not None and not msg.error():
                    first = msg.offset()
            assert first == last
        finally:
            resumed.close()
        # The new coordinator read the cleaned partition: not a record per commit.
        loaded = re.compile(rf"{OFFSETS_TOPIC}/{p}: coordinating in epoch \d+: (\d+) offset record")
        successor = c.leader_of(OFFSETS_TOPIC, p)
        counts = [int(x) for x in loaded.findall(c.log_path(successor).read_text())]
        assert counts and counts[-1] < commits // 4, counts
    finally:
        c.start_node(coordinator)


def test_a_transaction_s_committed_offsets_outlive_a_later_aborted_one(
    kcluster: LocalCluster,
) -> None:
    """A transactional producer commits the group's offset in one transaction, then
    aborts the next (the same producer epoch, so its offset record has the same key).
    Once the cleaners have cleaned that offsets partition and its coordinator is killed,
    the group's committed offset is the first transaction's."""
    c = kcluster
    c.create_topic("ktxnin", 1)
    c.produce("ktxnin", 0, [b"r%d" % i for i in range(20)])
    partitions = defaults.OFFSETS_TOPIC_NUM_PARTITIONS  # the nodes'
    group = "eos-offsets"
    p = partition_for(group, partitions)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": c.kafka_bootstrap, "transactional.id": "eos-offsets-1"}
    )
    try:
        # A plain commit first: the group's coordinator is up, and offset 1 is what a
        # lost transactional commit would fall back to.
        _commit_sync(consumer, confluent_kafka.TopicPartition("ktxnin", 0, 1))
        producer.init_transactions(60)
        for offset, commit in ((5, True), (9, False)):
            producer.begin_transaction()
            tp = confluent_kafka.TopicPartition("ktxnin", 0, offset)
            producer.send_offsets_to_transaction([tp], consumer.consumer_group_metadata(), 60)
            if commit:
                producer.commit_transaction(60)
            else:
                producer.abort_transaction(60)
    finally:
        consumer.close()

    # Another group of the same offsets partition fills it past a few segments, so the
    # transactions' records fall below its active segment and are cleaned.
    filler = next(
        f"filler-{i}" for i in range(10_000) if partition_for(f"filler-{i}", partitions) == p
    )
    other = confluent_kafka.Consumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": filler, "enable.auto.commit": False}
    )
    try:
        for i in range(6000):
            tp = confluent_kafka.TopicPartition("ktxnin", 0, i % 20)
            if i % 500 != 499:
                other.commit(offsets=[tp], asynchronous=True)
            else:
                _commit_sync(other, tp)
    finally:
        other.close()
    wait_until(
        lambda: (
            all(b <= 4 << 20 for b in _log_bytes(c, OFFSETS_TOPIC, p).values())
            and sum(1 for _ in (c.node_dir(1) / f"{OFFSETS_TOPIC}-{p}").glob("*.log")) <= 3
        ),
        WAIT_S,
        f"{OFFSETS_TOPIC}-{p} cleaned",
        state=lambda: _segments(c, OFFSETS_TOPIC, p),
    )
    coordinator = c.leader_of(OFFSETS_TOPIC, p)
    c.kill(coordinator)
    try:
        reader = confluent_kafka.Consumer(
            {"bootstrap.servers": c.kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        try:
            tp = confluent_kafka.TopicPartition("ktxnin", 0)

            def committed() -> int | None:
                try:
                    return int(reader.committed([tp], timeout=10)[0].offset)
                except confluent_kafka.KafkaException:
                    return None  # the coordinator is moving

            got = wait_until(committed, WAIT_S, "the group's committed offset after failover")
            assert got == 5
        finally:
            reader.close()
    finally:
        c.start_node(coordinator)
