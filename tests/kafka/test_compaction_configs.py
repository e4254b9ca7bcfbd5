"""Compaction's Kafka face on a 3-node cluster, with clients nobody here wrote: the
compaction configs through CreateTopics, IncrementalAlterConfigs and ``quorumlog topic
create/alter --config``, described by DescribeConfigs; a record without a key refused
from a compacted topic (confluent-kafka gets INVALID_RECORD, the native Producer
InvalidRecordError); the internal topics created compacted; two consumers that start
together share the first generation (group.initial.rebalance.delay.ms)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource
from quorumlog.replica.client import InvalidRecordError
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.kafka.coordinators import OFFSETS_TOPIC
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.topic_configs import KEYLESS_RECORD

from tests.support.cli import cluster_cli
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

WAIT_S = 60.0
#: Short, so the test of it waits little; long against two consumers starting together.
REBALANCE_DELAY_MS = 2000


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3,
        tmp_path_factory.mktemp("compaction-configs"),
        kafka=True,
        node_args=["--group-initial-rebalance-delay-ms", str(REBALANCE_DELAY_MS)],
    ) as c:
        yield c


@pytest.fixture
def admin(kcluster: LocalCluster) -> confluent_kafka.admin.AdminClient:
    return confluent_kafka.admin.AdminClient({"bootstrap.servers": kcluster.kafka_bootstrap})


def _configs(admin: confluent_kafka.admin.AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource("topic", topic)
    configs: dict[str, Any] = admin.describe_configs([resource])[resource].result(30)
    return configs


def test_compaction_configs_are_set_altered_and_described_in_kafka_s_names(
    kcluster: LocalCluster, admin: confluent_kafka.admin.AdminClient
) -> None:
    new = confluent_kafka.admin.NewTopic(
        "kcompact",
        1,
        3,
        config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.2"},
    )
    admin.create_topics([new])["kcompact"].result(30)
    wait_until(lambda: "kcompact" in kcluster.client.metadata(["kcompact"]), WAIT_S, "kcompact")
    configs = _configs(admin, "kcompact")
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["min.cleanable.dirty.ratio"].value == "0.2"
    assert configs["delete.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    resource = ConfigResource(
        "topic",
        "kcompact",
        incremental_configs=[
            ConfigEntry(
                "min.compaction.lag.ms", "1000", incremental_operation=AlterConfigOpType.SET
            ),
            ConfigEntry("delete.retention.ms", "0", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.ms", "600000", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(30)
    configs = _configs(admin, "kcompact")
    assert {n: configs[n].value for n in ("min.compaction.lag.ms", "delete.retention.ms")} == {
        "min.compaction.lag.ms": "1000",
        "delete.retention.ms": "0",
    }
    assert configs["segment.ms"].value == "600000"

    # A max lag below the topic's min lag crosses them (Kafka's check on the whole set).
    crossing = ConfigResource(
        "topic",
        "kcompact",
        incremental_configs=[
            ConfigEntry("max.compaction.lag.ms", "999", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        admin.incremental_alter_configs([crossing])[crossing].result(30)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG
    assert "min.compaction.lag.ms (1000) > max.compaction.lag.ms (999)" in str(refused.value)

    # The command line: create and alter with --config, in the same names.
    bootstrap = kcluster.bootstrap
    cluster_cli(
        bootstrap, "topic", "create", "clicompact", "--partitions", "1",
        "--config", "cleanup.policy=compact,delete",
    )  # fmt: skip
    cluster_cli(
        bootstrap, "topic", "alter", "clicompact", "--config", "max.compaction.lag.ms=60000"
    )
    described = kcluster.client.metadata(["clicompact"])["clicompact"].configs
    assert described == {"cleanup.policy": "compact,delete", "max.compaction.lag.ms": "60000"}
    assert _configs(admin, "clicompact")["cleanup.policy"].value == "compact,delete"


def test_a_record_without_a_key_is_refused_from_a_compacted_topic(
    kcluster: LocalCluster, admin: confluent_kafka.admin.AdminClient
) -> None:
    c = kcluster
    new = confluent_kafka.admin.NewTopic("kkeyed", 1, 3, config={"cleanup.policy": "compact"})
    admin.create_topics([new])["kkeyed"].result(30)
    c.client.wait_for_leaders("kkeyed", 30_000)

    outcomes: list[confluent_kafka.KafkaError | None] = []
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": c.kafka_bootstrap, "enable.idempotence": False, "linger.ms": 0}
    )
    for key in (b"k", None):
        producer.produce("kkeyed", b"v", key=key, on_delivery=lambda e, m: outcomes.append(e))
        assert producer.flush(30) == 0
    assert outcomes[0] is None
    refused = outcomes[1]
    # librdkafka shows its own text for the code; the node's message is the native one's.
    assert refused is not None and refused.code() == confluent_kafka.KafkaError.INVALID_RECORD

    native = Producer(c.client, linger_ms=0)
    try:
        assert native.send("kkeyed", b"v2", key=b"k").result(30).offset >= 0
        with pytest.raises(InvalidRecordError, match=KEYLESS_RECORD):
            native.send("kkeyed", b"v3", partition=0).result(30)
        with pytest.raises(InvalidRecordError):  # a flush raises the failure once more
            native.flush(30)
    finally:
        native.close(30)
    # Only the keyed records were written.
    fetched = c.client.fetch("kkeyed", 0, 0).to_arrow()
    assert fetched.column("key").to_pylist() == [b"k", b"k"]


def test_the_offsets_topic_is_created_compacted(kcluster: LocalCluster) -> None:
    c = kcluster
    c.create_topic("koffsets", 1)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": "kofs", "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[confluent_kafka.TopicPartition("koffsets", 0, 1)], asynchronous=False
        )
    finally:
        consumer.close()
    configs = c.client.metadata([OFFSETS_TOPIC])[OFFSETS_TOPIC].configs
    assert configs["cleanup.policy"] == "compact"
    assert int(configs["segment.bytes"]) < 16 << 20


def test_consumers_that_start_together_share_the_first_generation(kcluster: LocalCluster) -> None:
    """Without group.initial.rebalance.delay.ms the first to join is assigned every
    partition alone, and the second rebalances it away; with it, each consumer's first
    assignment is its share."""
    c = kcluster
    c.create_topic("ktogether", 4)
    first: dict[int, list[int]] = {}
    lock = threading.Lock()

    def consume(index: int, stop: threading.Event) -> None:
        def on_assign(consumer: Any, partitions: list[Any]) -> None:
            with lock:
                first.setdefault(index, sorted(p.partition for p in partitions))

        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": c.kafka_bootstrap,
                "group.id": "together",
                "enable.auto.commit": False,
                "heartbeat.interval.ms": 250,
            }
        )
        try:
            consumer.subscribe(["ktogether"], on_assign=on_assign)
            deadline = time.monotonic() + WAIT_S
            while not stop.is_set() and time.monotonic() < deadline:
                consumer.poll(0.1)
        finally:
            consumer.close()

    stop = threading.Event()
    threads = [threading.Thread(target=consume, args=(i, stop)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(first) == 2, WAIT_S, "both consumers assigned")
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT_S)
    assert all(len(parts) == 2 for parts in first.values()), first
    assert sorted(first[0] + first[1]) == [0, 1, 2, 3]
