"""The quorumlog sink (df.write / df.writeStream format "quorumlog") on a real cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.spark import source
from tests.support.waits import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

ROWS = 1_000_000


def digest(df: Any) -> tuple[int, int, int]:
    """Rows, distinct keys and an order-free digest of (key, value, headers)."""
    from pyspark.sql import functions as F

    row = df.agg(
        F.count("*"),
        F.count_distinct("key"),
        F.bit_xor(F.xxhash64("key", "value", "headers")),
    ).collect()[0]
    return (int(row[0]), int(row[1]), int(row[2]))


def test_batch_round_trip_of_a_million_rows(spark: Any, cluster: Any) -> None:
    from pyspark.sql import functions as F

    c = cluster
    c.create_topic("sunk", 2)
    df = spark.range(ROWS).select(
        F.col("id").cast("string").cast("binary").alias("key"),
        F.concat(F.lit("value-"), F.col("id").cast("string")).alias("value"),  # a string
        F.array(
            F.struct(
                F.lit("n").alias("key"), F.col("id").cast("string").cast("binary").alias("value")
            )
        ).alias("headers"),
    )
    df.write.format("quorumlog").option("bootstrap", c.bootstrap).option("topic", "sunk").mode(
        "append"
    ).save()
    back = source(spark, c, "sunk", includeHeaders="true").select("key", "value", "headers")
    expected = df.select("key", F.col("value").cast("binary").alias("value"), "headers")
    assert digest(back) == digest(expected)
    assert digest(back)[0] == ROWS
    # rows went by key hash to both partitions
    parts = {r[0] for r in source(spark, c, "sunk").select("partition").distinct().collect()}
    assert parts == {0, 1}


def test_stream_sink_and_errors(spark: Any, cluster: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F
    from quorumlog.connector import QuorumLogOptionError

    c = cluster
    c.create_topic("in", 1)
    c.create_topic("out", 1)
    c.produce("in", 0, [f"v{i}".encode() for i in range(50)], [f"k{i}".encode() for i in range(50)])
    query = (
        source(spark, c, "in", stream=True, startingOffsets="earliest", includeHeaders="true")
        .select("key", "value", "headers", F.lit("out").alias("topic"))
        .writeStream.format("quorumlog")
        .option("bootstrap", c.bootstrap)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    got = sorted((bytes(r.key), bytes(r.value)) for r in source(spark, c, "out").collect())
    assert got == sorted((f"k{i}".encode(), f"v{i}".encode()) for i in range(50))
    # Spark's progress counts the rows the sink wrote, per micro-batch
    assert sum(p["sink"]["numOutputRows"] for p in query.recentProgress) == 50

    small = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="does not exist|Unknown|unknown"):
        small.write.format("quorumlog").option("bootstrap", c.bootstrap).option(
            "topic", "no-such-topic"
        ).mode("append").save()
    with pytest.raises(Exception, match="Column 'offset' is not written"):
        spark.createDataFrame([(b"v", 1)], "value binary, offset long").write.format(
            "quorumlog"
        ).option("bootstrap", c.bootstrap).option("topic", "out").mode("append").save()
    with pytest.raises(Exception, match="needs option 'topic' or a 'topic' column"):
        small.write.format("quorumlog").option("bootstrap", c.bootstrap).mode("append").save()
    assert QuorumLogOptionError  # the sink's checks raise it (shown through Spark's error)


def test_a_key_lands_where_the_producer_puts_it(spark: Any, cluster: Any) -> None:
    from quorumlog.replica.client import Client
    from quorumlog.replica.client.producer import Producer

    c = cluster
    c.create_topic("keyed-by-sink", 5)
    c.create_topic("keyed-by-producer", 5)
    keys = [b"", *(b"key-%d" % i for i in range(300)), "ключ".encode()]
    spark.createDataFrame([(k, b"v") for k in keys], "key binary, value binary").write.format(
        "quorumlog"
    ).option("bootstrap", c.bootstrap).option("topic", "keyed-by-sink").mode("append").save()
    client = Client(c.bootstrap)
    try:
        with Producer(client) as producer:
            futures = [producer.send("keyed-by-producer", b"v", key=k) for k in keys]
            producer.flush(60)
    finally:
        client.close()
    expected = {k: f.result(0).partition for k, f in zip(keys, futures, strict=True)}

    def every_row() -> list[Any] | None:
        # save() returns once the commit is durable; the markers land moments later.
        got = source(spark, c, "keyed-by-sink").select("key", "partition").collect()
        return got if len(got) >= len(keys) else None

    rows = wait_until(every_row, 60, "every row the sink committed", interval=0.5)
    assert {bytes(r.key): r.partition for r in rows} == expected
    assert len(rows) == len(keys) and len(set(expected.values())) == 5
