"""A streaming query into DeltaSink, run as its own process by the crash test.

    python -m tests.connector_delta.stream_job INPUT CHECKPOINT TABLE KILL_AFTER_BATCH [mid-write]

Reads the parquet files under INPUT one per micro-batch and SIGKILLs its whole process
group (driver and JVM, as a machine crash would) right after the Delta commit of batch
KILL_AFTER_BATCH, before Spark writes that batch's checkpoint commit. With ``mid-write``
every batch goes through the executors and the kill comes in the middle of batch
KILL_AFTER_BATCH's write instead: Spark's writer has filled its staging directory, the
driver has not moved a file into the table.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from quorumlog.connector import delta
from quorumlog.connector.delta import CommitResult, DeltaSink

from tests.connector_delta.helpers import start_stream
from tests.support.spark import build_spark_session


def main(argv: list[str]) -> int:
    input_dir, checkpoint, table, kill_after = argv[0], argv[1], argv[2], int(argv[3])
    mid_write = argv[4:] == ["mid-write"]

    def crash(result: CommitResult) -> None:
        if result.batch_id == kill_after and not mid_write:
            os.killpg(os.getpgrp(), signal.SIGKILL)

    placed = [0]
    place = delta.FileBatch.place

    def crash_before_place(batch: Any) -> None:
        if placed[0] == kill_after:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        placed[0] += 1
        place(batch)

    if mid_write:
        delta.FileBatch.place = crash_before_place  # type: ignore[method-assign]
    spark = build_spark_session(app="delta-sink-crash")
    sink = DeltaSink(table, on_commit=crash, small_rows=0 if mid_write else 4096)
    query = start_stream(spark, input_dir, checkpoint, sink)
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
