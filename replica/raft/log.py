"""The log interface the raft core drives.

The core never opens files: it is handed an object with this shape. ``replica.storage.Log``
implements it on disk; the simulator's in-memory log implements it in RAM. Record data is
opaque to the core: whole batches as bytes, exactly as read from a leader's log, each with
its leader epoch in its header (the log, not the core, keeps the epoch cache up to date when
it appends them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..storage.errors import CorruptDataError, DiskError
from ..storage.records import TxnMarker
from ..storage.transactions import TransactionIndex
from ..storage.types import (
    CATCH_UP_UNKNOWN,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AppendInfo,
    EpochEndOffset,
    OffsetAndEpoch,
)

__all__ = [
    "CATCH_UP_UNKNOWN",
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "AppendInfo",
    "CorruptDataError",
    "DiskError",
    "EpochEndOffset",
    "OffsetAndEpoch",
    "ReplicaLog",
]


class ReplicaLog(Protocol):
    @property
    def start_offset(self) -> int:
        """First offset still held (retention moves it up)."""
        ...

    @property
    def end_offset(self) -> int:
        """Log end offset: the offset the next appended record gets."""
        ...

    @property
    def durable_end_offset(self) -> int:
        """End offset of what has been fsync'd; only this may count towards the HWM."""
        ...

    @property
    def catch_up_offset(self) -> int:
        """-1, or the durable end the log had before ``truncate_corrupt`` cut it (kept
        durably until the durable end is back there): the replica may lack records it
        acknowledged, so it neither votes, nor stands, nor counts towards the HWM."""
        ...

    @property
    def voters(self) -> tuple[int, ...] | None:
        """The voter set of the latest voter-set record in the log, committed or not;
        None if the log holds none. Truncation removes records with their data."""
        ...

    @property
    def voters_before(self) -> tuple[int, ...] | None:
        """The voter set the latest voter-set record replaced (None: no record before
        it in the log: the replica's initial voters)."""
        ...

    @property
    def voters_offset(self) -> int:
        """The offset of that record, or UNDEFINED_OFFSET (-1)."""
        ...

    def last_epoch(self) -> int:
        """Leader epoch of the last batch in the log (latest epoch-cache entry), or
        UNDEFINED_EPOCH if the log has none."""
        ...

    def end_offset_for(self, epoch: int) -> EpochEndOffset:
        """KIP-101 lookup with Kafka's semantics: the latest epoch -> (epoch, log end
        offset); otherwise (largest epoch <= requested, start offset of the next higher
        epoch); requested below every epoch -> (requested, first start offset); no
        entries -> (UNDEFINED_EPOCH, UNDEFINED_OFFSET)."""
        ...

    def epoch_at(self, offset: int) -> int:
        """Leader epoch of the record at ``offset`` (UNDEFINED_EPOCH if offset is not in
        the log). Used to answer "epoch of the record before offset X"."""
        ...

    def append_as_leader(self, records: bytes, epoch: int) -> AppendInfo:
        """Append client batches (any base offset in their headers): the log assigns
        offsets from end_offset, stamps ``epoch`` into each header, and records a new
        epoch-cache entry if ``epoch`` is new."""
        ...

    def append_control(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        """Append the leader-change control batch a new leader writes at the start of
        its epoch."""
        ...

    def append_voters(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        """Append a voter-set change control batch (KIP-853's VotersRecord); ``voters``
        is the voter set from its offset on."""
        ...

    def append_markers(
        self, markers: Sequence[TxnMarker], epoch: int, timestamp_ms: int
    ) -> AppendInfo:
        """Append transaction markers as leader (a transaction coordinator's), a batch
        each: each ends its producer's open transaction; one of an epoch its producer
        left raises ``storage.producers.InvalidProducerEpoch`` and nothing is written."""
        ...

    def transactions(self) -> TransactionIndex:
        """The open and aborted transactions of the log (``storage.transactions``),
        rebuilt from the log after a truncation, as the producer state is."""
        ...

    def append_as_follower(self, batches: bytes) -> AppendInfo | None:
        """Append whole batches fetched from the leader: base offsets must continue at
        end_offset (else ValueError); epochs come from the headers and extend the epoch
        cache. Returns None for empty input."""
        ...

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches starting with the one that holds ``offset``; at least one batch
        if any exists at or after offset even if larger than max_bytes; never a batch
        starting at or past ``max_offset`` when given. Every batch is checked (CRC)
        first: damaged bytes are never returned; the result stops before a damaged
        batch, and if the first one is damaged it raises ``CorruptDataError`` whose
        ``offset`` is where the damage starts."""
        ...

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or above ``offset`` (and epoch entries from there)."""
        ...

    def truncate_corrupt(self, offset: int) -> None:
        """Cut the log at damage found at ``offset``: first raise ``catch_up_offset``
        durably to the durable end, then ``truncate_to(offset)``."""
        ...

    def mark_catch_up(self, floor: int) -> None:
        """Durably mark the replica as lacking acknowledged records below ``floor``
        (``CATCH_UP_UNKNOWN``: not known yet; a known floor replaces it, a known one
        only rises); cleared once the durable end reaches it."""
        ...

    def flush(self) -> int:
        """fsync what is appended; returns the new durable end offset."""
        ...
