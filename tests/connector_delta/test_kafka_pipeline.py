"""A mixed pipeline, end to end: an idempotent librdkafka producer (confluent-kafka) writes
through the Kafka listener while a leader's followers stall and a leader is killed; Spark
reads the topic with ``format("quorumlog")`` into Delta (``DeltaSink``); the table holds
exactly what the producer was told was written: every record once, at the offset its
acknowledgement named, with its key, value and headers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from quorumlog.connector.delta import DeltaSink
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.cluster import leader_fault
from tests.support.kafka import idempotent_producer
from tests.support.waits import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(300)]

TOPIC = "kpipe"
RECORDS = 3000


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("kpipe"), kafka=True) as c:
        yield c


def _produce(c: LocalCluster) -> dict[tuple[int, int], tuple[bytes, bytes, Any]]:
    """(partition, offset) -> (key, value, headers) of every acknowledged record."""
    producer = idempotent_producer(c)
    acked: dict[tuple[int, int], tuple[bytes, bytes, Any]] = {}
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            # A delivery report carries no headers: they are the ones produced with it.
            headers = [("n", msg.value()[1:])]
            acked[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), headers)

    for i in range(RECORDS):
        producer.produce(
            TOPIC,
            key=f"k{i}".encode(),
            value=f"v{i}".encode(),
            headers=[("n", str(i).encode())],
            partition=i % 2,
            on_delivery=delivered,
        )
        producer.poll(0)
        if i == RECORDS // 3:
            leader_fault(c, TOPIC, 0, "stall")
        if i == 2 * RECORDS // 3:
            leader_fault(c, TOPIC, 1, "kill")
    assert producer.flush(120) == 0
    c.wait_ready()
    assert not failed, failed[:3]
    return acked


def test_confluent_kafka_to_quorumlog_to_delta_holds_what_was_acknowledged(
    spark: Any, kcluster: LocalCluster, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    c = kcluster
    c.create_topic(TOPIC, 2)
    acked = _produce(c)
    assert len(acked) == RECORDS

    table = str(tmp_path / "table")
    query = (
        spark.readStream.format("quorumlog")
        .option("bootstrap", c.bootstrap)
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .writeStream.foreachBatch(DeltaSink(table))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()

    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    got = {
        (r["partition"], r["offset"]): (
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"] or []],
        )
        for r in rows
    }
    assert len(rows) == len(got) == RECORDS  # no row twice
    assert got == acked


def test_partitions_added_while_a_stream_reads_reach_the_delta_table(
    spark: Any, kcluster: LocalCluster, tmp_path: Path
) -> None:
    """CreatePartitions through a Kafka admin client while a Spark stream reads the topic
    into Delta: the stream picks the new partitions up from their first offset, as
    Spark's Kafka source does, and their records reach the table."""
    from deltalake import DeltaTable

    c = kcluster
    topic = "kgrow-stream"
    c.create_topic(topic, 1)
    c.produce(topic, 0, [b"before"])
    table = str(tmp_path / "table")

    def rows() -> dict[int, list[bytes]]:
        try:
            got = DeltaTable(table).to_pyarrow_table(columns=["partition", "value"]).to_pylist()
        except Exception:
            return {}
        out: dict[int, list[bytes]] = {}
        for r in got:
            out.setdefault(r["partition"], []).append(r["value"])
        return out

    query = (
        spark.readStream.format("quorumlog")
        .option("bootstrap", c.bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(DeltaSink(table))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: rows() == {0: [b"before"]}, 120, "the first record in the table")
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": c.kafka_bootstrap})
        admin.create_partitions([confluent_kafka.admin.NewPartitions(topic, 3)])[topic].result(30)
        c.client.wait_for_leaders(topic)
        producer = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap})
        for p in (1, 2):
            producer.produce(topic, value=f"new-{p}".encode(), partition=p)
        assert producer.flush(30) == 0
        wait_until(
            lambda: rows() == {0: [b"before"], 1: [b"new-1"], 2: [b"new-2"]},
            120,
            "the new partitions' records in the table",
        )
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
