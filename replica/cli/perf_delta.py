"""quorumlog perf delta: rows/s from the log into Delta through ``DeltaSink``'s distributed
writer (executors write the Parquet files, the driver commits) beside a plain
``df.write.parquet`` of the same DataFrame in the same Spark session: the ratio says what
the Delta bookkeeping (file descriptions, the commit) costs over Spark's own writer.

Both writes read the log through the quorumlog source, so both ratios' numerators and
denominators include the same read. pyspark and deltalake are imported inside ``main``
only.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from ..node.cluster import LocalCluster
from .perf_spark import produce, session
from .perfutil import emit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf delta")
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--batch-records", type=int, default=10_000, help="records per produced batch")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)

    from ...connector import register
    from ...connector.delta import DeltaSink

    topic = "perf"
    with (
        LocalCluster(args.nodes, args.data_dir, log_level="WARNING") as cluster,
        tempfile.TemporaryDirectory(prefix="quorumlog-perf-delta-") as out,
    ):
        cluster.create_topic(topic, args.partitions)
        records = produce(cluster, topic, args)
        spark = session(args.master, app="quorumlog-perf-delta")
        try:
            register(spark)
            df = (
                spark.read.format("quorumlog")
                .option("bootstrap", cluster.bootstrap)
                .option("topic", topic)
                .load()
            )
            # warm up the JVM and the Python workers of both paths on a small read
            small = df.limit(1000)
            small.write.mode("overwrite").parquet(os.path.join(out, "warm-parquet"))
            DeltaSink(os.path.join(out, "warm-delta"), app_id="warm").write_batch(small, 0)

            t0 = time.monotonic()
            df.write.mode("overwrite").parquet(os.path.join(out, "parquet"))
            parquet_s = time.monotonic() - t0
            t0 = time.monotonic()
            result = DeltaSink(os.path.join(out, "delta"), app_id="perf").write_batch(df, 0)
            delta_s = time.monotonic() - t0
        finally:
            spark.stop()
    if result is None or result.rows != records:
        raise SystemExit(f"the Delta write committed {result} rows, expected {records}")

    delta_rate, parquet_rate = records / delta_s, records / parquet_s
    figures = {
        "bench": "delta",
        "records": records,
        "value_size": args.value_size,
        "partitions": args.partitions,
        "master": args.master,
        "delta_rows_per_s": round(delta_rate),
        "parquet_rows_per_s": round(parquet_rate),
        "delta_vs_parquet": round(delta_rate / parquet_rate, 3),
    }
    lines = (
        []
        if args.json
        else [
            f"records            {records:>12,}  ({args.partitions} partitions, "
            f"{args.value_size} B values, {args.master})",
            f"log -> df.write.parquet           {parquet_rate:>12,.0f} rows/s",
            f"log -> DeltaSink (executors)      {delta_rate:>12,.0f} rows/s  "
            f"({delta_rate / parquet_rate:.2f} of parquet)",
        ]
    )
    emit(figures, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
