"""One segment file ``<20-digit base offset>.log`` and its sparse offset index.

The index is kept in memory while a segment is active. It is written to
``<base>.index`` (atomically, with a CRC trailer) when the segment is sealed and has been
fsync'd, and for the active segment on clean close, so a valid index file means "this
segment's bytes are durable and need no recovery scan". Entries are
``(relative offset u32, position u32, max timestamp so far i64)``; a written index always
has an entry for the segment's last batch, which is what lets open check it against the
segment file with a single header read.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
from array import array
from contextlib import AbstractContextManager

from . import fileio
from .crc import crc32
from .errors import CorruptRecordError, StorageError
from .fdcache import FdCache
from .records import HEADER_SIZE, BatchHeader, parse_header

__all__ = ["Segment", "index_path", "log_path"]

_ENTRY = struct.Struct("<IIq")
_TRAILER = struct.Struct("<4sI")
_INDEX_MAGIC = b"QLIX"
_PLEN = struct.Struct("<I")
_PLEN_AT = 32  # payload_length within the header


def log_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, f"{base_offset:020d}.log")


def index_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, f"{base_offset:020d}.index")


class Segment:
    """Mutable state of one segment. Not thread-safe by itself; the Log serialises use.

    The file's descriptor lives in the node-wide ``FdCache``: it is used only inside
    ``pin`` (or the helpers below, which pin), opened on demand and closed when idle
    and the cache is full. The file is opened with O_APPEND, so writes through a
    reopened descriptor still land at the end."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        create: bool,
        files: FdCache,
        later: bool = False,
        suffix: str = "",
    ) -> None:
        """``create``: a new file; ``later`` with it: created by its first use (the
        first segment of a log not written yet, whose directory may not exist yet).
        ``suffix``: after both file names (a segment the cleaner writes before it swaps
        it in)."""
        self.base_offset = base_offset
        self.path = log_path(directory, base_offset) + suffix
        self.index_path = index_path(directory, base_offset) + suffix
        self._files = files
        if not create:
            self._file = files.handle(self.path)
        elif later:
            self._file = files.create_later(self.path)
        else:
            self._file = files.create(self.path)
        self.size = 0
        self.synced_size = 0
        self.end_offset = base_offset
        self.max_timestamp = -1
        self.last_batch_position = -1
        self.index_durable = False
        self.created_monotonic = time.monotonic()
        self._bytes_since_entry = 0
        self._offsets = array("q")  # absolute base offsets of indexed batches
        self._positions = array("q")
        self._max_ts = array("q")

    # -- the file ------------------------------------------------------------------------

    def pin(self, *, write: bool = False) -> AbstractContextManager[int]:
        """``with seg.pin() as fd``: the descriptor, valid until the block ends."""
        return self._files.pin(self._file, write=write)

    def pread(self, size: int, position: int) -> bytes:
        with self._files.pin(self._file) as fd:
            return fileio.pread(fd, size, position)

    def file_size(self) -> int:
        with self._files.pin(self._file) as fd:
            return os.fstat(fd).st_size

    def truncate_file(self, position: int) -> None:
        """Cut the file at ``position`` and fsync it."""
        with self._files.pin(self._file, write=True) as fd:
            fileio.ftruncate(fd, position)
            fileio.fsync(fd)
        # Only the owner thread writes, so nothing was written since the fsync.
        self._files.finish_sync(self._file, self._files.generation(self._file))

    def sync(self) -> None:
        """fdatasync what was written since the last sync (nothing to do if the cache
        closed the file since: it synced it first). Raises StorageError."""
        self._files.sync(self._file)

    def drop_cached(self, length: int) -> None:
        """Drop the page-cache pages of the file's first ``length`` bytes (synced ones:
        the kernel keeps dirty pages). Advice: a file that cannot be opened (deleted by
        retention meanwhile) is left as it is."""
        try:
            with self._files.pin(self._file) as fd:
                fileio.drop_cached(fd, length)
        except (OSError, StorageError):
            pass

    def sync_now(self) -> None:
        """fdatasync the file whatever was written through this process (recovery: what
        an earlier process wrote may not be on the disk yet)."""
        with self._files.pin(self._file) as fd:
            fileio.fdatasync(fd)

    def sync_generation(self) -> int:
        """Pass to ``finish_sync`` once a sync started after this call has succeeded."""
        return self._files.generation(self._file)

    def finish_sync(self, generation: int) -> None:
        self._files.finish_sync(self._file, generation)

    # -- building --------------------------------------------------------------------

    def reset_index(self) -> None:
        self._offsets = array("q")
        self._positions = array("q")
        self._max_ts = array("q")
        self._bytes_since_entry = 0
        self.size = 0
        self.end_offset = self.base_offset
        self.max_timestamp = -1
        self.last_batch_position = -1

    def track(
        self,
        position: int,
        base_offset: int,
        next_offset: int,
        size: int,
        max_ts: int,
        interval: int,
    ) -> None:
        """Record a batch written at ``position`` (in order)."""
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        if not self._offsets or self._bytes_since_entry >= interval:
            self._offsets.append(base_offset)
            self._positions.append(position)
            self._max_ts.append(self.max_timestamp)
            self._bytes_since_entry = 0
        self._bytes_since_entry += size
        self.last_batch_position = position
        self.size = position + size
        self.end_offset = next_offset

    # -- lookups ---------------------------------------------------------------------

    def header_at(self, position: int) -> BatchHeader:
        raw = self.pread(HEADER_SIZE, position)
        header = parse_header(raw, 0)
        return header._replace(position=position)

    def locate(self, offset: int) -> BatchHeader:
        """Header of the batch holding ``offset`` (base_offset <= offset < end_offset)."""
        index = bisect.bisect_right(self._offsets, offset) - 1
        position = self._positions[index] if index >= 0 else 0
        while True:
            header = self.header_at(position)
            if header.next_offset > offset:
                return header
            position = header.end
            if position >= self.size:
                raise CorruptRecordError(f"{self.path}: offset {offset} not found")

    def locate_lenient(self, offset: int) -> BatchHeader:
        """``locate``, except that a damaged header met on the way at the batch that
        would hold ``offset`` is returned as a stand-in (its position, base offset =
        the offset the walk expected there): what truncating at damage needs."""
        index = bisect.bisect_right(self._offsets, offset) - 1
        position = self._positions[index] if index >= 0 else 0
        expected = self._offsets[index] if index >= 0 else self.base_offset
        while position < self.size:
            try:
                header = self.header_at(position)
            except CorruptRecordError:
                if expected <= offset:
                    return BatchHeader(position, expected, 0, 1, -1, 8, 0, 0)
                raise
            if header.next_offset > offset:
                return header
            position, expected = header.end, header.next_offset
        raise CorruptRecordError(f"{self.path}: offset {offset} not found")

    def index_floor(self, offset: int) -> tuple[int, int]:
        """(position, base offset) of the nearest index entry at or below ``offset``."""
        index = bisect.bisect_right(self._offsets, offset) - 1
        if index < 0:
            return 0, self.base_offset
        return self._positions[index], self._offsets[index]

    def boundary_before(self, start: int, target: int) -> int:
        """Largest batch boundary in [start, target], ``start`` being a boundary. Walks
        headers from the nearest index entry, so at most an index interval's worth."""
        index = bisect.bisect_right(self._positions, target) - 1
        cursor = max(start, self._positions[index] if index >= 0 else 0)
        while cursor < target:
            raw = self.pread(HEADER_SIZE, cursor)
            if len(raw) < HEADER_SIZE:
                break
            end = cursor + HEADER_SIZE + _PLEN.unpack_from(raw, _PLEN_AT)[0]
            if end > target:
                break
            cursor = end
        return cursor

    # -- index file ------------------------------------------------------------------

    def index_bytes(self) -> bytes:
        """The index with an entry for the last batch (what a sealed segment stores)."""
        offsets, positions, max_ts = list(self._offsets), list(self._positions), list(self._max_ts)
        if self.last_batch_position >= 0 and positions[-1] != self.last_batch_position:
            offsets.append(self.header_at(self.last_batch_position).base_offset)
            positions.append(self.last_batch_position)
            max_ts.append(self.max_timestamp)
        body = b"".join(
            _ENTRY.pack(o - self.base_offset, p, t)
            for o, p, t in zip(offsets, positions, max_ts, strict=True)
        )
        return body + _TRAILER.pack(_INDEX_MAGIC, crc32(body))

    def load_index(self) -> bool:
        """Trust the index file if it is intact and matches the segment file exactly;
        return False (leaving the segment empty) when it is missing or does not."""
        self.reset_index()
        try:
            with open(self.index_path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return False
        body_len = len(raw) - _TRAILER.size
        if body_len < 0 or body_len % _ENTRY.size:
            return False
        magic, crc = _TRAILER.unpack_from(raw, body_len)
        if magic != _INDEX_MAGIC or crc32(memoryview(raw)[:body_len]) != crc:
            return False
        file_size = self.file_size()
        entries = list(_ENTRY.iter_unpack(memoryview(raw)[:body_len]))
        if not entries:
            return file_size == 0
        last_rel, last_pos, last_ts = entries[-1]
        if entries[0][1] != 0 or any(
            a[0] >= b[0] or a[1] >= b[1] for a, b in zip(entries, entries[1:], strict=False)
        ):
            return False
        try:
            last = self.header_at(last_pos)
        except CorruptRecordError:
            return False
        if last.base_offset != self.base_offset + last_rel or last.end != file_size:
            return False
        for rel, pos, ts in entries:
            self._offsets.append(self.base_offset + rel)
            self._positions.append(pos)
            self._max_ts.append(ts)
        self.size = self.synced_size = file_size
        self.end_offset = last.next_offset
        self.max_timestamp = last_ts
        self.last_batch_position = last_pos
        self._bytes_since_entry = last.size
        return True

    def truncate_index(self, position: int) -> None:
        """Drop in-memory state for batches at or past ``position`` (a batch boundary)
        and rebuild the tail from the last kept index entry."""
        keep = bisect.bisect_left(self._positions, position)
        start = self._positions[keep - 1] if keep else 0
        offsets, positions, max_ts = (
            self._offsets[:keep],
            self._positions[:keep],
            self._max_ts[:keep],
        )
        self.reset_index()
        self._offsets, self._positions, self._max_ts = offsets, positions, max_ts
        if keep:
            self.max_timestamp = max_ts[-1]
            self._bytes_since_entry = 0
        cursor = start
        while cursor < position:
            header = self.header_at(cursor)
            if max_ts and cursor == positions[-1]:
                self.last_batch_position = cursor
                self._bytes_since_entry = header.size
                self.size = header.end
                self.end_offset = header.next_offset
            else:
                self.track(
                    cursor,
                    header.base_offset,
                    header.next_offset,
                    header.size,
                    header.max_timestamp,
                    1 << 62,
                )
            cursor = header.end
        self.size = position
        self.synced_size = min(self.synced_size, position)

    def close(self) -> None:
        """Let go of the file (no sync: the log synced what it needs, or is deleting or
        abandoning the file)."""
        self._files.release(self._file)
