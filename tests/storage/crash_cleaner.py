"""The crash-state explorer's cleaner workload (``crash_explorer --workload cleaner``):
keyed appends with repeated keys and tombstones, control batches, flushes, cleans
(``Log.clean``: its rewrite and its swap), more appends, truncations (at or above the
cleaned end: a replica truncates only above its high watermark, which a clean never
passes) and reopens. Every crash state must recover to a log that reads as the
uncleaned or the cleaned log:

- the log opens; its records' offsets ascend, and each record is the one the workload
  wrote at that offset (before or after the call in progress): nothing renumbered;
- the latest value of each key below the recovered end is the workload's (a tombstone
  deleting its key), so no record other than a superseded version is lost and no
  deleted value comes back;
- the recovered end is at least what was reported durable;
- the recovered log takes an append, flushes and reopens clean.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from quorumlog.replica.storage import FdCache, Log, LogConfig, batches_to_table, encode_batch
from quorumlog.replica.storage.tail import TailBudget

from .helpers import usable_after_recovery

LOG_DIR = "t-0"
KEYS = [b"k%d" % i for i in range(6)]

Model = dict[int, tuple[bytes, bytes | None]]


@dataclass(frozen=True)
class CleanSnapshot:
    """What the workload knew between two calls (the log as if never cleaned)."""

    call: str
    end: int = 0
    durable: int = 0
    records: Model = field(default_factory=dict)
    journal: dict[Any, int] = field(default_factory=dict)  # none: the explorer asks


class CleanerWorkload:
    def __init__(self, seed: int, root: str, steps: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.root = root
        self.steps = steps
        self.config = LogConfig(
            segment_bytes=self.rng.choice([1500, 3000]),
            index_interval_bytes=600,
            retention_bytes=None,
            segment_ms=None,
            cleanup_policy="compact",
            delete_retention_ms=500,
        )
        self.capacity = self.rng.choice([1, 64])
        self.records: Model = {}
        self.history: dict[int, set[tuple[int, bytes]]] = {}  # the explorer's interface
        self.clock = 1_000_000
        self.gen = 0
        self.epoch = 1
        self.calls: list[str] = []

    def open_log(self) -> Log:
        return Log(
            os.path.join(self.root, LOG_DIR),
            self.config,
            files=FdCache(self.capacity),
            tail=TailBudget(0),
        )

    def snapshot(self, log: Log, call: str) -> CleanSnapshot:
        return CleanSnapshot(call, log.end_offset, log.durable_end_offset, dict(self.records))

    def run(self, rec: Any) -> None:
        rng = self.rng
        log = self.open_log()
        rec.mark(self.snapshot(log, "open"))
        for _ in range(self.steps):
            call = rng.choices(
                ["append", "tombstone", "control", "flush", "clean", "truncate", "reopen"],
                weights=[34, 5, 2, 14, 10, 3, 3],
            )[0]
            self.clock += 100
            label = call
            if call in ("append", "tombstone"):
                base = log.end_offset
                self.gen += 1
                count = 1 if call == "tombstone" else rng.randint(1, 5)
                keys = [rng.choice(KEYS) for _ in range(count)]
                values: list[bytes | None] = (
                    [None]
                    if call == "tombstone"
                    else [b"g%d-%d" % (self.gen, i) for i in range(count)]
                )
                log.append_as_leader(
                    encode_batch(values, keys=keys, timestamps=[self.clock] * count), self.epoch
                )
                for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                    self.records[base + i] = (key, value)
                label = f"{call}({count}) @{base}"
            elif call == "control":
                log.append_control(self.epoch, 1, [1, 2, 3], self.clock)
            elif call == "flush":
                log.flush()
            elif call == "clean":
                stats = log.clean(log.end_offset, None, self.clock)
                label = "clean(nothing)" if stats is None else f"clean(<{stats.cleanable_end})"
            elif call == "truncate":
                low = max(log.cleaned_end, log.start_offset)
                if log.end_offset <= low:
                    continue
                target = rng.randint(low, log.end_offset - 1)
                log.truncate_to(target)
                for offset in [o for o in self.records if o >= log.end_offset]:
                    del self.records[offset]
                self.epoch += 1
                label = f"truncate({target}) ->{log.end_offset}"
            else:
                log.close()
                log = self.open_log()
            self.calls.append(label)
            rec.mark(self.snapshot(log, label))
        log.close()
        self.calls.append("close")
        rec.mark(self.snapshot(log, "close"))

    def check(self, directory: str, before: Any, after: Any, *, use_it: bool = True) -> str:
        return check_cleaned_log(
            os.path.join(directory, LOG_DIR), self.config, before, after, use_it=use_it
        )


def _latest(records: Model, start: int, end: int) -> dict[bytes, bytes]:
    last: dict[bytes, bytes | None] = {}
    for offset in sorted(records):
        if start <= offset < end:
            key, value = records[offset]
            last[key] = value
    return {k: v for k, v in last.items() if v is not None}


def _read(log: Log) -> list[tuple[int, bytes, bytes | None]]:
    out: list[tuple[int, bytes, bytes | None]] = []
    offset = log.start_offset
    for _ in range(100_000):
        if offset >= log.end_offset:
            break
        data = log.read(offset, 1 << 20)
        if not data:
            break
        table = batches_to_table(data, include_control=True)
        offsets = table.column("offset").to_pylist()
        data_rows = batches_to_table(data)
        out.extend(
            zip(
                data_rows.column("offset").to_pylist(),
                data_rows.column("key").to_pylist(),
                data_rows.column("value").to_pylist(),
                strict=True,
            )
        )
        offset = offsets[-1] + 1
    return out


def _against(
    got: list[tuple[int, bytes, bytes | None]], start: int, end: int, snap: CleanSnapshot
) -> str:
    for offset, key, value in got:
        if snap.records.get(offset) != (key, value):
            return f"offset {offset} holds {(key, value)}, {snap.call!r} had {snap.records.get(offset)}"
    have = _latest({o: (k, v) for o, k, v in got}, start, end)
    want = _latest(snap.records, start, end)
    if have != want:
        return f"latest values in [{start}, {end}): {have}, {snap.call!r} says {want}"
    return ""


def check_cleaned_log(
    directory: str, config: LogConfig, before: CleanSnapshot, after: CleanSnapshot, *, use_it: bool
) -> str:
    try:
        log = Log(directory, config, files=FdCache(8), tail=TailBudget(0))
    except Exception as exc:  # noqa: BLE001 - any refusal is the violation
        return f"recovery failed: {type(exc).__name__}: {exc}"
    try:
        got = _read(log)
        end = log.end_offset
        offsets = [o for o, _, _ in got]
        if offsets != sorted(set(offsets)):
            return f"offsets not ascending: {offsets}"
        durable = min(before.durable, after.end)
        start = log.start_offset
        if end < durable or (start > 0 and durable > 0):
            return f"the log is [{start}, {end}), the durable end was {durable}"
        reasons = [_against(got, start, end, before), _against(got, start, end, after)]
        if all(reasons):
            return " / ".join(reasons)
        if not use_it:
            return ""
        return usable_after_recovery(log, end, b"z")
    except Exception as exc:  # noqa: BLE001
        return f"recovered log misbehaves: {type(exc).__name__}: {exc}"
    finally:
        try:
            log.close()
        except Exception:  # noqa: BLE001 - closed above, or the violation is reported
            pass
