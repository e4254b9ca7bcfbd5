"""The 64-byte batch header (the format is in ``records``' docstring): its fields
(``BatchHeader``), parsing and checking it (magic, header CRC, sanity, a sparse batch's
last offset delta), the payload CRC, iterating the batches of a buffer by their headers
alone, and re-stamping a header's base offset and epoch."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from ..constants import UNKNOWN
from .crc import crc32
from .errors import CorruptRecordError, UnsupportedFormatError

__all__ = [
    "COMMIT_FLAG",
    "CONTROL_FLAG",
    "HEADER_SIZE",
    "MAGIC",
    "MAGIC_V1",
    "MAX_OFFSET_DELTA",
    "MAX_PAYLOAD",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "SPARSE_OFFSETS_FLAG",
    "TRANSACTIONAL_FLAG",
    "BatchHeader",
    "Producer",
    "iter_batches",
    "parse_header",
    "plain_span",
    "restamp_header",
    "rewrite_header",
    "validate_payload",
]

MAGIC = b"QLB\x02"
MAGIC_V1 = b"QLB\x01"
_HEADER = struct.Struct("<4sIqiiqIIHhiqQ")
HEADER_SIZE = _HEADER.size  # 64
_HEADER_TAIL = struct.Struct("<qiiqIIHhiqQ")  # bytes [8, 64): what header_crc covers
_HEADER_HEAD = struct.Struct("<4sI")  # bytes [0, 8): magic, header_crc
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
CONTROL_FLAG = 0x1
TRANSACTIONAL_FLAG = 0x2
COMMIT_FLAG = 0x4
SPARSE_OFFSETS_FLAG = 0x8
_KNOWN_FLAGS = CONTROL_FLAG | TRANSACTIONAL_FLAG | COMMIT_FLAG | SPARSE_OFFSETS_FLAG
#: The largest offset delta a sparse batch holds (its column is an int32).
MAX_OFFSET_DELTA = (1 << 31) - 1
_MARKER_FLAGS = CONTROL_FLAG | TRANSACTIONAL_FLAG
MAX_PAYLOAD = 1 << 30


class BatchHeader(NamedTuple):
    """A parsed batch header and where the batch sits in the buffer it came from."""

    position: int
    base_offset: int
    leader_epoch: int
    record_count: int
    max_timestamp: int
    payload_length: int
    payload_crc: int
    flags: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    #: A sparse batch's last record offset minus its base offset (the header's last 8
    #: bytes); for any other batch record_count - 1 (its offsets are implicit).
    last_offset_delta: int = -1

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.payload_length

    @property
    def end(self) -> int:
        """Position just past this batch in its buffer."""
        return self.position + HEADER_SIZE + self.payload_length

    @property
    def is_sparse(self) -> bool:
        """Its payload holds each record's offset delta (gaps a clean left inside)."""
        return bool(self.flags & SPARSE_OFFSETS_FLAG)

    # Each offset property computed directly, not one through another: they are read
    # several times a batch on every append.
    @property
    def last_offset(self) -> int:
        if self.flags & SPARSE_OFFSETS_FLAG:
            return self.base_offset + self.last_offset_delta
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        if self.flags & SPARSE_OFFSETS_FLAG:
            return self.base_offset + self.last_offset_delta + 1
        return self.base_offset + self.record_count

    @property
    def offset_span(self) -> int:
        """Offsets from base to last: record_count, or more for a sparse batch."""
        if self.flags & SPARSE_OFFSETS_FLAG:
            return self.last_offset_delta + 1
        return self.record_count

    @property
    def is_control(self) -> bool:
        return bool(self.flags & CONTROL_FLAG)

    @property
    def is_quorum_control(self) -> bool:
        """A control batch of the quorum's own (leader change, voter set), not a
        transaction marker: what ``decode_control`` reads."""
        return self.is_control and self.marker is None

    @property
    def is_transactional(self) -> bool:
        """Written inside a transaction (a data batch), or a transaction marker."""
        return bool(self.flags & TRANSACTIONAL_FLAG)

    @property
    def marker(self) -> bool | None:
        """For a transaction marker: True if it commits, False if it aborts; None for
        any other batch."""
        if self.flags & _MARKER_FLAGS != _MARKER_FLAGS:
            return None
        return bool(self.flags & COMMIT_FLAG)

    @property
    def producer(self) -> Producer | None:
        """The idempotent producer fields, or None for a batch written without them."""
        if self.producer_id == NO_PRODUCER_ID:
            return None
        return Producer(self.producer_id, self.producer_epoch, self.base_sequence)


class Producer(NamedTuple):
    """Who wrote a batch, as an idempotent producer: id, epoch and the sequence number
    of the batch's first record (Kafka's RecordBatch v2 fields)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int


def _pack_header(
    base_offset: int,
    leader_epoch: int,
    record_count: int,
    max_timestamp: int,
    payload_length: int,
    payload_crc: int,
    flags: int,
    producer: Producer | None,
    last_offset_delta: int = 0,
) -> bytes:
    pid, pepoch, seq = producer or (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
    return _packed(
        base_offset,
        leader_epoch,
        record_count,
        max_timestamp,
        payload_length,
        payload_crc,
        flags,
        pepoch,
        seq,
        pid,
        last_offset_delta if flags & SPARSE_OFFSETS_FLAG else 0,
    )


def _packed(*fields: int) -> bytes:
    """The header of ``fields`` (those of _HEADER_TAIL, in order), its CRC computed."""
    tail = _HEADER_TAIL.pack(*fields)
    return _HEADER_HEAD.pack(MAGIC, crc32(tail)) + tail


def _sane_producer(pid: int, pepoch: int, seq: int, flags: int) -> bool:
    """No producer (all three -1), or an id with an epoch and a first sequence; a
    control batch has none, but for a transaction marker (an id and an epoch, no
    sequence). Only a batch with a producer is transactional; only a marker commits."""
    if flags & COMMIT_FLAG and flags & _MARKER_FLAGS != _MARKER_FLAGS:
        return False
    if pid == NO_PRODUCER_ID:
        return pepoch == NO_PRODUCER_EPOCH and seq == NO_SEQUENCE and not flags & TRANSACTIONAL_FLAG
    if flags & CONTROL_FLAG:
        return flags & TRANSACTIONAL_FLAG != 0 and pid >= 0 and pepoch >= 0 and seq == NO_SEQUENCE
    return pid >= 0 and pepoch >= 0 and seq >= 0


_new_header = tuple.__new__


def parse_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse and check (magic, header CRC, sanity) the header at ``position``. Does not
    check that the payload is present or intact."""
    if len(buf) - position < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header at position {position}: "
            f"{len(buf) - position} of {HEADER_SIZE} bytes"
        )
    (magic, header_crc, base, epoch, count, max_ts, plen, pcrc, flags, pepoch, seq, pid, r1) = (
        _HEADER.unpack_from(buf, position)
    )
    if magic != MAGIC:
        # A format-1 header (48 bytes, its CRC over [8, 48)) is an old log; a format-2
        # header whose magic byte flipped to 1 is damage (its CRC does not match that).
        v1_crc = crc32(memoryview(buf)[position + 8 : position + 48])
        if magic == MAGIC_V1 and v1_crc == header_crc:
            raise UnsupportedFormatError(
                f"batch at position {position} is in quorumlog's batch format 1, which "
                "this version does not read (format 2 added the producer fields)"
            )
        raise CorruptRecordError(f"bad batch magic {magic!r} at position {position}")
    view = buf if type(buf) is memoryview else memoryview(buf)
    if crc32(view[position + 8 : position + HEADER_SIZE]) != header_crc:
        raise CorruptRecordError(f"batch header CRC mismatch at position {position}")
    if (
        count < 1
        or base < 0
        or epoch < UNKNOWN
        or plen < 8
        or plen % 8
        or plen > MAX_PAYLOAD
        or flags & ~_KNOWN_FLAGS
        # A plain batch (no flags, no producer) is the common case: its producer fields
        # are checked here as _sane_producer checks them, without the call.
        or not (
            (
                not flags
                and pid == NO_PRODUCER_ID
                and pepoch == NO_PRODUCER_EPOCH
                and seq == NO_SEQUENCE
            )
            or _sane_producer(pid, pepoch, seq, flags)
        )
    ):
        raise CorruptRecordError(f"insane batch header at position {position}")
    if flags & SPARSE_OFFSETS_FLAG:
        if flags & CONTROL_FLAG or not count - 1 <= r1 <= MAX_OFFSET_DELTA:
            raise CorruptRecordError(f"insane sparse batch header at position {position}")
        last_delta = r1
    elif r1:
        raise CorruptRecordError(f"insane batch header at position {position}")
    else:
        last_delta = count - 1
    # tuple.__new__ directly: the NamedTuple's own __new__ is a Python call more (a third
    # of this function's time).
    return _new_header(
        BatchHeader,
        (position, base, epoch, count, max_ts, plen, pcrc, flags, pid, pepoch, seq, last_delta),
    )


def validate_payload(buf: bytes | bytearray | memoryview, header: BatchHeader) -> None:
    """Check that the payload is complete and matches its CRC."""
    start = header.position + HEADER_SIZE
    if len(buf) < start + header.payload_length:
        raise CorruptRecordError(
            f"truncated batch at position {header.position}: payload needs "
            f"{header.payload_length} bytes, {max(0, len(buf) - start)} present"
        )
    payload = memoryview(buf)[start : start + header.payload_length]
    if crc32(payload) != header.payload_crc:
        raise CorruptRecordError(
            f"batch payload CRC mismatch at position {header.position} "
            f"(base offset {header.base_offset})"
        )


def iter_batches(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = False
) -> Iterator[BatchHeader]:
    """Yield the header of every batch in ``buf`` (whole batches back to back) without
    decoding payloads. Raises CorruptRecordError on a bad or incomplete batch."""
    position = 0
    total = len(buf)
    view = buf if type(buf) is memoryview else memoryview(buf)
    while position < total:
        header = parse_header(view, position)
        if header.end > total:
            raise CorruptRecordError(
                f"truncated batch at position {position}: {header.size} bytes needed, "
                f"{total - position} present"
            )
        if verify_crc and crc32(view[position + HEADER_SIZE : header.end]) != header.payload_crc:
            validate_payload(buf, header)  # raises, naming the batch
        yield header
        position = header.end


_PLAIN_FIELDS = struct.Struct("<4s16xi8xI4xHhiq")  # magic, count, plen, flags ... pid


def plain_span(buf: bytes | bytearray | memoryview) -> int | None:
    """The offsets a client's batches span appended (their records), when ``buf`` holds
    whole plain batches only: format 2, no flags, no producer fields. None for any other
    buffer (a producer's numbered or transactional batch, a control batch, one that does
    not end where ``buf`` ends), which the append then takes, or refuses, on its own.
    Reads the fields it needs of each header and checks no CRC: the append checks every
    batch."""
    total = len(buf)
    position = span = 0
    while position < total:
        if total - position < HEADER_SIZE:
            return None
        magic, count, plen, flags, pepoch, seq, pid = _PLAIN_FIELDS.unpack_from(buf, position)
        if (
            magic != MAGIC
            or count < 1
            or flags
            or pid != NO_PRODUCER_ID
            or pepoch != NO_PRODUCER_EPOCH
            or seq != NO_SEQUENCE
        ):
            return None
        span += count
        position += HEADER_SIZE + plen
    return span if position == total and span else None


def restamp_header(header: BatchHeader, base_offset: int, leader_epoch: int) -> bytes:
    """A new header for the batch, with a new base offset and epoch; the payload (and
    its CRC) and the producer fields stay as they are."""
    (_, _, _, count, max_ts, plen, pcrc, flags, pid, pepoch, seq, last_delta) = header
    if pid == NO_PRODUCER_ID:
        pepoch, seq = NO_PRODUCER_EPOCH, NO_SEQUENCE
    return _packed(
        base_offset,
        leader_epoch,
        count,
        max_ts,
        plen,
        pcrc,
        flags,
        pepoch,
        seq,
        pid,
        last_delta if flags & SPARSE_OFFSETS_FLAG else 0,
    )


def rewrite_header(
    buf: bytearray | memoryview, position: int, base_offset: int, leader_epoch: int
) -> None:
    """Re-stamp, in place, the header of the batch at ``position`` of a writable buffer."""
    header = parse_header(buf, position)
    buf[position : position + HEADER_SIZE] = restamp_header(header, base_offset, leader_epoch)
