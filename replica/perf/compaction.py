"""``quorumlog perf compaction``: what log compaction costs and what it keeps.

* **The cleaner's rate** (``cleaned_mb_per_s``), unthrottled, on one local log: ``--mb``
  MiB of 100 B keyed records (``--keys`` distinct keys drawn at random, so many versions
  of each; ``--tombstone-share`` of them null values) in ``--segment-mb`` segments, then
  one clean of everything below the active segment (``Log.clean``, both halves in this
  thread, as the node's worker runs them without its throttle). The rate is the dirty
  segment bytes the clean read per second of the whole clean (read, Arrow group-by,
  write and fsync of the cleaned segments, swap). ``bytes_after_vs_live``: the bytes the
  clean wrote over the bytes its survivors would take packed into full batches (how
  close a cleaned log comes to its live data).
* **Producers while it cleans** (``produce_during_vs_before``), on a 3-node cluster at
  the nodes' default cleaner throttle: the records per second ``--producers`` native
  producers write to a topic of ``cleanup.policy=delete`` for ``--seconds``, first with
  nothing to clean, then while every node cleans a compacted backlog of
  ``--backlog-mb`` MiB (written before, held back by ``min.compaction.lag.ms`` until the
  second run starts). ``backlog_mb`` is the backlog's bytes over every replica, and
  ``backlog_cleaned_mb`` how much of them the nodes' cleaners removed during that run
  (if they finished early, the run's second half had nothing to compete with), and
  ``backlog_cleaning_s`` when, into that run, the backlog last shrank.

``load_1m``: the machine's load average when it ended (the figures of a shared machine
are read against it).

The last line printed is one JSON object with every figure (``--json``: only that line).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..node.cluster import LocalCluster
from ..storage.log import Log, LogConfig
from ..storage.records import encode_batch
from .util import ProduceJob, emit, run_producers

MIB = 1024 * 1024
RECORD_BYTES = 100
BATCH_RECORDS = 1000


def _keys(count: int) -> list[bytes]:
    return [b"key-%08d" % i for i in range(count)]


def clean_run(
    directory: str, mb: int, keys: int, segment_mb: int, tombstone_share: float, seed: int = 1
) -> dict[str, float]:
    """One log of ``mb`` MiB of keyed records, cleaned once: the cleaner's figures."""
    rng = random.Random(seed)
    names = _keys(keys)
    value = os.urandom(RECORD_BYTES)
    config = LogConfig(
        segment_bytes=segment_mb * MIB,
        cleanup_policy="compact",
        delete_retention_ms=0,
    )
    # What a live record takes packed in a full batch (keys of the same length).
    full_batch = len(encode_batch([value] * BATCH_RECORDS, keys=_keys(BATCH_RECORDS)))
    log = Log(directory, config)
    try:
        written = 0
        while written < mb * MIB:
            batch_keys = [rng.choice(names) for _ in range(BATCH_RECORDS)]
            values = [None if rng.random() < tombstone_share else value for _ in batch_keys]
            batch = encode_batch(values, keys=batch_keys)
            log.append_as_leader(batch, 1)
            written += len(batch)
        log.flush()
        started = time.perf_counter()
        stats = log.clean(high_watermark=log.end_offset)
        elapsed = time.perf_counter() - started
        if stats is None or stats.bytes_read == 0:
            raise RuntimeError("the clean found nothing to clean: raise --mb or lower --segment-mb")
        live_bytes = stats.records_kept * full_batch / BATCH_RECORDS
        return {
            "written_mb": written / MIB,
            "cleaned_input_mb": stats.bytes_read / MIB,
            "cleaned_output_mb": stats.bytes_written / MIB,
            "records_read": stats.records_read,
            "records_kept": stats.records_kept,
            "clean_s": elapsed,
            "cleaned_mb_per_s": stats.bytes_read / MIB / elapsed,
            "bytes_after_vs_live": stats.bytes_written / live_bytes if live_bytes else 0.0,
        }
    finally:
        log.close()


def _topic_bytes(cluster: LocalCluster, topic: str) -> int:
    """The segment bytes of every replica of ``topic``, summed over the nodes."""
    return sum(
        f.stat().st_size
        for n in cluster.ports
        for f in cluster.node_dir(n).glob(f"{topic}-*/*.log")
        if f.is_file()
    )


def produce_run(
    data_dir: Path | None, backlog_mb: int, seconds: float, partitions: int, producers: int
) -> dict[str, float]:
    """Producers' rate to a delete topic before and while every node cleans a compacted
    backlog, at the nodes' default cleaner throttle."""
    keys = _keys(BATCH_RECORDS)
    value = os.urandom(RECORD_BYTES)
    backlog_batch = encode_batch([value] * BATCH_RECORDS, keys=keys)
    load_batch = encode_batch([value] * BATCH_RECORDS)
    with LocalCluster(3, data_dir, log_level="WARNING") as cluster:
        client = cluster.client
        held = {
            "cleanup.policy": "compact",
            "segment.bytes": str(8 * MIB),
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": str(1 << 40),  # no clean until the second run
        }
        client.create_topic("perf-backlog", partitions, configs=held)
        cluster.create_topic("perf-load", partitions)
        for topic in ("perf-backlog", "perf-load"):
            for p in range(partitions):
                cluster.wait_for_leader(topic, p, 60)

        def job(topic: str, payload: bytes, **amount: Any) -> ProduceJob:
            return ProduceJob(
                cluster.bootstrap, topic, tuple(range(partitions)), payload, BATCH_RECORDS, **amount
            )

        backlog_batches = max(1, backlog_mb * MIB // len(backlog_batch))
        run_producers(job("perf-backlog", backlog_batch, total_batches=backlog_batches), producers)
        before = run_producers(job("perf-load", load_batch, duration_s=seconds), producers)
        backlog_before = _topic_bytes(cluster, "perf-backlog")
        # When the backlog stops shrinking during the second run: how much of it the
        # producers shared the machine with the cleaners.
        sizes: list[tuple[float, int]] = []
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.25):
                sizes.append((time.monotonic(), _topic_bytes(cluster, "perf-backlog")))

        watcher = threading.Thread(target=watch, daemon=True)
        client.alter_topic("perf-backlog", configs={"min.compaction.lag.ms": "0"})
        started = time.monotonic()
        watcher.start()
        try:
            during = run_producers(job("perf-load", load_batch, duration_s=seconds), producers)
        finally:
            done.set()
            watcher.join(10)
        backlog_after = _topic_bytes(cluster, "perf-backlog")
        shrinking = [t for (t, b), (_, a) in zip(sizes, sizes[1:], strict=False) if a < b]
        cleaning_s = (shrinking[-1] - started) if shrinking else 0.0
    return {
        "produce_before_records_per_s": before.rate,
        "produce_during_records_per_s": during.rate,
        "produce_during_vs_before": during.rate / before.rate if before.rate else 0.0,
        "backlog_mb": backlog_before / MIB,
        "backlog_cleaned_mb": (backlog_before - backlog_after) / MIB,
        "backlog_cleaning_s": cleaning_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf compaction")
    ap.add_argument("--mb", type=int, default=512, help="MiB of keyed records the log holds")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys")
    ap.add_argument("--segment-mb", type=int, default=64)
    ap.add_argument(
        "--tombstone-share", type=float, default=0.05, help="share of records with a null value"
    )
    ap.add_argument(
        "--backlog-mb",
        type=int,
        default=512,
        help="MiB of compacted backlog per replica the nodes clean while producers write "
        "(more than a node cleans in --seconds at the default throttle)",
    )
    ap.add_argument("--seconds", type=float, default=8.0, help="each producers' run")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--data-dir", default=None, help="where the logs go (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)
    base = (
        Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="perf-compaction-"))
    )
    figures: dict[str, Any] = {"bench": "compaction"}
    lines: list[str] = []
    try:
        clean = clean_run(
            str(base / "clean"), args.mb, args.keys, args.segment_mb, args.tombstone_share
        )
        figures.update(clean)
        lines.append(
            f"cleaner: {clean['cleaned_input_mb']:.0f} MiB of dirty log cleaned in "
            f"{clean['clean_s']:.2f} s = {clean['cleaned_mb_per_s']:.0f} MiB/s unthrottled; "
            f"kept {clean['records_kept']:,} of {clean['records_read']:,} records, "
            f"{clean['cleaned_output_mb']:.1f} MiB = {clean['bytes_after_vs_live']:.2f}x "
            "their bytes packed in full batches"
        )
        produce = produce_run(
            base / "cluster", args.backlog_mb, args.seconds, args.partitions, args.producers
        )
        figures.update(produce)
        lines.append(
            f"producers: {produce['produce_before_records_per_s']:,.0f} records/s before, "
            f"{produce['produce_during_records_per_s']:,.0f} while the nodes cleaned "
            f"{produce['backlog_cleaned_mb']:.0f} of {produce['backlog_mb']:.0f} MiB of backlog "
            f"in its first {produce['backlog_cleaning_s']:.1f} s (default throttle) = "
            f"{produce['produce_during_vs_before']:.2f}x"
        )
    finally:
        if not args.data_dir:
            shutil.rmtree(base, ignore_errors=True)
    figures["load_1m"] = os.getloadavg()[0]
    emit(figures, [] if args.json else lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
