"""Kafka transactions (KIP-98, KIP-447) on a 3-node cluster's Kafka listener, with real
clients: librdkafka (confluent-kafka), aiokafka and kafka-python. Commits and aborts are
seen right by read_committed and read_uncommitted consumers; a second producer of the
same transactional id fences the first; a producer killed mid-transaction is aborted by
its timeout and read_committed readers move on; consume-transform-produce commits its
offsets with its output or neither; markers are refused to clients."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.kafka import NO_REBALANCE_DELAY
from tests.support.waits import wait_until

from .test_groups import _call

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

WAIT_S = 60.0


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3, tmp_path_factory.mktemp("txn"), kafka=True, node_args=NO_REBALANCE_DELAY
    ) as c:
        yield c


def _topic(cluster: LocalCluster, partitions: int = 3) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 3)]).values():
        fut.result(30)
    wait_until(
        lambda: all(
            p.leader >= 0
            for p in admin.list_topics(name, timeout=5).topics[name].partitions.values()
        ),
        WAIT_S,
        f"leaders of {name}",
    )
    return name


def _producer(cluster: LocalCluster, tid: str, **extra: Any) -> confluent_kafka.Producer:
    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "transactional.id": tid,
            "transaction.timeout.ms": 60000,
            "linger.ms": 5,
            **extra,
        }
    )
    p.init_transactions(30)
    return p


def _read_all(
    cluster: LocalCluster, topic: str, isolation: str, expect: int, *, settle_s: float = 1.0
) -> list[bytes]:
    """Every value a fresh consumer reads from ``topic`` with ``isolation``, once it has
    ``expect`` and nothing more came for ``settle_s``."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        quiet_until = None
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
                quiet_until = None
                continue
            if len(values) >= expect:
                quiet_until = quiet_until or time.monotonic() + settle_s
                if time.monotonic() >= quiet_until:
                    break
        return values
    finally:
        consumer.close()


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def test_commit_and_abort_seen_right_by_both_isolation_levels(kcluster: LocalCluster) -> None:
    topic = _topic(kcluster)
    producer = _producer(kcluster, f"tx-{uuid.uuid4().hex[:6]}")
    for prefix, commit in (("one", True), ("aborted", False), ("two", True)):
        producer.begin_transaction()
        for i, value in enumerate(_values(prefix, 30)):
            producer.produce(topic, value, key=str(i).encode())
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    committed = _read_all(kcluster, topic, "read_committed", 60)
    assert sorted(committed) == sorted(_values("one", 30) + _values("two", 30))
    everything = _read_all(kcluster, topic, "read_uncommitted", 90)
    assert sorted(everything) == sorted(
        _values("one", 30) + _values("aborted", 30) + _values("two", 30)
    )


def test_a_second_producer_of_the_id_fences_the_first(kcluster: LocalCluster) -> None:
    topic = _topic(kcluster)
    tid = f"fence-{uuid.uuid4().hex[:6]}"
    first = _producer(kcluster, tid)
    first.begin_transaction()
    for value in _values("zombie", 10):
        first.produce(topic, value)
    first.flush(30)
    second = _producer(kcluster, tid)  # bumps the epoch, aborting the first's
    second.begin_transaction()
    for value in _values("live", 10):
        second.produce(topic, value)
    second.flush(30)
    second.commit_transaction(30)
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        first.commit_transaction(30)
    error = failed.value.args[0]
    assert error.fatal() or error.code() in (
        confluent_kafka.KafkaError._FENCED,
        confluent_kafka.KafkaError.PRODUCER_FENCED,
        confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    assert sorted(_read_all(kcluster, topic, "read_committed", 10)) == sorted(_values("live", 10))


_KILLED_PRODUCER = textwrap.dedent(
    """
    import os, sys, confluent_kafka
    bootstrap, topic, tid = sys.argv[1:4]
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                                  "transaction.timeout.ms": 3000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, f"hung-{i}".encode())
    p.flush(30)
    print("produced", flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_a_producer_killed_mid_transaction_is_aborted_by_its_timeout(
    kcluster: LocalCluster,
) -> None:
    topic = _topic(kcluster, partitions=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PRODUCER, kcluster.kafka_bootstrap, topic, "hung-tid"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "produced"
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    # Records after the hung transaction: read_committed readers wait below its first
    # offset until the coordinator aborts it (transaction.timeout.ms 3 s).
    later = confluent_kafka.Producer(
        {"bootstrap.servers": kcluster.kafka_bootstrap, "enable.idempotence": True}
    )
    for value in _values("later", 5):
        later.produce(topic, value)
    assert later.flush(30) == 0
    began = time.monotonic()
    seen = _read_all(kcluster, topic, "read_committed", 5, settle_s=0.5)
    waited = time.monotonic() - began
    assert sorted(seen) == sorted(_values("later", 5)), seen
    print(f"read_committed saw the later records {waited:.1f} s after they were written")


def test_consume_transform_produce_commits_offsets_with_its_output(
    kcluster: LocalCluster,
) -> None:
    source, sink = _topic(kcluster, partitions=2), _topic(kcluster, partitions=2)
    plain = confluent_kafka.Producer({"bootstrap.servers": kcluster.kafka_bootstrap})
    for i, value in enumerate(_values("in", 40)):
        plain.produce(source, value, partition=i % 2)
    assert plain.flush(30) == 0
    group = f"ctp-{uuid.uuid4().hex[:6]}"
    tid = f"ctp-{uuid.uuid4().hex[:6]}"

    def one_pass(commit: bool) -> int:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": kcluster.kafka_bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        producer = _producer(kcluster, tid)
        try:
            consumer.subscribe([source])
            taken: list[Any] = []
            deadline = time.monotonic() + WAIT_S
            while len(taken) < 40 and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    taken.append(msg)
            producer.begin_transaction()
            for msg in taken:
                producer.produce(sink, msg.value().replace(b"in", b"out"))
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            if commit:
                producer.commit_transaction(30)
            else:
                producer.abort_transaction(30)
            return len(taken)
        finally:
            consumer.close()

    assert one_pass(commit=False) == 40
    assert _read_all(kcluster, sink, "read_committed", 0, settle_s=1.0) == []
    # The aborted pass committed no offsets: the next one starts over, from offset 0.
    assert one_pass(commit=True) == 40
    assert sorted(_read_all(kcluster, sink, "read_committed", 40)) == sorted(_values("out", 40))
    checker = confluent_kafka.Consumer(
        {"bootstrap.servers": kcluster.kafka_bootstrap, "group.id": group}
    )
    try:
        parts = [confluent_kafka.TopicPartition(source, p) for p in range(2)]
        committed = checker.committed(parts, timeout=30)
        # Each partition's end (a new leader's control record takes an offset too).
        ends = [checker.get_watermark_offsets(tp, timeout=30)[1] for tp in parts]
        assert [tp.offset for tp in committed] == ends, committed
    finally:
        checker.close()


def test_aiokafka_transactions(kcluster: LocalCluster) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    topic = _topic(kcluster)

    async def run() -> tuple[list[bytes], list[bytes]]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=kcluster.kafka_bootstrap,
            transactional_id=f"aio-{uuid.uuid4().hex[:6]}",
        )
        await producer.start()
        try:
            async with producer.transaction():
                for value in _values("aio-ok", 10):
                    await producer.send(topic, value)
            await producer.begin_transaction()
            for value in _values("aio-aborted", 10):
                await producer.send(topic, value)
            await producer.abort_transaction()
        finally:
            await producer.stop()
        out = []
        for isolation, expect in (("read_committed", 10), ("read_uncommitted", 20)):
            consumer = aiokafka.AIOKafkaConsumer(
                topic,
                bootstrap_servers=kcluster.kafka_bootstrap,
                auto_offset_reset="earliest",
                isolation_level=isolation,
            )
            await consumer.start()
            try:
                got: list[bytes] = []
                deadline = time.monotonic() + WAIT_S
                while len(got) < expect and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        got += [r.value for r in records]
                out.append(got)
            finally:
                await consumer.stop()
        return out[0], out[1]

    committed, everything = asyncio.run(run())
    assert sorted(committed) == sorted(_values("aio-ok", 10))
    assert sorted(everything) == sorted(_values("aio-ok", 10) + _values("aio-aborted", 10))


def test_kafka_python_transactions(kcluster: LocalCluster) -> None:
    kafka = pytest.importorskip("kafka")
    topic = _topic(kcluster)
    producer = kafka.KafkaProducer(
        bootstrap_servers=kcluster.kafka_bootstrap, transactional_id=f"kp-{uuid.uuid4().hex[:6]}"
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for value in _values("kp-aborted", 10):
            producer.send(topic, value)
        producer.abort_transaction()
        producer.begin_transaction()
        for value in _values("kp-ok", 10):
            producer.send(topic, value)
        producer.commit_transaction()
    finally:
        producer.close(10)
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=kcluster.kafka_bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=3000,
    )
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 10 and time.monotonic() < deadline:
            got += [r.value for r in consumer]
    finally:
        consumer.close()
    assert sorted(got) == sorted(_values("kp-ok", 10))


def test_markers_are_refused_to_clients(kcluster: LocalCluster) -> None:
    body = km.WRITE_TXN_MARKERS.default_request(1)
    body["markers"] = [
        {
            "producer_id": 7,
            "producer_epoch": 0,
            "transaction_result": True,
            "topics": [{"name": "anything", "partition_indexes": [0]}],
            "coordinator_epoch": 0,
        }
    ]
    port = next(iter(kcluster.kafka_ports.values()))
    answer = _call(port, km.WRITE_TXN_MARKERS, 1, body)
    codes = [
        p["error_code"] for mk in answer["markers"] for t in mk["topics"] for p in t["partitions"]
    ]
    assert codes == [int(KafkaError.CLUSTER_AUTHORIZATION_FAILED)]


def test_init_producer_id_refuses_a_timeout_past_the_nodes_maximum(kcluster: LocalCluster) -> None:
    body = km.INIT_PRODUCER_ID.default_request(4)
    body.update(transactional_id="too-long", transaction_timeout_ms=10**9)
    port = next(iter(kcluster.kafka_ports.values()))
    answer = _call(port, km.INIT_PRODUCER_ID, 4, body)
    assert answer["error_code"] == int(KafkaError.INVALID_TRANSACTION_TIMEOUT)


def test_describe_and_list_transactions(kcluster: LocalCluster) -> None:
    """DescribeTransactions at the id's coordinator shows an open transaction's state
    and partitions; ListTransactions, asked of every node, lists it, and filters by
    state."""
    topic = _topic(kcluster, partitions=2)
    tid = f"desc-{uuid.uuid4().hex[:6]}"
    producer = _producer(kcluster, tid)
    producer.begin_transaction()
    producer.produce(topic, b"x", partition=1)
    assert producer.flush(30) == 0

    def described() -> dict[str, Any] | None:
        body = km.DESCRIBE_TRANSACTIONS.default_request(0)
        body["transactional_ids"] = [tid]
        for port in kcluster.kafka_ports.values():
            (state,) = _call(port, km.DESCRIBE_TRANSACTIONS, 0, body)["transaction_states"]
            if state["error_code"] == 0:
                return state
        return None

    state = wait_until(described, WAIT_S, f"the coordinator of {tid}")
    assert state["transaction_state"] == "Ongoing"
    assert state["topics"] == [{"topic": topic, "partitions": [1]}]

    def listed(states: list[str]) -> set[str]:
        body = km.LIST_TRANSACTIONS.default_request(1)
        body["state_filters"] = states
        return {
            t["transactional_id"]
            for port in kcluster.kafka_ports.values()
            for t in _call(port, km.LIST_TRANSACTIONS, 1, body)["transaction_states"]
        }

    assert tid in listed([]) and tid in listed(["Ongoing"])
    assert tid not in listed(["CompleteCommit"])
    producer.commit_transaction(30)
    assert wait_until(lambda: tid in listed(["CompleteCommit"]), WAIT_S, "the commit listed")
