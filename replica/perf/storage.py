"""``quorumlog perf storage``: append throughput with group-commit fsync, read and
decode throughput, and how long retention holds its caller deleting cached segments, on
one local log; with ``--quorum-states N``, also the time to make N
replicas' election states durable as one quorum-journal write against N per-replica
quorum-state files (what 10,000 partitions electing at once cost a node); with
``--flush``, only the cost of one node flush job over 1, 8, 64 and 1000 dirty logs, one
fdatasync per file against one syncfs(2).

Appends run on the main thread while a worker thread calls ``flush()`` in a loop, as
the node does with its executor; a run ends when everything appended is durable. The
last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import tempfile
import threading
import time

from ..storage.fdcache import FdCache
from ..storage.groupflush import flush_logs, syncfs_available
from ..storage.log import Log, LogConfig
from ..storage.quorum_journal import QuorumJournal
from ..storage.quorum_state import QuorumState, QuorumStateStore
from ..storage.records import batches_to_table, encode_batch, iter_batches

RECORD_BYTES = 100
MIB = 1024 * 1024


def _append_run(directory: str, records_per_batch: int, total_bytes: int) -> dict[str, float]:
    values = [os.urandom(RECORD_BYTES) for _ in range(records_per_batch)]
    batch = encode_batch(values)
    rounds = max(3, 20_000 // records_per_batch)
    started = time.perf_counter()
    for _ in range(rounds):
        encode_batch(values)
    encode_s = (time.perf_counter() - started) / rounds
    batches = max(1, total_bytes // len(batch))
    log = Log(directory, LogConfig(segment_bytes=256 * MIB))
    stop = threading.Event()
    fsyncs = 0

    def flusher() -> None:
        nonlocal fsyncs
        while not stop.is_set():
            before = log.durable_end_offset
            if log.flush() != before:
                fsyncs += 1
            else:
                time.sleep(0.0005)  # nothing new: do not spin on the GIL

    thread = threading.Thread(target=flusher, name="perf-flush")
    started = time.perf_counter()
    thread.start()
    for _ in range(batches):
        log.append_as_leader(batch, 1)
    appended = time.perf_counter()
    stop.set()
    thread.join()
    log.flush()
    durable = time.perf_counter()
    assert log.durable_end_offset == log.end_offset == batches * records_per_batch
    log.close()
    written = batches * len(batch)
    return {
        "batch_bytes": len(batch),
        "batches": batches,
        "mb_per_s": written / MIB / (durable - started),
        "records_per_s": batches * records_per_batch / (durable - started),
        "append_only_mb_per_s": written / MIB / (appended - started),
        "fsyncs": fsyncs + 1,
        "encode_mb_per_s": len(batch) / MIB / encode_s,
    }


def _read_run(directory: str, max_bytes: int) -> dict[str, float]:
    log = Log(directory)
    total = 0
    rows = 0
    started = time.perf_counter()
    offset = log.start_offset
    while offset < log.end_offset:
        chunk = log.read(offset, max_bytes)
        total += len(chunk)
        offset = _next_offset(chunk)
    read_s = time.perf_counter() - started
    offset = log.start_offset
    started = time.perf_counter()
    while offset < log.end_offset:
        chunk = log.read(offset, max_bytes)
        rows += batches_to_table(chunk).num_rows
        offset = _next_offset(chunk)
    decode_s = time.perf_counter() - started
    log.close()
    return {
        "read_mb_per_s": total / MIB / read_s,
        "read_and_decode_mb_per_s": total / MIB / decode_s,
        "decode_records_per_s": rows / decode_s,
    }


def _close_each(fds: queue.SimpleQueue[int | None]) -> None:
    while (fd := fds.get()) is not None:
        os.close(fd)


def _retention_run(root: str, total_bytes: int) -> dict[str, float]:
    """Retention deleting ``total_bytes`` of cached segments (four): how long
    ``apply_retention`` holds its caller (a node's event loop) when the unlinks free the
    pages there (``inline``), against a node's way, the segments' last descriptors handed
    to a thread of their own that closes them (``background``, ``close_deleted``). Each
    mode its own log, filled alike."""
    batch = encode_batch([os.urandom(RECORD_BYTES) for _ in range(10_000)])
    segment_bytes = max(MIB, total_bytes // 4)
    figures: dict[str, float] = {"segment_mib": segment_bytes / MIB}
    for mode in ("inline", "background"):
        directory = os.path.join(root, f"retention-{mode}")
        shutil.rmtree(directory, ignore_errors=True)
        fds: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        thread = threading.Thread(target=_close_each, args=(fds,), name="perf-closer")
        thread.start()
        config = LogConfig(segment_bytes=segment_bytes, retention_bytes=1)
        log = Log(directory, config, close_deleted=fds.put if mode == "background" else None)
        for _ in range(max(2, total_bytes // len(batch))):
            log.append_as_leader(batch, 1)
        log.flush()
        started = time.perf_counter()
        deleted = log.apply_retention()
        figures[f"{mode}_hold_ms"] = (time.perf_counter() - started) * 1000
        fds.put(None)
        thread.join()
        figures["segments"] = deleted
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
    return figures


def flush_benchmark(
    directory: str, log_counts: tuple[int, ...] = (1, 8, 64, 1000), rounds: int = 7
) -> dict[str, dict[str, float]]:
    """One flush job over N logs that each appended one small batch (10 x 100 B records)
    since the last job, as a node's flush cycle with N partitions written: fdatasync
    per file (``flush_logs(syncfs_min=0)``) against one syncfs (``syncfs_min=1``),
    alternating round by round. Median and max milliseconds per job."""
    batch = encode_batch([os.urandom(RECORD_BYTES) for _ in range(10)])
    modes = {"fdatasync": 0, "syncfs": 1} if syncfs_available() else {"fdatasync": 0}
    result: dict[str, dict[str, float]] = {}
    for count in log_counts:
        root = os.path.join(directory, f"flush-{count}")
        shutil.rmtree(root, ignore_errors=True)
        cache = FdCache(count + 16)
        logs = [Log(os.path.join(root, f"p-{i}"), files=cache) for i in range(count)]
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        job_rounds = max(3, min(rounds * 4, 2000 // count)) if count < 64 else rounds
        for _ in range(job_rounds):
            for mode, syncfs_min in modes.items():
                for lg in logs:
                    lg.append_as_leader(batch, 1)
                started = time.perf_counter()
                outcome = flush_logs(logs, syncfs_min=syncfs_min)
                times[mode].append((time.perf_counter() - started) * 1000)
                assert outcome.outcomes == [lg.end_offset for lg in logs], outcome.errors
                assert outcome.syncfs_calls == (1 if syncfs_min else 0)
        for lg in logs:
            lg.close()
        shutil.rmtree(root, ignore_errors=True)
        figures: dict[str, float] = {"rounds": job_rounds}
        for mode, ms in times.items():
            figures[f"{mode}_ms_median"] = statistics.median(ms)
            figures[f"{mode}_ms_max"] = max(ms)
        result[f"logs_{count}"] = figures
    return result


def _quorum_states_run(root: str, count: int) -> dict[str, float]:
    state = QuorumState(leader_epoch=5, leader_id=1, voted_id=1, voters=(1, 2, 3))
    items = [(("perf-topic", p), state) for p in range(count)]
    journal = QuorumJournal(os.path.join(root, "journal"))
    started = time.perf_counter()
    journal.write_many(items)
    journal_s = time.perf_counter() - started
    journal.close()
    started = time.perf_counter()
    QuorumJournal(os.path.join(root, "journal")).close()
    replay_s = time.perf_counter() - started
    stores = [
        QuorumStateStore(os.path.join(root, "files", f"perf-topic-{p}")) for p in range(count)
    ]
    started = time.perf_counter()
    for store in stores:
        store.write(state)
    files_s = time.perf_counter() - started
    return {
        "states": count,
        "journal_write_s": journal_s,
        "journal_replay_s": replay_s,
        "per_file_writes_s": files_s,
        "speedup": files_s / journal_s,
    }


def _next_offset(chunk: bytes) -> int:
    last = 0
    for header in iter_batches(chunk):
        last = header.next_offset
    return last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quorumlog perf storage", description=__doc__)
    parser.add_argument("--dir", help="directory for the logs (default: a temp dir)")
    parser.add_argument("--mb", type=int, default=256, help="MiB to append per run")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument(
        "--flush",
        action="store_true",
        help="only the flush-job benchmark: per-file fdatasync against one syncfs",
    )
    parser.add_argument(
        "--flush-logs",
        default="1,8,64,1000",
        help="dirty logs per flush job, comma-separated (default 1,8,64,1000)",
    )
    parser.add_argument(
        "--quorum-states",
        type=int,
        default=0,
        metavar="N",
        help="also time N election states: one journal write vs N quorum-state files",
    )
    args = parser.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="quorumlog-perf-")
    os.makedirs(root, exist_ok=True)
    if args.flush:
        counts = tuple(int(c) for c in args.flush_logs.split(","))
        try:
            flush = flush_benchmark(root, counts)
        finally:
            if not args.dir:
                shutil.rmtree(root, ignore_errors=True)
        if not args.json:
            for name, f in flush.items():
                line = f"flush job, {name.split('_')[1]:>5} dirty logs: fdatasync per file "
                line += f"{f['fdatasync_ms_median']:8.2f} ms (max {f['fdatasync_ms_max']:.2f})"
                if "syncfs_ms_median" in f:
                    line += (
                        f"; one syncfs {f['syncfs_ms_median']:8.2f} ms "
                        f"(max {f['syncfs_ms_max']:.2f})"
                    )
                print(line + f"; medians of {f['rounds']:.0f} jobs")
        print(json.dumps({"flush": flush}, sort_keys=True))
        return 0
    result: dict[str, object] = {"record_bytes": RECORD_BYTES, "mb": args.mb}
    try:
        for per_batch in (1000, 10_000):
            directory = os.path.join(root, f"append-{per_batch}")
            shutil.rmtree(directory, ignore_errors=True)
            figures = _append_run(directory, per_batch, args.mb * MIB)
            result[f"append_{per_batch}"] = figures
            if not args.json:
                print(
                    f"append {per_batch:>6} x {RECORD_BYTES} B records "
                    f"({figures['batch_bytes'] / MIB:.2f} MiB batches), fsync'd: "
                    f"{figures['mb_per_s']:8.1f} MiB/s {figures['records_per_s']:12,.0f} rec/s "
                    f"({figures['fsyncs']:.0f} fsyncs; append only "
                    f"{figures['append_only_mb_per_s']:.0f} MiB/s; "
                    f"encode {figures['encode_mb_per_s']:.0f} MiB/s)"
                )
        retention = _retention_run(root, args.mb * MIB)
        result["retention"] = retention
        if not args.json:
            print(
                f"retention deleting {retention['segments']:.0f} cached "
                f"{retention['segment_mib']:.0f} MiB segments holds "
                f"its caller {retention['inline_hold_ms']:.1f} ms freeing their pages there, "
                f"{retention['background_hold_ms']:.1f} ms handing them to a thread (a node)"
            )
        for max_bytes in (MIB, 8 * MIB):
            figures = _read_run(os.path.join(root, "append-10000"), max_bytes)
            result[f"read_{max_bytes // MIB}mib"] = figures
            if not args.json:
                print(
                    f"read (max_bytes {max_bytes // MIB} MiB): {figures['read_mb_per_s']:8.1f} "
                    f"MiB/s; read + to Arrow table: {figures['read_and_decode_mb_per_s']:8.1f} "
                    f"MiB/s {figures['decode_records_per_s']:12,.0f} rec/s"
                )
        if args.quorum_states > 0:
            directory = os.path.join(root, "quorum-states")
            shutil.rmtree(directory, ignore_errors=True)
            qs = _quorum_states_run(directory, args.quorum_states)
            result["quorum_states"] = qs
            if not args.json:
                print(
                    f"{args.quorum_states} election states durable: one journal write "
                    f"{qs['journal_write_s'] * 1000:.1f} ms (replay "
                    f"{qs['journal_replay_s'] * 1000:.1f} ms); one quorum-state file each "
                    f"{qs['per_file_writes_s'] * 1000:.0f} ms ({qs['speedup']:.0f}x)"
                )
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
