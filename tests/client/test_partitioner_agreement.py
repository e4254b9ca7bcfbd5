"""A key lands on the same partition whichever client writes it: the same keys produced
through librdkafka (confluent-kafka, its ``partitioner`` set) to the nodes' Kafka listener
and through the native Producer, partitions compared, for both partitioners."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.cluster

PARTITIONS = 7  # not a power of two: a hash that agrees only in its low bits shows


def _keys() -> list[bytes]:
    rng = random.Random(42)
    keys = [b"user-%d" % i for i in range(300)]
    keys += [rng.randbytes(rng.randrange(1, 64)) for _ in range(300)]
    return keys


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(1, Path(tmp_path_factory.mktemp("agree")), kafka=True) as c:
        yield c


def _librdkafka_partitions(c: LocalCluster, topic: str, partitioner: str) -> dict[bytes, int]:
    placed: dict[bytes, int] = {}
    failed: list[object] = []

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            failed.append(err)
        else:
            placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": c.kafka_bootstrap, "partitioner": partitioner, "linger.ms": 5}
    )
    for key in _keys():
        producer.produce(topic, b"v", key=key, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0 and not failed, failed[:1]
    return placed


@pytest.mark.parametrize("partitioner", ["murmur2_random", "consistent_random"])
def test_keys_land_where_librdkafka_puts_them(
    kafka_cluster: LocalCluster, partitioner: str
) -> None:
    c = kafka_cluster
    theirs_topic, ours_topic = f"{partitioner}-rdkafka", f"{partitioner}-native"
    for topic in (theirs_topic, ours_topic):
        c.create_topic(topic, PARTITIONS)
        for p in range(PARTITIONS):
            c.wait_for_leader(topic, p, 60)
    theirs = _librdkafka_partitions(c, theirs_topic, partitioner)
    with Producer(c.client, partitioner=partitioner) as producer:
        futures = {key: producer.send(ours_topic, b"v", key=key) for key in _keys()}
        producer.flush(60)
    ours = {key: future.result(0).partition for key, future in futures.items()}
    assert len(set(ours.values())) == PARTITIONS  # every partition used: the test can tell
    differ = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
    assert not differ, f"{len(differ)} of {len(ours)} keys differ, e.g. {list(differ.items())[:3]}"
    # Sent one at a time too (a single key's own batch), the same partition.
    with Producer(c.client, partitioner=partitioner, linger_ms=0) as producer:
        key = _keys()[-1]
        assert producer.send(ours_topic, b"v", key=key).result(30).partition == theirs[key]
