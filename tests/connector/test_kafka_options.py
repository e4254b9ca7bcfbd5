"""Spark Kafka-source options carried over, end to end on a real cluster and Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .test_spark_e2e import run_available_now, source, triples

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


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

    out, ck = tmp_path / "out", tmp_path / "ck"
    query = run_available_now(
        source(spark, c, "split", stream=True, startingOffsets="earliest", minPartitions="4"),
        out,
        ck,
    )
    assert query.exception() is None
    assert triples(spark.read.parquet(str(out))) == whole
