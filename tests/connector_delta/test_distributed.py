"""DeltaSink at scale on ``local-cluster[2,1,1024]`` (executors in their own JVMs and
Python workers): a 5M-row micro-batch from a real log goes into Delta through the
executors while the driver's Python RSS stays flat, the table equals the log, and a
truncation repair rewrites files on the executors too. The same Spark application also
reads a small topic through the executors, as a batch and as a stream of 40-offset
micro-batches into Parquet, each record once (one local-cluster start for both)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.spark import REPO, run_spark_script

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

TOPIC = "big"
PARTITIONS = 2
#: The small topic's records per partition.
SMALL, SMALL_RECORDS = "small", 50
RECORDS = 5_000_000
BATCH = 50_000  # records per produced batch
RSS_LIMIT_MB = 300

_SCRIPT = r"""
import json, os, sys, tempfile, threading, time
sys.path.insert(0, {repo!r})
from tests.support.spark import build_spark_session
from quorumlog.connector.delta import DeltaSink
from pyspark.sql import functions as F

BOOT, TOPIC, TABLE, SMALL = {bootstrap!r}, {topic!r}, {table!r}, {small!r}


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Peak:
    # samples this process's RSS every 20 ms while the block runs (bounded by the block)
    def __enter__(self):
        self.base = self.peak = rss_mb()
        self.stop = threading.Event()
        def run():
            while not self.stop.wait(0.02):
                self.peak = max(self.peak, rss_mb())
        self.t = threading.Thread(target=run, daemon=True)
        self.t.start()
        return self
    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(5)
        self.peak = max(self.peak, rss_mb())
        self.growth = self.peak - self.base


def summary(df):
    # per partition: rows, distinct offsets, offset range, an order-free digest of the rows
    digest = F.xxhash64("offset", "leaderEpoch", "key", "value", "timestamp")
    rows = (df.groupBy("partition").agg(F.count("*").alias("n"),
            F.count_distinct("offset").alias("d"), F.min("offset").alias("lo"),
            F.max("offset").alias("hi"), F.bit_xor(digest).alias("x")).collect())
    return sorted(tuple(r) for r in rows)


def table_df(spark):
    from deltalake import DeltaTable
    uris = DeltaTable(TABLE).file_uris()
    return spark.read.option("basePath", TABLE).parquet(*uris)


# a loaded machine can take long to start a Python worker: wait for it rather than fail
spark = build_spark_session("local-cluster[2,1,1024]", app="quorumlog-delta-distributed",
                            **{{"spark.python.authenticate.socketTimeout": "180s"}})
spark.sparkContext.setLogLevel("ERROR")
out = {{}}
try:
    sink = DeltaSink(TABLE, bootstrap=BOOT)
    ck = tempfile.mkdtemp()
    query = (spark.readStream.format("quorumlog").option("bootstrap", BOOT)
             .option("topic", TOPIC).option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
    with Peak() as write:
        query.awaitTermination(900)
    assert query.exception() is None, query.exception()
    out["write_rss_growth_mb"] = write.growth
    out["write_rss_base_mb"] = write.base
    from deltalake import DeltaTable
    dt = DeltaTable(TABLE)
    out["versions"] = dt.version()
    out["files"] = len(dt.file_uris())
    log = spark.read.format("quorumlog").option("bootstrap", BOOT).option("topic", TOPIC).load()
    out["log"] = summary(log)
    out["table"] = summary(table_df(spark))

    # A truncation repair: partition 0 re-delivered from its middle in a new epoch (as
    # after an unclean election); the file holding both sides is rewritten by a task.
    end = out["log"][0][4] + 1  # (partition, n, d, lo, hi, x): hi
    cut = end // 2
    starting = json.dumps({{TOPIC: {{"0": cut, "1": -1}}}})
    redelivered = (spark.read.format("quorumlog").option("bootstrap", BOOT)
                   .option("topic", TOPIC).option("startingOffsets", starting).load()
                   .withColumn("leaderEpoch", F.col("leaderEpoch") + 100)
                   .withColumn("value", F.lit(b"new")))
    repair_sink = DeltaSink(TABLE, app_id="repair")
    with Peak() as repair:
        result = repair_sink.write_batch(redelivered, 0)
    commit = DeltaTable(TABLE).history(limit=1)[0]
    out["repair_metrics"] = commit["operationMetrics"]
    out["repair_rss_growth_mb"] = repair.growth
    out["truncations"] = [t.to_json() for t in result.truncations]
    out["repair_rows"] = result.rows  # the log's records of partition 0 from the cut
    out["cut"] = cut
    t = table_df(spark)
    out["after"] = sorted(tuple(r) for r in t.groupBy("partition").agg(
        F.count("*"), F.count_distinct("offset"),
        F.sum(F.when(F.col("value") == F.lit(b"new"), 1).otherwise(0)),
        F.min(F.when(F.col("value") == F.lit(b"new"), F.col("offset"))),
        F.min(F.when(F.col("leaderEpoch") >= 100, F.col("offset")))).collect())

    # The small topic through the executors: a batch read, and a stream of 40-offset
    # micro-batches into Parquet; (partition, offset) pairs each read once.
    small = spark.read.format("quorumlog").option("bootstrap", BOOT).option("topic", SMALL).load()
    out["small_batch"] = small.select("partition", "offset").distinct().count()
    d = os.path.join(os.path.dirname(TABLE), "small")
    q = (spark.readStream.format("quorumlog").option("bootstrap", BOOT)
         .option("topic", SMALL).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "40").load()
         .writeStream.format("parquet").option("path", d + "/out")
         .option("checkpointLocation", d + "/ck").trigger(availableNow=True).start())
    q.awaitTermination(240)
    streamed = spark.read.parquet(d + "/out").select("partition", "offset")
    out["small_stream"] = [streamed.count(), streamed.distinct().count()]
    print("RESULT " + json.dumps(out), flush=True)
    print("REPAIR " + json.dumps(out["repair_metrics"]), file=sys.stderr, flush=True)
finally:
    spark.stop()
"""


@pytest.fixture(scope="module")
def big_topic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from quorumlog.replica.client import Client
    from quorumlog.replica.node.cluster import LocalCluster
    from quorumlog.replica.storage.records import encode_batch

    with LocalCluster(3, tmp_path_factory.mktemp("big")) as cluster:
        cluster.create_topic(TOPIC, PARTITIONS)
        cluster.create_topic(SMALL, PARTITIONS)
        for p in range(PARTITIONS):
            cluster.produce(SMALL, p, [f"v{i}".encode() for i in range(SMALL_RECORDS)])
        per_partition = RECORDS // PARTITIONS // BATCH
        errors: list[BaseException] = []

        def produce(partition: int) -> None:
            try:
                with Client(cluster.bootstrap) as client:
                    for i in range(per_partition):
                        base = i * BATCH
                        values = [b"v%09d" % (base + j) for j in range(BATCH)]
                        client.produce(TOPIC, partition, encode_batch(values))
            except BaseException as exc:  # re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(PARTITIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads), "produce did not finish in 300 s"
        yield cluster


@pytest.mark.timeout(1300)
def test_five_million_rows_written_by_executors_with_a_flat_driver(
    big_topic: Any, tmp_path: Path
) -> None:
    table = tmp_path / "table"
    script = tmp_path / "job.py"
    script.write_text(
        _SCRIPT.format(
            repo=str(REPO),
            bootstrap=big_topic.bootstrap,
            topic=TOPIC,
            table=str(table),
            small=SMALL,
        )
    )
    out = run_spark_script(script, 1200)

    # The small topic read through the executors: every record once, batch and stream.
    assert out["small_batch"] == PARTITIONS * SMALL_RECORDS, out
    assert out["small_stream"] == [PARTITIONS * SMALL_RECORDS] * 2, out

    # One micro-batch of 5M rows, one commit, files from both executors' tasks.
    assert out["versions"] == 0, out
    assert out["files"] >= PARTITIONS
    assert out["write_rss_growth_mb"] < RSS_LIMIT_MB, out
    # The table equals the log: per partition the same rows, offsets and row digest.
    assert out["table"] == out["log"], out
    # at least: a produce retried on a loaded machine may append its batch twice, and
    # the table must hold what the log holds
    assert sum(n for _, n, *_ in out["log"]) >= RECORDS

    # The repair replaced partition 0 from the cut up, in one commit, via Spark jobs.
    cut = out["cut"]
    assert [(t["partition"], t["divergenceOffset"]) for t in out["truncations"]] == [(0, cut)]
    assert out["repair_rss_growth_mb"] < RSS_LIMIT_MB, out
    # partition 0's old file removed; added: the batch's file(s) and the rewrite of the old
    # file's rows below the cut (the driver writes no data file: FileRewriter on a task)
    p0, p1 = out["after"]
    _, n0, _, lo0, hi0, _ = out["log"][0]
    n1 = out["log"][1][1]
    assert lo0 < cut <= hi0
    # offsets are consecutive but for a leader change's control record (one offset, no
    # row) when an election happened while producing, as a loaded machine can cause
    gaps = hi0 - lo0 + 1 - n0
    assert 0 <= gaps <= 10, out
    assert hi0 - cut + 1 - gaps <= out["repair_rows"] <= hi0 - cut + 1, out
    assert p0 == [0, n0, n0, out["repair_rows"], cut, cut], out
    assert p1 == [1, n1, n1, 0, None, None], out
    metrics = out["repair_metrics"]
    assert metrics["num_removed_files"] >= 1 and metrics["num_added_files"] >= 2, out
    assert metrics["num_added_rows"] == n0, out  # new rows + the kept ones
