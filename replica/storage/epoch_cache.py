"""The leader-epoch cache (KIP-101) and its ``leader-epoch-checkpoint`` file.

Semantics follow Kafka's LeaderEpochFileCache. File format: a version line ``0``, a
count line, then ``epoch start_offset`` lines, written atomically (temp + fsync + rename
+ directory fsync).

Thread-safety: mutations and lookups take an internal lock, so one thread may write the
checkpoint (``flush``) while another appends entries.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading

from ..constants import UNKNOWN
from . import fileio
from .errors import CorruptCheckpointError
from .fileutil import atomic_write, write_all
from .types import EpochEndOffset, OffsetAndEpoch

__all__ = ["CHECKPOINT_FILE", "LeaderEpochCache"]

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
_VERSION = 0


class LeaderEpochCache:
    """Epoch -> start offset entries, epochs and start offsets strictly increasing.

    By default every change is written to the checkpoint at once (``auto_flush``). The
    log turns that off and writes the checkpoint in its group-commit ``flush`` instead
    (its recovery rebuilds entries for the unflushed tail from batch headers)."""

    def __init__(self, path: str, *, auto_flush: bool = True) -> None:
        self.path = path
        self._auto_flush = auto_flush
        self._lock = threading.RLock()
        self._epochs: list[int] = []
        self._starts: list[int] = []
        self._dirty = False
        if os.path.exists(path):
            for epoch, start in read_checkpoint(path):
                self._epochs.append(epoch)
                self._starts.append(start)
        self._latest = self._epochs[-1] if self._epochs else UNKNOWN

    # -- queries ---------------------------------------------------------------------

    @property
    def entries(self) -> list[OffsetAndEpoch]:
        """(start_offset, epoch) per entry, oldest first."""
        with self._lock:
            return [OffsetAndEpoch(s, e) for e, s in zip(self._epochs, self._starts, strict=True)]

    @property
    def latest_epoch(self) -> int:
        # Read several times an append: the one attribute every change sets (under the
        # lock, in _changed) is read without taking the lock.
        return self._latest

    @property
    def dirty(self) -> bool:
        return self._dirty

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Kafka's endOffsetFor: latest epoch -> (epoch, log end offset); otherwise
        (largest epoch <= requested, start offset of the first higher epoch); requested
        below every epoch -> (requested, first start offset); requested above every
        epoch, UNKNOWN, or no entries -> (UNKNOWN, UNKNOWN)."""
        with self._lock:
            if epoch == UNKNOWN or not self._epochs:
                return EpochEndOffset(UNKNOWN, UNKNOWN)
            if epoch == self._epochs[-1]:
                return EpochEndOffset(epoch, log_end_offset)
            higher = bisect.bisect_right(self._epochs, epoch)
            if higher == len(self._epochs):
                return EpochEndOffset(UNKNOWN, UNKNOWN)
            if higher == 0:
                return EpochEndOffset(epoch, self._starts[0])
            return EpochEndOffset(self._epochs[higher - 1], self._starts[higher])

    def epoch_for_offset(self, offset: int) -> int:
        """Epoch of the entry covering ``offset`` (UNKNOWN before the first)."""
        with self._lock:
            index = bisect.bisect_right(self._starts, offset)
            return self._epochs[index - 1] if index else UNKNOWN

    # -- mutations -------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``. As Kafka: a no-op when
        ``epoch`` is the latest epoch and the offset is not below its start; otherwise
        entries with an epoch >= ``epoch`` or a start offset >= ``start_offset`` are
        removed first (they are not monotonic with the new entry). Returns whether the
        cache changed."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid epoch entry ({epoch}, {start_offset})")
        with self._lock:
            if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
                return False
            removed: list[tuple[int, int]] = []
            while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
                removed.append((self._epochs.pop(), self._starts.pop()))
            if removed:
                log.warning(
                    "%s: new epoch entry (%d, %d) removes non-monotonic entries %s",
                    self.path,
                    epoch,
                    start_offset,
                    removed,
                )
            self._epochs.append(epoch)
            self._starts.append(start_offset)
            self._changed()
            return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove entries starting at or after ``end_offset`` (log truncated there)."""
        with self._lock:
            if end_offset < 0 or not self._starts or self._starts[-1] < end_offset:
                return
            index = bisect.bisect_left(self._starts, end_offset)
            del self._epochs[index:]
            del self._starts[index:]
            self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: drop entries wholly before it and move
        the start of the entry covering it up to ``start_offset`` (Kafka semantics)."""
        with self._lock:
            if start_offset < 0 or not self._starts or self._starts[0] >= start_offset:
                return
            covering = bisect.bisect_right(self._starts, start_offset) - 1
            epoch = self._epochs[covering]
            del self._epochs[: covering + 1]
            del self._starts[: covering + 1]
            self._epochs.insert(0, epoch)
            self._starts.insert(0, start_offset)
            self._changed()

    def clear(self) -> None:
        with self._lock:
            if self._epochs:
                self._epochs.clear()
                self._starts.clear()
                self._changed()

    def flush(self) -> None:
        """Write the checkpoint atomically (whether or not anything changed)."""
        # Written outside the lock: only the log's flush/truncate paths (which are
        # serialised by the log) write the file, so appends never wait on its fsync.
        atomic_write(self.path, self._content())

    def _content(self) -> bytes:
        with self._lock:
            lines = [str(_VERSION), str(len(self._epochs))]
            lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts, strict=True)]
            self._dirty = False
        return ("\n".join(lines) + "\n").encode()

    def stage(self) -> str | None:
        """For a group flush: write the changed checkpoint to a temporary file, not
        synced; the caller syncs the filesystem, then ``commit_staged`` renames it (and
        syncs again). None if nothing changed. A crash leaves the old checkpoint (the
        temporary file is removed at the next open)."""
        if not self._dirty:
            return None
        tmp = self.path + ".tmp"
        fd = fileio.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, self._content())
        finally:
            fileio.close(fd)
        return tmp

    def commit_staged(self, tmp: str) -> None:
        fileio.replace(tmp, self.path)

    def unstage(self) -> None:
        """The filesystem sync failed: the next flush writes the checkpoint itself."""
        self._dirty = True

    def _changed(self) -> None:
        """Under the lock, after every change of the entries."""
        self._latest = self._epochs[-1] if self._epochs else UNKNOWN
        self._dirty = True
        if self._auto_flush:
            self.flush()


def read_checkpoint(path: str) -> list[tuple[int, int]]:
    """Parse a leader-epoch-checkpoint file; CorruptCheckpointError names the file."""
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read()
        lines = text.split("\n")
        if lines[-1] != "":
            raise ValueError("missing final newline")
        lines.pop()
        if len(lines) < 2 or int(lines[0]) != _VERSION:
            raise ValueError("bad version line")
        count = int(lines[1])
        if count != len(lines) - 2:
            raise ValueError(f"count line says {count} entries, found {len(lines) - 2}")
        entries: list[tuple[int, int]] = []
        for line in lines[2:]:
            epoch_text, start_text = line.split(" ")
            epoch, start = int(epoch_text), int(start_text)
            if epoch < 0 or start < 0:
                raise ValueError(f"negative entry {line!r}")
            if entries and (epoch <= entries[-1][0] or start <= entries[-1][1]):
                raise ValueError(f"entry {line!r} is not increasing")
            entries.append((epoch, start))
        return entries
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpointError(f"corrupt leader epoch checkpoint {path}: {exc}") from exc
