"""quorumlog perf latency: produce-to-Delta latency as a streaming user sees it.

A producer sends one record (``--value-size`` bytes) every ``1 / --rate`` seconds to a
topic on a local cluster (partitions in turn); a streaming query reads the topic with
``format("quorumlog")`` into ``DeltaSink``. A record's latency is the wall-clock time its
micro-batch's Delta commit returned (``DeltaSink``'s ``on_commit``, run on the driver
right after the commit) minus the time its producer sent it. The query starts, commits
one warm-up record, and only then does the measured ``--duration`` begin, so the figures
are the steady state and not Spark's start-up.

pyspark and deltalake are imported inside ``main`` only.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from typing import Any

from ..client import Client
from ..node.cluster import LocalCluster
from ..storage.records import encode_batch
from .spark import session
from .util import Progress, emit, percentile

#: Spark's checkpoint writer for a file system through Hadoop's FileSystem API. The default
#: one (FileContext) starts a ``chmod`` or ``readlink`` process for every file it writes
#: or renames when Hadoop's native library is missing (a pip-installed pyspark): eight
#: processes per offset-log and commit-log entry, two entries per micro-batch. A rename
#: on a local or POSIX file system is atomic either way. docs/delta-sink.md gives it as
#: part of the low-latency recipe.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
CHECKPOINT_FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"

#: How long, after the producer's last record, the query may take to commit it.
DRAIN_TIMEOUT_S = 60.0
#: How often the query's recent progress (its last 100 micro-batches) is read: rarely, so
#: reading it costs the measured query little, and often enough that none scrolls off.
PROGRESS_POLL_S = 5.0


class Produced:
    """Send times (wall clock, seconds) of the produced records by (partition, offset), and
    each Delta commit's time with the end offsets it committed; filled by the producer
    thread and by the sink's ``on_commit`` on the driver."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.sent: dict[tuple[int, int], float] = {}
        self.ends: dict[int, int] = {}  # partition -> end offset committed so far
        self.commits: list[tuple[float, dict[int, int]]] = []  # (time, ends after it)

    def on_commit(self, result: Any) -> None:
        now = time.time()
        ends = _batch_ends(result)
        with self.lock:
            for partition, end in ends.items():
                self.ends[partition] = max(end, self.ends.get(partition, 0))
            self.commits.append((now, dict(self.ends)))
            self.changed.notify_all()

    def committed(self, key: tuple[int, int]) -> bool:
        return self.ends.get(key[0], 0) > key[1]

    def wait_committed(self, keys: list[tuple[int, int]], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while not all(self.committed(k) for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def latencies_ms(self) -> list[float]:
        """Per sent record: the first commit whose end offset passed it, minus its send."""
        out = []
        for (partition, offset), sent in self.sent.items():
            done = next(t for t, ends in self.commits if ends.get(partition, 0) > offset)
            out.append((done - sent) * 1000)
        return out


class BatchDurations:
    """Spark's ``durationMs`` of each measured micro-batch that read rows (by batch id,
    from ``query.recentProgress``, polled often enough that none scrolls off): where a
    micro-batch's time goes."""

    def __init__(self, after_batch_id: int) -> None:
        self.after = after_batch_id
        self.by_batch: dict[int, dict[str, int]] = {}

    def add(self, progress: list[dict[str, Any]]) -> None:
        for p in progress:
            batch_id = int(p["batchId"])
            if batch_id > self.after and p.get("numInputRows", 0) > 0:
                self.by_batch[batch_id] = dict(p.get("durationMs", {}))

    def medians_ms(self) -> dict[str, float]:
        """Median per phase (Spark's names: latestOffset, getBatch, queryPlanning,
        addBatch, walCommit, commitOffsets, triggerExecution)."""
        phases = sorted({k for d in self.by_batch.values() for k in d})
        return {
            k: percentile([float(d.get(k, 0)) for d in self.by_batch.values()], 50) for k in phases
        }


def _batch_ends(result: Any) -> dict[int, int]:
    """End offset per partition of a committed micro-batch (``CommitResult.ranges``; a sink
    without them: the commit's own metadata, read back)."""
    ranges = getattr(result, "ranges", None)
    if ranges is not None:
        return {int(r.partition): int(r.max_offset) + 1 for r in ranges}
    from ...connector.delta import read_committed_positions

    positions = read_committed_positions(result.path)
    return {p: pos.offset for by_p in positions.values() for p, pos in by_p.items()}


def produce_paced(
    bootstrap: str,
    topic: str,
    partitions: int,
    rate: float,
    duration_s: float,
    value_size: int,
    produced: Produced,
    stop: threading.Event,
) -> None:
    """One record every ``1 / rate`` s for ``duration_s`` (a late send goes at once, the
    schedule does not drift), partitions in turn; each record's send time is kept."""
    interval = 1.0 / rate
    count = max(1, int(duration_s * rate))
    value = b"v" * value_size
    with Client(bootstrap) as client:
        start = time.monotonic()
        for i in range(count):
            delay = start + i * interval - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            partition = i % partitions
            sent = time.time()
            payload = encode_batch([value], timestamps=[int(sent * 1000)])
            ack = client.produce(topic, partition, payload)
            with produced.lock:
                produced.sent[(partition, ack.base_offset)] = sent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf latency")
    ap.add_argument("--rate", type=float, default=50.0, help="records per second (default 50)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of producing")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument(
        "--trigger",
        default=None,
        help="processing-time trigger interval (e.g. '500 milliseconds'); default: Spark's "
        "default trigger (the next micro-batch as soon as the last one ends)",
    )
    ap.add_argument(
        "--default-checkpoint-manager",
        action="store_true",
        help=f"keep Spark's default checkpoint writer (else {CHECKPOINT_FILE_MANAGER_CONF} is "
        "set to the FileSystem-based one for the run, as the low-latency recipe does)",
    )
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.partitions < 1:
        ap.error("--rate and --duration must be positive and --partitions at least 1")

    from ...connector import register
    from ...connector.delta import DeltaSink

    topic = "latency"
    produced = Produced()
    batches = BatchDurations(-1)
    with (
        LocalCluster(args.nodes, args.data_dir, log_level="WARNING") as cluster,
        tempfile.TemporaryDirectory(prefix="quorumlog-perf-latency-") as out,
    ):
        cluster.create_topic(topic, args.partitions)
        from pyspark.sql import SparkSession

        # a session already running in this process (a test's) is used and left running
        own = SparkSession.getActiveSession() is None
        spark = session(args.master, app="quorumlog-perf-latency")
        query = None
        previous_manager = spark.conf.get(CHECKPOINT_FILE_MANAGER_CONF, None)
        try:
            if not args.default_checkpoint_manager:
                spark.conf.set(CHECKPOINT_FILE_MANAGER_CONF, CHECKPOINT_FILE_MANAGER)
            register(spark)
            sink = DeltaSink(f"{out}/table", on_commit=produced.on_commit)
            writer = (
                spark.readStream.format("quorumlog")
                .option("bootstrap", cluster.bootstrap)
                .option("topic", topic)
                .option("startingOffsets", "earliest")
                .load()
                .writeStream.foreachBatch(sink)
                .option("checkpointLocation", f"{out}/checkpoint")
            )
            if args.trigger:
                writer = writer.trigger(processingTime=args.trigger)
            query = writer.start()
            # warm-up: one record per partition, committed before the measured run
            with Client(cluster.bootstrap) as client:
                warm = [
                    (p, client.produce(topic, p, encode_batch([b"warm-up"])).base_offset)
                    for p in range(args.partitions)
                ]
            if not produced.wait_committed(warm, 300):
                raise SystemExit(f"the query did not commit the warm-up records: {query.status}")

            stop = threading.Event()
            errors: list[BaseException] = []

            def producer() -> None:
                try:
                    produce_paced(
                        cluster.bootstrap,
                        topic,
                        args.partitions,
                        args.rate,
                        args.duration,
                        args.value_size,
                        produced,
                        stop,
                    )
                except BaseException as exc:  # reported after the run
                    errors.append(exc)

            thread = threading.Thread(target=producer, daemon=True)
            thread.start()
            progress = Progress(args.duration, "latency", heartbeat_s=10)
            begin = time.monotonic()
            batches.after = query.lastProgress["batchId"] if query.lastProgress else -1
            polled = time.monotonic()
            while thread.is_alive():
                if query.exception() is not None:
                    stop.set()
                    break
                progress.update(time.monotonic() - begin, f"{len(produced.commits)} commits")
                if time.monotonic() - polled >= PROGRESS_POLL_S:
                    polled = time.monotonic()
                    batches.add(query.recentProgress)
                thread.join(0.2)
            progress.close()
            stop.set()
            thread.join()
            if errors:
                raise errors[0]
            if query.exception() is not None:
                raise SystemExit(f"the streaming query failed: {query.exception()}")
            with produced.lock:
                keys = list(produced.sent)
            if not produced.wait_committed(keys, DRAIN_TIMEOUT_S):
                raise SystemExit(
                    f"records not committed {DRAIN_TIMEOUT_S:.0f} s after the last send: "
                    f"{query.status}"
                )
            batches.add(query.recentProgress)
        finally:
            if query is not None:
                query.stop()
            if previous_manager is None:
                spark.conf.unset(CHECKPOINT_FILE_MANAGER_CONF)
            else:
                spark.conf.set(CHECKPOINT_FILE_MANAGER_CONF, previous_manager)
            if own:
                spark.stop()

    latencies_ms = produced.latencies_ms()
    figures = {
        "bench": "latency",
        "records": len(latencies_ms),
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "partitions": args.partitions,
        "trigger": args.trigger or "default",
        "master": args.master,
        "checkpoint_manager": "default" if args.default_checkpoint_manager else "filesystem",
        "p50_ms": round(percentile(latencies_ms, 50), 1),
        "p90_ms": round(percentile(latencies_ms, 90), 1),
        "p99_ms": round(percentile(latencies_ms, 99), 1),
        "max_ms": round(max(latencies_ms), 1),
        "batches": len(batches.by_batch),
        "batch_median_ms": {k: round(v, 1) for k, v in batches.medians_ms().items()},
    }
    lines = (
        []
        if args.json
        else [
            f"records {len(latencies_ms):,} ({args.rate:g}/s for {args.duration:g} s, "
            f"{args.partitions} partition(s), trigger {figures['trigger']})",
            f"produce -> Delta commit  p50 {figures['p50_ms']} ms  p90 {figures['p90_ms']} ms  "
            f"p99 {figures['p99_ms']} ms  max {figures['max_ms']} ms",
            f"micro-batches with rows {figures['batches']}; median ms per phase (Spark's "
            "durationMs): " + "  ".join(f"{k} {v}" for k, v in figures["batch_median_ms"].items()),
        ]
    )
    emit(figures, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
