"""quorumlog perf spark-read: rows/s of the Spark source (batch read and a streaming
Trigger.AvailableNow query, both into the noop sink) beside the same session's rate for a
trivial in-memory Python data source yielding pre-built Arrow batches of the same shape:
the ceiling of Spark's Python data source path on this machine.

pyspark is imported inside ``main`` only (nothing under ``replica/`` imports it at module
level); this command is the one place the log service's CLI drives Spark.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from typing import Any

from ..client import Client
from ..node.cluster import LocalCluster
from .util import Progress, emit

CEILING_NAME = "quorumlog_perf_ceiling"


def produce(
    cluster: LocalCluster,
    topic: str,
    args: argparse.Namespace,
    partitions: int | None = None,
    compression: str = "none",
) -> int:
    """``args.records`` records of ``args.value_size`` bytes spread over the topic's
    partitions, in batches of ``args.batch_records``, one producing thread per partition;
    ``compression`` the batches' codec (``none``, ``lz4``, ``zstd``)."""
    from ..storage.records import encode_batch

    codec = None if compression == "none" else compression
    payload = encode_batch([b"v" * args.value_size] * args.batch_records, compression=codec)
    partitions = args.partitions if partitions is None else partitions
    per_partition = max(1, args.records // args.batch_records // partitions)
    errors: list[BaseException] = []
    done = [0]
    lock = threading.Lock()

    def worker(partition: int) -> None:
        try:
            with Client(cluster.bootstrap) as c:
                for _ in range(per_partition):
                    c.produce(topic, partition, payload)
                    with lock:
                        done[0] += args.batch_records
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    progress = Progress(per_partition * partitions * args.batch_records, "produce")
    threads = [threading.Thread(target=worker, args=(p,), daemon=True) for p in range(partitions)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        progress.update(done[0])
        time.sleep(0.1)
    progress.close()
    if errors:
        raise errors[0]
    return done[0]


def _ceiling_source(rows_per_partition: int, batch_rows: int, value_size: int) -> Any:
    """A DataSource class (pickled by value) whose read() yields one pre-built batch of
    the connector's Arrow schema over and over."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from ...connector.schema import ARROW_SCHEMA, SPARK_SCHEMA

    class CeilingReader(DataSourceReader):  # type: ignore[misc]
        def __init__(self, partitions: int, batches: int) -> None:
            self.n = partitions
            self.batches = batches

        def partitions(self) -> list[Any]:
            return [InputPartition(i) for i in range(self.n)]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa

            n = batch_rows
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.nulls(n, pa.binary()),
                    pa.array([b"v" * value_size] * n, pa.binary()),
                    pa.repeat(pa.scalar("perf", pa.string()), n),
                    pa.repeat(pa.scalar(int(partition.value), pa.int32()), n),
                    pa.array(range(n), pa.int64()),
                    pa.repeat(pa.scalar(1, pa.int32()), n),
                    pa.repeat(pa.scalar(0, ARROW_SCHEMA.field("timestamp").type), n),
                    pa.nulls(n, ARROW_SCHEMA.field("headers").type),
                ],
                schema=ARROW_SCHEMA,
            )
            for _ in range(self.batches):
                yield batch

    class CeilingSource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return CEILING_NAME

        def schema(self) -> Any:
            return SPARK_SCHEMA

        def reader(self, schema: Any) -> Any:
            default = max(1, rows_per_partition // batch_rows)
            return CeilingReader(
                int(self.options.get("partitions", "1")),
                int(self.options.get("batches", str(default))),
            )

    return CeilingSource


def session(master: str, app: str = "quorumlog-perf-spark-read") -> Any:
    """The perf commands' Spark session: loopback only, and no console progress bar (it
    would share the terminal with the figures and glue itself to the JSON line)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


def _timed(fn: Any) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf spark-read")
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--batch-records", type=int, default=10_000, help="records per produced batch")
    ap.add_argument("--fetch-max-bytes", type=int, default=8 << 20)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument(
        "--min-partitions",
        type=int,
        default=8,
        help="also read a 1-partition topic (a fifth of --records) with this minPartitions",
    )
    ap.add_argument(
        "--compression",
        choices=("none", "lz4", "zstd"),
        default="none",
        help="the topics' compression.type: batches stored (and read) compressed so",
    )
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)

    from ...connector import register

    configs = {} if args.compression == "none" else {"compression.type": args.compression}

    topic = "perf"
    with LocalCluster(args.nodes, args.data_dir, log_level="WARNING") as cluster:
        cluster.client.create_topic(topic, args.partitions, configs=configs)
        cluster.client.wait_for_leaders(topic)
        t0 = time.monotonic()
        records = produce(cluster, topic, args, compression=args.compression)
        produce_s = time.monotonic() - t0
        split_topic = "perf-one"
        split_records = 0
        if args.min_partitions > 1:
            cluster.client.create_topic(split_topic, 1, configs=configs)
            cluster.client.wait_for_leaders(split_topic)
            split_records = produce(
                cluster,
                split_topic,
                argparse.Namespace(**{**vars(args), "records": args.records // 5}),
                1,
            )
        spark = session(args.master)
        try:
            register(spark)  # discovery works too; explicit keeps editable installs working
            spark.dataSource.register(
                _ceiling_source(records // args.partitions, args.batch_records, args.value_size)
            )

            def ceiling() -> None:
                (
                    spark.read.format(CEILING_NAME)
                    .option("partitions", str(args.partitions))
                    .load()
                    .write.format("noop")
                    .mode("overwrite")
                    .save()
                )

            def source(stream: bool, name: str = topic, **options: str) -> Any:
                reader = spark.readStream if stream else spark.read
                reader = (
                    reader.format("quorumlog")
                    .option("bootstrap", cluster.bootstrap)
                    .option("topic", name)
                    .option("startingOffsets", "earliest")
                    .option("fetchMaxBytes", str(args.fetch_max_bytes))
                )
                for key, value in options.items():
                    reader = reader.option(key, value)
                return reader.load()

            def batch() -> None:
                source(False).write.format("noop").mode("overwrite").save()

            def stream() -> None:
                with tempfile.TemporaryDirectory(prefix="quorumlog-perf-") as ck:
                    query = (
                        source(True)
                        .writeStream.format("noop")
                        .option("checkpointLocation", ck)
                        .trigger(availableNow=True)
                        .start()
                    )
                    query.awaitTermination()

            # warm up the JVM and the Python workers on a small read
            spark.read.format(CEILING_NAME).option("batches", "1").load().count()
            ceiling_s = _timed(ceiling)
            batch_s = _timed(batch)
            stream_s = _timed(stream)
            split_tasks, split_s = 0, float("nan")
            if split_records:
                split_df = source(False, split_topic, minPartitions=str(args.min_partitions))
                split_tasks = split_df.rdd.getNumPartitions()
                split_s = _timed(lambda: split_df.write.format("noop").mode("overwrite").save())
        finally:
            spark.stop()

    rate = {
        "ceiling": records / ceiling_s,
        "batch": records / batch_s,
        "stream": records / stream_s,
    }
    figures = {
        "bench": "spark-read",
        "records": records,
        "value_size": args.value_size,
        "partitions": args.partitions,
        "master": args.master,
        "compression": args.compression,
        "produce_records_per_s": round(records / produce_s),
        "ceiling_rows_per_s": round(rate["ceiling"]),
        "batch_rows_per_s": round(rate["batch"]),
        "stream_available_now_rows_per_s": round(rate["stream"]),
        "batch_vs_ceiling": round(rate["batch"] / rate["ceiling"], 3),
        "stream_vs_ceiling": round(rate["stream"] / rate["ceiling"], 3),
        "min_partitions": args.min_partitions,
        "min_partitions_records": split_records,
        "min_partitions_tasks": split_tasks,
        "min_partitions_rows_per_s": round(split_records / split_s) if split_records else 0,
    }
    lines = (
        []
        if args.json
        else [
            f"records            {records:>12,}  ({args.partitions} partitions, {args.value_size} B values)",
            f"ceiling (in-memory Python source) {rate['ceiling']:>12,.0f} rows/s",
            f"batch read -> noop                {rate['batch']:>12,.0f} rows/s  "
            f"({rate['batch'] / rate['ceiling']:.2f} of ceiling)",
            f"stream AvailableNow -> noop       {rate['stream']:>12,.0f} rows/s  "
            f"({rate['stream'] / rate['ceiling']:.2f} of ceiling)",
        ]
        + (
            [
                f"1-partition topic, minPartitions={args.min_partitions}: {split_tasks} tasks, "
                f"{figures['min_partitions_rows_per_s']:,} rows/s ({split_records:,} records)"
            ]
            if split_records
            else []
        )
    )
    emit(figures, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
