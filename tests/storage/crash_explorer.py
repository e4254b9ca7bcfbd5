"""The crash-state explorer: random storage workloads are recorded through the file layer
(``crashfs.RecordingFileOps``); at every point of the recorded stream, each file tree a
power loss may leave there (``crashfs.Shadow.crash_states``) is written out, recovered
and checked:

- the log opens (recovery accepts every state a crash leaves);
- every record the log reported durable before the crash point is there;
- the log is a prefix of what was written: each record is the one at its offset before
  or after the call in progress (below the log start, one that was there once), none
  from a truncated-away branch;
- the epoch cache agrees with the batches, and so do the voter sets (``voters-checkpoint``
  names every voters record in the log and no other), every batch is found through the
  indexes,
  and the idempotent producers' state agrees with the batches, and so do the open and
  aborted transactions (``transactions``: as a fresh index over the batches says);
- the catch-up floor of a repaired log survives until the log reaches it again;
- the recovered log takes an append, flushes and reopens clean;
- the quorum journal holds, per replica, the state before or after the call in progress,
  and every state it reported durable.

The cleaner workload (``crash_cleaner``: compaction's rewrite and swap) has checks of
its own. ``python -m tests.storage.crash_explorer --states N [--workload
log|cleaner|all]`` runs a sweep (``make crash-sweep``: a deep one of both); the bounded sweep runs in ``make test`` (tests/storage/test_crash_states.py).
A violation prints the seed, the crash point, the workload's calls up to it and the files.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from quorumlog.replica.constants import UNKNOWN
from quorumlog.replica.storage import (
    CATCH_UP_UNKNOWN,
    FdCache,
    Log,
    LogConfig,
    Producer,
    QuorumJournal,
    QuorumState,
    encode_batch,
    fileio,
    flush_logs,
    iter_batches,
    parse_header,
)
from quorumlog.replica.storage.records import VOTERS_KEY, BatchHeader, TxnMarker, decode_control
from quorumlog.replica.storage.tail import TailBudget
from quorumlog.replica.storage.transactions import TransactionIndex, committed_batches

from .crash_cleaner import CleanerWorkload
from .crashfs import RecordingFileOps, Shadow, materialize
from .helpers import usable_after_recovery

LOG_DIR = "t-0"
# One recovered state in this many is also appended to, flushed, closed and reopened
# (the first of each crash point always is).
USE_EVERY = 4
JOURNAL_DIR = "meta"


@dataclass(frozen=True)
class Snapshot:
    """What a workload knew between two calls."""

    call: str
    start: int = 0
    end: int = 0
    durable: int = 0
    catch_up: int = UNKNOWN
    records: dict[int, tuple[int, bytes]] = field(default_factory=dict)
    journal: dict[tuple[str, int], int] = field(default_factory=dict)  # key -> epoch


@dataclass
class Violation:
    seed: int
    point: int
    calls: list[str]
    problem: str
    tree: dict[str, int]

    def __str__(self) -> str:
        files = ", ".join(f"{k}={v}" for k, v in sorted(self.tree.items()))
        return (
            f"crash-state violation (seed {self.seed}, after recorded op {self.point}): "
            f"{self.problem}\n  calls: {' ; '.join(self.calls)}\n  files: {files}"
        )


@dataclass
class SweepResult:
    workloads: int = 0
    points: int = 0
    states: int = 0
    violations: list[Violation] = field(default_factory=list)


# -- the log workload ------------------------------------------------------------------


class LogWorkload:
    """Random calls on one log: appends as leader (plain, control, idempotent) and as
    follower, rolls (small segments), group and plain flushes, truncation to a diverging
    point followed by a new epoch, retention, repair (truncate_corrupt), catch-up marks,
    clean reopens; and quorum journal writes (with compaction) beside it."""

    def __init__(self, seed: int, root: str, steps: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.root = root
        self.steps = steps
        self.config = LogConfig(
            segment_bytes=self.rng.choice([1200, 2500, 5000]),
            index_interval_bytes=600,
            retention_bytes=self.rng.choice([None, 6000]),
            segment_ms=None,
        )
        self.capacity = self.rng.choice([1, 64])  # 1: evictions sync descriptors
        self.records: dict[int, tuple[int, bytes]] = {}
        self.history: dict[int, set[tuple[int, bytes]]] = {}
        self.epoch = 0
        self.gen = 0
        self.producer_id = 7
        self.txn_producer = 100  # a transactional producer, and its epoch
        self.txn_epoch = 0
        self.journal_states: dict[tuple[str, int], int] = {}
        self.calls: list[str] = []

    def open_log(self) -> Log:
        return Log(
            os.path.join(self.root, LOG_DIR),
            self.config,
            files=FdCache(self.capacity),
            tail=TailBudget(0),
        )

    def snapshot(self, log: Log, call: str) -> Snapshot:
        return Snapshot(
            call,
            log.start_offset,
            log.end_offset,
            log.durable_end_offset,
            log.catch_up_offset,
            dict(self.records),
            dict(self.journal_states),
        )

    def _remember(self, base: int, epoch: int, header: BatchHeader) -> None:
        """A batch appended at ``base``: its records are known by the batch's payload CRC
        and their index in it (the log checks every payload against its CRC on read)."""
        for i in range(header.record_count):
            record = (epoch, _identity(header, i))
            self.records[base + i] = record
            self.history.setdefault(base + i, set()).add(record)

    def _forget_from(self, offset: int) -> None:
        for o in [o for o in self.records if o >= offset]:
            del self.records[o]

    def _forget_below(self, offset: int) -> None:
        for o in [o for o in self.records if o < offset]:
            del self.records[o]

    def run(self, rec: RecordingFileOps) -> None:
        rng = self.rng
        journal = QuorumJournal(
            os.path.join(self.root, JOURNAL_DIR), compact_ratio=2, compact_min_bytes=200
        )
        log = self.open_log()
        rec.mark(self.snapshot(log, "open"))
        for _ in range(self.steps):
            call = rng.choices(
                [
                    "leader",
                    "follower",
                    "control",
                    "voters",
                    "idempotent",
                    "flush",
                    "group-flush",
                    "truncate",
                    "retention",
                    "repair",
                    "catch-up",
                    "reopen",
                    "journal",
                    "transactional",
                    "marker",
                ],
                weights=[24, 12, 4, 3, 6, 16, 6, 6, 4, 2, 2, 3, 8, 6, 3],
            )[0]
            label = call
            if call in ("transactional", "marker"):
                self.epoch = max(self.epoch, log.last_epoch(), 0)
                base = log.end_offset
                label = self.transact(log, call == "marker")
                self._remember(base, self.epoch, next(iter_batches(log.read(base, 1 << 20))))
                call = "done"
            if call in ("leader", "idempotent", "control", "voters"):
                self.epoch = max(self.epoch + (rng.random() < 0.15), log.last_epoch(), 0)
                base = log.end_offset
                if call in ("control", "voters"):
                    if call == "control":
                        log.append_control(self.epoch, 1, [1, 2, 3], 0)
                    else:
                        voters = sorted(rng.sample(range(1, 7), rng.randint(1, 4)))
                        log.append_voters(self.epoch, 1, voters, 0)
                    self._remember(base, self.epoch, next(iter_batches(log.read(base, 1))))
                else:
                    self.gen += 1
                    count = rng.randint(1, 6)
                    values = [b"g%d-%d" % (self.gen, base + i) for i in range(count)]
                    producer = None
                    if call == "idempotent":
                        last = log.producer_state().last_batch(self.producer_id)
                        if last is None:  # truncated or retained away: a new producer
                            self.producer_id += 1
                        seq = 0 if last is None else last.last_sequence + 1
                        producer = Producer(self.producer_id, 0, seq)
                    data = encode_batch(values, producer=producer)
                    log.append_as_leader(data, self.epoch)
                    self._remember(base, self.epoch, parse_header(data, 0))
                label = f"{call}(epoch {self.epoch}) @{base}"
            elif call == "follower":
                self.epoch = max(self.epoch + (rng.random() < 0.3), log.last_epoch(), 0)
                base = log.end_offset
                batches = b""
                self.gen += 1
                for _ in range(rng.randint(1, 3)):
                    count = rng.randint(1, 4)
                    values = [b"f%d-%d" % (self.gen, base + i) for i in range(count)]
                    data = encode_batch(values, base_offset=base, leader_epoch=self.epoch)
                    batches += data
                    self._remember(base, self.epoch, parse_header(data, 0))
                    base += count
                log.append_as_follower(batches)
                label = f"follower(epoch {self.epoch}) ->{base}"
            elif call == "flush":
                log.flush()
            elif call == "group-flush":
                outcome = flush_logs([log], syncfs_min=1).outcomes[0]
                assert not isinstance(outcome, Exception), outcome
            elif call in ("truncate", "repair"):
                if log.end_offset == log.start_offset:
                    continue
                target = rng.randint(log.start_offset, log.end_offset - 1)
                if call == "truncate":
                    log.truncate_to(target)
                else:
                    log.truncate_corrupt(target)
                self._forget_from(log.end_offset)
                self.epoch += 1  # the new branch is a new leader's
                label = f"{call}({target}) ->{log.end_offset}"
            elif call == "retention":
                log.apply_retention()
                self._forget_below(log.start_offset)
                label = f"retention ->start {log.start_offset}"
            elif call == "catch-up":
                floor = rng.choice([CATCH_UP_UNKNOWN, log.end_offset + rng.randint(1, 20)])
                log.mark_catch_up(floor)
                label = f"catch-up({'unknown' if floor == CATCH_UP_UNKNOWN else floor})"
            elif call == "done":
                pass
            elif call == "reopen":
                log.close()
                log = self.open_log()
            else:
                keys = [("t", rng.randint(0, 5)) for _ in range(rng.randint(1, 3))]
                items = []
                for key in keys:
                    epoch = self.journal_states.get(key, 0) + 1
                    items.append((key, QuorumState(epoch, 1, 1, (1, 2, 3))))
                    self.journal_states[key] = epoch
                journal.write_many(items)
                label = f"journal({keys})"
            problem = _transactions_problem(log)
            assert not problem, f"seed {self.seed} after {label}: {problem}"
            self.calls.append(label)
            rec.mark(self.snapshot(log, label))
        log.close()
        journal.close()
        self.calls.append("close")
        rec.mark(self.snapshot(log, "close"))

    def transact(self, log: Log, marker: bool) -> str:
        """A transactional producer's batch (opening its transaction if none is), or
        its transaction's marker: commit, abort, or abort with the epoch bumped (a
        coordinator fencing the producer)."""
        pid = self.txn_producer
        if marker:
            commit = self.rng.random() < 0.5
            if not commit and self.rng.random() < 0.4:
                self.txn_epoch += 1
            log.append_markers([TxnMarker(pid, self.txn_epoch, commit, 0)], self.epoch, 0)
            return f"marker({'commit' if commit else 'abort'}, epoch {self.txn_epoch})"
        last = log.producer_state().last_batch(pid)
        seq = 0 if last is None or last.producer_epoch != self.txn_epoch else last.last_sequence + 1
        self.gen += 1
        values = [b"x%d-%d" % (self.gen, i) for i in range(self.rng.randint(1, 4))]
        data = encode_batch(values, producer=Producer(pid, self.txn_epoch, seq), transactional=True)
        log.append_as_leader(data, self.epoch)
        return f"transactional(epoch {self.txn_epoch}, sequence {seq})"


# -- checks ----------------------------------------------------------------------------


def _transactions_problem(log: Log) -> str:
    """'' if the log's open transactions are what its batches say, and its aborted ones
    drop the same batches from a read_committed read of the whole log as theirs do (an
    abort whose first offset retention deleted is kept from there, where the batches
    alone start it at its producer's first batch left)."""
    headers = list(_headers(log))
    have, want = log.transactions(), TransactionIndex.of(headers)
    if have.open_transactions != want.open_transactions:
        return (
            f"open transactions {have.open_transactions}, the batches say {want.open_transactions}"
        )

    def visible(index: TransactionIndex) -> list[int]:
        aborted = index.aborted_between(log.start_offset, log.end_offset)
        pairs = [(a.producer_id, a.first_offset) for a in aborted]
        return [h.base_offset for h in committed_batches(headers, pairs)]

    seen, expected = visible(have), visible(want)
    if seen != expected:
        return f"read_committed sees batches {seen}, the batches say {expected} ({have.state()})"
    return ""


def _identity(header: BatchHeader, index: int) -> bytes:
    return b"%08x:%d" % (header.payload_crc, index)


def _read_log(log: Log) -> list[tuple[int, int, int, bytes | None]]:
    """(offset, epoch, batch base, identity) of every record, read batch by batch from
    the log start through the indexes (each batch found at its own base offset; the log
    checks each one's CRCs as it reads it)."""
    out: list[tuple[int, int, int, bytes | None]] = []
    offset = log.start_offset
    while offset < log.end_offset:
        data = log.read(offset, 1)
        headers = list(iter_batches(data))
        if not headers or headers[0].base_offset != offset:
            raise AssertionError(f"read({offset}) found no batch starting there")
        header = headers[0]
        if header.record_count > 1:
            inner = log.read(header.next_offset - 1, 1)
            if next(iter_batches(inner)).base_offset != header.base_offset:
                raise AssertionError(f"read({header.next_offset - 1}) missed its batch")
        for i in range(header.record_count):
            out.append((offset + i, header.leader_epoch, offset, _identity(header, i)))
        offset = header.next_offset
    return out


def _consistent(
    got: dict[int, tuple[int, bytes]],
    start: int,
    end: int,
    snap: Snapshot,
    durable: int,
    history: dict[int, set[tuple[int, bytes]]],
) -> str:
    for offset, record in got.items():
        if offset >= snap.end:
            return f"offset {offset} {record} is past the log end {snap.end} of {snap.call!r}"
        if offset >= snap.start:
            if snap.records.get(offset) != record:
                return (
                    f"offset {offset} holds {record}, {snap.call!r} had {snap.records.get(offset)}"
                )
        elif record not in history.get(offset, ()):
            return f"offset {offset} holds {record}, never written there"
    for offset in range(max(snap.start, start), min(durable, snap.end)):
        if offset not in got:
            return f"durable offset {offset} (durable end {durable}) is missing"
    if start > snap.start and min(durable, snap.end) > snap.start:
        return f"the log starts at {start}, {snap.call!r} started at {snap.start}"
    return ""


def check_log(
    directory: str,
    config: LogConfig,
    before: Snapshot,
    after: Snapshot,
    history: dict[int, set[tuple[int, bytes]]],
    *,
    use_it: bool = True,
) -> str:
    """'' if the log recovered from ``directory`` is one the crash may leave, else why.
    ``use_it``: also append to it, flush, close and reopen it."""
    try:
        log = Log(directory, config, files=FdCache(8), tail=TailBudget(0))
    except Exception as exc:  # noqa: BLE001 - any refusal is the violation
        return f"recovery failed: {type(exc).__name__}: {exc}"
    try:
        rows = _read_log(log)
        got = {o: (e, v if v is not None else b"") for o, e, _b, v in rows}
        start, end = log.start_offset, log.end_offset
        if len(got) != end - start:
            return f"log [{start}, {end}) reads {len(got)} records"
        # What was reported durable before the call, less what the call (a truncation)
        # was removing anyway.
        durable = min(before.durable, after.end)
        reasons = [
            _consistent(got, start, end, before, durable, history),
            _consistent(got, start, end, after, durable, history),
        ]
        if all(reasons):
            return " / ".join(reasons)
        expected: list[tuple[int, int]] = []
        for o, e, _b, _v in rows:
            if not expected or e > expected[-1][0]:
                expected.append((e, o))
        cache = [(x.epoch, x.offset) for x in log.epoch_cache.entries]
        # An emptied log (retention) may keep its last epoch's entry at the log start.
        kept_at_start = not rows and len(cache) == 1 and cache[0][1] == start
        if cache != expected and not kept_at_start:
            return f"epoch cache {cache}, the batches say {expected}"
        problem = _voters_problem(log)
        if problem:
            return problem
        floor = log.catch_up_offset
        if not any(_floor_kept(floor, end, s.catch_up) for s in (before, after)):
            floors = sorted({before.catch_up, after.catch_up})
            return f"catch-up floor {floor} at log end {end}, expected one of {floors}"
        problem = _transactions_problem(log)
        if problem:
            return problem
        table = log.producer_state()
        want: dict[int, tuple[int, int] | None] = {}
        epochs: dict[int, int] = {}
        for h in _headers(log):
            if h.producer is None:
                continue
            pid = h.producer.producer_id
            if h.marker is not None:  # a marker of a later epoch starts it anew
                if h.producer_epoch > epochs.get(pid, -1):
                    want[pid] = None
            else:
                want[pid] = (h.producer.base_sequence, h.next_offset - 1)
            epochs[pid] = max(epochs.get(pid, -1), h.producer_epoch)
        for pid, batch in want.items():
            last = table.last_batch(pid)
            have = None if last is None else (last.first_sequence, last.last_offset)
            if have != batch:
                return f"producer {pid} state {have}, the batches say {batch}"
        if not use_it:
            return ""
        return usable_after_recovery(log, end)
    except Exception as exc:  # noqa: BLE001
        return f"recovered log misbehaves: {type(exc).__name__}: {exc}"
    finally:
        try:
            log.close()
        except Exception:  # noqa: BLE001 - closed above, or the violation is reported
            pass


def _floor_kept(floor: int, end: int, expected: int) -> bool:
    """The recovered catch-up floor is the expected one, or it was cleared because the
    log reaches that (known) floor again."""
    if floor == expected:
        return True
    known = expected not in (UNKNOWN, CATCH_UP_UNKNOWN)
    return floor == UNKNOWN and known and end >= expected


def _voters_problem(log: Log) -> str:
    """'' if the voters checkpoint names exactly the voters records in the log from its
    start on, else how it differs (entries below the start are the voter sets in force
    there: retention keeps one, and a crash before it forgot the rest keeps more)."""
    in_log = []
    for h in _headers(log):
        if h.is_quorum_control:
            record = decode_control(log.read(h.base_offset, 1))
            if record.key == VOTERS_KEY:
                in_log.append((h.base_offset, tuple(record.voters)))
    entries = log.voters_cache.entries
    kept = [e for e in entries if e[0] >= log.start_offset]
    if kept != in_log:
        return f"voters checkpoint {entries}, the log holds voters records {in_log}"
    return ""


def _headers(log: Log) -> Iterator[Any]:
    offset = log.start_offset
    while offset < log.end_offset:
        data = log.read(offset, 1)
        header = next(iter_batches(data))
        yield header
        offset = header.next_offset


def check_journal(directory: str, before: Snapshot, after: Snapshot) -> str:
    try:
        journal = QuorumJournal(directory)
    except Exception as exc:  # noqa: BLE001
        return f"quorum journal refused: {type(exc).__name__}: {exc}"
    try:
        states = {k: s.leader_epoch for k, s in journal.states().items()}
    finally:
        journal.close()
    for key in set(before.journal) | set(after.journal) | set(states):
        ok = {before.journal.get(key), after.journal.get(key)}
        if states.get(key) not in ok:
            return f"quorum journal {key}: epoch {states.get(key)}, expected one of {ok}"
    return ""


# -- the sweep ---------------------------------------------------------------------------


def _marks(ops: list[Any]) -> list[tuple[int, Snapshot]]:
    return [(i, op[1]) for i, op in enumerate(ops) if op[0] == "mark"]


def explore(
    seed: int,
    steps: int,
    per_point: int,
    scratch: str,
    *,
    recover_twice: int = 0,
    on_state: Callable[[], None] | None = None,
    workload_name: str = "log",
) -> SweepResult:
    """Run one recorded workload and check up to ``per_point`` crash states at every
    point of its stream. ``recover_twice``: every that-many states, the recovery itself
    is recorded and a crash at each of its points checked too."""
    result = SweepResult(workloads=1)
    root = tempfile.mkdtemp(prefix="qlwork", dir=scratch)
    rec = RecordingFileOps(root)
    previous = fileio.install(rec)
    workload: LogWorkload | CleanerWorkload = (
        CleanerWorkload(seed, root, steps)
        if workload_name == "cleaner"
        else LogWorkload(seed, root, steps)
    )
    try:
        workload.run(rec)
    finally:
        fileio.install(previous)
    rng = random.Random(seed ^ 0x5EED)
    shadow = Shadow(root)
    for op in rec.initial:
        shadow.apply(op)
    shadow.make_durable()
    marks = _marks(rec.ops)
    mark_at = 0
    calls_done = 0
    target = os.path.join(scratch, "state")
    for point, op in enumerate(rec.ops):
        shadow.apply(op)
        if op[0] == "mark":
            mark_at += 1
            calls_done = mark_at - 1
            continue
        if mark_at == 0 or mark_at >= len(marks):
            continue
        before, after = marks[mark_at - 1][1], marks[mark_at][1]
        result.points += 1
        for n, (_digest, tree) in enumerate(shadow.crash_states(rng, per_point)):
            result.states += 1
            if on_state is not None:
                on_state()
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)
            materialize(tree, target)
            problem = _check_state(target, workload, before, after, use_it=n % USE_EVERY == 0)
            if not problem and recover_twice and n % recover_twice == 0:
                problem = _recover_twice(tree, target, workload, before, after, rng, result)
            if problem:
                sizes = {k: len(v) for k, v in tree.items()}
                result.violations.append(
                    Violation(seed, point, workload.calls[: calls_done + 1], problem, sizes)
                )
                return result
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    return result


def _check_state(
    target: str,
    workload: LogWorkload | CleanerWorkload,
    before: Snapshot,
    after: Snapshot,
    *,
    use_it: bool = True,
) -> str:
    if isinstance(workload, CleanerWorkload):
        return workload.check(target, before, after, use_it=use_it)
    problem = ""
    if os.path.isdir(os.path.join(target, JOURNAL_DIR)):
        problem = check_journal(os.path.join(target, JOURNAL_DIR), before, after)
    elif before.journal:
        problem = "the quorum journal's directory is gone"
    if not problem:
        problem = check_log(
            os.path.join(target, LOG_DIR),
            workload.config,
            before,
            after,
            workload.history,
            use_it=use_it,
        )
    return problem


def _recover_twice(
    state: dict[str, bytes],
    target: str,
    workload: LogWorkload | CleanerWorkload,
    before: Snapshot,
    after: Snapshot,
    rng: random.Random,
    result: SweepResult,
) -> str:
    """A crash during recovery: record recovery of a fresh copy of ``state``, then
    check a few crash states at each of its points against the same expectations."""
    copy = target + "-r"
    shutil.rmtree(copy, ignore_errors=True)
    os.makedirs(copy)
    materialize(state, copy)
    rec = RecordingFileOps(copy)
    previous = fileio.install(rec)
    try:
        recovered = Log(
            os.path.join(copy, LOG_DIR), workload.config, files=FdCache(8), tail=TailBudget(0)
        )
        for seg in recovered._segments:  # left as a crash leaves it: nothing more written
            seg.close()
    except Exception as exc:  # noqa: BLE001
        return f"recovery failed: {exc}"
    finally:
        fileio.install(previous)
    shadow = Shadow(copy)
    for op in rec.initial:
        shadow.apply(op)
    shadow.make_durable()
    second = target + "-2"
    for op in rec.ops:
        shadow.apply(op)
        for _digest, tree in shadow.crash_states(rng, 3):
            result.states += 1
            shutil.rmtree(second, ignore_errors=True)
            os.makedirs(second)
            materialize(tree, second)
            problem = _check_state(second, workload, before, after)
            if problem:
                return "after a crash during recovery: " + problem
    shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(second, ignore_errors=True)
    return ""


def sweep(
    states: int,
    *,
    first_seed: int = 1,
    seed_step: int = 1,
    steps: int = 30,
    per_point: int = 12,
    recover_twice: int = 0,
    deadline_s: float | None = None,
    out: Callable[[str], None] | None = None,
    workload: str = "log",
) -> SweepResult:
    """Workloads from ``first_seed`` on until ``states`` crash states are checked (or
    the deadline passes, or a violation is found). ``workload``: "log", "cleaner", or
    "all" (both, for each seed)."""
    names = ["log", "cleaner"] if workload == "all" else [workload]
    total = SweepResult(workloads=0)
    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="qlcrash", dir=_scratch_root())
    seed = first_seed
    try:
        while total.states < states:
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                break
            for name in names:
                one = explore(
                    seed,
                    steps,
                    per_point,
                    scratch,
                    recover_twice=recover_twice,
                    workload_name=name,
                )
                total.workloads += 1
                total.points += one.points
                total.states += one.states
                total.violations += one.violations
                if out is not None:
                    out(
                        f"seed {seed} ({name}): {one.points} crash points, {one.states} "
                        f"states (total {total.states} in {time.monotonic() - started:.0f} s)"
                    )
                if one.violations:
                    break
            if total.violations:
                break
            seed += seed_step
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return total


def _scratch_root() -> str | None:
    """Crash states are many small files written and read once: tmpfs when there is one."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _sweep_share(share: tuple[int, int, int, argparse.Namespace]) -> SweepResult:
    states, first, step, args = share
    logging.basicConfig(level=logging.ERROR)
    return sweep(
        states,
        first_seed=first,
        seed_step=step,
        steps=args.steps,
        per_point=args.per_point,
        recover_twice=args.recover_twice,
        out=print,
        workload=args.workload,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=100_000, help="crash states to check")
    parser.add_argument("--seed", type=int, default=1, help="first workload seed")
    parser.add_argument("--steps", type=int, default=30, help="calls per workload")
    parser.add_argument("--per-point", type=int, default=12, help="states per crash point")
    parser.add_argument(
        "--recover-twice", type=int, default=25, help="every N states, crash during recovery"
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--workload",
        choices=["log", "cleaner", "all"],
        default="log",
        help="the log's calls, the cleaner's (crash_cleaner), or both for each seed",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    jobs = max(1, args.jobs)
    shares = [
        (args.states // jobs + (j < args.states % jobs), args.seed + j, jobs, args)
        for j in range(jobs)
    ]
    if jobs == 1:
        parts = [_sweep_share(shares[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            parts = pool.map(_sweep_share, shares)
    result = SweepResult(workloads=0)
    for part in parts:
        result.workloads += part.workloads
        result.points += part.points
        result.states += part.states
        result.violations += part.violations
    for v in result.violations:
        print(v)
    print(
        f"{result.workloads} workloads, {result.points} crash points, {result.states} crash "
        f"states, {len(result.violations)} violations"
    )
    print(
        json.dumps(
            {
                "workloads": result.workloads,
                "crash_points": result.points,
                "crash_states": result.states,
                "violations": len(result.violations),
            }
        )
    )
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
