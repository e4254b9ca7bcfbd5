"""A Spark driver for tests/connector/test_sink_exactly_once.py, run as its own process
(``python -m tests.connector.sink_driver ...``) so a test can kill it with SIGKILL and
start it again from its checkpoints.

It streams the input topic into one output topic per ``--sink DELIVERY=TOPIC`` through
the quorumlog sink, one query each (its checkpoint ``<checkpoints>/<DELIVERY>``), in
micro-batches of at most ``--max-per-trigger`` records (a query's own number with
``--max-per-trigger-of DELIVERY=N``; trigger availableNow), with executors in their own
JVMs (local-cluster mode). Between source and sink a
``mapInArrow`` step fails the first attempt of every task after it has passed
``--fail-after`` Arrow batches on and the output's high watermarks grew, so each
micro-batch's sink tasks have written some rows when they fail and Spark retries them (``spark.task.maxFailures``). A query that fails
because a Python worker Spark started did not connect back in time (a busy machine) starts
again from its checkpoint. When every query has ended the driver prints one
``RESULT <json>`` line and exits 0, or 1 if a query failed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from tests.support.spark import build_spark_session

#: What Spark says when a Python worker it started did not connect back in time.
WORKER_TIMEOUT = "Python worker failed to connect back"
#: How long a failing first attempt waits for rows it passed on to reach the log.
REACH_BOUND_S = 20.0


class InjectedTaskFailure(RuntimeError):
    """The failure a task's first attempt raises on purpose."""


def failing_first_attempts(fail_after: int, bootstrap: str, output: str) -> Any:
    """A ``mapInArrow`` function passing batches through; a task's first attempt, after
    ``fail_after`` batches, waits until rows reached ``output`` (its high watermarks grew
    since the task began, within ``REACH_BOUND_S``), then raises."""

    def step(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext
        from quorumlog.replica.client import Client

        ctx = TaskContext.get()
        if ctx is None or ctx.attemptNumber() > 0:
            yield from batches
            return
        with Client(bootstrap) as client:
            count = len(client.metadata([output])[output].partitions)

            def written() -> int:
                return sum(client.list_offsets(output, p, "latest").offset for p in range(count))

            began = written()
            for i, batch in enumerate(batches):
                if i == fail_after:
                    # The batches passed on reach the sink's task (and the log) only once
                    # the worker's output buffer fills and Spark hands them over.
                    deadline = time.monotonic() + REACH_BOUND_S
                    while written() == began and time.monotonic() < deadline:
                        time.sleep(0.02)
                    raise InjectedTaskFailure(
                        f"injected failure of task {ctx.partitionId()} attempt 0 after "
                        f"{fail_after} batches ({written() - began} offsets written meanwhile)"
                    )
                yield batch

    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sink_driver")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--sink", action="append", required=True, help="DELIVERY=TOPIC")
    ap.add_argument("--checkpoints", required=True)
    ap.add_argument("--max-per-trigger", type=int, default=2000)
    ap.add_argument(
        "--max-per-trigger-of",
        action="append",
        default=[],
        help="DELIVERY=N: that query's own micro-batch size (others: --max-per-trigger)",
    )
    ap.add_argument("--fail-after", type=int, default=5, help="Arrow batches before failing")
    ap.add_argument("--arrow-batch", type=int, default=100, help="rows per Arrow batch")
    ap.add_argument("--transaction-timeout-ms", type=int, default=60_000)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    args = ap.parse_args(argv)

    spark = build_spark_session(
        args.master,
        app="quorumlog-sink-driver",
        **{
            "spark.task.maxFailures": "4",
            "spark.sql.execution.arrow.maxRecordsPerBatch": str(args.arrow_batch),
            "spark.ui.showConsoleProgress": "false",
        },
    )
    from quorumlog.connector import register

    register(spark)
    per_trigger = {
        delivery: int(n) for delivery, n in (x.split("=", 1) for x in args.max_per_trigger_of)
    }

    def start(delivery: str, topic: str) -> Any:
        source = (
            spark.readStream.format("quorumlog")
            .option("bootstrap", args.bootstrap)
            .option("topic", args.input)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(per_trigger.get(delivery, args.max_per_trigger)))
            .load()
            .select("key", "value")
        )
        step = failing_first_attempts(args.fail_after, args.bootstrap, topic)
        return (
            source.mapInArrow(step, source.schema)
            .writeStream.format("quorumlog")
            .option("bootstrap", args.bootstrap)
            .option("topic", topic)
            .option("delivery", delivery)
            .option("transactionTimeoutMs", str(args.transaction_timeout_ms))
            .option("checkpointLocation", f"{args.checkpoints}/{delivery}")
            .trigger(availableNow=True)
            .start()
        )

    # One query at a time, in the order given: two streaming queries of one session
    # submitting tasks at once can corrupt a task's serialized properties in Spark
    # (java.io.OptionalDataException on the executor, every attempt).
    sinks = dict(sink.split("=", 1) for sink in args.sink)
    result: dict[str, Any] = {}
    for delivery, topic in sinks.items():
        restarts = 0
        query = start(delivery, topic)
        while True:
            while query.isActive:
                time.sleep(0.2)
            error = query.exception()
            if error is not None and WORKER_TIMEOUT in str(error) and restarts < 5:
                # Spark gives a Python worker it starts 10 s to connect back; a busy machine
                # may take longer. The query restarts from its checkpoint, as after a crash.
                restarts += 1
                print(f"RESTART {delivery}: {WORKER_TIMEOUT}", flush=True)
                query = start(delivery, topic)
                continue
            break
        result[delivery] = {
            "error": None if error is None else str(error)[:2000],
            "batches": [p["batchId"] for p in query.recentProgress],
            "restarts": restarts,
        }
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()
    return 0 if all(r["error"] is None for r in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
