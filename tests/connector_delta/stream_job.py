"""A streaming query into DeltaSink, run as its own process by the crash test.

    python -m tests.connector_delta.stream_job INPUT CHECKPOINT TABLE KILL_AFTER_BATCH

Reads the parquet files under INPUT one per micro-batch and SIGKILLs its whole process
group (driver and JVM, as a machine crash would) right after the Delta commit of batch
KILL_AFTER_BATCH, before Spark writes that batch's checkpoint commit.
"""

from __future__ import annotations

import os
import signal
import sys

from quorumlog.connector.delta import CommitResult, DeltaSink

from tests.connector_delta.helpers import start_stream
from tests.support.spark import build_spark_session


def main(argv: list[str]) -> int:
    input_dir, checkpoint, table, kill_after = argv[0], argv[1], argv[2], int(argv[3])

    def crash(result: CommitResult) -> None:
        if result.batch_id == kill_after:
            os.killpg(os.getpgrp(), signal.SIGKILL)

    spark = build_spark_session(app="delta-sink-crash")
    query = start_stream(spark, input_dir, checkpoint, DeltaSink(table, on_commit=crash))
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
