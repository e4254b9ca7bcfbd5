"""Appends to a ``Log``: as leader (offsets and epoch stamped), as follower (byte for byte),
control batches and transaction markers, segment rolls; and the idempotent producers' state
and transaction index kept up to date by them. A role of ``Log`` (see ``log.py``)."""

# Methods here run on a Log, which subclasses this role: mypy takes that self type
# but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import fileio
from .batch_header import plain_span
from .clean_batches import batch_from
from .errors import (
    CorruptRecordError,
    DiskError,
)
from .log_fields import LogFields
from .producers import ProducerBatch, ProducerStateTable, last_sequence
from .records import (
    CONTROL_FLAG,
    HEADER_SIZE,
    SPARSE_OFFSETS_FLAG,
    VOTERS_KEY,
    BatchHeader,
    TxnMarker,
    decode_control,
    encode_control_batch,
    encode_txn_marker,
    encode_voters_batch,
    iter_batches,
    restamp_header,
    validate_arrow,
)
from .segment import Segment
from .transactions import TransactionIndex
from .types import AppendInfo

if TYPE_CHECKING:
    from .log import Log

log = logging.getLogger(__name__)


class AppendRole(LogFields):
    # -- appends ---------------------------------------------------------------------

    def append_as_leader(self: Log, records: bytes, epoch: int) -> AppendInfo:
        """Append client batches: offsets assigned from end_offset and ``epoch`` stamped
        by writing new headers in front of the untouched payloads (CRCs are checked, and
        with ``validate_records`` the Arrow schema and row counts). Control batches are
        rejected; use append_control."""
        return self._append_leader(records, epoch, allow_control=False)

    @staticmethod
    def plain_span(records: bytes) -> int | None:
        """The offsets ``records`` span appended when they are plain batches, which an
        append may take with others (``batch_header.plain_span``); else None."""
        return plain_span(records)

    def append_control(
        self: Log, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        batch = encode_control_batch(leader_id, voters, timestamp_ms, leader_epoch=epoch)
        return self._append_leader(batch, epoch, allow_control=True)

    def append_voters(
        self: Log, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        """Append a voter-set change (KIP-853's VotersRecord): ``voters`` is in force
        from its offset on (see ``voters_cache``)."""
        batch = encode_voters_batch(leader_id, voters, timestamp_ms, leader_epoch=epoch)
        return self._append_leader(batch, epoch, allow_control=True)

    def _append_leader(
        self: Log, records: bytes, epoch: int, *, allow_control: bool, markers: bool = False
    ) -> AppendInfo:
        self._check_open()
        if epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, got {epoch}")
        latest = self._cache.latest_epoch
        if epoch < latest:
            raise ValueError(f"append with epoch {epoch} below the latest epoch {latest}")
        view = memoryview(records)
        planned: list[_Planned] = []
        kept: list[tuple[int, bytes]] = []  # (base offset, the batch as written)
        next_offset = self._end_offset
        validate = self.config.validate_records
        refused_flags = SPARSE_OFFSETS_FLAG if allow_control else SPARSE_OFFSETS_FLAG | CONTROL_FLAG
        for header in iter_batches(view, verify_crc=True):
            if header.flags & refused_flags:
                if header.is_sparse:  # only the cleaner writes one, never a producer
                    raise CorruptRecordError(
                        f"client batch at position {header.position} has the sparse offsets "
                        "flag set"
                    )
                raise CorruptRecordError(
                    f"client batch at position {header.position} has the control flag set"
                )
            if validate:
                validate_arrow(view, header)
            # One copy of the batch, restamped: written, then kept in the tail.
            data = (
                restamp_header(header, next_offset, epoch)
                + view[header.position + HEADER_SIZE : header.end]
            )
            planned.append(_Planned(header, next_offset, epoch, [data]))
            kept.append((next_offset, data))
            next_offset += header.offset_span
        if not planned:
            raise ValueError("append_as_leader needs at least one batch")
        end = self._end_offset
        try:
            if markers:
                info = self._write(planned)
                table = self.producer_state()
                for item in planned:
                    self._apply_producer(table, item.header, item.base_offset)
                    self._note_transaction(item.header, item.base_offset)
            elif any(item.header.producer is not None for item in planned):
                info = self._append_idempotent(planned)
            else:
                info = self._write(planned)
        except BaseException:
            if self._end_offset != end:  # written in part: the tail no longer ends there
                self._tail.clear()
            raise
        self._tail.extend(kept)
        return info

    def append_markers(
        self: Log, markers: Sequence[TxnMarker], epoch: int, timestamp_ms: int
    ) -> AppendInfo:
        """Append transaction markers (a coordinator's, through the partition's leader),
        a batch each, of epochs their producers have not left (``InvalidProducerEpoch``,
        nothing written); each ends its producer's open transaction here
        (``transactions``)."""
        table = self.producer_state()
        for marker in markers:
            table.check_marker(marker.producer_id, marker.producer_epoch)
        self.transactions()  # built before the markers land, so they update it
        records = b"".join(encode_txn_marker(marker, timestamp_ms) for marker in markers)
        return self._append_leader(records, epoch, allow_control=True, markers=True)

    def _append_idempotent(self: Log, planned: list[_Planned]) -> AppendInfo:
        """An idempotent producer's batch: checked against the producer state first (a
        retry raises ``DuplicateSequence`` naming where the batch already is)."""
        item = planned[0]
        if len(planned) > 1 or item.header.producer is None:
            raise CorruptRecordError("an idempotent producer's batch must travel alone")
        table = self.producer_state()
        batch = _producer_batch(item.header, item.base_offset)
        pid = item.header.producer.producer_id
        table.check(pid, batch.producer_epoch, batch.first_sequence, batch.last_sequence)
        info = self._write(planned)
        table.apply(pid, batch)
        self._note_transaction(item.header, item.base_offset)
        return info

    def _note_transaction(self: Log, header: BatchHeader, base_offset: int) -> None:
        if self._txns is not None:
            self._txns.apply(
                header.producer_id, base_offset, header.is_transactional, header.marker
            )

    def append_as_follower(self: Log, batches: bytes) -> AppendInfo | None:
        """Append whole batches fetched from the leader, byte for byte. Base offsets must
        continue at end_offset, or skip offsets a clean of the leader's log dropped (the
        log's ``cleaned_end`` then rises past the gap); a first batch that holds the end
        offset is taken from it on. Epochs must not go below the latest epoch (else
        ValueError, nothing written); CRCs are checked."""
        self._check_open()
        view = memoryview(batches)
        if not view:
            return None
        self._tail.clear()  # a follower serves no fetches: it keeps no tail
        planned: list[_Planned] = []
        expected = self._end_offset
        latest = self._cache.latest_epoch
        gap_to = 0
        for header in iter_batches(view, verify_crc=True):
            raw: bytes | memoryview = view[header.position : header.end]
            if not planned and header.base_offset < expected < header.next_offset:
                # This log ends inside a batch the leader holds whole: its own clean cut
                # the batch into runs and a repair then truncated it at a run's start.
                # The records from the end on are taken, as the cleaner keeps a run.
                header, raw = batch_from(bytes(raw), header, expected)
            if header.base_offset > expected:
                gap_to = header.base_offset  # the leader's log was cleaned here
            elif header.base_offset != expected:
                raise ValueError(
                    f"batch at position {header.position} has base offset "
                    f"{header.base_offset}, expected {expected}"
                )
            if header.leader_epoch < 0 or header.leader_epoch < latest:
                raise ValueError(
                    f"batch at offset {header.base_offset} has epoch {header.leader_epoch}, "
                    f"below the latest epoch {latest}"
                )
            latest = header.leader_epoch
            planned.append(
                _Planned(
                    header,
                    header.base_offset,
                    header.leader_epoch,
                    [raw],
                )
            )
            expected = header.next_offset
        if gap_to > self._cleaned_end:
            self._set_cleaned_end(gap_to)  # before the gap is written (see cleaned_end)
        info = self._write(planned)
        if self._producers is not None:
            for item in planned:
                if item.header.producer is not None:
                    self._apply_producer(self._producers, item.header, item.base_offset)
                    self._note_transaction(item.header, item.base_offset)
        return info

    # -- idempotent producers ----------------------------------------------------------

    def producer_state(self: Log) -> ProducerStateTable:
        """The producers' state as this log holds it (``storage.producers``), built by
        walking every batch header the first time it is needed. A damaged header on the
        way raises ``CorruptDataError`` (the state past it is unknown), as a read does."""
        if self._producers is None:
            table = ProducerStateTable(complete=self.start_offset == 0)
            txns = TransactionIndex()
            for seg in self._segments:
                position, expected = 0, seg.base_offset
                while position < seg.size:
                    try:
                        header = seg.header_at(position)
                    except CorruptRecordError as exc:
                        raise self._detected(
                            self._find_corruption(seg, expected, str(exc))
                        ) from exc
                    if header.producer is not None:
                        self._apply_producer(table, header, header.base_offset)
                        txns.apply_header(header)
                    position, expected = header.end, header.next_offset
            self._producers, self._txns = table, txns
        return self._producers

    def transactions(self: Log) -> TransactionIndex:
        """The open and aborted transactions as this log holds them, built with the
        producer state (``producer_state``) and kept up to date alike."""
        if self._txns is None or self._producers is None:
            self._producers = None
            self.producer_state()
        assert self._txns is not None
        return self._txns

    @staticmethod
    def _apply_producer(table: ProducerStateTable, header: BatchHeader, base: int) -> None:
        assert header.producer is not None
        if header.marker is not None:  # a marker moves the epoch, it holds no sequence
            table.apply_marker(header.producer_id, header.producer_epoch)
        else:
            table.apply(header.producer.producer_id, _producer_batch(header, base))

    def _write(self: Log, planned: Sequence[_Planned]) -> AppendInfo:
        """Write planned batches, rolling segments as needed. A failed write truncates
        the segment back so the log never holds a partial batch."""
        first = planned[0].base_offset
        group: list[_Planned] = []
        grouped = 0  # bytes of the batches in group
        for item in planned:
            if self._should_roll(self._segments[-1].size + grouped, item):
                self._write_group(group)
                group, grouped = [], 0
                self._roll(item.base_offset)
            group.append(item)
            grouped += item.header.size
        self._write_group(group)
        last = planned[-1]
        last_offset = last.base_offset + last.header.offset_span - 1
        return AppendInfo(first, last_offset, last_offset + 1 - first)

    def _should_roll(self: Log, active_size: int, item: _Planned) -> bool:
        if active_size == 0:
            return False
        active = self._segments[-1]
        if active_size + item.header.size > self.config.segment_bytes:
            return True
        if item.base_offset + item.header.offset_span - active.base_offset > _MAX_RELATIVE:
            return True
        segment_ms = self.config.segment_ms
        return segment_ms is not None and (
            (time.monotonic() - active.created_monotonic) * 1000 >= segment_ms
        )

    def _write_group(self: Log, group: list[_Planned]) -> None:
        if not group:
            return
        self._make_directory()
        seg = self._segments[-1]
        buffers = [buf for item in group for buf in item.buffers]
        start = seg.size
        # A voter-set record is in the checkpoint before it is in the segment (so the
        # checkpoint names every one the log can hold; see voters_cache).
        voters_from = self._note_voters(group)
        with seg.pin(write=True) as fd:
            try:
                _writev_all(fd, buffers)
            except BaseException as exc:
                fileio.ftruncate(fd, start)
                if voters_from is not None:
                    self._voters.truncate_from_end(voters_from)
                if isinstance(exc, OSError):
                    raise DiskError(seg.path, exc) from exc
                raise
        interval = self.config.index_interval_bytes
        position = start
        for item in group:
            if item.epoch > self._cache.latest_epoch:
                self._cache.assign(item.epoch, item.base_offset)
            next_offset = item.base_offset + item.header.offset_span
            with self._lock:
                seg.track(
                    position,
                    item.base_offset,
                    next_offset,
                    item.header.size,
                    item.header.max_timestamp,
                    interval,
                )
                self._end_offset = next_offset
            position += item.header.size

    def _note_voters(self: Log, group: list[_Planned]) -> int | None:
        """Record the voter-set records of ``group`` in the voters checkpoint; the offset
        of the first one (None: there is none)."""
        first = None
        for item in group:
            if item.header.flags & CONTROL_FLAG and item.header.is_quorum_control:
                record = decode_control(b"".join(bytes(b) for b in item.buffers))
                if record.key == VOTERS_KEY:
                    self._voters.assign(item.base_offset, tuple(record.voters))
                    first = item.base_offset if first is None else first
        return first

    def _roll(self: Log, base_offset: int) -> None:
        self._make_directory()
        seg = Segment(self.directory, base_offset, create=True, files=self._files)
        with self._lock:
            self._segments.append(seg)
            self._bases.append(base_offset)
            self._dir_dirty = True
        log.debug("%s: rolled new segment at offset %d", self.directory, base_offset)


_IOV_MAX = 512
# The most offsets past its base a segment holds: its index keeps 32-bit relative offsets.
_MAX_RELATIVE = (1 << 31) - 1


@dataclass
class _Planned:
    header: BatchHeader
    base_offset: int
    epoch: int
    buffers: list[bytes | memoryview]


def _producer_batch(header: BatchHeader, base_offset: int) -> ProducerBatch:
    """The producer-state entry of a batch with producer fields appended at ``base_offset``
    (a sparse batch's last sequence is base_sequence + last_offset_delta, as Kafka's)."""
    assert header.producer is not None
    _, epoch, first = header.producer
    span = header.offset_span
    return ProducerBatch(
        epoch, first, last_sequence(first, span), base_offset, base_offset + span - 1
    )


def _writev_all(fd: int, buffers: list[bytes | memoryview]) -> None:
    pending = buffers
    first = 0
    while first < len(pending):
        written = fileio.writev(fd, pending[first : first + _IOV_MAX])
        while written:
            head = pending[first]
            if written >= len(head):
                written -= len(head)
                first += 1
            else:  # a short write: the rest of this buffer goes next (buffers is not changed)
                if pending is buffers:
                    pending = list(buffers)
                pending[first] = memoryview(head)[written:]
                written = 0
