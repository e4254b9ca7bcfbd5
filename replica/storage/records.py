"""Record batch format: a fixed 64-byte header followed by an Arrow IPC stream payload.

Header (little-endian, 64 bytes; every batch starts 8-byte aligned because the payload
length is a multiple of 8, so Arrow reads the payload zero-copy)::

    0  magic          4s  b"QLB\\x02"
    4  header_crc     u32 CRC32 of header bytes [8, 64)
    8  base_offset    i64 offset of the first record; record i has base_offset + i
                          (with bit 3: base_offset + its offset_delta)
   16  leader_epoch   i32 epoch of the leader that appended the batch (-1 from a client)
   20  record_count   i32 rows in the payload (>= 1)
   24  max_timestamp  i64 largest record timestamp in ms (-1 if none)
   32  payload_length u32 bytes of the Arrow IPC stream (multiple of 8)
   36  payload_crc    u32 CRC32 of the payload
   40  flags          u16 bit 0: control batch; bit 1: transactional (a batch written
                          inside a transaction, or with bit 0 a transaction marker);
                          bit 2: on a marker, commit (clear: abort); bit 3: sparse
                          offsets (the payload has an offset_delta column)
   42  producer_epoch i16 -1, or the idempotent producer's epoch
   44  base_sequence  i32 -1, or the producer's sequence number of the first record
   48  producer_id    i64 -1, or the idempotent producer's id (``storage.producers``)
   56  last_delta     u64 with bit 3: last_offset_delta, the last record's offset
                          minus base_offset; else zero

The header is parsed, checked and re-stamped in ``batch_header``; this module encodes and
decodes payloads. The producer fields are those of Kafka's RecordBatch v2: a leader
checks them against the partition's producer state so that a retried batch is never
appended twice.

The payload CRC covers only the payload, so a leader re-stamps base offset and epoch by
writing a new 64-byte header (with a new header CRC) in front of the untouched payload.
The header CRC makes a torn or corrupt header detectable before its lengths are trusted.
Format 1 (magic ``QLB\\x01``, 48 bytes, no producer fields; its header CRC checks out) is
recognised only to refuse it with ``UnsupportedFormatError`` rather than take it for damage.

The payload is an Arrow IPC stream with schema ``RECORD_SCHEMA``. Offsets are implicit:
record i has base_offset + i. A *sparse* batch (flag bit 3, ``SPARSE_OFFSETS_FLAG``; only
the cleaner writes one, never a client) has gaps inside, as a compacted Kafka batch has:
its schema is ``SPARSE_SCHEMA``, RECORD_SCHEMA plus ``offset_delta: int32`` (strictly
ascending, first 0, last equal to the header's last_offset_delta), and its offsets run
to base_offset + last_offset_delta, so that a scan of headers alone (recovery, the
segment index, ``next_offset``) knows where it ends. A control batch is never sparse.
A control batch carries one record whose value is a msgpack leader-change record, or
(flags control and transactional) a transaction marker: Kafka's control record as it is
on Kafka's wire (key: version INT16 0, type INT16 0 abort / 1 commit; value: version
INT16 0, coordinator epoch INT32), with the producer id and epoch in the header and no
sequence. Whether a marker commits or aborts is in the header too (bit 2), so the
transaction state is rebuilt from headers alone.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..constants import UNKNOWN
from .batch_header import (
    _KNOWN_FLAGS,
    _MARKER_FLAGS,
    COMMIT_FLAG,
    CONTROL_FLAG,
    HEADER_SIZE,
    MAGIC,
    MAGIC_V1,
    MAX_OFFSET_DELTA,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SPARSE_OFFSETS_FLAG,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    Producer,
    _pack_header,
    _sane_producer,
    iter_batches,
    parse_header,
    restamp_header,
    rewrite_header,
    validate_payload,
)
from .crc import crc32
from .errors import CorruptRecordError
from .transactions import committed_batches

__all__ = [
    "COMMIT_FLAG",
    "CONTROL_FLAG",
    "SPARSE_OFFSETS_FLAG",
    "SPARSE_SCHEMA",
    "TRANSACTIONAL_FLAG",
    "TxnMarker",
    "decode_txn_marker",
    "encode_txn_marker",
    "HEADER_SIZE",
    "MAGIC",
    "MAGIC_V1",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "OUTPUT_SCHEMA",
    "RECORD_SCHEMA",
    "BatchHeader",
    "VOTERS_KEY",
    "ControlRecord",
    "LeaderChange",
    "Producer",
    "batches_to_table",
    "decode_control",
    "decode_leader_change",
    "encode_arrow",
    "encode_batch",
    "encode_control_batch",
    "encode_voters_batch",
    "iter_batches",
    "null_array",
    "parse_header",
    "read_records",
    "restamp_header",
    "rewrite_header",
    "validate_arrow",
    "validate_payload",
]

_CONTROL_KEY = b"LeaderChange"
#: The key of a voter-set change's control record (KIP-853's VotersRecord): the whole
#: new voter set, in the log it governs.
VOTERS_KEY = b"Voters"


HEADER_FIELD = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("ms")),
        pa.field("headers", pa.list_(HEADER_FIELD)),
    ]
)
#: A sparse batch's payload: the records and each one's offset minus the base offset.
SPARSE_SCHEMA = RECORD_SCHEMA.append(pa.field("offset_delta", pa.int32()))
OUTPUT_SCHEMA = RECORD_SCHEMA.append(pa.field("offset", pa.int64())).append(
    pa.field("leaderEpoch", pa.int32())
)


class LeaderChange(NamedTuple):
    """The record of a control batch: who leads the epoch and the voter set."""

    leader_id: int
    voters: list[int]
    timestamp_ms: int


class TxnMarker(NamedTuple):
    """A transaction marker: the producer whose transaction it ends, whether it commits,
    and the epoch of the transaction coordinator that wrote it."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


class ControlRecord(NamedTuple):
    """The record of any control batch: its key (``b"LeaderChange"`` or ``VOTERS_KEY``),
    the leader that wrote it and the voter set it names."""

    key: bytes
    leader_id: int
    voters: list[int]
    timestamp_ms: int


#: An Arrow IPC stream of RECORD_SCHEMA is this schema message, the record batch messages,
#: then the end-of-stream marker: an uncompressed record batch is framed with these
#: bytes instead of a new stream writer (a third of a small batch's cost to encode).
_SCHEMA_MESSAGE = RECORD_SCHEMA.serialize().to_pybytes()
_SPARSE_SCHEMA_MESSAGE = SPARSE_SCHEMA.serialize().to_pybytes()
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _ipc_payload(batch: pa.RecordBatch | pa.Table, compression: str | None) -> pa.Buffer | bytes:
    sparse = batch.schema.equals(SPARSE_SCHEMA)
    if compression is None and isinstance(batch, pa.RecordBatch):
        schema_message = _SPARSE_SCHEMA_MESSAGE if sparse else _SCHEMA_MESSAGE
        return b"".join((schema_message, batch.serialize(), _END_OF_STREAM))
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    schema = SPARSE_SCHEMA if sparse else RECORD_SCHEMA
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        if isinstance(batch, pa.Table):
            writer.write_table(batch)
        else:
            writer.write_batch(batch)
    payload: pa.Buffer = sink.getvalue()
    return payload


def _frame(
    payload: pa.Buffer | bytes,
    *,
    record_count: int,
    max_timestamp: int,
    base_offset: int,
    leader_epoch: int,
    flags: int,
    producer: Producer | None,
    last_offset_delta: int = 0,
) -> bytes:
    view = memoryview(payload)
    pad = (-len(view)) % 8  # Arrow streams are 8-aligned already; keep it guaranteed
    if pad:
        view = memoryview(bytes(view) + b"\x00" * pad)
    crc = crc32(view)
    header = _pack_header(
        base_offset,
        leader_epoch,
        record_count,
        max_timestamp,
        len(view),
        crc,
        flags,
        producer,
        last_offset_delta,
    )
    return b"".join((header, view))


def _max_timestamp(column: pa.Array | pa.ChunkedArray) -> int:
    """The largest timestamp in ms (-1 for none): the kernel reads the column as it is,
    without a cast to int64 first (a cast costs more than the max on a small batch)."""
    if isinstance(column, pa.Array) and not column.null_count and len(column):
        # numpy over the column's buffer: a tenth of pc.max's call on a small batch
        stamps = np.frombuffer(column.buffers()[1], np.int64, len(column), 8 * column.offset)
        return int(stamps.max())
    value = pc.max(column).value
    return -1 if value is None else int(value)


def null_array(rows: int, type_: pa.DataType) -> pa.Array:
    """``rows`` nulls of ``type_`` in the fewest bytes. ``pa.nulls`` gives a list column a
    child of ``rows`` null entries, written whole: for the headers column of records that
    have none, 8 bytes a record of offsets on the wire and on every replica's disk (a 100 B
    record is 128 B with them, 120 without). A list here has an empty child instead."""
    if pa.types.is_list(type_):
        validity = pa.py_buffer(bytes((rows + 7) // 8))
        offsets = pa.py_buffer(bytes(4 * (rows + 1)))
        child = pa.array([], type_.value_type)
        return pa.Array.from_buffers(
            type_, rows, [validity, offsets], null_count=rows, children=[child]
        )
    return pa.nulls(rows, type_)


def encode_arrow(
    data: pa.Table | pa.RecordBatch,
    *,
    base_offset: int = 0,
    leader_epoch: int = UNKNOWN,
    compression: str | None = None,
    control: bool = False,
    producer: Producer | None = None,
    transactional: bool = False,
    flags: int | None = None,
    max_timestamp: int | None = None,
    offset_deltas: np.ndarray | None = None,
) -> bytes:
    """Encode a Table/RecordBatch as one batch. ``value`` is required; ``key`` and
    ``headers`` default to null and ``timestamp`` to now. Columns are cast to
    ``RECORD_SCHEMA`` (in C, no per-record Python). ``compression``: None, "lz4" or
    "zstd" (Arrow IPC buffer compression; readers decompress transparently).
    ``producer``: the idempotent producer's id, epoch and first sequence number;
    ``transactional``: written inside that producer's open transaction. ``flags``: the
    header flags whole (a transaction marker's), instead of ``control`` and
    ``transactional``. ``max_timestamp``: the rows' largest timestamp when the caller
    knows it (the cleaner, re-encoding runs of a batch). ``offset_deltas``: each
    record's offset minus ``base_offset`` (strictly ascending from 0), for a sparse batch
    (the cleaner's: see the module docstring); the sparse flag follows it."""
    if flags is None:
        flags = (CONTROL_FLAG if control else 0) | (TRANSACTIONAL_FLAG if transactional else 0)
    flags &= ~SPARSE_OFFSETS_FLAG
    if offset_deltas is not None:
        flags |= SPARSE_OFFSETS_FLAG
    pid, pepoch, seq = producer or (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
    if flags & ~_KNOWN_FLAGS or not _sane_producer(pid, pepoch, seq, flags):
        raise ValueError(f"invalid producer fields {producer} for flags {flags:#x}")
    rows = data.num_rows
    if rows < 1:
        raise ValueError("a batch needs at least one record")
    last_delta = 0
    if offset_deltas is not None:
        if flags & CONTROL_FLAG:
            raise ValueError("a control batch is never sparse")
        last_delta = _check_deltas(np.asarray(offset_deltas), rows)
    names = set(data.schema.names)
    unknown = names - set(RECORD_SCHEMA.names)
    if unknown or "value" not in names:
        raise ValueError(
            f"batch columns must be a subset of {RECORD_SCHEMA.names} including 'value'; "
            f"got {data.schema.names}"
        )
    table: pa.Table | pa.RecordBatch = data
    if not data.schema.equals(RECORD_SCHEMA):  # already in shape (the Kafka listener's)
        columns: list[pa.Array | pa.ChunkedArray] = []
        for field in RECORD_SCHEMA:
            if field.name in names:
                columns.append(data.column(field.name).cast(field.type))
            elif field.name == "timestamp":
                now = pa.scalar(time.time_ns() // 1_000_000, pa.timestamp("ms"))
                columns.append(pa.repeat(now, rows))
            else:
                columns.append(null_array(rows, field.type))
        table = pa.Table.from_arrays(columns, schema=RECORD_SCHEMA)
    if offset_deltas is not None:
        table = table.append_column(
            SPARSE_SCHEMA.field("offset_delta"), pa.array(offset_deltas, pa.int32())
        )
    return _frame(
        _ipc_payload(table, compression),
        record_count=rows,
        max_timestamp=(
            _max_timestamp(table.column("timestamp")) if max_timestamp is None else max_timestamp
        ),
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        flags=flags,
        producer=producer,
        last_offset_delta=last_delta,
    )


def _check_deltas(deltas: np.ndarray, rows: int) -> int:
    """The last of a sparse batch's offset deltas, once they are found to be a delta a
    row, strictly ascending from 0 and int32 (else ValueError)."""
    if len(deltas) != rows or deltas[0] != 0 or (rows > 1 and (np.diff(deltas) <= 0).any()):
        raise ValueError(f"offset deltas must be {rows} strictly ascending from 0")
    last = int(deltas[-1])
    if last > MAX_OFFSET_DELTA:
        raise ValueError(f"offset delta {last} past {MAX_OFFSET_DELTA}")
    return last


def encode_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[int | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None = None,
    *,
    base_offset: int = 0,
    leader_epoch: int = UNKNOWN,
    compression: str | None = None,
    producer: Producer | None = None,
    transactional: bool = False,
) -> bytes:
    """Encode Python lists as one batch (what a producer sends). ``timestamps`` are ms
    since the epoch (default now); ``headers`` per record a list of (key, value);
    ``transactional``: inside ``producer``'s open transaction."""
    rows = len(values)
    columns: dict[str, pa.Array] = {"value": pa.array(values, pa.binary())}
    if keys is not None:
        columns["key"] = pa.array(keys, pa.binary())
    if timestamps is not None:
        columns["timestamp"] = pa.array(timestamps, pa.int64()).cast(pa.timestamp("ms"))
    if headers is not None:
        columns["headers"] = pa.array(headers, pa.list_(HEADER_FIELD))
    for name, column in columns.items():
        if len(column) != rows:
            raise ValueError(f"column {name!r} has {len(column)} entries, values has {rows}")
    return encode_arrow(
        pa.RecordBatch.from_pydict(columns),
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        compression=compression,
        producer=producer,
        transactional=transactional,
    )


#: A transaction marker's record as on Kafka's wire (Kafka's ControlRecordType: 0 abort,
#: 1 commit; EndTransactionMarker: version 0, coordinator epoch).
_MARKER_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


def encode_txn_marker(
    marker: TxnMarker, timestamp_ms: int, *, leader_epoch: int = UNKNOWN, base_offset: int = 0
) -> bytes:
    """The control batch that ends ``marker.producer_id``'s open transaction."""
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([_MARKER_KEY.pack(0, 1 if marker.commit else 0)], pa.binary()),
            "value": pa.array([_MARKER_VALUE.pack(0, marker.coordinator_epoch)], pa.binary()),
            "timestamp": pa.array([timestamp_ms], pa.int64()).cast(pa.timestamp("ms")),
        }
    )
    flags = _MARKER_FLAGS | (COMMIT_FLAG if marker.commit else 0)
    producer = Producer(marker.producer_id, marker.producer_epoch, NO_SEQUENCE)
    return encode_arrow(
        batch, base_offset=base_offset, leader_epoch=leader_epoch, producer=producer, flags=flags
    )


def decode_txn_marker(batch: bytes | bytearray | memoryview) -> TxnMarker:
    """The transaction marker a single control batch holds (ValueError if it is not one)."""
    header = parse_header(batch, 0)
    if header.marker is None:
        raise ValueError(f"batch at offset {header.base_offset} is not a transaction marker")
    validate_payload(batch, header)
    rows = pa.Table.from_batches(_read_payload(pa.py_buffer(batch), header))
    value = rows.column("value")[0].as_py()
    if value is None or len(value) != _MARKER_VALUE.size:
        raise CorruptRecordError(f"transaction marker at {header.base_offset}: bad value")
    _, coordinator_epoch = _MARKER_VALUE.unpack(value)
    return TxnMarker(header.producer_id, header.producer_epoch, header.marker, coordinator_epoch)


def encode_control_batch(
    leader_id: int,
    voters: Sequence[int],
    timestamp_ms: int,
    *,
    leader_epoch: int = UNKNOWN,
    base_offset: int = 0,
    key: bytes = _CONTROL_KEY,
) -> bytes:
    """A control batch of one record: key ``b"LeaderChange"`` (a new leader's first
    record) or ``VOTERS_KEY`` (a voter-set change), value a msgpack map
    {"version": 0, "leader_id": int, "voters": [int]}."""
    value = msgpack.packb({"version": 0, "leader_id": leader_id, "voters": list(voters)})
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([key], pa.binary()),
            "value": pa.array([value], pa.binary()),
            "timestamp": pa.array([timestamp_ms], pa.int64()).cast(pa.timestamp("ms")),
        }
    )
    return encode_arrow(batch, base_offset=base_offset, leader_epoch=leader_epoch, control=True)


def encode_voters_batch(
    leader_id: int,
    voters: Sequence[int],
    timestamp_ms: int,
    *,
    leader_epoch: int = UNKNOWN,
    base_offset: int = 0,
) -> bytes:
    """The control batch of a voter-set change (KIP-853's VotersRecord)."""
    return encode_control_batch(
        leader_id,
        voters,
        timestamp_ms,
        leader_epoch=leader_epoch,
        base_offset=base_offset,
        key=VOTERS_KEY,
    )


#: Schema messages (their flatbuffer bytes) already found equal to RECORD_SCHEMA,
#: SPARSE_SCHEMA or neither (None): every writer of one pyarrow version sends the same
#: bytes, so the schema of a batch is compared once, not decoded per batch. Bounded:
#: past this many, a new one is decoded.
_SCHEMA_VERDICTS: dict[bytes, pa.Schema | None] = {}
_SCHEMA_VERDICTS_MAX = 64
#: The metadata of schema messages found equal to one of the two and without a body: a
#: payload opening with one is past its schema after 8 + len(metadata) bytes.
_SCHEMA_PREFIXES: dict[bytes, pa.Schema] = {}
#: An Arrow message's continuation marker; a stream's end: it and a zero metadata length.
_CONTINUATION = b"\xff\xff\xff\xff"
_END_OF_STREAM = _CONTINUATION + b"\x00\x00\x00\x00"


def _schema_of(message: pa.ipc.Message) -> pa.Schema | None:
    """RECORD_SCHEMA or SPARSE_SCHEMA, whichever the schema message holds; None: neither."""
    meta = message.metadata.to_pybytes()
    if meta in _SCHEMA_VERDICTS:
        return _SCHEMA_VERDICTS[meta]
    schema = pa.ipc.read_schema(message)
    verdict = next(
        (known for known in (RECORD_SCHEMA, SPARSE_SCHEMA) if schema.equals(known)), None
    )
    if len(_SCHEMA_VERDICTS) < _SCHEMA_VERDICTS_MAX:
        _SCHEMA_VERDICTS[meta] = verdict
        if verdict is not None and (message.body is None or message.body.size == 0):
            _SCHEMA_PREFIXES[meta] = verdict
    return verdict


def _read_payload(
    pbuf: pa.Buffer, header: BatchHeader, *, full: bool = False
) -> list[pa.RecordBatch]:
    """Decode one batch's Arrow payload (zero-copy) and check schema and row count; with
    ``full``, also every buffer of every column (offsets in bounds, UTF-8 keys of
    headers: what a reader would otherwise trip over). A payload laid out as the encoder
    writes one (a schema message whose bytes were found equal to RECORD_SCHEMA's, or
    SPARSE_SCHEMA's, before; one record batch; the end of the stream) is read as such
    (``_single_batch``), any other message by message (``_read_messages``): the same
    checks either way. A sparse batch's batches have SPARSE_SCHEMA, its offset deltas
    checked."""
    payload = pbuf.slice(header.position + HEADER_SIZE, header.payload_length)
    view = memoryview(payload).cast("B")  # pyarrow exports signed bytes
    known, found = _known_schema_prefix(view)
    if known and found is (SPARSE_SCHEMA if header.is_sparse else RECORD_SCHEMA):
        try:
            single = _single_batch(payload, view, known, found, full)
        except (pa.ArrowInvalid, OSError, ValueError, EOFError) as exc:
            raise _unreadable(header, exc) from exc
        if single is not None:
            _check_rows(header, single.num_rows)
            return [single]
    return _read_messages(pbuf, header, full=full)


def _read_messages(
    pbuf: pa.Buffer, header: BatchHeader, *, full: bool = False
) -> list[pa.RecordBatch]:
    """``_read_payload`` of any payload: the stream read message by message, a schema,
    then record batches, then its end. A schema message whose bytes were found equal to
    RECORD_SCHEMA's (SPARSE_SCHEMA's) before is skipped by comparing them."""
    length = header.payload_length
    payload = pbuf.slice(header.position + HEADER_SIZE, length)
    view = memoryview(payload).cast("B")  # pyarrow exports signed bytes
    stream = pa.BufferReader(payload)
    batches: list[pa.RecordBatch] = []
    expected = SPARSE_SCHEMA if header.is_sparse else RECORD_SCHEMA
    try:
        known, found = _known_schema_prefix(view)
        if known:
            stream.seek(known)
        else:
            first = pa.ipc.read_message(stream)
            if first.type != "schema":
                raise CorruptRecordError(
                    f"{_where(header)}: its Arrow stream starts with a {first.type}"
                )
            found = _schema_of(first)
        if found is not expected:
            raise CorruptRecordError(
                f"{_where(header)} has schema {found if found is not None else 'unknown'}, "
                f"expected {expected} (sparse flag {header.is_sparse})"
            )
        while True:
            at = stream.tell()
            if length - at < 8 or view[at : at + 8] == _END_OF_STREAM:
                break  # as a stream reader: what follows the end marker is not read
            message = pa.ipc.read_message(stream)
            if message.type != "record batch":
                raise CorruptRecordError(
                    f"{_where(header)}: its Arrow stream holds a {message.type}"
                )
            batch = pa.ipc.read_record_batch(message, expected)
            if full:
                batch.validate(full=True)
            batches.append(batch)
    except CorruptRecordError:
        raise
    except (pa.ArrowInvalid, OSError, ValueError, EOFError) as exc:
        raise _unreadable(header, exc) from exc
    _check_rows(header, sum(b.num_rows for b in batches))
    return batches


def _unreadable(header: BatchHeader, exc: Exception) -> CorruptRecordError:
    return CorruptRecordError(f"{_where(header)} has an unreadable Arrow payload: {exc}")


def _check_rows(header: BatchHeader, rows: int) -> None:
    """A payload's rows are as many as its header says (else CorruptRecordError)."""
    if rows != header.record_count:
        raise CorruptRecordError(
            f"{_where(header)} holds {rows} rows, header says {header.record_count}"
        )


def _single_batch(
    payload: pa.Buffer, view: memoryview, at: int, schema: pa.Schema, full: bool
) -> pa.RecordBatch | None:
    """The one record batch of a payload laid out as an encoder writes one (the schema
    message, ending at ``at``, then one record batch message, then the end of the
    stream, ending the payload), read and checked as ``_read_messages`` would read and
    check it, without its stream reader; None for any other layout (``_read_messages``
    then reads it, and says what is wrong with it)."""
    if view[at : at + 4] != _CONTINUATION:
        return None
    metadata_end = at + 8 + int.from_bytes(view[at + 4 : at + 8], "little", signed=True)
    message = pa.ipc.read_message(payload.slice(at))
    if message.type != "record batch":
        return None
    end = metadata_end + message.body.size
    if end + 8 != len(view) or view[end:] != _END_OF_STREAM:
        return None
    batch = pa.ipc.read_record_batch(message, schema)
    if full:
        batch.validate(full=True)
    return batch


def _offset_deltas(batches: list[pa.RecordBatch], header: BatchHeader) -> np.ndarray:
    """A sparse batch's offset deltas (int64), checked: no nulls, strictly ascending from
    0 to the header's last_offset_delta (else CorruptRecordError)."""
    columns = [b.column(_DELTA_COLUMN) for b in batches]
    if any(c.null_count for c in columns):
        raise CorruptRecordError(f"{_where(header)} has a null offset delta")
    deltas = np.concatenate([c.to_numpy() for c in columns]).astype(np.int64)
    if (
        deltas[0] != 0
        or deltas[-1] != header.last_offset_delta
        or (len(deltas) > 1 and (np.diff(deltas) <= 0).any())
    ):
        raise CorruptRecordError(
            f"{_where(header)}: its offset deltas are not strictly ascending from 0 to "
            f"{header.last_offset_delta}"
        )
    return deltas


def read_records(
    pbuf: pa.Buffer, header: BatchHeader, *, full: bool = False
) -> tuple[list[pa.RecordBatch], np.ndarray | None]:
    """A batch's records (zero-copy views of ``pbuf``, the buffer ``header`` was parsed
    from) with RECORD_SCHEMA, checked as ``batches_to_table`` checks them, and a sparse
    batch's offset deltas (None for a batch whose offsets are implicit)."""
    batches = _read_payload(pbuf, header, full=full)
    if not header.is_sparse:
        return batches, None
    deltas = _offset_deltas(batches, header)
    return [b.drop_columns([_DELTA_COLUMN]) for b in batches], deltas


_DELTA_COLUMN = "offset_delta"


def _where(header: BatchHeader) -> str:
    return f"batch at position {header.position}"


def _known_schema_prefix(view: memoryview) -> tuple[int, pa.Schema | None]:
    """Length of the schema message that opens ``view`` when its bytes are those of a
    schema message found equal to RECORD_SCHEMA or SPARSE_SCHEMA before (continuation
    marker, metadata length, metadata; a schema message has no body), and that schema;
    else (0, None): read it as a message."""
    if len(view) < 8 or view[:4] != _CONTINUATION:
        return 0, None
    end = 8 + int.from_bytes(view[4:8], "little", signed=True)
    if not 8 < end <= len(view):
        return 0, None
    schema = _SCHEMA_PREFIXES.get(bytes(view[8:end]))
    return (end, schema) if schema is not None else (0, None)


def validate_arrow(buf: bytes | bytearray | memoryview, header: BatchHeader) -> None:
    """Check that a batch's payload is a well-formed Arrow stream with RECORD_SCHEMA (a
    sparse batch: SPARSE_SCHEMA, its offset deltas as its header says) and as many rows
    as its header says, every buffer checked (what a leader checks on client batches
    before any reader sees them)."""
    read_records(pa.py_buffer(buf), header, full=True)


def batches_to_table(
    buf: bytes | bytearray | memoryview,
    *,
    include_control: bool = False,
    verify_crc: bool = True,
    aborted: Sequence[tuple[int, int]] | None = None,
) -> pa.Table:
    """Fetched batch bytes -> a Table with ``OUTPUT_SCHEMA`` (RECORD_SCHEMA plus
    ``offset: int64`` and ``leaderEpoch: int32``). Payload columns are zero-copy views of
    ``buf``; offset and epoch columns are computed with Arrow kernels over all batches at once.
    Control batches are skipped (by header flag, without decoding) unless
    ``include_control``. ``aborted`` (a read_committed fetch's aborted transactions:
    producer id, first offset): those transactions' batches are skipped too, and every
    control batch (``storage.transactions.committed_batches``)."""
    pbuf = pa.py_buffer(buf)
    record_batches: list[pa.RecordBatch] = []
    bases: list[int] = []
    counts: list[int] = []
    epochs: list[int] = []
    deltas: list[np.ndarray | None] = []
    headers: Iterable[BatchHeader] = iter_batches(buf, verify_crc=verify_crc)
    if aborted:  # without aborted transactions, skipping control batches is all it does
        headers = committed_batches(headers, aborted)  # type: ignore[assignment]
    for header in headers:
        if header.is_control and not include_control:
            continue
        records, batch_deltas = read_records(pbuf, header)
        record_batches.extend(records)
        bases.append(header.base_offset)
        counts.append(header.record_count)
        epochs.append(header.leader_epoch)
        deltas.append(batch_deltas)
    if not record_batches:
        return OUTPUT_SCHEMA.empty_table()
    table = pa.Table.from_batches(record_batches, schema=RECORD_SCHEMA)
    offsets, epoch_col = _offset_and_epoch_columns(bases, counts, epochs)
    if any(d is not None for d in deltas):
        offsets = _sparse_offsets(bases, counts, deltas)
    table = table.append_column(OUTPUT_SCHEMA.field("offset"), offsets)
    return table.append_column(OUTPUT_SCHEMA.field("leaderEpoch"), epoch_col)


def _offset_and_epoch_columns(
    bases: list[int], counts: list[int], epochs: list[int]
) -> tuple[pa.Array, pa.Array]:
    """Offsets as a cumulative sum of run-end-encoded steps (the first row of a batch
    jumps to its base offset, the others step by 1); epochs as one run per batch. The
    Python loop is per batch; everything per record runs in Arrow's C++ kernels."""
    step_ends: list[int] = []
    steps: list[int] = []
    epoch_ends: list[int] = []
    row = 0
    previous = 0
    for base, count in zip(bases, counts, strict=True):
        row += 1
        step_ends.append(row)
        steps.append(base - previous)
        if count > 1:
            row += count - 1
            step_ends.append(row)
            steps.append(1)
        epoch_ends.append(row)
        previous = base + count - 1
    step_runs = pa.RunEndEncodedArray.from_arrays(
        pa.array(step_ends, pa.int64()), pa.array(steps, pa.int64())
    )
    epoch_runs = pa.RunEndEncodedArray.from_arrays(
        pa.array(epoch_ends, pa.int64()), pa.array(epochs, pa.int32())
    )
    offsets = pc.cumulative_sum(pc.run_end_decode(step_runs))
    return offsets, pc.run_end_decode(epoch_runs)


def _sparse_offsets(
    bases: list[int], counts: list[int], deltas: list[np.ndarray | None]
) -> pa.Array:
    """The offset column when some batches are sparse: base + delta for those, base + i
    for the others."""
    parts = [
        base + (np.arange(count, dtype=np.int64) if d is None else d)
        for base, count, d in zip(bases, counts, deltas, strict=True)
    ]
    return pa.array(np.concatenate(parts), pa.int64())


def decode_control(batch: bytes | bytearray | memoryview) -> ControlRecord:
    """Decode the record of a single control batch (either kind)."""
    header = parse_header(batch, 0)
    if not header.is_control:
        raise ValueError(f"batch at offset {header.base_offset} is not a control batch")
    validate_payload(batch, header)
    rows = pa.Table.from_batches(_read_payload(pa.py_buffer(batch), header))
    key = rows.column("key")[0].as_py()
    if key not in (_CONTROL_KEY, VOTERS_KEY):
        raise CorruptRecordError(f"unknown control record type {key!r}")
    value = msgpack.unpackb(rows.column("value")[0].as_py())
    ts = rows.column("timestamp").cast(pa.int64())[0].as_py()
    voters = [int(v) for v in value["voters"]]
    return ControlRecord(key, int(value["leader_id"]), voters, int(ts))


def decode_leader_change(batch: bytes | bytearray | memoryview) -> LeaderChange:
    """Decode the leader-change record of a single control batch."""
    record = decode_control(batch)
    if record.key != _CONTROL_KEY:
        raise CorruptRecordError(f"control record {record.key!r} is not a leader change")
    return LeaderChange(record.leader_id, record.voters, record.timestamp_ms)
