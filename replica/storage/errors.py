"""Storage errors. Each message names the file (and offset/position) involved."""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error raised by ``replica.storage``."""


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


class CorruptCheckpointError(StorageError):
    """A checkpoint file (leader-epoch-checkpoint, quorum-state) cannot be parsed."""


class OffsetOutOfRangeError(StorageError, ValueError):
    """A read asked for an offset outside [start_offset, end_offset]."""
