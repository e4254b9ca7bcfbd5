"""Storage errors. Each message names the file (and offset/position) involved."""

from __future__ import annotations

__all__ = [
    "CorruptCheckpointError",
    "CorruptDataError",
    "CorruptLogError",
    "CorruptRecordError",
    "DiskError",
    "OffsetOutOfRangeError",
    "StorageError",
    "UnsupportedFormatError",
]


class StorageError(Exception):
    """Base class of every error raised by ``replica.storage``."""


class DiskError(StorageError):
    """The disk refused a write (``errno``: ENOSPC when full, EIO when failing). Nothing
    of the failed write is in the log: it was cut back to where it was. The replica stops
    writing for a while and hands over any leadership (``RaftReplica.on_disk_fault``);
    it writes again once the disk takes a write."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(f"{path}: cannot write: {cause.strerror or cause}")
        self.path = path
        self.errno = cause.errno
        self._cause = cause

    def __reduce__(self) -> tuple[type[DiskError], tuple[str, OSError]]:
        return DiskError, (self.path, self._cause)  # crosses process pools whole


class UnsupportedFormatError(StorageError):
    """Bytes in a format this version does not read (not damage: nothing is truncated
    for it; the replica refuses to open instead)."""


class CorruptRecordError(StorageError, ValueError):
    """A batch failed its header or payload check (bad magic, CRC, or sanity)."""


class CorruptLogError(StorageError):
    """Valid batches follow a corrupt one inside a segment: data in the middle of the log
    is damaged. Recovery refuses to truncate good data silently; open with
    ``repair=True`` to truncate at the corrupt batch instead."""

    def __init__(self, path: str, offset: int, position: int, reason: str) -> None:
        super().__init__(
            f"corrupt batch in {path} at position {position} (expected offset {offset}): "
            f"{reason}; valid batches follow it, so this is not a torn tail. "
            "Restore the replica from another one, or reopen with repair=True to "
            "truncate the log at this offset."
        )
        self.path = path
        self.offset = offset
        self.position = position


class CorruptDataError(StorageError):
    """Bytes already in the log fail their batch checks (header or payload CRC, bad
    magic, a length that does not fit): latent corruption found by a read, a scrub or
    recovery. ``offset`` is where the damage starts: the log is intact below it, so the
    replica truncates there and re-fetches the rest from the leader."""

    def __init__(self, path: str, offset: int, position: int, reason: str) -> None:
        super().__init__(
            f"corrupt batch in {path} at position {position} (offset {offset}): {reason}"
        )
        self.path = path
        self.offset = offset
        self.position = position
        self.reason = reason


class CorruptCheckpointError(StorageError):
    """A checkpoint file (leader-epoch-checkpoint, quorum-state) cannot be parsed."""


class OffsetOutOfRangeError(StorageError, ValueError):
    """A read asked for an offset outside [start_offset, end_offset]."""
