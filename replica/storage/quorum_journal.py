"""The quorum-state journal: the election state of every replica a node hosts, in one
append-only file per data directory, ``<data>/quorum-journal``, made durable with one
fdatasync per write however many replicas it covers (10,000 partitions electing at once
cost one fsync, not 10,000 temp-file + rename + directory-fsync rounds).

The file is a sequence of frames, one per ``write_many`` / ``forget_many`` call::

    offset  size  field
       0     4    magic    b"QLQJ"
       4     4    length   u32 LE, bytes of payload
       8     4    crc      u32 LE, CRC32C of bytes [4, 8) (the length) and the payload
      12   length payload:
                    u8  format version (1)
                    u32 entry count
                    entries, each:
                      u8  kind: 1 state, 0 tombstone (a deleted topic's replica)
                      u16 topic length, topic (UTF-8), i32 partition
                      state only: i64 leader_epoch, i32 leader_id, i32 voted_id,
                                  u16 voter count, i32 per voter,
                                  u32 extra length, extra (JSON object; empty: {})

All integers are little-endian. One CRC per write, not per entry: the entries of one write
become durable together at its one fdatasync, and a crash during it may leave any subset
of its pages on disk. So only the last frame can be torn, and a bad frame followed by a
valid one is damage, never a crash.

Replay, at open: frames in order, entries in order, the last entry per (topic, partition)
wins; a tombstone removes the key. A frame that fails (magic, a length below the smallest
payload or past the end of the file, CRC) with no valid frame anywhere after it is a torn
tail: the file is truncated there (fsync'd) and a warning logged. With a valid frame after
it, it is damage: ``CorruptCheckpointError`` names the file and position, and the node
does not start (a forgotten vote could be granted twice in one epoch). A frame in a newer
format version raises ``UnsupportedFormatError`` and truncates nothing. Lengths are only
checked against the bytes read (the whole file, which compaction keeps small), so a lying
length field allocates nothing.

Compaction: when the file holds more than ``COMPACT_RATIO`` x the live entries and more
than ``COMPACT_MIN_BYTES``, a write rewrites the live states (its own included) as one
frame with ``atomic_write`` (temp + fsync + rename + directory fsync) instead of
appending, and later writes append to the new file. Tombstones are dropped there.

Exclusive to one process: the node holds the data directory's lock (``.lock``)."""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterable
from typing import Any

from crc32c import crc32c

from . import fileio
from .errors import CorruptCheckpointError, StorageError, UnsupportedFormatError
from .fileutil import atomic_write, fsync_dir
from .quorum_state import QuorumState

__all__ = [
    "COMPACT_MIN_BYTES",
    "COMPACT_RATIO",
    "QUORUM_JOURNAL_FILE",
    "JournalKey",
    "QuorumJournal",
]

log = logging.getLogger(__name__)

QUORUM_JOURNAL_FILE = "quorum-journal"
# Compact when the file holds more than this many entries per live key...
COMPACT_RATIO = 4
# ...and is larger than this (10,000 live states take about 0.5 MiB).
COMPACT_MIN_BYTES = 1 << 20

JournalKey = tuple[str, int]

MAGIC = b"QLQJ"
_VERSION = 1
_FRAME = struct.Struct("<4sII")  # magic, payload length, crc
_PAYLOAD_HEAD = struct.Struct("<BI")  # version, entry count
_KEY = struct.Struct("<BH")  # kind, topic length (then topic, then _PARTITION)
_PARTITION = struct.Struct("<i")
_STATE = struct.Struct("<qiiH")  # leader_epoch, leader_id, voted_id, voter count
_EXTRA_LEN = struct.Struct("<I")
_STATE_KIND = 1
_TOMBSTONE_KIND = 0


class QuorumJournal:
    """The node's quorum-state journal in ``directory`` (created if absent), replayed at
    construction. ``write_many`` and ``forget_many`` return once durable; after a failed
    fsync every further write raises (the kernel may have dropped the unwritten pages, so
    a retry could report durable what is not)."""

    def __init__(
        self,
        directory: str,
        *,
        compact_ratio: int = COMPACT_RATIO,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
    ) -> None:
        self.path = os.path.join(directory, QUORUM_JOURNAL_FILE)
        self.compact_ratio = compact_ratio
        self.compact_min_bytes = compact_min_bytes
        self._states: dict[JournalKey, QuorumState] = {}
        self._entries = 0  # entries in the file, superseded ones and tombstones included
        self._failed: BaseException | None = None
        self.compactions = 0  # since open
        # Durable at once: the journal's states are only as durable as its directory.
        fileio.makedirs(directory, durable=True)
        try:
            fileio.unlink(self.path + ".tmp")  # a compaction cut short: the old file stands
        except FileNotFoundError:
            pass
        created = not os.path.exists(self.path)
        self._fd = fileio.open_file(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if created:
                fsync_dir(directory)
            self._size = self._replay()
        except BaseException:
            fileio.close(self._fd)
            raise

    # ------------------------------------------------------------------ reading
    def get(self, key: JournalKey) -> QuorumState | None:
        return self._states.get(key)

    def states(self) -> dict[JournalKey, QuorumState]:
        """A copy of every live state."""
        return dict(self._states)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def __len__(self) -> int:
        return len(self._states)

    @property
    def size(self) -> int:
        """Bytes in the file."""
        return self._size

    # ------------------------------------------------------------------ writing
    def write(self, key: JournalKey, state: QuorumState) -> None:
        self.write_many([(key, state)])

    def write_many(self, items: Iterable[tuple[JournalKey, QuorumState]]) -> None:
        """Record every state (the last one per key wins) with one fdatasync; a crash
        leaves, for each key, the old state or the new one."""
        self._write([(key, state) for key, state in items])

    def forget(self, key: JournalKey) -> None:
        self.forget_many([key])

    def forget_many(self, keys: Iterable[JournalKey]) -> None:
        """Drop the states of replicas that are gone (a deleted topic's), durably."""
        self._write([(key, None) for key in keys if key in self._states])

    def close(self) -> None:
        if self._fd >= 0:
            fileio.close(self._fd)
            self._fd = -1

    def _write(self, entries: list[tuple[JournalKey, QuorumState | None]]) -> None:
        if not entries:
            return
        if self._fd < 0:
            raise StorageError(f"{self.path}: the quorum journal is closed")
        if self._failed is not None:
            raise StorageError(
                f"{self.path}: an earlier write failed ({self._failed}); "
                "no further election state can be made durable"
            )
        frame = _encode_frame(entries)
        # The states after this write, counted without copying them all (a node hosting
        # thousands of replicas writes a few at a time).
        updates = dict(entries)
        live = len(self._states)
        for key, state in updates.items():
            live += (state is not None) - (key in self._states)
        entries_after = self._entries + len(entries)
        if self._compaction_due(self._size + len(frame), entries_after, live):
            states = dict(self._states)
            _apply(states, updates)
            self._compact(states)
            return
        try:
            _write_all(self._fd, frame, self._size)
        except OSError as exc:
            self._undo_append(exc)
            raise
        self._sync()
        self._size += len(frame)
        self._entries = entries_after
        _apply(self._states, updates)

    def _compaction_due(self, size: int, entries: int, live: int) -> bool:
        return size > self.compact_min_bytes and entries > self.compact_ratio * max(1, live)

    def _compact(self, states: dict[JournalKey, QuorumState]) -> None:
        items: list[tuple[JournalKey, QuorumState | None]] = list(states.items())
        data = _encode_frame(items) if items else b""
        before = self._size
        try:
            atomic_write(self.path, data)
            fd = fileio.open_file(self.path, os.O_RDWR)
        except OSError as exc:
            # Before or after the rename, the file holds the old states or the new ones;
            # but our descriptor may point at the replaced file, so no write goes on.
            self._failed = exc
            raise
        fileio.close(self._fd)
        self._fd = fd
        self._size = len(data)
        self._entries = len(items)
        self._states = states
        self.compactions += 1
        log.info(
            "%s: compacted %d bytes to %d (%d live states)",
            self.path,
            before,
            len(data),
            len(items),
        )

    def _sync(self) -> None:
        try:
            fileio.fdatasync(self._fd)
        except OSError as exc:
            self._failed = exc
            raise

    def _undo_append(self, exc: OSError) -> None:
        """A short or failed write: cut it off, so that the file ends at its last whole
        frame and the next write starts there."""
        try:
            fileio.ftruncate(self._fd, self._size)
        except OSError:
            self._failed = exc

    # ------------------------------------------------------------------ replaying
    def _replay(self) -> int:
        """Read the file, fill ``_states``, cut a torn tail; returns the valid length."""
        data = _read_all(self._fd)
        position = 0
        total = len(data)
        while position < total:
            payload, reason = _frame_at(data, position)
            if payload is None:
                follower = _find_valid_frame(data, position + 1)
                if follower is not None:
                    raise CorruptCheckpointError(
                        f"corrupt quorum journal {self.path} at position {position}: "
                        f"{reason}; a valid frame follows at position {follower}, so this is "
                        "not a torn write but damage. The replica election states written "
                        "there are lost; restore this data directory from a replica."
                    )
                log.warning(
                    "%s: torn tail at position %d (%s): truncating %d bytes",
                    self.path,
                    position,
                    reason,
                    total - position,
                )
                fileio.ftruncate(self._fd, position)
                fileio.fsync(self._fd)
                return position
            try:
                entries = _decode_payload(payload)
            except (ValueError, struct.error, UnicodeDecodeError) as exc:
                raise CorruptCheckpointError(
                    f"corrupt quorum journal {self.path} at position {position}: "
                    f"frame passes its CRC but does not decode: {exc}"
                ) from exc
            except UnsupportedFormatError as exc:
                raise UnsupportedFormatError(
                    f"{self.path} at position {position}: {exc}; nothing was changed "
                    "(run the version that wrote it)"
                ) from None
            _apply(self._states, dict(entries))
            self._entries += len(entries)
            position += _FRAME.size + len(payload)
        return position


# ---------------------------------------------------------------------- the format
def _encode_frame(entries: list[tuple[JournalKey, QuorumState | None]]) -> bytes:
    parts = [_PAYLOAD_HEAD.pack(_VERSION, len(entries))]
    for (topic, partition), state in entries:
        name = topic.encode()
        if state is None:
            parts += [_KEY.pack(_TOMBSTONE_KIND, len(name)), name, _PARTITION.pack(partition)]
            continue
        extra = json.dumps(state.extra, sort_keys=True).encode() if state.extra else b""
        parts += [
            _KEY.pack(_STATE_KIND, len(name)),
            name,
            _PARTITION.pack(partition),
            _STATE.pack(state.leader_epoch, state.leader_id, state.voted_id, len(state.voters)),
            struct.pack(f"<{len(state.voters)}i", *state.voters),
            _EXTRA_LEN.pack(len(extra)),
            extra,
        ]
    payload = b"".join(parts)
    length = struct.pack("<I", len(payload))
    return MAGIC + length + struct.pack("<I", crc32c(payload, crc32c(length))) + payload


def _frame_at(data: bytes, position: int) -> tuple[bytes | None, str]:
    """The payload of the intact frame at ``position``, or None and why not."""
    if len(data) - position < _FRAME.size:
        return None, "incomplete frame header"
    magic, length, crc = _FRAME.unpack_from(data, position)
    if magic != MAGIC:
        return None, f"bad magic {magic!r}"
    if length < _PAYLOAD_HEAD.size:
        return None, f"length {length} is below the smallest payload"
    start = position + _FRAME.size
    if length > len(data) - start:
        return None, f"length {length} runs past the end of the file ({len(data)} bytes)"
    payload = data[start : start + length]
    if crc32c(payload, crc32c(data[position + 4 : position + 8])) != crc:
        return None, "CRC32C mismatch"
    return payload, ""


def _find_valid_frame(data: bytes, start: int) -> int | None:
    found = data.find(MAGIC, start)
    while found >= 0:
        if _frame_at(data, found)[0] is not None:
            return found
        found = data.find(MAGIC, found + 1)
    return None


def _decode_payload(payload: bytes) -> list[tuple[JournalKey, QuorumState | None]]:
    version, count = _PAYLOAD_HEAD.unpack_from(payload, 0)
    if version != _VERSION:
        raise UnsupportedFormatError(f"quorum journal format version {version}")
    pos = _PAYLOAD_HEAD.size
    out: list[tuple[JournalKey, QuorumState | None]] = []
    for _ in range(count):
        kind, name_len = _KEY.unpack_from(payload, pos)
        pos += _KEY.size
        topic = _take(payload, pos, name_len).decode()
        pos += name_len
        (partition,) = _PARTITION.unpack_from(payload, pos)
        pos += _PARTITION.size
        if kind == _TOMBSTONE_KIND:
            out.append(((topic, partition), None))
            continue
        if kind != _STATE_KIND:
            raise ValueError(f"unknown entry kind {kind}")
        epoch, leader_id, voted_id, n_voters = _STATE.unpack_from(payload, pos)
        pos += _STATE.size
        voters = struct.unpack_from(f"<{n_voters}i", payload, pos)
        pos += 4 * n_voters
        (extra_len,) = _EXTRA_LEN.unpack_from(payload, pos)
        pos += _EXTRA_LEN.size
        extra: Any = json.loads(_take(payload, pos, extra_len)) if extra_len else {}
        pos += extra_len
        if not isinstance(extra, dict):
            raise ValueError(f"extra is not an object: {extra!r}")
        out.append(((topic, partition), QuorumState(epoch, leader_id, voted_id, voters, extra)))
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} bytes after the last entry")
    return out


def _take(payload: bytes, pos: int, n: int) -> bytes:
    if n > len(payload) - pos:
        raise ValueError(f"a field of {n} bytes runs past the frame")
    return payload[pos : pos + n]


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks = []
    position = 0
    while position < size:
        chunk = fileio.pread(fd, size - position, position)
        if not chunk:
            break
        chunks.append(chunk)
        position += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = fileio.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _apply(
    states: dict[JournalKey, QuorumState], updates: dict[JournalKey, QuorumState | None]
) -> None:
    """Set each updated state; None forgets the key."""
    for key, state in updates.items():
        if state is None:
            states.pop(key, None)
        else:
            states[key] = state
