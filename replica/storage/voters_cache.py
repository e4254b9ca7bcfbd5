"""The voter sets a log holds (KIP-853: a voter set is state in the log it governs) and
their ``voters-checkpoint`` file.

Each voter-set change is a control record (``VOTERS_KEY``) at some offset; the voter set
in force is the latest one in the log, committed or not (Raft's rule for single-server
changes). This cache keeps (offset, voters) for those records, as the leader-epoch cache
keeps epoch starts. Changes are rare (an operator's reassignment), so every change is
written to the checkpoint at once, and written *before* the record itself reaches the
segment: the file then names every voter record the log can hold, plus perhaps one past
its end (an append that failed or did not survive a crash), which ``truncate_from_end``
at recovery drops. Recovery also re-adds any voter record it scans past the recovery
point, so a truncation that a crash undid brings its record back with its data.

File format: a version line ``0``, a count line, then ``offset voter voter ...`` lines,
written atomically (temp + fsync + rename + directory fsync).
"""

from __future__ import annotations

import bisect
import os
import threading

from .errors import CorruptCheckpointError
from .fileutil import atomic_write

__all__ = ["VOTERS_FILE", "VotersCache"]

VOTERS_FILE = "voters-checkpoint"
_VERSION = 0


class VotersCache:
    """(offset, voters) per voter-set record, offsets strictly increasing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._offsets: list[int] = []
        self._voters: list[tuple[int, ...]] = []
        if os.path.exists(path):
            for offset, voters in _read(path):
                self._offsets.append(offset)
                self._voters.append(voters)
        self._latest = self._last_locked()

    @property
    def entries(self) -> list[tuple[int, tuple[int, ...]]]:
        with self._lock:
            return list(zip(self._offsets, self._voters, strict=True))

    @property
    def latest(self) -> tuple[int, tuple[int, ...]] | None:
        """The voter set in force and the offset of its record; None: the log holds none
        (the voters the replica was created with apply)."""
        # Read on every step of the partition's raft core: the one attribute every change
        # sets (under the lock) is read without taking the lock.
        return self._latest

    def _last_locked(self) -> tuple[int, tuple[int, ...]] | None:
        return (self._offsets[-1], self._voters[-1]) if self._offsets else None

    def assign(self, offset: int, voters: tuple[int, ...]) -> None:
        """Record the voter-set record at ``offset`` (a repeat of a known one is a no-op;
        entries at or past ``offset`` are replaced: the log was cut there)."""
        with self._lock:
            i = bisect.bisect_left(self._offsets, offset)
            if i < len(self._offsets) and self._offsets[i] == offset:
                if self._voters[i] == voters and i == len(self._offsets) - 1:
                    return
            del self._offsets[i:], self._voters[i:]
            self._offsets.append(offset)
            self._voters.append(voters)
            self._write_locked()

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget records at or above ``end_offset`` (the log was cut there)."""
        with self._lock:
            i = bisect.bisect_left(self._offsets, end_offset)
            if i < len(self._offsets):
                del self._offsets[i:], self._voters[i:]
                self._write_locked()

    def truncate_from_start(self, start_offset: int) -> None:
        """Retention moved the log start: keep the record in force there (it is the
        state the remaining log starts from, as a snapshot would carry it) and later
        ones."""
        with self._lock:
            i = bisect.bisect_right(self._offsets, start_offset) - 1
            if i > 0:
                del self._offsets[:i], self._voters[:i]
                self._write_locked()

    def clear(self) -> None:
        with self._lock:
            if self._offsets:
                self._offsets.clear()
                self._voters.clear()
                self._write_locked()

    def _write_locked(self) -> None:
        lines = [str(_VERSION), str(len(self._offsets))]
        lines += [
            " ".join(map(str, (o, *v))) for o, v in zip(self._offsets, self._voters, strict=True)
        ]
        try:
            atomic_write(self.path, ("\n".join(lines) + "\n").encode())
        finally:
            # Seen by latest once written, as a reader waiting for the lock saw it.
            self._latest = self._last_locked()


def _read(path: str) -> list[tuple[int, tuple[int, ...]]]:
    with open(path, "rb") as f:
        text = f.read().decode("ascii", errors="replace")
    lines = text.splitlines()
    try:
        if not lines or int(lines[0]) != _VERSION:
            raise ValueError(f"unsupported version line {lines[:1]!r}")
        count = int(lines[1])
        rows = [tuple(int(x) for x in line.split()) for line in lines[2 : 2 + count]]
        if len(rows) != count or any(len(r) < 2 for r in rows):
            raise ValueError("truncated")
        out = [(r[0], r[1:]) for r in rows]
        if any(a[0] >= b[0] for a, b in zip(out, out[1:], strict=False)):
            raise ValueError("offsets not increasing")
        return out
    except (ValueError, IndexError) as exc:
        raise CorruptCheckpointError(path, f"bad voters checkpoint: {exc}") from exc
