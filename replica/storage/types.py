"""Value types shared by the storage log and the raft core's log interface (no I/O here)."""

from __future__ import annotations

from typing import NamedTuple

from ..constants import UNKNOWN

__all__ = [
    "CATCH_UP_UNKNOWN",
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "AppendInfo",
    "EpochEndOffset",
    "OffsetAndEpoch",
]

# Kafka's names for an unknown epoch / offset: the one UNKNOWN (replica.constants), kept
# as names for callers outside replica/ (the simulator's in-memory log uses them).
UNDEFINED_EPOCH = UNKNOWN
UNDEFINED_OFFSET = UNKNOWN
# A catch-up floor not yet known: the replica's data directory replaced one that may have
# held acknowledged records (a lost disk). It stays catching up until a leader tells it
# how far every acknowledged record reaches (see ReplicaLog.mark_catch_up).
CATCH_UP_UNKNOWN = (1 << 63) - 1


class OffsetAndEpoch(NamedTuple):
    offset: int
    epoch: int


class EpochEndOffset(NamedTuple):
    """Answer of ``end_offset_for``: (UNDEFINED_EPOCH, UNDEFINED_OFFSET) when unknown."""

    epoch: int
    end_offset: int


class AppendInfo(NamedTuple):
    first_offset: int
    last_offset: int  # inclusive
    record_count: int
