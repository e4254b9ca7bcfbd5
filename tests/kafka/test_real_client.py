"""A real librdkafka client (confluent-kafka) against a test broker built on the codec."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .server import PRODUCER_ID, KafkaTestBroker

confluent_kafka = pytest.importorskip("confluent_kafka")

RECORDS = 1000
TOPIC = "events"
BASE_TS = 1_700_000_000_000


@pytest.fixture
def broker() -> Iterator[KafkaTestBroker]:
    b = KafkaTestBroker()
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _expected(i: int) -> tuple[bytes, bytes, list[tuple[str, bytes]], int]:
    key = f"key-{i}".encode()
    value = bytes([i % 251]) * 100
    headers = [("source", b"test"), ("n", str(i).encode())]
    return key, value, headers, BASE_TS + i


def _produce(bootstrap: str, idempotent: bool, compression: str = "none") -> list[object]:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": idempotent,
            "compression.type": compression,
            "linger.ms": 5,
            "message.timeout.ms": 20000,
        }
    )
    outcomes: list[object] = []

    def delivered(err: object, msg: object) -> None:
        outcomes.append(err)

    for i in range(RECORDS):
        key, value, headers, ts = _expected(i)
        producer.produce(
            TOPIC, value=value, key=key, headers=headers, timestamp=ts, on_delivery=delivered
        )
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records still queued after 30 s"
    return outcomes


def _check_produced(broker: KafkaTestBroker) -> list[tuple[bytes | None, bytes | None, list, int]]:
    got = []
    for batch in broker.produced:
        for k, v, h, ts in zip(
            batch.keys, batch.values, batch.headers, batch.timestamps, strict=True
        ):
            got.append((k, v, h, ts))
    assert len(got) == RECORDS
    for i, (k, v, h, ts) in enumerate(got):
        key, value, headers, expected_ts = _expected(i)
        assert (k, v, h, ts) == (key, value, headers, expected_ts), f"record {i}"
    return got


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_producer_delivers_through_the_codec(
    broker: KafkaTestBroker, compression: str
) -> None:
    outcomes = _produce(broker.bootstrap, idempotent=False, compression=compression)
    assert outcomes == [None] * RECORDS
    _check_produced(broker)
    assert not broker.errors
    codec = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[compression]
    assert all(b.compression == codec for b in broker.produced)
    assert all(b.producer_id == -1 for b in broker.produced)
    assert any(name == "Produce" for name, _ in broker.versions_used)


def test_idempotent_producer_then_consumer_reads_back(broker: KafkaTestBroker) -> None:
    outcomes = _produce(broker.bootstrap, idempotent=True)
    assert outcomes == [None] * RECORDS
    _check_produced(broker)
    assert all(b.producer_id == PRODUCER_ID and b.producer_epoch == 0 for b in broker.produced)
    sequences = [b.base_sequence for b in broker.produced]
    counts = [b.record_count for b in broker.produced]
    assert sequences == [sum(counts[:i]) for i in range(len(counts))]

    consumer = _consumer(broker, "codec-test")
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        seen = _consume(consumer, RECORDS)
        for i, msg in enumerate(seen):
            key, value, headers, ts = _expected(i)
            assert msg.offset() == i
            assert (msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]) == (
                key,
                value,
                headers,
                ts,
            )
            assert msg.leader_epoch() == 0
    finally:
        consumer.close()
    assert not broker.errors, broker.errors
    assert any(name == "Fetch" for name, _ in broker.versions_used)


def _consumer(broker: KafkaTestBroker, group: str) -> Any:
    """A librdkafka consumer of ``broker`` that checks every batch's CRC32C (librdkafka
    skips the check by default; this makes it verify our encoder's)."""
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "check.crcs": True,
        }
    )


def _consume(consumer: object, count: int) -> list[object]:
    seen: list[object] = []
    deadline = time.monotonic() + 30
    while len(seen) < count and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=500, timeout=0.5):  # type: ignore[attr-defined]
            assert msg.error() is None, msg.error()
            seen.append(msg)
    assert len(seen) == count, f"consumed {len(seen)} of {count} in 30 s"
    return seen


def test_group_consumer_subscribes_commits_and_resumes(broker: KafkaTestBroker) -> None:
    assert _produce(broker.bootstrap, idempotent=False) == [None] * RECORDS
    config = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": "resumers",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "check.crcs": True,
    }
    first = confluent_kafka.Consumer(config)
    try:
        first.subscribe([TOPIC])
        seen = _consume(first, RECORDS)
        assert [m.offset() for m in seen] == list(range(RECORDS))
        first.commit(asynchronous=False)
    finally:
        first.close()
    assert broker.committed[("resumers", TOPIC, 0)] == RECORDS

    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce(TOPIC, value=b"late-%d" % i)
    assert producer.flush(30) == 0

    second = confluent_kafka.Consumer(config)
    try:
        second.subscribe([TOPIC])
        late = _consume(second, 10)
    finally:
        second.close()
    assert [(m.offset(), m.value()) for m in late] == [
        (RECORDS + i, b"late-%d" % i) for i in range(10)
    ]
    assert not broker.errors, broker.errors
    used = {name for name, _ in broker.versions_used}
    assert {"JoinGroup", "SyncGroup", "OffsetFetch", "OffsetCommit", "LeaveGroup"} <= used


def test_admin_client_creates_describes_and_deletes_topics(broker: KafkaTestBroker) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("made", 1, 1)])["made"].result(timeout=20)
    assert "made" in broker.topics
    again = admin.create_topics([NewTopic("made", 1, 1)])["made"]
    with pytest.raises(confluent_kafka.KafkaException) as info:
        again.result(timeout=20)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    resource = ConfigResource("topic", "made")
    configs = admin.describe_configs([resource])[resource].result(timeout=20)
    assert configs["retention.ms"].value == "604800000"
    admin.delete_topics(["made"])["made"].result(timeout=20)
    assert "made" not in broker.topics
    assert not broker.errors, broker.errors
    used = {name for name, _ in broker.versions_used}
    assert {"CreateTopics", "DescribeConfigs", "DeleteTopics"} <= used


@pytest.mark.parametrize("password", ["right", "wrong"])
def test_sasl_plain_handshake_and_authenticate(broker: KafkaTestBroker, password: str) -> None:
    broker.sasl_users = {"alice": "right"}
    errors: list[object] = []
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": password,
            "message.timeout.ms": 5000,
            "error_cb": errors.append,
        }
    )
    outcomes: list[object] = []
    producer.produce(TOPIC, value=b"v", on_delivery=lambda err, msg: outcomes.append(err))

    def auth_failed() -> bool:
        return any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors)

    deadline = time.monotonic() + 20
    while not (outcomes or auth_failed()) and time.monotonic() < deadline:
        producer.poll(0.1)
    if password == "right":
        assert outcomes == [None]
        assert broker.authentications and all(ok for _, ok in broker.authentications)
    else:
        assert auth_failed(), errors
        assert ("alice", False) in broker.authentications
        assert None not in outcomes  # nothing was delivered
        producer.purge()
    producer.flush(1)


def test_consumer_validates_its_position_after_a_leader_epoch_change(
    broker: KafkaTestBroker,
) -> None:
    """KIP-320 with a real client: after a new leader epoch the consumer's fetches are
    fenced, it refreshes metadata and validates with OffsetForLeaderEpoch, then reads on."""
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
    for i in range(100):
        producer.produce(TOPIC, value=b"e0-%d" % i)
    assert producer.flush(30) == 0
    consumer = _consumer(broker, "epochs")
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        assert [m.leader_epoch() for m in _consume(consumer, 100)] == [0] * 100
        broker.leader_epoch = 1
        for i in range(10):
            producer.produce(TOPIC, value=b"e1-%d" % i)
        assert producer.flush(30) == 0
        late = _consume(consumer, 10)
    finally:
        consumer.close()
    assert [(m.offset(), m.value(), m.leader_epoch()) for m in late] == [
        (100 + i, b"e1-%d" % i, 1) for i in range(10)
    ]
    assert broker.epoch_starts[TOPIC] == {0: 0, 1: 100}
    assert any(name == "OffsetForLeaderEpoch" for name, _ in broker.versions_used)
    assert not broker.errors, broker.errors
