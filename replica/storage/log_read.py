"""Reads of a ``Log``: batches by offset (every batch served CRC-checked), lookups by time,
and the scrub of sealed segments. A role of ``Log`` (see ``log.py``)."""

# Methods here run on a Log, which subclasses this role: mypy takes that self type
# but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

from .errors import (
    CorruptDataError,
    CorruptRecordError,
    OffsetOutOfRangeError,
)
from .log_fields import LogFields
from .records import (
    HEADER_SIZE,
    batches_to_table,
    iter_batches,
    parse_header,
    validate_payload,
)
from .segment import Segment

if TYPE_CHECKING:
    from .log import Log

log = logging.getLogger(__name__)


class ReadRole(LogFields):
    # -- reads -----------------------------------------------------------------------

    def read(self: Log, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches starting with the one holding ``offset``: up to ``max_bytes``
        but at least one batch, and no batch starting at or past ``max_offset``. From
        the tail in memory when it holds ``offset`` (batches this log appended as
        leader, checked then); else from one segment, with one pread (one kernel-to-user
        copy) for the result, every batch read CRC-checked. Raises
        OffsetOutOfRangeError outside [start_offset, end_offset]."""
        self._check_open()
        if not self.start_offset <= offset <= self._end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{self.start_offset}, {self._end_offset}]"
            )
        if offset == self._end_offset or (max_offset is not None and offset >= max_offset):
            return b""
        kept = self._tail.read(offset, max_bytes, max_offset)
        if kept is not None:
            return kept
        index = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[index]
        while offset >= seg.end_offset:
            # A gap a clean left at the end of the segment (or a cleaned-out segment):
            # the answer starts with the next segment's first batch.
            index += 1
            if index == len(self._segments):
                return b""  # the gap reaches the log end (a truncation inside a gap)
            seg = self._segments[index]
            if max_offset is not None and seg.base_offset >= max_offset:
                return b""
            offset = seg.base_offset
        try:
            return self._read_segment(seg, offset, max_bytes, max_offset)
        except OSError as exc:
            # A disk that fails a read is treated as damage there: the replica repairs
            # from a healthy copy (a leader resigns first), as for a bad CRC.
            reason = f"the disk failed the read ({exc})"
            raise self._detected(CorruptDataError(seg.path, offset, -1, reason)) from exc

    def _read_segment(
        self: Log, seg: Segment, offset: int, max_bytes: int, max_offset: int | None
    ) -> bytes:
        try:
            first = seg.locate(offset)
        except CorruptRecordError as exc:
            raise self._detected(self._find_corruption(seg, offset, str(exc))) from exc
        if max_offset is not None and first.base_offset >= max_offset:
            return b""
        limit = seg.size
        if max_offset is not None and max_offset < seg.end_offset:
            try:
                last = seg.locate(max_offset - 1)
                # Past a gap (a cleaned log) the batch found may start at max_offset.
                limit = last.position if last.base_offset >= max_offset else last.end
            except CorruptRecordError:
                limit = first.end  # the damage lies past the first batch: checked below
        target = min(limit, first.position + max(max_bytes, 0))
        end = first.end if target <= first.end else seg.boundary_before(first.position, target)
        data = seg.pread(end - first.position, first.position)
        # Never serve damaged bytes: CRC-check every batch (header and payload). A
        # damaged batch ends the result; if it is the first, raise CorruptDataError.
        valid, reason = _valid_prefix(data)
        if valid == len(data):
            return data
        if valid:
            return data[:valid]
        raise self._detected(CorruptDataError(seg.path, first.base_offset, first.position, reason))

    def offset_for_timestamp(self: Log, timestamp_ms: int, max_offset: int) -> tuple[int, int]:
        """ListOffsets by time: (the first offset below ``max_offset`` whose record
        timestamp is >= ``timestamp_ms``, that timestamp), or (max_offset, -1) if none.
        Scans batch headers; decodes only the batch that holds the answer."""
        import pyarrow.compute as pc

        offset = self.start_offset
        while offset < max_offset:
            data = self.read(offset, 4 << 20, max_offset=max_offset)
            if not data:
                break
            for h in iter_batches(data):
                if not h.is_control and h.max_timestamp >= timestamp_ms:
                    table = batches_to_table(data[h.position : h.end])
                    stamps = table.column("timestamp").cast("int64")
                    idx = pc.index(pc.greater_equal(stamps, timestamp_ms), True).as_py()
                    if idx >= 0:
                        return int(table.column("offset")[idx].as_py()), int(stamps[idx].as_py())
                offset = h.next_offset
        return max_offset, -1

    # -- verification ----------------------------------------------------------------

    def scrub(self: Log, max_bytes: int) -> CorruptDataError | None:
        """Verify (header and payload CRC, offsets continuous) about ``max_bytes`` of
        sealed segments from where the last call stopped, wrapping around to the first
        sealed segment after the last (``scrub_passes`` counts finished passes). Returns
        the first damage found (the cursor stays there) or None. The caller bounds the
        rate by the budget it passes per call."""
        self._check_open()
        sealed = len(self._segments) - 1
        if sealed <= 0:
            self._scrub_at = (-1, 0, 0)
            return None
        base, position, expected = self._scrub_at
        index = bisect.bisect_left(self._bases, base)
        if index >= sealed:
            index, position = 0, 0
        seg = self._segments[index]
        if seg.base_offset != base:
            position, expected = 0, seg.base_offset
        budget = max(max_bytes, 1)
        while budget > 0:
            if position >= seg.size:
                index += 1
                if index >= sealed:
                    self.scrub_passes += 1
                    self._scrub_at = (-1, 0, 0)
                    return None
                seg = self._segments[index]
                position, expected = 0, seg.base_offset
                continue
            data = seg.pread(min(max(budget, HEADER_SIZE), seg.size - position), position)
            budget -= len(data)
            self.scrubbed_bytes += len(data)
            valid, reason = _valid_prefix(data, expected, self._cleaned_end)
            if not valid and len(data) >= HEADER_SIZE and not reason:
                # The first batch is larger than the budget: read it whole.
                try:
                    header = parse_header(data, 0)
                    data = seg.pread(min(header.size, seg.size - position), position)
                    valid, reason = _valid_prefix(data, expected, self._cleaned_end)
                except CorruptRecordError as exc:
                    reason = str(exc)
            if not valid:
                self._scrub_at = (seg.base_offset, position, expected)
                return CorruptDataError(seg.path, expected, position, reason or "torn batch")
            expected = _next_offset_after(data, valid)
            position += valid
        self._scrub_at = (seg.base_offset, position, expected)
        return None

    @staticmethod
    def _detected(exc: CorruptDataError) -> CorruptDataError:
        log.error(
            "%s: damaged batch at offset %d (position %d) found by a read, not served: %s",
            exc.path,
            exc.offset,
            exc.position,
            exc.reason,
        )
        return exc

    def _find_corruption(self: Log, seg: Segment, offset: int, reason: str) -> CorruptDataError:
        """Walk ``seg`` from its nearest index entry at or below ``offset`` and name the
        first damaged batch (an index entry is trusted: it was written with a CRC)."""
        position, expected = seg.index_floor(offset)
        while position < seg.size:
            data = seg.pread(min(8 * 1024 * 1024, seg.size - position), position)
            valid, why = _valid_prefix(data, expected, self._cleaned_end)
            if not valid:
                try:
                    header = parse_header(data, 0)
                    data = seg.pread(header.size, position)
                    valid, why = _valid_prefix(data, expected, self._cleaned_end)
                except CorruptRecordError as exc:
                    why = str(exc)
                if not valid:
                    return CorruptDataError(seg.path, expected, position, why or reason)
            expected = _next_offset_after(data, valid)
            position += valid
        return CorruptDataError(seg.path, expected, position, reason)


def _valid_prefix(data: bytes, expected: int | None = None, gaps_below: int = 0) -> tuple[int, str]:
    """Length of the longest prefix of whole, intact batches (header and payload CRC;
    base offsets continuing from ``expected`` when given, or skipping offsets below
    ``gaps_below``: a cleaned log's) and why it stops ("" when it
    stops at a batch cut off by the end of ``data``, or at the end)."""
    position = 0
    total = len(data)
    while position < total:
        try:
            header = parse_header(data, position)
        except CorruptRecordError as exc:
            if total - position < HEADER_SIZE:
                return position, ""
            return position, str(exc)
        if header.end > total:
            return position, ""
        try:
            validate_payload(data, header)
        except CorruptRecordError as exc:
            return position, str(exc)
        if expected is not None:
            base = header.base_offset
            if base != expected and not expected < base <= gaps_below:
                return position, f"base offset {header.base_offset}, expected {expected}"
            expected = header.next_offset
        position = header.end
    return position, ""


def _next_offset_after(data: bytes, length: int) -> int:
    """Next offset after the whole batches in ``data[:length]`` (length > 0)."""
    last = 0
    position = 0
    while position < length:
        last = position
        position = parse_header(data, position).end
    return parse_header(data, last).next_offset
