"""quorumlog perf delta: rows/s from the log into Delta through ``DeltaSink``'s distributed
writer (executors write the Parquet files, the driver commits) beside a plain
``df.write.parquet`` of the same DataFrame in the same Spark session: the ratio says what
the Delta bookkeeping (the sort by offset, the file descriptions, the commit) costs over
Spark's own writer, which writes the Delta files too.

The writes run in rounds of parquet, Delta, Delta, parquet (ABBA), each into a fresh
directory, so neither kind gains from going first or second (JIT warm-up, page cache, a
machine whose load drifts); each rate is all rows written over all that kind's seconds.

Both writes read the log through the quorumlog source, so both ratios' numerators and
denominators include the same read. pyspark and deltalake are imported inside ``main``
only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from ..node.cluster import LocalCluster
from .spark import produce, session
from .util import emit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf delta")
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--batch-records", type=int, default=10_000, help="records per produced batch")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument(
        "--rounds", type=int, default=1, help="rounds of parquet, delta, delta, parquet writes"
    )
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {args.rounds}")

    from ...connector import register
    from ...connector.delta import DeltaSink

    topic = "perf"
    with (
        LocalCluster(args.nodes, args.data_dir, log_level="WARNING") as cluster,
        tempfile.TemporaryDirectory(prefix="quorumlog-perf-delta-") as out,
    ):
        cluster.create_topic(topic, args.partitions)
        records = produce(cluster, topic, args)
        from pyspark.sql import SparkSession

        # a session already running in this process (a test's) is used and left running
        own = SparkSession.getActiveSession() is None
        spark = session(args.master, app="quorumlog-perf-delta")
        master = spark.sparkContext.master
        try:
            register(spark)
            df = (
                spark.read.format("quorumlog")
                .option("bootstrap", cluster.bootstrap)
                .option("topic", topic)
                .load()
            )
            # warm up the JVM and the Python workers of both paths on a small read
            small = df.limit(50_000)
            small.write.mode("overwrite").parquet(os.path.join(out, "warm-parquet"))
            DeltaSink(os.path.join(out, "warm-delta"), app_id="warm").write_batch(small, 0)

            seconds: dict[str, list[float]] = {"parquet": [], "delta": []}
            for i, kind in enumerate(["parquet", "delta", "delta", "parquet"] * args.rounds):
                target = os.path.join(out, f"{kind}-{i}")
                t0 = time.monotonic()
                if kind == "parquet":
                    df.write.mode("overwrite").parquet(target)
                else:
                    result = DeltaSink(target, app_id="perf").write_batch(df, 0)
                    if result is None or result.rows != records:
                        raise SystemExit(f"the Delta write committed {result}, expected {records}")
                seconds[kind].append(time.monotonic() - t0)
                shutil.rmtree(target)  # the disk holds one copy at a time
        finally:
            if own:
                spark.stop()

    delta_rate, parquet_rate = (
        records * len(seconds[kind]) / sum(seconds[kind]) for kind in ("delta", "parquet")
    )
    figures = {
        "bench": "delta",
        "records": records,
        "value_size": args.value_size,
        "partitions": args.partitions,
        "master": master,
        "delta_rows_per_s": round(delta_rate),
        "parquet_rows_per_s": round(parquet_rate),
        "delta_vs_parquet": round(delta_rate / parquet_rate, 3),
        "delta_s": [round(x, 2) for x in seconds["delta"]],
        "parquet_s": [round(x, 2) for x in seconds["parquet"]],
    }
    lines = (
        []
        if args.json
        else [
            f"records            {records:>12,}  ({args.partitions} partitions, "
            f"{args.value_size} B values, {master})",
            f"log -> df.write.parquet           {parquet_rate:>12,.0f} rows/s  "
            f"(writes of {', '.join(f'{x:.1f}' for x in seconds['parquet'])} s)",
            f"log -> DeltaSink (executors)      {delta_rate:>12,.0f} rows/s  "
            f"({delta_rate / parquet_rate:.2f} of parquet; writes of "
            f"{', '.join(f'{x:.1f}' for x in seconds['delta'])} s)",
        ]
    )
    emit(figures, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
