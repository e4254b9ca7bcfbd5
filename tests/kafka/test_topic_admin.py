"""Topics that change through Kafka's admin APIs, with admin clients nobody here wrote:
librdkafka's AdminClient adds partitions (CreatePartitions) and changes configs
(IncrementalAlterConfigs and AlterConfigs), DescribeConfigs shows them as the topic's;
kafka-python's KafkaAdminClient adds partitions too; a producer then writes to the new
partitions and a consumer reads them. A node that is not the controller forwards every
topic change to it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.admin
import pytest
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
)
from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
)
from quorumlog.replica.kafka_listener.auth import RESOURCE_TOPIC
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

WAIT_S = 60.0
NOT_CONTROLLER = 41


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("topic-admin"), kafka=True) as c:
        yield c


@pytest.fixture
def admin(kcluster: LocalCluster) -> confluent_kafka.admin.AdminClient:
    return confluent_kafka.admin.AdminClient({"bootstrap.servers": kcluster.kafka_bootstrap})


def _partitions(admin: confluent_kafka.admin.AdminClient, topic: str) -> int:
    return len(admin.list_topics(topic, timeout=20).topics[topic].partitions)


def _topic_configs(admin: confluent_kafka.admin.AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource("topic", topic)
    configs: dict[str, Any] = admin.describe_configs([resource])[resource].result(30)
    return configs


def test_create_partitions_then_produce_and_consume_every_partition(
    kcluster: LocalCluster, admin: confluent_kafka.admin.AdminClient
) -> None:
    c = kcluster
    c.create_topic("kgrow", 1)
    admin.create_partitions([NewPartitions("kgrow", 3)])["kgrow"].result(30)
    assert _partitions(admin, "kgrow") == 3
    with pytest.raises(confluent_kafka.KafkaException) as shrink:
        admin.create_partitions([NewPartitions("kgrow", 2)])["kgrow"].result(30)
    assert shrink.value.args[0].code() == confluent_kafka.KafkaError.INVALID_PARTITIONS

    python_admin = kafka.KafkaAdminClient(bootstrap_servers=c.kafka_bootstrap)
    try:
        answer = python_admin.create_partitions({"kgrow": kafka.admin.NewPartitions(4)})
        assert [tuple(r[:2]) for r in answer.topic_errors] == [("kgrow", 0)]
    finally:
        python_admin.close()
    assert _partitions(admin, "kgrow") == 4
    c.client.wait_for_leaders("kgrow")

    producer = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap, "acks": "all"})
    for p in range(4):
        producer.produce("kgrow", value=f"to-{p}".encode(), partition=p)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("kgrow", p, 0) for p in range(4)])
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + WAIT_S
        while len(got) < 4 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got[msg.partition()] = msg.value()
        assert got == {p: f"to-{p}".encode() for p in range(4)}
    finally:
        consumer.close()


def test_configs_altered_incrementally_and_whole_are_described_as_the_topic_s(
    kcluster: LocalCluster, admin: confluent_kafka.admin.AdminClient
) -> None:
    c = kcluster
    c.create_topic("kconf", 1)
    resource = ConfigResource(
        "topic",
        "kconf",
        incremental_configs=[
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(30)
    configs = _topic_configs(admin, "kconf")
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.bytes"].value == "1048576"
    assert not configs["retention.ms"].is_read_only

    # DELETE: back to the node's value.
    resource = ConfigResource(
        "topic",
        "kconf",
        incremental_configs=[
            ConfigEntry("segment.bytes", None, incremental_operation=AlterConfigOpType.DELETE)
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(30)
    configs = _topic_configs(admin, "kconf")
    assert configs["segment.bytes"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.ms"].value == "3600000"

    # AlterConfigs replaces the whole set: retention.ms, not named, goes.
    whole = ConfigResource("topic", "kconf", set_config={"max.message.bytes": "500000"})
    with pytest.deprecated_call():  # the client's, not the API's: Kafka still serves it
        altered = admin.alter_configs([whole])
    altered[whole].result(30)
    configs = _topic_configs(admin, "kconf")
    assert configs["max.message.bytes"].value == "500000"
    assert configs["retention.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert c.client.metadata(["kconf"])["kconf"].configs == {"max.message.bytes": "500000"}

    bad = ConfigResource(
        "topic",
        "kconf",
        incremental_configs=[
            ConfigEntry(
                "min.cleanable.dirty.ratio", "1.5", incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        admin.incremental_alter_configs([bad])[bad].result(30)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG

    created = admin.create_topics(
        [confluent_kafka.admin.NewTopic("kconf-new", 1, 3, config={"retention.bytes": "1000000"})]
    )
    created["kconf-new"].result(30)
    wait_until(
        lambda: _topic_configs(admin, "kconf-new")["retention.bytes"].value == "1000000",
        WAIT_S,
        "the created topic's retention.bytes",
    )


def controller_id(admin: confluent_kafka.admin.AdminClient) -> int:
    controller: int = admin.list_topics(timeout=20).controller_id
    return controller


def _error_codes(answer: Any) -> list[int]:
    """The per-topic or per-resource error codes of a topic-changing answer."""
    codes = [r[1] for r in getattr(answer, "topic_errors", ())]
    codes += [r[0] for r in getattr(answer, "resources", ())]
    return codes + [r[1] for r in getattr(answer, "topic_error_codes", ())]


def ask_node(bootstrap: str, node: int, requests: list[Any], **config: Any) -> list[Any]:
    """Each request on kafka-python's connection to ``node`` itself (not the node the
    client would pick), and its answer. An answer of NOT_CONTROLLER only (no metadata
    leader while one is elected, as on a loaded machine) is asked again, as clients do."""
    client = kafka.KafkaClient(bootstrap_servers=bootstrap, **config)
    try:
        deadline = time.monotonic() + WAIT_S
        while not client.ready(node) and time.monotonic() < deadline:
            client.poll(timeout_ms=100)
        answers = []
        for request in requests:
            for _ in range(10):
                future = client.send(node, request)
                client.poll(future=future, timeout_ms=int(WAIT_S * 1000))
                assert future.succeeded(), future.exception
                codes = _error_codes(future.value)
                if not codes or set(codes) != {NOT_CONTROLLER}:
                    break
                time.sleep(1)
            answers.append(future.value)
        return answers
    finally:
        client.close()


def test_a_node_that_is_not_the_controller_forwards_topic_changes_to_it(
    kcluster: LocalCluster, admin: confluent_kafka.admin.AdminClient
) -> None:
    """kafka-python's AlterConfigs goes to any node (as the Java client's does) and takes
    NOT_CONTROLLER for an answer, so every node decides topic changes through the
    controller, as Kafka's brokers forward them (KIP-590). Here each request goes to a
    node that is not the controller, bootstrapped against it alone."""
    c = kcluster
    controller = controller_id(admin)
    for node in sorted(n for n in c.kafka_ports if n != controller):
        topic = f"kfwd-{node}"
        bootstrap = f"{c.host}:{c.kafka_ports[node]}"
        created, grown, altered = ask_node(
            bootstrap,
            node,
            [
                CreateTopicsRequest[3](
                    create_topic_requests=[(topic, 1, 3, [], [])],
                    timeout=30_000,
                    validate_only=False,
                ),
                CreatePartitionsRequest[1](
                    topic_partitions=[(topic, (3, None))], timeout=30_000, validate_only=False
                ),
                AlterConfigsRequest[1](
                    resources=[(RESOURCE_TOPIC, topic, [("retention.ms", "7200000")])],
                    validate_only=False,
                ),
            ],
        )
        assert created.topic_errors == [(topic, 0, None)]
        assert grown.topic_errors == [(topic, 0, None)]
        assert [r[:2] for r in altered.resources] == [(0, None)]
        # Every node learns the change from the metadata log: the one asked may lag.
        wait_until(
            lambda name=topic: (
                _partitions(admin, name) == 3
                and _topic_configs(admin, name)["retention.ms"].value == "7200000"
            ),
            WAIT_S,
            f"{topic}'s 3 partitions and retention.ms",
        )
        (deleted,) = ask_node(
            bootstrap, node, [DeleteTopicsRequest[3](topics=[topic], timeout=30_000)]
        )
        assert deleted.topic_error_codes == [(topic, 0)]
        wait_until(
            lambda name=topic: name not in admin.list_topics(timeout=20).topics,
            WAIT_S,
            f"{topic} deleted",
        )

    # librdkafka's AdminClient, bootstrapped against a node that is not the controller.
    other = min(n for n in c.kafka_ports if n != controller)
    elsewhere = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": f"{c.host}:{c.kafka_ports[other]}"}
    )
    c.create_topic("kfwd-rdkafka", 1)
    elsewhere.create_partitions([NewPartitions("kfwd-rdkafka", 2)])["kfwd-rdkafka"].result(30)
    resource = ConfigResource(
        "topic",
        "kfwd-rdkafka",
        incremental_configs=[
            ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    elsewhere.incremental_alter_configs([resource])[resource].result(30)
    wait_until(
        lambda: (
            _partitions(admin, "kfwd-rdkafka") == 2
            and _topic_configs(admin, "kfwd-rdkafka")["retention.ms"].value == "60000"
        ),
        WAIT_S,
        "kfwd-rdkafka's 2 partitions and retention.ms",
    )
