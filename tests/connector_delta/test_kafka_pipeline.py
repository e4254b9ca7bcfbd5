"""A mixed pipeline, end to end: an idempotent librdkafka producer (confluent-kafka) writes
through the Kafka listener while a leader's followers stall and a leader is killed; Spark
reads the topic with ``format("quorumlog")`` into Delta (``DeltaSink``); the table holds
exactly what the producer was told was written: every record once, at the offset its
acknowledgement named, with its key, value and headers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from quorumlog.connector.delta import DeltaSink
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.cluster import leader_fault
from tests.support.kafka import idempotent_producer

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
