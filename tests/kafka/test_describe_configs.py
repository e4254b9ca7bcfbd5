"""DescribeConfigs on the Kafka listener, asked by a real client (confluent-kafka's
AdminClient) of a 3-node cluster started with non-default retention: topics answer the
values the nodes apply, brokers a small set of their own, and what is not there an error
per resource."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from quorumlog.replica import defaults
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka.codec import decode_response, encode_request
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.wire import FrameDecoder, frame
from quorumlog.replica.node.cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

RETENTION_MS = 86_400_000
TOPIC_LIMIT = 100_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3,
        tmp_path_factory.mktemp("kconfigs"),
        kafka=True,
        node_args=["--retention-ms", str(RETENTION_MS)],
    ) as c:
        c.create_topic("plain", 2)
        admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
        limited = NewTopic("limited", 1, 3, config={"max.message.bytes": str(TOPIC_LIMIT)})
        admin.create_topics([limited])["limited"].result(30)
        c.client.wait_for_leaders("limited", 30_000)
        yield c


def _describe(c: LocalCluster, *resources: ConfigResource) -> dict[ConfigResource, object]:
    admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
    futures = admin.describe_configs(list(resources), request_timeout=30)
    out: dict[ConfigResource, object] = {}
    for resource, future in futures.items():
        try:
            out[resource] = {name: e for name, e in future.result(30).items()}
        except confluent_kafka.KafkaException as exc:
            out[resource] = exc.args[0]
    return out


def test_a_topic_describes_the_configs_its_nodes_apply(cluster: LocalCluster) -> None:
    plain, limited = ConfigResource("topic", "plain"), ConfigResource("topic", "limited")
    got = _describe(cluster, plain, limited)
    configs = got[plain]
    assert isinstance(configs, dict)
    values = {name: e.value for name, e in configs.items()}
    never = str((1 << 63) - 1)  # Kafka's "no bound" for a time
    assert values == {
        "cleanup.policy": "delete",
        "compression.type": "producer",
        "delete.retention.ms": str(defaults.DELETE_RETENTION_MS),
        "max.compaction.lag.ms": never,
        "max.message.bytes": str(defaults.MAX_MESSAGE_BYTES),
        "message.timestamp.type": "CreateTime",
        "min.cleanable.dirty.ratio": str(defaults.MIN_CLEANABLE_DIRTY_RATIO),
        "min.compaction.lag.ms": str(defaults.MIN_COMPACTION_LAG_MS),
        "min.insync.replicas": "2",
        "retention.bytes": "-1",
        "retention.ms": str(RETENTION_MS),
        "segment.bytes": str(defaults.SEGMENT_BYTES),
        "segment.ms": never,
        "unclean.leader.election.enable": "false",
    }
    assert configs["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    alterable = {
        "cleanup.policy",
        "compression.type",
        "delete.retention.ms",
        "max.compaction.lag.ms",
        "max.message.bytes",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.ms",
    }
    assert {n for n, e in configs.items() if not e.is_read_only} == alterable
    assert not any(e.is_sensitive for e in configs.values())
    limits = got[limited]
    assert isinstance(limits, dict)
    assert limits["max.message.bytes"].value == str(TOPIC_LIMIT)
    assert limits["max.message.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_a_broker_describes_its_own_configs(cluster: LocalCluster) -> None:
    broker = ConfigResource("broker", "2")
    configs = _describe(cluster, broker)[broker]
    assert isinstance(configs, dict)
    assert configs["node.id"].value == "2"
    assert configs["message.max.bytes"].value == str(defaults.MAX_MESSAGE_BYTES)
    assert configs["log.retention.ms"].value == str(RETENTION_MS)
    assert configs["auto.create.topics.enable"].value == "false"
    assert configs["log.cleanup.policy"].value == "delete"
    assert configs["group.initial.rebalance.delay.ms"].value == str(
        defaults.GROUP_INITIAL_REBALANCE_DELAY_MS
    )


def test_unknown_topics_and_unserved_resource_types_err_per_resource(
    cluster: LocalCluster,
) -> None:
    """Raw, so that one request carries all four kinds: each resource is answered alone."""
    port = cluster.kafka_ports[1]
    req = km.DESCRIBE_CONFIGS.default_request(4)
    req["include_synonyms"] = True
    req["resources"] = [
        {"resource_type": 2, "resource_name": "plain", "configuration_keys": ["retention.ms"]},
        {"resource_type": 2, "resource_name": "missing", "configuration_keys": None},
        {"resource_type": 3, "resource_name": "group", "configuration_keys": None},
        {"resource_type": 4, "resource_name": "2", "configuration_keys": None},
    ]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(frame(encode_request(km.DESCRIBE_CONFIGS, 4, 7, req, client_id="raw")))
        frames = FrameDecoder()
        answers: list[bytes] = []
        while not answers:
            data = s.recv(1 << 16)
            assert data, "the listener closed the connection"
            answers.extend(frames.feed(data))
    cid, body = decode_response(km.DESCRIBE_CONFIGS, 4, answers[0])
    assert cid == 7
    codes = [r["error_code"] for r in body["results"]]
    assert codes == [
        0,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        KafkaError.INVALID_REQUEST,
        KafkaError.INVALID_REQUEST,  # node 2's configs are node 2's to tell
    ]
    (retention,) = body["results"][0]["configs"]
    assert (retention["name"], retention["value"]) == ("retention.ms", str(RETENTION_MS))
    assert retention["synonyms"] == [
        {"name": "log.retention.ms", "value": str(RETENTION_MS), "source": 4}
    ]
