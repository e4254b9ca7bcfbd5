"""quorumlog perf sink: the Spark sink (``format("quorumlog")``) exactly once against at
least once, on an embedded cluster (3 replicas with fsync).

Throughput: batch writes (``df.write``) of the same ``--records`` generated rows (a key,
a ``--value-size`` value) into a fresh topic of ``--partitions`` partitions each, in
rounds of at-least-once, exactly-once, exactly-once, at-least-once (ABBA), so neither
gains from going first or second; each rate is all rows over all that delivery's
seconds (from the write's start until a read_committed reader may see every row), and
``exactly_once_vs_at_least_once`` their ratio. An exactly-once write is one
transaction group: every task writes in a transaction left open, the driver commits
them at once; an at-least-once task produces idempotently and is done.

Latency: a stream of small micro-batches (trigger every ``--trigger-ms``) from an input
topic a producer fills at ``--stream-rate`` rows a second, stamped with the wall clock,
into the exactly-once sink, then the same into the at-least-once sink. A poller per
output partition reads it both ways: read_uncommitted (when a row is written, by its
task) and read_committed (when a reader may see it). ``written_to_visible`` is, for each
group of rows that becomes visible at once (a batch's rows of a partition), the time
from the last of them written to their visibility: the driver's commit of the batch
after its last task, as a read_committed reader waits for it. ``end_to_end`` is a row's
wall-clock stamp at the input to a read_committed reader seeing it in the output.

pyspark is imported inside ``main`` only."""

from __future__ import annotations

import argparse
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..client import Client
from ..node.cluster import LocalCluster
from ..storage.records import encode_batch
from .spark import session
from .util import Progress, emit, percentile

DELIVERIES = ("at-least-once", "exactly-once")
#: A stamped row's value: its wall-clock send time, then padding.
STAMP = struct.Struct(">d")
#: How often a poller reads its partition (each way).
POLL_S = 0.005
#: How long a stream may take to show its first rows (Spark starting its Python workers).
WARMUP_TIMEOUT_S = 120.0
#: How long a batch write's rows may take to become visible after ``save()`` returned.
VISIBLE_TIMEOUT_S = 60.0
#: How long, after the producer's last row, the stream may take to make it visible.
DRAIN_TIMEOUT_S = 60.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf sink")
    ap.add_argument("--records", type=int, default=1_000_000, help="rows of each batch write")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of ABBA batch writes")
    ap.add_argument("--stream-seconds", type=float, default=15.0, help="each stream's run")
    ap.add_argument("--stream-rate", type=float, default=500.0, help="rows a second in")
    ap.add_argument("--trigger-ms", type=int, default=200, help="a micro-batch every this")
    ap.add_argument(
        "--warmup-seconds",
        type=float,
        default=3.0,
        help="each stream's warm-up: rows flow until its output shows some and this long "
        "has passed, before the measure starts",
    )
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)
    if args.records < 1 or args.rounds < 1 or args.partitions < 1:
        ap.error("--records, --rounds and --partitions must be at least 1")
    if args.stream_seconds <= 0 or args.stream_rate <= 0 or args.trigger_ms <= 0:
        ap.error("--stream-seconds, --stream-rate and --trigger-ms must be positive")

    from ...connector import register

    with (
        LocalCluster(args.nodes, args.data_dir, log_level="WARNING") as cluster,
        tempfile.TemporaryDirectory(prefix="quorumlog-perf-sink-") as tmp,
    ):
        from pyspark.sql import SparkSession

        # a session already running in this process (a test's) is used and left running
        own = SparkSession.getActiveSession() is None
        spark = session(args.master, app="quorumlog-perf-sink")
        try:
            register(spark)
            seconds = _batch_writes(spark, cluster, args)
            streams = {
                delivery: _stream(spark, cluster, args, delivery, f"{tmp}/{delivery}")
                for delivery in DELIVERIES
            }
        finally:
            if own:
                spark.stop()

    rates = {d: args.records * len(s) / sum(s) for d, s in seconds.items()}
    eo, alo = streams["exactly-once"], streams["at-least-once"]
    figures: dict[str, Any] = {
        "bench": "sink",
        "records": args.records,
        "value_size": args.value_size,
        "partitions": args.partitions,
        "master": args.master,
        "exactly_once_rows_per_s": round(rates["exactly-once"]),
        "at_least_once_rows_per_s": round(rates["at-least-once"]),
        "exactly_once_vs_at_least_once": round(rates["exactly-once"] / rates["at-least-once"], 3),
        "exactly_once_s": [round(x, 2) for x in seconds["exactly-once"]],
        "at_least_once_s": [round(x, 2) for x in seconds["at-least-once"]],
        "trigger_ms": args.trigger_ms,
        "stream_rate": args.stream_rate,
        "stream_seconds": args.stream_seconds,
        "written_to_visible_ms_p50": round(percentile(eo.written_to_visible_ms, 50), 1),
        "written_to_visible_ms_p99": round(percentile(eo.written_to_visible_ms, 99), 1),
        "commits_seen": len(eo.written_to_visible_ms),
        "end_to_end_ms_p50": round(percentile(eo.end_to_end_ms, 50), 1),
        "end_to_end_ms_p99": round(percentile(eo.end_to_end_ms, 99), 1),
        "at_least_once_end_to_end_ms_p50": round(percentile(alo.end_to_end_ms, 50), 1),
        "at_least_once_end_to_end_ms_p99": round(percentile(alo.end_to_end_ms, 99), 1),
        "stream_rows": len(eo.end_to_end_ms),
        "at_least_once_stream_rows": len(alo.end_to_end_ms),
    }
    lines = (
        []
        if args.json
        else [
            f"batch writes       {args.records:,} rows each ({args.partitions} partitions, "
            f"{args.value_size} B values, {args.master})",
            f"at-least-once      {figures['at_least_once_rows_per_s']:>12,} rows/s  (writes of "
            f"{', '.join(f'{x:.1f}' for x in seconds['at-least-once'])} s)",
            f"exactly-once       {figures['exactly_once_rows_per_s']:>12,} rows/s  (writes of "
            f"{', '.join(f'{x:.1f}' for x in seconds['exactly-once'])} s)",
            f"  vs at-least-once {figures['exactly_once_vs_at_least_once']}",
            f"streams            {args.stream_rate:g} rows/s in, a micro-batch every "
            f"{args.trigger_ms} ms, {args.stream_seconds:g} s each",
            f"exactly-once: written -> read_committed reader sees it  p50 "
            f"{figures['written_to_visible_ms_p50']} ms, p99 "
            f"{figures['written_to_visible_ms_p99']} ms ({figures['commits_seen']} commits seen)",
            f"exactly-once: stamped at the input -> seen  p50 {figures['end_to_end_ms_p50']} ms, "
            f"p99 {figures['end_to_end_ms_p99']} ms ({figures['stream_rows']:,} rows)",
            f"at-least-once: stamped at the input -> seen  p50 "
            f"{figures['at_least_once_end_to_end_ms_p50']} ms, p99 "
            f"{figures['at_least_once_end_to_end_ms_p99']} ms",
        ]
    )
    emit(figures, lines)
    return 0


def _batch_writes(
    spark: Any, cluster: LocalCluster, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Seconds of each batch write, by delivery (rounds of ABBA after an unmeasured write
    of each)."""
    from pyspark.sql import functions as F

    def rows(n: int) -> Any:
        pad = "x" * max(0, args.value_size - 12)
        return spark.range(n, numPartitions=args.partitions).select(
            F.col("id").cast("string").cast("binary").alias("key"),
            F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(pad))
            .cast("binary")
            .alias("value"),
        )

    def write(df: Any, topic: str, delivery: str, expected: int) -> float:
        cluster.create_topic(topic, args.partitions)
        start = time.monotonic()
        df.write.format("quorumlog").option("bootstrap", cluster.bootstrap).option(
            "topic", topic
        ).option("delivery", delivery).mode("append").save()
        _wait_visible(cluster.client, topic, args.partitions, expected, delivery)
        return time.monotonic() - start

    df = rows(args.records)
    # Python workers, the JIT, each path's first use: a first write of the full size is
    # slower by half or more, whichever delivery goes first
    for delivery in DELIVERIES:
        write(df, f"warm-{delivery}", delivery, args.records)
    seconds: dict[str, list[float]] = {d: [] for d in DELIVERIES}
    order = [DELIVERIES[0], DELIVERIES[1], DELIVERIES[1], DELIVERIES[0]] * args.rounds
    progress = Progress(len(order), "batch writes", heartbeat_s=10)
    for i, delivery in enumerate(order):
        seconds[delivery].append(write(df, f"batch-{i}-{delivery}", delivery, args.records))
        progress.update(i + 1)
    progress.close()
    return seconds


def _wait_visible(client: Client, topic: str, partitions: int, expected: int, what: str) -> None:
    """Wait until every row is visible read_committed: each partition's last stable
    offset at its high watermark (the coordinator writes a commit's markers after it
    answers), holding at least ``expected`` offsets (rows and markers)."""
    deadline = time.monotonic() + VISIBLE_TIMEOUT_S
    while True:
        stable = [
            client.list_offsets(topic, p, "latest", isolation="read_committed").offset
            for p in range(partitions)
        ]
        ends = [client.list_offsets(topic, p, "latest").offset for p in range(partitions)]
        if stable == ends and sum(stable) >= expected:
            return
        if time.monotonic() >= deadline:
            raise SystemExit(
                f"the {what} write of {expected} rows left {topic} at last stable offsets "
                f"{stable}, high watermarks {ends} after {VISIBLE_TIMEOUT_S:.0f} s"
            )
        time.sleep(POLL_S)


@dataclass
class Seen:
    """What the output's pollers saw: for each group of rows that became visible at once,
    the time from its last row written to its visibility; for each row, from its stamp
    to its visibility (both in ms, after the warm-up)."""

    measure_from: float = 0.0  # wall clock: rows stamped earlier are the warm-up
    written_to_visible_ms: list[float] = field(default_factory=list)
    end_to_end_ms: list[float] = field(default_factory=list)
    rows: int = 0  # rows seen read_committed, the warm-up's too
    lock: threading.Lock = field(default_factory=threading.Lock)


def _poll_partition(
    bootstrap: str, topic: str, partition: int, seen: Seen, stop: threading.Event
) -> None:
    """Read ``topic/partition`` read_uncommitted and read_committed in turn until ``stop``."""
    written: dict[int, float] = {}  # offset -> when a read_uncommitted fetch first held it
    uncommitted = committed = 0
    with Client(bootstrap) as client:
        while not stop.is_set():
            got = client.fetch(topic, partition, uncommitted)
            now = time.time()
            last = got.last_offset_and_epoch()
            if last is not None:
                for offset in range(uncommitted, last.offset + 1):
                    written[offset] = now
                uncommitted = last.offset + 1
            got = client.fetch(topic, partition, committed, isolation="read_committed")
            now = time.time()
            last = got.last_offset_and_epoch()
            if last is None:
                stop.wait(POLL_S)
                continue
            table = got.to_arrow()
            stamps = [
                STAMP.unpack_from(v)[0] for v in table.column("value").to_pylist() if v is not None
            ]
            offsets = table.column("offset").to_pylist()
            with seen.lock:
                seen.rows += len(stamps)
                measured = [s for s in stamps if s >= seen.measure_from]
                seen.end_to_end_ms.extend((now - s) * 1000 for s in measured)
                if measured and offsets:
                    wrote = written.get(max(offsets), now)
                    seen.written_to_visible_ms.append((now - wrote) * 1000)
            for offset in range(committed, last.offset + 1):
                written.pop(offset, None)
            committed = last.offset + 1


def _stream(
    spark: Any, cluster: LocalCluster, args: argparse.Namespace, delivery: str, checkpoint: str
) -> Seen:
    """A stream from a stamped input topic into ``delivery``'s sink, and what a
    read_committed reader of its output saw."""
    source, output = f"stream-in-{delivery}", f"stream-out-{delivery}"
    cluster.create_topic(source, args.partitions)
    cluster.create_topic(output, args.partitions)
    query = (
        spark.readStream.format("quorumlog")
        .option("bootstrap", cluster.bootstrap)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
        .writeStream.format("quorumlog")
        .option("bootstrap", cluster.bootstrap)
        .option("topic", output)
        .option("delivery", delivery)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    seen = Seen(measure_from=float("inf"))  # set when the warm-up ends
    stop = threading.Event()
    pollers = [
        threading.Thread(
            target=_poll_partition, args=(cluster.bootstrap, output, p, seen, stop), daemon=True
        )
        for p in range(args.partitions)
    ]
    for t in pollers:
        t.start()
    sent = 0
    try:
        sent = _produce_stamped(cluster.bootstrap, source, args, query, seen)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline and query.exception() is None:
            with seen.lock:
                if seen.rows >= sent:
                    break
            time.sleep(0.05)
        if query.exception() is not None:
            raise SystemExit(f"the {delivery} stream failed: {query.exception()}")
        with seen.lock:
            if seen.rows < sent:
                raise SystemExit(
                    f"the {delivery} stream showed {seen.rows} of {sent} rows "
                    f"{DRAIN_TIMEOUT_S:.0f} s after the last was sent"
                )
    finally:
        stop.set()
        query.stop()
        for t in pollers:
            t.join(10)
    return seen


def _produce_stamped(
    bootstrap: str, topic: str, args: argparse.Namespace, query: Any, seen: Seen
) -> int:
    """Rows at ``--stream-rate`` a second (a batch every 20 ms, partitions in turn), each
    value its send time: a warm-up until the output shows rows and ``--warmup-seconds``
    have passed, then ``--stream-seconds`` measured; how many were sent."""
    tick = 0.02
    per_tick = max(1, round(args.stream_rate * tick))
    pad = b"x" * max(0, args.value_size - STAMP.size)
    progress = Progress(args.stream_seconds, "stream", heartbeat_s=10)
    sent = 0
    warm_until = time.monotonic() + args.warmup_seconds
    give_up = time.monotonic() + WARMUP_TIMEOUT_S
    end: float | None = None
    with Client(bootstrap) as client:
        start = time.monotonic()
        i = 0
        while end is None or time.monotonic() < end:
            delay = start + i * tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if query.exception() is not None:
                break
            if end is None:
                with seen.lock:
                    shown = seen.rows > 0
                now = time.monotonic()
                if shown and now >= warm_until:
                    end = now + args.stream_seconds
                    with seen.lock:
                        seen.measure_from = time.time()
                elif now >= give_up:
                    raise SystemExit(f"the stream showed no row in {WARMUP_TIMEOUT_S:.0f} s")
            else:
                progress.update(args.stream_seconds - (end - time.monotonic()))
            values = [STAMP.pack(time.time()) + pad for _ in range(per_tick)]
            client.produce(topic, i % args.partitions, encode_batch(values))
            sent += per_tick
            i += 1
    progress.close()
    return sent


if __name__ == "__main__":
    raise SystemExit(main())
