"""Spark Kafka-source options carried over, end to end on a real cluster and Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.spark import run_available_now, source, triples

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


def read_available_now(spark: Any, df: Any, tmp_path: Path) -> Any:
    """Run the streaming ``df`` once with Trigger.AvailableNow into Parquet; what it wrote."""
    out = tmp_path / "out"
    query = run_available_now(df, out, tmp_path / "ck")
    assert query.exception() is None
    return spark.read.parquet(str(out))


def test_min_partitions_and_max_records_split_the_read(
    spark: Any, cluster: Any, tmp_path: Path
) -> None:
    c = cluster
    c.create_topic("split", 1)
    c.produce("split", 0, [f"v{i}".encode() for i in range(400)])
    whole = triples(source(spark, c, "split", startingOffsets="earliest"))
    assert len(whole) == 400

    df = source(spark, c, "split", minPartitions="8")
    assert df.rdd.getNumPartitions() == 8
    assert triples(df) == whole
    capped = source(spark, c, "split", maxRecordsPerPartition="150")
    assert capped.rdd.getNumPartitions() == 3
    assert triples(capped) == whole

    streamed = source(spark, c, "split", stream=True, startingOffsets="earliest", minPartitions="4")
    assert triples(read_available_now(spark, streamed, tmp_path)) == whole


def test_timestamps_and_headers(spark: Any, cluster: Any, tmp_path: Path) -> None:
    from quorumlog.replica.storage.records import encode_batch

    c = cluster
    c.create_topic("ts", 2)
    for p in range(2):
        c.client.produce(
            "ts",
            p,
            encode_batch(
                [f"p{p}-{i}".encode() for i in range(10)],
                timestamps=[1000 * (i + 1) + p for i in range(10)],
                headers=[[("h", str(i).encode())] for i in range(10)],
            ),
        )

    def rows(df: Any) -> list[tuple[int, int, int, bytes, Any]]:
        return sorted(
            (
                r["partition"],
                r["offset"],
                int(r["timestamp"].timestamp() * 1000),
                bytes(r["value"]),
                None
                if r["headers"] is None
                else [(h["key"], bytes(h["value"])) for h in r["headers"]],
            )
            for r in df.collect()
        )

    everything = rows(source(spark, c, "ts", includeHeaders="true"))
    assert len(everything) == 20
    assert everything[0][4] == [("h", b"0")]
    # Spark's default: no headers asked for, NULL
    assert all(r[4] is None for r in rows(source(spark, c, "ts")))

    window = rows(
        source(
            spark, c, "ts", includeHeaders="true", startingTimestamp="5000", endingTimestamp="8000"
        )
    )
    assert window == [r for r in everything if 5000 <= r[2] < 8000]
    assert len(window) == 6

    by_partition = rows(
        source(
            spark,
            c,
            "ts",
            includeHeaders="true",
            startingOffsetsByTimestamp='{"ts": {"0": 9000}}',
            endingOffsetsByTimestamp='{"ts": {"1": 3000}}',
        )
    )
    # p0 from its first record at >= 9000 to latest; p1 from earliest to before 3000
    assert by_partition == [
        r for r in everything if (r[0] == 0 and r[2] >= 9000) or (r[0] == 1 and r[2] < 3000)
    ]
    # a timestamp past every record resolves to the end: nothing to read
    assert rows(source(spark, c, "ts", startingTimestamp="99999")) == []

    streamed = source(spark, c, "ts", stream=True, startingTimestamp="7000", includeHeaders="true")
    assert rows(read_available_now(spark, streamed, tmp_path)) == [
        r for r in everything if r[2] >= 7000
    ]
