"""Incremental batch reads with epoch-aware offsets into Delta.

Each run fixes its end first (``ending_offsets_json``: high watermark + the epoch of the
record before it, per partition), reads ``[start, end)`` with ``spark.read``, appends the
rows to a Delta table with a transaction per run, and keeps ``end`` as the next run's
``startingOffsets``. Because the stored start carries epochs, the next run validates it
with OffsetsForLeaderEpoch: a log truncated in between fails the read with
``LogTruncationException`` instead of silently skipping or re-reading records.

Run: ``.venv/bin/python examples/batch_incremental.py`` (starts and stops its own cluster).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

TOPIC = "orders"


def main() -> int:
    from deltalake import DeltaTable
    from quorumlog.connector import ending_offsets_json
    from quorumlog.connector.delta import DeltaSink
    from quorumlog.connector.local import local_spark_session
    from quorumlog.replica.node.cluster import LocalCluster

    work = Path(tempfile.mkdtemp(prefix="quorumlog-batch-"))
    table_path = str(work / "orders_delta")
    state_file = work / "next_offsets.json"
    spark = local_spark_session("quorumlog-batch-incremental")
    sink = DeltaSink(table_path, app_id="orders-incremental")
    try:
        with LocalCluster(3, work / "cluster", log_level="WARNING") as cluster:
            cluster.create_topic(TOPIC, 2)
            produced = 0
            for run in range(3):
                for p in range(2):
                    cluster.produce(TOPIC, p, [f"run{run}-p{p}-{i}".encode() for i in range(100)])
                    produced += 100
                start = state_file.read_text() if state_file.exists() else "earliest"
                end = ending_offsets_json(cluster.bootstrap, TOPIC)
                df = (
                    spark.read.format("quorumlog")
                    .options(bootstrap=cluster.bootstrap, topic=TOPIC)
                    .options(startingOffsets=start, endingOffsets=end)
                    .load()
                )
                sink(df, run)  # one Delta transaction per run; a re-run of `run` is skipped
                state_file.write_text(end)
                rows = DeltaTable(table_path).to_pyarrow_dataset().count_rows()
                print(
                    f"run {run}: read {start if start == 'earliest' else json.loads(start)} -> {json.loads(end)}"
                )
                print(f"        table holds {rows} rows (produced {produced})")
                if rows != produced:
                    print("MISMATCH: the table does not hold every produced record exactly once")
                    return 1
    finally:
        spark.stop()
    print("incremental batches: every record exactly once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
