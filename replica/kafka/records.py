"""Kafka RecordBatch v2 (magic 2): decode and encode, CRC32C-checked.

Layout (big-endian; ``batch_length`` counts the bytes after itself; the CRC32C covers
everything from ``attributes`` to the end)::

     0 base_offset            INT64
     8 batch_length           INT32
    12 partition_leader_epoch INT32
    16 magic                  INT8   (2)
    17 crc                    UINT32 CRC32C
    21 attributes             INT16  bits 0-2 compression, 3 timestamp type,
                                     4 transactional, 5 control, 6 delete horizon
    23 last_offset_delta      INT32
    27 base_timestamp         INT64
    35 max_timestamp          INT64
    43 producer_id            INT64
    51 producer_epoch         INT16
    53 base_sequence          INT32
    57 records_count          INT32
    61 records...

A record: length VARINT, attributes INT8, timestamp_delta VARLONG, offset_delta VARINT,
key (VARINT length, -1 = null), value (likewise), header count VARINT, then per header a
key (VARINT length, UTF-8) and a value (VARINT length, -1 = null).

Records are decoded into columns (lists per field). This is the reference codec: the
listener decodes and encodes with ``columnar`` (vectorised, straight to and from Arrow
columns), which falls back to this one and is tested against it.

Compression: Kafka's four codecs. gzip through the standard library's zlib; snappy (raw
as librdkafka writes it, or xerial-framed as the Java client does), lz4 (the LZ4 frame
format, as Kafka writes it for magic 2) and zstd through ``cramjam`` (Rust bindings of
the reference libraries). Every codec inflates into at most ``MAX_DECOMPRESSED`` bytes:
lz4 and zstd frames need not state their decompressed size, so they inflate into a
buffer of that size and a frame that does not fit is refused. Any other codec number
raises :class:`UnsupportedCompression` (a listener answers UNSUPPORTED_COMPRESSION_TYPE,
which clients do not retry).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import cramjam
import numpy as np
import numpy.typing as npt
from crc32c import crc32c

from .errors import KafkaError
from .wire import Buffer, KafkaDecodeError, put_uvar

__all__ = [
    "ATTR_CONTROL",
    "ATTR_TRANSACTIONAL",
    "BATCH_HEADER_SIZE",
    "BatchFields",
    "COMPRESSION_GZIP",
    "COMPRESSION_LZ4",
    "COMPRESSION_NAMES",
    "COMPRESSION_NONE",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_ZSTD",
    "MAX_DECOMPRESSED",
    "Header",
    "InvalidRecord",
    "KafkaRecordBatch",
    "ProducedBatch",
    "UnsupportedCompression",
    "check_produced",
    "check_produced_fields",
    "decode_batch",
    "decode_records",
    "encode_batch",
    "encode_sparse_batch",
    "iter_batches",
    "iter_decoded",
    "read_frame",
    "refuse_control_batch",
]

_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = _HEADER.size  # 61
_LENGTH_OVERHEAD = 12  # base_offset + batch_length precede what batch_length counts
_CRC_START = 21
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
#: Kafka's codec numbers (the low three bits of a batch's attributes) and names.
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
# Decompressed records larger than this are refused (a gzip bomb in a 1 MB request).
MAX_DECOMPRESSED = 64 * 1024 * 1024

Header = tuple[str, bytes | None]


class InvalidRecord(KafkaDecodeError):
    """A well-formed batch a producer may not send (Kafka's InvalidRecordException:
    answer the partition with INVALID_RECORD)."""

    error_code = KafkaError.INVALID_RECORD


class UnsupportedCompression(KafkaDecodeError):
    error_code = KafkaError.UNSUPPORTED_COMPRESSION_TYPE

    def __init__(self, codec: int) -> None:
        name = COMPRESSION_NAMES.get(codec, f"unknown ({codec})")
        super().__init__(
            f"record batch compression {name} is not supported "
            "(none, gzip, snappy, lz4 and zstd are)"
        )
        self.codec = codec


@dataclass
class BatchFields:
    """The header fields of a RecordBatch v2, shared by both decoded forms: records as
    lists (:class:`KafkaRecordBatch`, this module) or as Arrow columns
    (``columnar.KafkaColumns``)."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def compression(self) -> int:
        return self.attributes & _COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


@dataclass
class KafkaRecordBatch(BatchFields):
    """One decoded RecordBatch v2, records as columns (lists)."""

    offset_deltas: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)  # absolute, ms
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[list[Header]] = field(default_factory=list)
    size: int = 0  # bytes on the wire

    @property
    def record_count(self) -> int:
        return len(self.values)


def _uvarint_slow(buf: bytes, pos: int, max_bytes: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for _ in range(max_bytes):
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    raise KafkaDecodeError(f"varint longer than {max_bytes} bytes in a record")


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        inflater = zlib.decompressobj(wbits=31)
        try:
            out = inflater.decompress(data, MAX_DECOMPRESSED)
        except zlib.error as exc:
            raise KafkaDecodeError(f"corrupt gzip records: {exc}") from exc
        if inflater.unconsumed_tail:
            raise KafkaDecodeError(f"gzip records inflate past {MAX_DECOMPRESSED} bytes")
        return out
    if codec == COMPRESSION_SNAPPY:
        return _snappy_decompress(data)
    if codec == COMPRESSION_LZ4:
        return _inflate_bounded(cramjam.lz4.decompress_into, "lz4", data)
    if codec == COMPRESSION_ZSTD:
        return _inflate_bounded(cramjam.zstd.decompress_into, "zstd", data)
    raise UnsupportedCompression(codec)


def _inflate_bounded(
    decompress_into: Callable[[bytes, memoryview], int], name: str, data: bytes
) -> bytes:
    # np.empty maps the pages without touching them: only what the frame inflates to
    # is ever committed, and the codec stops where the buffer ends.
    out = np.empty(MAX_DECOMPRESSED, np.uint8)
    try:
        n = decompress_into(data, out.data)
    except (cramjam.DecompressionError, ValueError) as exc:
        raise KafkaDecodeError(
            f"corrupt {name} records, or records inflating past {MAX_DECOMPRESSED} bytes: {exc}"
        ) from exc
    return out[:n].tobytes()


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_block(block: bytes) -> bytes:
    # A raw snappy block starts with its uncompressed length as an unsigned varint: a
    # hostile one is refused before inflating, and the block inflates into exactly that.
    try:
        size, _ = _uvarint_slow(block, 0, 5)
    except IndexError as exc:
        raise KafkaDecodeError("empty snappy block") from exc
    if size > MAX_DECOMPRESSED:
        raise KafkaDecodeError(f"snappy block inflates to {size} bytes")
    out = np.empty(size, np.uint8)
    try:
        n = cramjam.snappy.decompress_raw_into(block, out.data)
    except (cramjam.DecompressionError, ValueError) as exc:
        raise KafkaDecodeError(f"corrupt snappy records: {exc}") from exc
    if n != size:
        raise KafkaDecodeError(f"snappy block inflates to {n} bytes, its header says {size}")
    return out.tobytes()


def _snappy_decompress(data: bytes) -> bytes:
    """Raw snappy (librdkafka) or xerial-framed snappy (the Java client)."""
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data)
    # xerial: magic, INT32 version, INT32 compatible version, then [INT32 length, block]...
    pos = len(_XERIAL_MAGIC) + 8
    parts: list[bytes] = []
    total = 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise KafkaDecodeError("truncated xerial snappy block length")
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or n > len(data) - pos:
            raise KafkaDecodeError(f"xerial snappy block of {n} bytes overruns the batch")
        part = _snappy_block(data[pos : pos + n])
        total += len(part)
        if total > MAX_DECOMPRESSED:
            raise KafkaDecodeError(f"snappy records inflate past {MAX_DECOMPRESSED} bytes")
        parts.append(part)
        pos += n
    return b"".join(parts)


def decode_batch(buf: Buffer, position: int = 0, *, verify_crc: bool = True) -> KafkaRecordBatch:
    """Decode the RecordBatch v2 at ``position``. Any malformation -> KafkaDecodeError."""
    batch, data, count = read_frame(buf, position, verify_crc=verify_crc)
    decode_records(data, count, batch, position)
    return batch


def read_frame(
    buf: Buffer, position: int = 0, *, verify_crc: bool = True
) -> tuple[KafkaRecordBatch, bytes, int]:
    """The batch at ``position`` checked (magic, length, CRC32C, counts) and its records
    decompressed: the batch's fields (no records yet), the records' bytes, and their count."""
    available = len(buf) - position
    if available < BATCH_HEADER_SIZE:
        raise KafkaDecodeError(
            f"truncated record batch at {position}: {available} of {BATCH_HEADER_SIZE} bytes"
        )
    (
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = _HEADER.unpack_from(buf, position)
    if magic != 2:
        raise KafkaDecodeError(f"record batch magic {magic} at {position}: only v2 is supported")
    size = batch_length + _LENGTH_OVERHEAD
    if size < BATCH_HEADER_SIZE or size > available:
        raise KafkaDecodeError(
            f"record batch at {position} claims {size} bytes, {available} are present"
        )
    view = memoryview(buf)[position : position + size]
    if verify_crc and crc32c(view[_CRC_START:]) != crc:
        raise KafkaDecodeError(f"record batch CRC32C mismatch at {position} (base {base_offset})")
    if count < 0 or last_offset_delta < 0:
        raise KafkaDecodeError(f"record batch at {position} has negative counts")
    batch = KafkaRecordBatch(
        base_offset,
        leader_epoch,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        size=size,
    )
    data = _decompress(attributes & _COMPRESSION_MASK, bytes(view[BATCH_HEADER_SIZE:]))
    if count > len(data):
        raise KafkaDecodeError(f"record batch at {position}: {count} records in {len(data)} bytes")
    return batch, data, count


def decode_records(data: bytes, count: int, batch: KafkaRecordBatch, position: int = 0) -> None:
    """The reference record decoder: ``count`` records of ``data`` appended to ``batch``'s
    lists (timestamps absolute from its base timestamp)."""
    try:
        _decode_records(data, count, batch.base_timestamp, batch)
    except IndexError as exc:
        raise KafkaDecodeError(f"truncated record in the batch at {position}") from exc


def _decode_records(data: bytes, count: int, base_ts: int, batch: KafkaRecordBatch) -> None:
    # The hot loop of a Kafka produce: one pass, varints of one or two bytes inline (the
    # common case), longer ones through _uvarint_slow. Reads past the end raise IndexError,
    # which decode_batch turns into KafkaDecodeError; overruns inside the buffer are caught
    # by the record-length check at the end of each record.
    ts_append = batch.timestamps.append
    od_append = batch.offset_deltas.append
    key_then_value = ((batch.keys.append, "key"), (batch.values.append, "value"))
    headers_append = batch.headers.append
    uvar = _uvarint_slow
    end = len(data)
    pos = 0
    for _ in range(count):
        b = data[pos]
        if b < 0x80:
            pos += 1
        else:
            b, pos = uvar(data, pos, 5)
        record_end = pos + ((b >> 1) ^ -(b & 1))
        if record_end <= pos or record_end > end:
            raise KafkaDecodeError(f"record length at {pos} outside the batch")
        b = data[pos + 1]  # after the record attributes (unused in v2)
        if b < 0x80:
            pos += 2
        elif data[pos + 2] < 0x80:
            b = (b & 0x7F) | (data[pos + 2] << 7)
            pos += 3
        else:
            b, pos = uvar(data, pos + 1, 10)
        ts_append(base_ts + ((b >> 1) ^ -(b & 1)))
        b = data[pos]
        if b < 0x80:
            pos += 1
        elif data[pos + 1] < 0x80:
            b = (b & 0x7F) | (data[pos + 1] << 7)
            pos += 2
        else:
            b, pos = uvar(data, pos, 5)
        od_append((b >> 1) ^ -(b & 1))
        for append, what in key_then_value:  # the same nullable-bytes field twice
            b = data[pos]
            if b < 0x80:
                pos += 1
            else:
                b, pos = uvar(data, pos, 5)
            n = (b >> 1) ^ -(b & 1)
            if n >= 0:
                append(data[pos : pos + n])
                pos += n
            elif n == -1:
                append(None)
            else:
                raise KafkaDecodeError(f"negative {what} length {n} in a record")
        b = data[pos]
        if b == 0:
            pos += 1
            headers_append([])
        else:
            pos = _decode_headers(data, pos, record_end, headers_append)
        if pos != record_end:
            raise KafkaDecodeError(f"record ends at {pos}, its length says {record_end}")
    if pos != end:
        raise KafkaDecodeError(f"{end - pos} bytes after the last of {count} records")


def _decode_headers(
    data: bytes, pos: int, record_end: int, append: Callable[[list[Header]], None]
) -> int:
    v, pos = _uvarint_slow(data, pos, 5)
    n_headers = (v >> 1) ^ -(v & 1)
    if n_headers < 0 or n_headers > record_end - pos:
        raise KafkaDecodeError(f"header count {n_headers} at {pos}")
    hs: list[Header] = []
    for _ in range(n_headers):
        v, pos = _uvarint_slow(data, pos, 5)
        n = (v >> 1) ^ -(v & 1)
        if n < 0 or pos + n > record_end:
            raise KafkaDecodeError(f"header key length {n} at {pos}")
        try:
            hkey = str(data[pos : pos + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise KafkaDecodeError(f"header key at {pos} is not UTF-8") from exc
        pos += n
        v, pos = _uvarint_slow(data, pos, 5)
        n = (v >> 1) ^ -(v & 1)
        if n < -1 or pos + n > record_end:
            raise KafkaDecodeError(f"header value length {n} at {pos}")
        if n == -1:
            hs.append((hkey, None))
        else:
            hs.append((hkey, data[pos : pos + n]))
            pos += n
    append(hs)
    return pos


class ProducedFields(Protocol):
    """What :func:`check_produced_fields` reads of a batch's header."""

    last_offset_delta: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def is_control(self) -> bool: ...


class ProducedBatch(ProducedFields, Protocol):
    """What :func:`check_produced` reads of a decoded batch (either form)."""

    @property
    def record_count(self) -> int: ...

    @property
    def offset_deltas(self) -> Sequence[int] | npt.NDArray[np.int64]: ...


def check_produced(batch: ProducedBatch) -> None:
    """What a broker checks of a producer's batch beyond its framing and CRC (Kafka's
    LogValidator for magic 2): offset deltas 0..n-1 matching lastOffsetDelta, no control
    batch, and producer fields that are either all unset or all set."""
    count = batch.record_count
    check_produced_fields(batch, count)
    if not np.array_equal(batch.offset_deltas, np.arange(count)):
        raise InvalidRecord(
            f"offset deltas of the {count} records are not 0..{count - 1} "
            f"(lastOffsetDelta {batch.last_offset_delta})"
        )


def check_produced_fields(batch: ProducedFields, count: int) -> None:
    """What :func:`check_produced` reads of a producer's batch before its records are
    decoded (``count`` records, as its header says)."""
    if count == 0:
        raise InvalidRecord("a produced batch holds no records")
    if batch.last_offset_delta != count - 1:
        raise InvalidRecord(
            f"offset deltas of the {count} records are not 0..{count - 1} "
            f"(lastOffsetDelta {batch.last_offset_delta})"
        )
    refuse_control_batch(batch)
    if batch.producer_id >= 0 and (batch.producer_epoch < 0 or batch.base_sequence < 0):
        raise InvalidRecord(
            f"producer id {batch.producer_id} with epoch {batch.producer_epoch} and base "
            f"sequence {batch.base_sequence}"
        )


def refuse_control_batch(batch: ProducedFields) -> None:
    """Only a broker writes control batches (transaction markers, leader changes): one
    from a producer is refused with INVALID_RECORD, as Kafka's LogValidator does."""
    if batch.is_control:
        raise InvalidRecord("clients may not produce control batches")


def iter_batches(
    buf: Buffer, *, verify_crc: bool = True, allow_partial_tail: bool = False
) -> Iterator[KafkaRecordBatch]:
    """Every batch in a ``records`` field. A fetch response may end in a partial batch
    (``allow_partial_tail`` skips it); in a produce request that is an error."""
    return iter_decoded(
        decode_batch, buf, verify_crc=verify_crc, allow_partial_tail=allow_partial_tail
    )


class _SizedBatch(Protocol):
    size: int  # bytes on the wire


_Decoded = TypeVar("_Decoded", bound=_SizedBatch)


def iter_decoded(
    decode: Callable[..., _Decoded],
    buf: Buffer,
    *,
    verify_crc: bool = True,
    allow_partial_tail: bool = False,
) -> Iterator[_Decoded]:
    """:func:`iter_batches` with another decoder (``decode(buf, position, verify_crc=)``,
    returning a batch with a ``size``)."""
    position = 0
    total = len(buf)
    while position < total:
        if allow_partial_tail:
            if total - position < BATCH_HEADER_SIZE:
                return
            (length,) = struct.unpack_from(">i", buf, position + 8)
            if length + _LENGTH_OVERHEAD > total - position:
                return
        batch = decode(buf, position, verify_crc=verify_crc)
        yield batch
        position += batch.size


def _put_varint(out: bytearray, v: int) -> None:
    put_uvar(out, (v << 1) ^ (v >> 63))


def _encode_records(
    out: bytearray,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps: Sequence[int],
    headers: Sequence[Sequence[Header] | None] | None,
    base_ts: int,
    offset_deltas: Sequence[int],
) -> None:
    body = bytearray()
    put = _put_varint
    for i in range(len(values)):
        body.clear()
        body.append(0)  # record attributes
        put(body, timestamps[i] - base_ts)
        put(body, offset_deltas[i])
        for item in (keys[i], values[i]):
            if item is None:
                body.append(1)  # zigzag(-1)
            else:
                put(body, len(item))
                body += item
        hs = headers[i] if headers is not None else None
        if not hs:
            body.append(0)
        else:
            put(body, len(hs))
            for hkey, hvalue in hs:
                raw = hkey.encode("utf-8")
                put(body, len(raw))
                body += raw
                if hvalue is None:
                    body.append(1)
                else:
                    put(body, len(hvalue))
                    body += hvalue
        put(out, len(body))
        out += body


def encode_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[int] | None = None,
    headers: Sequence[Sequence[Header] | None] | None = None,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    compression: int = COMPRESSION_NONE,
) -> bytes:
    """One RecordBatch v2 with offset deltas 0..n-1 and a CRC32C. ``timestamps`` in ms
    (default 0); ``attributes`` may set ATTR_TRANSACTIONAL / ATTR_CONTROL."""
    return encode_sparse_batch(
        range(len(values)),
        values,
        keys,
        timestamps,
        headers,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        attributes=attributes,
        compression=compression,
    )


def encode_sparse_batch(
    offset_deltas: Sequence[int],
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[int] | None = None,
    headers: Sequence[Sequence[Header] | None] | None = None,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    compression: int = COMPRESSION_NONE,
) -> bytes:
    """``encode_batch`` with the records' ``offset_deltas`` (ascending from 0; with gaps,
    as a compacted topic's batch has them), the last one the header's lastOffsetDelta."""
    count = len(values)
    if count < 1:
        raise ValueError("a record batch needs at least one record")
    if keys is None:
        keys = [None] * count
    if timestamps is None:
        timestamps = [0] * count
    if (
        len(keys) != count
        or len(timestamps) != count
        or (headers and len(headers) != count)
        or len(offset_deltas) != count
    ):
        raise ValueError("keys, values, timestamps and headers need one entry per record")
    base_ts = timestamps[0]
    max_ts = max(timestamps)
    records = bytearray()
    _encode_records(records, keys, values, timestamps, headers, base_ts, offset_deltas)
    if compression == COMPRESSION_GZIP:
        compressor = zlib.compressobj(wbits=31)
        payload = compressor.compress(records) + compressor.flush()
    elif compression == COMPRESSION_SNAPPY:
        payload = bytes(cramjam.snappy.compress_raw(bytes(records)))
    elif compression == COMPRESSION_LZ4:
        payload = bytes(cramjam.lz4.compress(bytes(records)))
    elif compression == COMPRESSION_ZSTD:
        payload = bytes(cramjam.zstd.compress(bytes(records)))
    elif compression == COMPRESSION_NONE:
        payload = bytes(records)
    else:
        raise UnsupportedCompression(compression)
    attributes = (attributes & ~_COMPRESSION_MASK) | compression
    header = bytearray(
        _HEADER.pack(
            base_offset,
            BATCH_HEADER_SIZE - _LENGTH_OVERHEAD + len(payload),
            partition_leader_epoch,
            2,
            0,
            attributes,
            int(offset_deltas[-1]),  # lastOffsetDelta
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    )
    crc = crc32c(payload, crc32c(memoryview(header)[_CRC_START:]))
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + payload
