"""RecordBatch v2 records <-> Arrow columns, vectorised (numpy and Arrow kernels).

The listener's record path: a produced batch is decoded straight into Arrow columns
(``RECORD_SCHEMA``) and stored batches' columns are encoded straight into RecordBatch v2,
with no Python object per record. Both give exactly what the reference codec in
``records`` gives (its lists as Arrow arrays, its bytes), which the property tests check
path by path. A batch no vectorised path takes (a varint of more than 9 bytes,
timestamps near the ends of int64, a malformed batch, ...) goes to the reference codec,
so every input gets the reference's answer or its error.

Decoding tries, in order:

- runs: the records fall into a few runs of one layout each (librdkafka's batches: one
  value size, null or equal keys, no headers; a new run where the offset or timestamp
  delta grows a byte). A run is a 2-D array, a record a row, a field a column: one
  comparison checks every record's structure bytes, and keys and values are sliced out.
- short: record bounds found in strides (or one length varint at a time), then every
  field read for all records with lookup tables over byte pairs (varints of one or two
  bytes; no headers), checked once at the end.
- general: the same bounds, varints of up to 9 bytes read for all records at once and
  checked field by field; records with headers by the reference's header decoder.

Encoding lays out runs of one layout the same way (a template row broadcast, the varying
columns filled), or else builds each record's varint bytes in numpy and concatenates
them with the keys and values in one Arrow ``take``. ``encode_many`` encodes the stored
batches of a Fetch response together, leaving per batch only its header and CRC32C.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from ..storage.records import HEADER_FIELD, RECORD_SCHEMA, null_array
from .records import (
    BATCH_HEADER_SIZE,
    COMPRESSION_NONE,
    BatchFields,
    Header,
    KafkaRecordBatch,
    _uvarint_slow,
    decode_records,
    encode_batch,
    iter_decoded,
    read_frame,
)
from .records import _decode_headers as _reference_headers
from .wire import Buffer, KafkaDecodeError, put_uvar

__all__ = [
    "KafkaBatchFields",
    "KafkaColumns",
    "columns_from_lists",
    "decode_columns",
    "decode_frame",
    "decode_joined",
    "encode_columns",
    "encode_many",
    "iter_batches",
    "with_records",
]

Ints = npt.NDArray[np.int64]
_HEADERS_TYPE = pa.list_(HEADER_FIELD)
_PAD = bytes(16)  # gathers read up to 10 bytes past a field; the padding keeps them in bounds
# Timestamps whose deltas and sums cannot overflow int64 (the reference uses Python ints).
_TS_LIMIT = 1 << 62
# Runs (and strides of equal-length records) shorter than this stop the search for more:
# the records are then decoded another way. At most _MAX_STRIDES runs or strides.
_MIN_STRIDE_RUN = 16
_MAX_STRIDES = 16
_ZIGZAG_BYTE = np.array([(b >> 1) ^ -(b & 1) for b in range(256)], np.int64)
_SPAN = np.arange(10, dtype=np.int64)
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
# varint size thresholds: an unsigned value v takes 1 + searchsorted(_VARINT_LIMITS, v) bytes
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)
_HEADER = struct.Struct(">qiibIhiqqqhii")
_TIMESTAMP = pa.timestamp("ms")


def _pair_tables() -> tuple[Ints, Ints, Ints, npt.NDArray[np.bool_], Ints]:
    """Lookup tables over two bytes (b0 | b1 << 8) read as a varint of one or two bytes:
    its size (_HUGE if longer), zigzag value, as a length of nullable bytes (the bytes'
    size, 0 for null, _HUGE if below -1) and whether not null, and a record's whole size
    (length varint and body; _HUGE unless the length is positive)."""
    pair = np.arange(1 << 16, dtype=np.int64)
    b0, b1 = pair & 0xFF, pair >> 8
    one = b0 < 0x80
    two = ~one & (b1 < 0x80)
    size = np.where(one, 1, np.where(two, 2, _HUGE))
    raw = np.where(one, b0, (b0 & 0x7F) | ((b1 & 0x7F) << 7))
    value = (raw >> 1) ^ -(raw & 1)
    short = size < _HUGE
    length = np.where(short & (value >= 0), value, np.where(short & (value == -1), 0, _HUGE))
    record = np.where(short & (value > 0), size + value, _HUGE)
    return size, value, length, short & (value >= 0), record


_HUGE = 1 << 40  # a size that puts any later position past every record
_PAIR_SIZE, _PAIR_VALUE, _PAIR_BYTES, _PAIR_PRESENT, _PAIR_RECORD = _pair_tables()
# After the value: a zero header count is one byte; any other is for _decode_general.
_HEADERLESS = np.where(np.arange(256) == 0, 1, _HUGE).astype(np.int64)


@dataclass
class KafkaColumns(BatchFields):
    """One decoded RecordBatch v2, records as an Arrow batch with ``RECORD_SCHEMA``."""

    records: Any = None  # pa.RecordBatch (RECORD_SCHEMA)
    offset_deltas: Ints = field(default_factory=lambda: np.zeros(0, np.int64))
    size: int = 0  # bytes on the wire

    @property
    def record_count(self) -> int:
        return int(self.records.num_rows)


def decode_columns(buf: Buffer, position: int = 0, *, verify_crc: bool = True) -> KafkaColumns:
    """Decode the RecordBatch v2 at ``position`` into Arrow columns; errors as
    ``records.decode_batch`` raises them (KafkaDecodeError)."""
    batch, data, count = read_frame(buf, position, verify_crc=verify_crc)
    return decode_frame(batch, data, count, position)


def decode_frame(
    batch: KafkaRecordBatch, data: bytes, count: int, position: int = 0
) -> KafkaColumns:
    """A batch ``records.read_frame`` read (its fields, records bytes and count) decoded
    into Arrow columns; errors as ``records.decode_batch`` raises them."""
    fast = _decode_fast(data, count, batch.base_timestamp) if count else None
    if fast is None:
        decode_records(data, count, batch, position)
        return columns_from_lists(batch)
    records, offset_deltas = fast
    return _columns(batch, records, offset_deltas)


_ROWS = np.arange(1 << 12, dtype=np.int64)


def with_records(batch: KafkaRecordBatch, records: pa.RecordBatch) -> KafkaColumns:
    """A batch's fields with ``records`` as its rows (offset deltas 0..n-1, as a produced
    batch's are once checked): a batch's share of what :func:`decode_joined` gave."""
    rows = records.num_rows
    return _columns(batch, records, _ROWS[:rows] if rows <= len(_ROWS) else np.arange(rows))


def decode_joined(sections: Sequence[tuple[int, bytes, int]]) -> pa.RecordBatch | None:
    """The records of several produced batches decoded in one pass: ``sections`` are each
    batch's (base timestamp, records bytes, record count) as ``records.read_frame`` gives
    them. The rows are those decoding each with :func:`decode_frame` and concatenating
    give, for batches whose records tile their own bytes exactly and whose offset deltas
    run 0..n-1; None where any batch is not like that or needs more than the fast paths
    (then each is decoded alone, which says what is wrong). What a batch costs to decode
    is mostly per call: a producer's small batches, decoded together, cost their records."""
    if not sections:
        return None
    counts = np.fromiter((c for _, _, c in sections), np.int64, len(sections))
    bases = np.fromiter((t for t, _, _ in sections), np.int64, len(sections))
    lengths = np.fromiter((len(d) for _, d, _ in sections), np.int64, len(sections))
    if counts.min() < 1 or bases.min() < -_TS_LIMIT or bases.max() >= _TS_LIMIT:
        return None
    count = int(counts.sum())
    first_rows = np.cumsum(counts) - counts
    first_bytes = np.cumsum(lengths) - lengths
    data = b"".join(d for _, d, _ in sections)
    padded = data + _PAD
    arr = np.frombuffer(padded, np.uint8)
    pairs: npt.NDArray[np.uint16] = np.ndarray((len(padded) - 1,), np.dtype("<u2"), padded, 0, (1,))
    # Batches whose bytes are their counts times one record's length (each first record's)
    # mostly hold records of one layout: one run reads them all as the rows of one array
    # (and, of one length, the records start each batch where its bytes do).
    strides = _PAIR_RECORD[pairs[first_bytes]]
    uniform = (strides == strides[0]).all() and np.array_equal(lengths, counts * strides)
    runs = _decode_runs(data, arr, count, strides=1) if uniform else None
    if runs is not None:
        ts_deltas, offset_deltas, keys, values = runs
        headers = null_array(count, _HEADERS_TYPE)
    else:
        bounds = _section_bounds(data, pairs, first_bytes, first_bytes + lengths, counts)
        if bounds is None:
            return None
        bounded = _decode_bounded(data, arr, pairs, *bounds)
        if bounded is None:
            return None
        ts_deltas, offset_deltas, keys, values, headers = bounded
    if not np.array_equal(offset_deltas, np.arange(count) - np.repeat(first_rows, counts)):
        return None
    timestamps = ts_deltas + np.repeat(bases, counts)
    stamps = pa.Array.from_buffers(_TIMESTAMP, count, [None, pa.py_buffer(timestamps)])
    return pa.RecordBatch.from_arrays([keys, values, stamps, headers], schema=RECORD_SCHEMA)


def _section_bounds(
    data: bytes, pairs: npt.NDArray[np.uint16], starts: Ints, stops: Ints, counts: Ints
) -> tuple[Ints, Ints] | None:
    """Where each record's body starts (past its length varint) and where it ends, for
    sections of records (a batch's each: from ``starts`` to ``stops`` in ``data``, holding
    ``counts`` records), or None unless every section's records tile its bytes exactly.

    All sections are read together, a run of records of one length each per section and
    round: a round's candidates are the records that would follow each section's next one
    if they were all as long, kept up to the first whose length varint says otherwise
    (librdkafka's batches take one to three rounds: a record grows a byte when its offset
    or timestamp delta does). Records with longer length varints, or sections still not
    read after ``_MAX_STRIDES`` rounds, are walked one record at a time."""
    total = int(counts.sum())
    bodies = np.empty(total, np.int64)
    ends = np.empty(total, np.int64)
    pos = starts.copy()  # each section's next record
    row = np.cumsum(counts) - counts  # and its row
    left = counts.copy()
    last_pair = len(pairs) - 1
    active = np.flatnonzero(left)
    walk: list[Ints] = []
    for _ in range(_MAX_STRIDES):
        stride = _PAIR_RECORD[pairs[pos[active]]]
        beyond = pos[active] + stride > stops[active]
        if beyond.any():  # a length past its section, or a longer length varint
            walk.append(active[beyond])
            active, stride = active[~beyond], stride[~beyond]
        if not active.size:
            break
        at, n, stop = pos[active], left[active], stops[active]
        varint = _PAIR_SIZE[pairs[at]]
        firsts = np.cumsum(n) - n
        j = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(firsts, n)
        each = np.repeat(stride, n)
        candidates = np.repeat(at, n) + j * each
        fits = (candidates + each <= np.repeat(stop, n)) & (
            _PAIR_RECORD[pairs[np.minimum(candidates, last_pair)]] == each
        )
        run = np.minimum(np.minimum.reduceat(np.where(fits, n.max(), j), firsts), n)
        taken = j < np.repeat(run, n)
        rows = (np.repeat(row[active], n) + j)[taken]
        kept = candidates[taken]
        bodies[rows] = kept + np.repeat(varint, n)[taken]
        ends[rows] = kept + each[taken]
        pos[active] += run * stride
        row[active] += run
        left[active] -= run
        active = active[left[active] > 0]
    for s in np.concatenate([active, *walk]):  # irregular records: one at a time
        walked = _walk(data, int(pos[s]), int(left[s]))
        if walked is None:
            return None
        bodies[row[s] : row[s] + left[s]], ends[row[s] : row[s] + left[s]] = walked
        pos[s] = walked[1][-1]
    if not np.array_equal(pos, stops):
        return None
    return bodies, ends


def iter_batches(
    buf: Buffer, *, verify_crc: bool = True, allow_partial_tail: bool = False
) -> Iterator[KafkaColumns]:
    """``records.iter_batches``, decoding each batch with :func:`decode_columns`."""
    return iter_decoded(
        decode_columns, buf, verify_crc=verify_crc, allow_partial_tail=allow_partial_tail
    )


def _fields(batch: BatchFields) -> tuple[int, ...]:
    return (
        batch.base_offset,
        batch.partition_leader_epoch,
        batch.attributes,
        batch.last_offset_delta,
        batch.base_timestamp,
        batch.max_timestamp,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
    )


def _columns(batch: KafkaRecordBatch, records: pa.RecordBatch, offset_deltas: Ints) -> KafkaColumns:
    return KafkaColumns(
        base_offset=batch.base_offset,
        partition_leader_epoch=batch.partition_leader_epoch,
        attributes=batch.attributes,
        last_offset_delta=batch.last_offset_delta,
        base_timestamp=batch.base_timestamp,
        max_timestamp=batch.max_timestamp,
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        records=records,
        offset_deltas=offset_deltas,
        size=batch.size,
    )


def _headers_column(headers: list[list[Header]]) -> pa.Array:
    if not any(headers):
        return null_array(len(headers), _HEADERS_TYPE)
    return pa.array([hs or None for hs in headers], _HEADERS_TYPE)


def columns_from_lists(batch: KafkaRecordBatch) -> KafkaColumns:
    """A batch decoded by the reference codec, as Arrow columns (records without headers
    get a null headers list)."""
    try:
        timestamps = pa.array(batch.timestamps, pa.int64()).cast(pa.timestamp("ms"))
    except OverflowError as exc:
        raise KafkaDecodeError("a record timestamp is outside int64") from exc
    records = pa.RecordBatch.from_arrays(
        [
            pa.array(batch.keys, pa.binary()),
            pa.array(batch.values, pa.binary()),
            timestamps,
            _headers_column(batch.headers),
        ],
        schema=RECORD_SCHEMA,
    )
    return _columns(batch, records, np.array(batch.offset_deltas, np.int64))


# -- decoding ---------------------------------------------------------------------------


def _decode_fast(data: bytes, count: int, base_ts: int) -> tuple[pa.RecordBatch, Ints] | None:
    """The records as (RECORD_SCHEMA batch, offset deltas), or None where the reference
    decoder must answer (what it accepts, this gives identically; what it refuses, this
    never accepts)."""
    if not -_TS_LIMIT <= base_ts < _TS_LIMIT:
        return None
    padded = data + _PAD
    arr = np.frombuffer(padded, np.uint8)
    runs = _decode_runs(data, arr, count)
    if runs is not None:
        ts_deltas, offset_deltas, keys_array, values_array = runs
        timestamps = ts_deltas + base_ts
        ts_array = pa.Array.from_buffers(_TIMESTAMP, count, [None, pa.py_buffer(timestamps)])
        columns = [keys_array, values_array, ts_array, null_array(count, _HEADERS_TYPE)]
        return pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA), offset_deltas
    # Every position's two bytes as one little-endian uint16 (an unaligned view, no copy):
    # one gather and a table lookup read a varint of one or two bytes.
    pairs: npt.NDArray[np.uint16] = np.ndarray((len(padded) - 1,), np.dtype("<u2"), padded, 0, (1,))
    bounds = _record_bounds(data, pairs, count)
    if bounds is None:
        return None
    bounded = _decode_bounded(data, arr, pairs, *bounds)
    if bounded is None:
        return None
    ts_deltas, offset_deltas, keys, values, headers = bounded
    timestamps = ts_deltas + base_ts
    ts_array = pa.Array.from_buffers(_TIMESTAMP, count, [None, pa.py_buffer(timestamps)])
    columns = [keys, values, ts_array, headers]
    return pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA), offset_deltas


def _decode_bounded(
    data: bytes, arr: npt.NDArray[np.uint8], pairs: npt.NDArray[np.uint16], bodies: Ints, ends: Ints
) -> tuple[Ints, Ints, pa.Array, pa.Array, pa.Array] | None:
    """Records whose bounds are known: (timestamp deltas, offset deltas, keys, values,
    headers) by the short path, else the general one; None where neither answers."""
    try:
        got = _decode_short(arr, pairs, bodies, ends)
    except IndexError:  # a field ran past the records: the general path says where
        got = None
    if got is None:
        got = _decode_general(data, arr, bodies, ends)
        if got is None:
            return None
    ts_deltas, offset_deltas, keys, values, headers = got
    buffer = pa.py_buffer(data)
    return ts_deltas, offset_deltas, _binary(buffer, *keys), _binary(buffer, *values), headers


class _Layout:
    """Where the fields of a record without headers sit, relative to its start: records
    with the same bytes at the fixed columns (the length varint, the key's and value's
    lengths, the header count) and the same continuation bits in the timestamp and
    offset deltas have exactly this layout."""

    __slots__ = ("stride", "ts", "od", "key", "value", "columns", "masks", "expect")

    def __init__(self, shape: tuple[int, ...], fixed_bytes: bytes) -> None:
        stride, length_end, ts_end, od_end, key_at, key_size, value_at, value_size = shape
        self.stride = stride
        ts_start = length_end + 1  # past the attributes
        self.ts = (ts_start, ts_end)
        self.od = (ts_end, od_end)
        self.key = (key_at, key_size)
        self.value = (value_at, value_size)
        fixed = [
            *range(length_end),
            *range(od_end, key_at),
            *range(key_at + max(key_size, 0), value_at),
            stride - 1,
        ]
        varying = list(range(ts_start, od_end))
        self.columns = np.array(fixed + varying, np.int64)
        self.masks = np.array([0xFF] * len(fixed) + [0x80] * len(varying), np.uint8)
        ends = {ts_end - 1, od_end - 1}
        expect = [*fixed_bytes, *(0 if i in ends else 0x80 for i in varying)]
        self.expect = np.array(expect, np.uint8)


_LAYOUTS: dict[tuple[tuple[int, ...], bytes], _Layout] = {}


def _layout(data: bytes, pos: int, end: int) -> _Layout:
    """The layout of the record at ``pos`` (one without headers, ending by ``end``)."""
    b, p = _uvarint_slow(data, pos, 5)
    n = (b >> 1) ^ -(b & 1)
    if n <= 0 or p + n > end:
        raise _NoLayout
    length_end = p
    _, p = _uvarint_slow(data, p + 1, 9)  # past the attributes, the timestamp delta
    ts_end = p
    _, p = _uvarint_slow(data, p, 5)  # offset delta
    od_end = p
    b, p = _uvarint_slow(data, p, 5)
    key_size = (b >> 1) ^ -(b & 1)
    key_at = p
    b, p = _uvarint_slow(data, p + max(key_size, 0), 5)
    value_size = (b >> 1) ^ -(b & 1)
    value_at = p
    p += max(value_size, 0)
    if key_size < -1 or value_size < -1 or p >= end or data[p] != 0 or p + 1 != length_end + n:
        raise _NoLayout
    fixed_bytes = b"".join(
        (
            data[pos:length_end],
            data[od_end:key_at],
            data[key_at + max(key_size, 0) : value_at],
            b"\x00",
        )
    )
    shape = (
        length_end + n - pos,
        length_end - pos,
        ts_end - pos,
        od_end - pos,
        key_at - pos,
        key_size,
        value_at - pos,
        value_size,
    )
    key = (shape, fixed_bytes)
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(_LAYOUTS) >= 4096:  # bounded: hostile producers could vary every field
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = _Layout(shape, fixed_bytes)
    return layout


class _NoLayout(Exception):
    pass


def _decode_runs(
    data: bytes, arr: npt.NDArray[np.uint8], count: int, strides: int = _MAX_STRIDES
) -> tuple[Ints, Ints, pa.Array, pa.Array] | None:
    """Records without headers in runs of one layout each (librdkafka's batches: a few
    runs, where the offset or timestamp delta grows a byte): each run is a 2-D array, one
    row a record, its fields columns. None if the records do not fall into at most
    ``strides`` runs."""
    end = len(data)
    pos = 0
    done = 0
    ts_parts: list[Ints] = []
    od_parts: list[Ints] = []
    key_runs: list[tuple[int, int, bytes]] = []
    value_runs: list[tuple[int, int, bytes]] = []
    for _ in range(strides):
        if done == count:
            break
        try:
            layout = _layout(data, pos, end)
        except (_NoLayout, IndexError, KafkaDecodeError):
            return None
        stride = layout.stride
        most = min(count - done, (end - pos) // stride)
        rows = arr[pos : pos + most * stride].reshape(most, stride)
        checked = rows.take(layout.columns, axis=1)
        np.bitwise_and(checked, layout.masks, out=checked)
        matches = (checked == layout.expect).all(axis=1)
        run = int(matches.argmin()) or most  # row 0 matches itself: 0 means all do
        if run < most:
            if run < _MIN_STRIDE_RUN:
                return None
            rows = rows[:run]
        ts_parts.append(_column_varints(rows, *layout.ts))
        od_parts.append(_column_varints(rows, *layout.od))
        for (at, size), runs in ((layout.key, key_runs), (layout.value, value_runs)):
            runs.append((run, size, rows[:, at : at + size].tobytes() if size > 0 else b""))
        pos += run * stride
        done += run
    if done != count or pos != end:
        return None
    ts = ts_parts[0] if len(ts_parts) == 1 else np.concatenate(ts_parts)
    od = od_parts[0] if len(od_parts) == 1 else np.concatenate(od_parts)
    return ts, od, _binary_runs(count, key_runs), _binary_runs(count, value_runs)


def _column_varints(rows: npt.NDArray[np.uint8], start: int, stop: int) -> Ints:
    """The zigzag varint in columns [start, stop) of every row (its size known)."""
    if stop - start == 1:
        one: Ints = _ZIGZAG_BYTE.take(rows[:, start])
        return one
    if stop - start == 2:
        pairs = np.ascontiguousarray(rows[:, start:stop]).view("<u2").ravel()
        two: Ints = _PAIR_VALUE.take(pairs)
        return two
    value = np.zeros(len(rows), np.uint64)
    for k in range(stop - start):
        value |= (rows[:, start + k] & 0x7F).astype(np.uint64) << _SHIFTS[k]
    zigzag: Ints = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(
        np.int64
    )
    return zigzag


def _binary_runs(count: int, runs: list[tuple[int, int, bytes]]) -> pa.Array:
    """A binary array from runs of (records, size of each or -1 for null, their bytes)."""
    sizes = {size for _, size, _ in runs}
    if sizes == {-1}:
        return null_array(count, pa.binary())
    data = pa.py_buffer(b"".join(part for _, _, part in runs))
    validity = None
    if len(sizes) == 1:
        (size,) = sizes
        offsets = _uniform_offsets(count, size)
    else:
        per_run = np.array([run for run, _, _ in runs], np.int64)
        run_sizes = np.array([size for _, size, _ in runs], np.int64)
        lengths = np.repeat(np.maximum(run_sizes, 0), per_run)
        offsets = pa.py_buffer(_offsets(lengths))
        if -1 in sizes:
            valid = np.repeat(run_sizes >= 0, per_run)
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), count, [validity, offsets, data])


# The offsets of equal-sized values (what most batches have) are made once per size and
# shared: Arrow buffers are immutable, and a slice of one is a buffer of its own size.
# (Arrays are not shared: a slice of a longer array would be written whole to storage.)
_CACHED_ROWS = 1 << 14  # 64 KiB of offsets per cached size
_UNIFORM: dict[int, pa.Buffer] = {}


def _uniform_offsets(count: int, size: int) -> pa.Buffer:
    """The offsets of ``count`` values of ``size`` bytes each."""
    if count > _CACHED_ROWS or size * _CACHED_ROWS >= 1 << 31:
        return pa.py_buffer((np.arange(count + 1, dtype=np.int64) * size).astype(np.int32))
    offsets = _UNIFORM.get(size)
    if offsets is None:
        if len(_UNIFORM) >= 32:  # bounded: producers may send values of any size
            _UNIFORM.clear()
        uniform = np.arange(_CACHED_ROWS + 1, dtype=np.int32) * np.int32(size)
        offsets = _UNIFORM[size] = pa.py_buffer(uniform)
    return offsets.slice(0, 4 * (count + 1))


_Field = tuple[Ints, Ints, npt.NDArray[np.bool_]]  # starts, sizes, non-null
_Decoded = tuple[Ints, Ints, _Field, _Field, pa.Array]


def _decode_short(
    arr: npt.NDArray[np.uint8], pairs: npt.NDArray[np.uint16], bodies: Ints, ends: Ints
) -> _Decoded | None:
    """Records whose varints are all one or two bytes long and that have no headers (what
    producers send): every field read with a table lookup, all checks at the end. A
    longer varint or a bad length reads as a huge size, which lands past the records."""
    pos = bodies + 1  # past the record attributes (unused in v2)
    pair = pairs[pos]
    ts_deltas = _PAIR_VALUE[pair]
    pos = pos + _PAIR_SIZE[pair]
    pair = pairs[pos]
    offset_deltas = _PAIR_VALUE[pair]
    pos = pos + _PAIR_SIZE[pair]
    fields = []
    for _ in range(2):  # key, then value: nullable bytes
        pair = pairs[pos]
        pos = pos + _PAIR_SIZE[pair]
        sizes = _PAIR_BYTES[pair]
        fields.append((pos, sizes, _PAIR_PRESENT[pair]))
        pos = pos + sizes
    pos = pos + _HEADERLESS[arr[pos]]
    if not np.array_equal(pos, ends):
        return None
    return ts_deltas, offset_deltas, fields[0], fields[1], null_array(len(pos), _HEADERS_TYPE)


def _decode_general(
    data: bytes, arr: npt.NDArray[np.uint8], bodies: Ints, ends: Ints
) -> _Decoded | None:
    """Any record the reference decodes, but varints of at most 9 bytes: fields read for
    all records at once, checked field by field; headers by the reference's code."""
    pos = bodies + 1
    got = _varints(arr, pos, 9)
    if got is None:
        return None
    ts_deltas, pos = got
    got = _varints(arr, pos, 5)
    if got is None:
        return None
    offset_deltas, pos = got
    fields = []
    for _ in range(2):
        got = _varints(arr, pos, 5)
        if got is None:
            return None
        lengths, pos = got
        if lengths.min() < -1:
            return None
        sizes = np.maximum(lengths, 0)
        fields.append((pos, sizes, lengths >= 0))
        pos = pos + sizes
        if (pos > ends).any():  # a length past its record: the reference says which
            return None
    header_counts = arr[pos]
    if header_counts.max() == 0:
        headers = null_array(len(pos), _HEADERS_TYPE)
        pos = pos + 1
    else:
        got_headers = _headers(data, pos, ends, header_counts)
        if got_headers is None:
            return None
        headers, pos = got_headers
    if not np.array_equal(pos, ends):
        return None
    return ts_deltas, offset_deltas, fields[0], fields[1], headers


def _record_bounds(
    data: bytes, pairs: npt.NDArray[np.uint16], count: int
) -> tuple[Ints, Ints] | None:
    """Where each record's body starts (past its length varint) and where it ends, or
    None if the lengths do not tile the records section exactly."""
    end = len(data)
    pos = 0
    done = 0
    bodies: list[Ints] = []
    ends: list[Ints] = []
    for _ in range(_MAX_STRIDES):
        if done == count:
            break
        try:
            b, body = _uvarint_slow(data, pos, 5)
        except (IndexError, KafkaDecodeError):
            return None
        n = (b >> 1) ^ -(b & 1)
        if n <= 0:
            return None
        varint = body - pos
        stride = varint + n
        # Records of this one's length, back to back, are records exactly when their
        # length varints read as this one's: each then ends where the next begins.
        most = min(count - done, (end - pos) // stride)
        if most < 1:
            return None
        starts = np.arange(pos, pos + most * stride, stride, dtype=np.int64)
        if varint <= 2:
            same = _PAIR_RECORD[pairs[starts]] == stride
            run = most if same.all() else int(same.argmin())
        else:
            run = 1
        if run < most:
            starts = starts[:run]
        bodies.append(starts + varint)
        ends.append(starts + stride)
        pos += run * stride
        done += run
        if run < _MIN_STRIDE_RUN:
            break
    if done < count:
        walked = _walk(data, pos, count - done)
        if walked is None:
            return None
        bodies.append(walked[0])
        ends.append(walked[1])
        pos = int(walked[1][-1])
    if pos != end:
        return None
    if len(bodies) == 1:
        return bodies[0], ends[0]
    return np.concatenate(bodies), np.concatenate(ends)


def _walk(data: bytes, pos: int, count: int) -> tuple[Ints, Ints] | None:
    """Record bounds one length varint at a time (records of irregular lengths)."""
    bodies: list[int] = []
    ends: list[int] = []
    body_append = bodies.append
    end_append = ends.append
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                b, pos = _uvarint_slow(data, pos, 5)
            if b == 0 or b & 1:  # a record is at least one byte long
                return None
            body_append(pos)
            pos += b >> 1
            end_append(pos)
    except (IndexError, KafkaDecodeError):
        return None
    return np.array(bodies, np.int64), np.array(ends, np.int64)


def _varints(arr: npt.NDArray[np.uint8], pos: Ints, max_bytes: int) -> tuple[Ints, Ints] | None:
    """The zigzag varint at each position (at most ``max_bytes`` long, max_bytes <= 9)
    and the position after it; None if one is longer."""
    first = arr[pos]
    if first.max() < 0x80:
        return _ZIGZAG_BYTE[first], pos + 1
    for width in (2, max_bytes):
        block = arr[pos[:, None] + _SPAN[:width]]
        ends = block < 0x80
        if ends.any(axis=1).all():
            break
    else:
        return None
    size = ends.argmax(axis=1)  # index of each varint's last byte
    keep = _SPAN[:width] <= size[:, None]
    parts = (block & 0x7F).astype(np.uint64) << _SHIFTS[:width]
    value = np.where(keep, parts, 0).sum(axis=1, dtype=np.uint64)
    zigzag = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return zigzag, pos + size + 1


def _headers(
    data: bytes, pos: Ints, ends: Ints, counts: npt.NDArray[np.uint8]
) -> tuple[pa.Array, Ints] | None:
    """Records with headers are read by the reference header decoder, one by one."""
    column: list[list[Header] | None] = [None] * len(pos)
    after = pos + 1
    got: list[list[Header]] = []
    for i in np.flatnonzero(counts).tolist():
        try:
            after[i] = _reference_headers(data, int(pos[i]), int(ends[i]), got.append)
        except (IndexError, KafkaDecodeError):
            return None
        column[i] = got[-1] or None
    if not any(column):
        return null_array(len(pos), _HEADERS_TYPE), after
    return pa.array(column, _HEADERS_TYPE), after


def _binary(buffer: pa.Buffer, starts: Ints, sizes: Ints, valid: npt.NDArray[np.bool_]) -> pa.Array:
    """The byte ranges [start, start + size) of ``buffer`` as a binary array (invalid
    entries null)."""
    n = len(starts)
    if not valid.any():
        return null_array(n, pa.binary())
    # Elements alternate between a field and the bytes up to the next field; taking the
    # even elements copies the fields out in C++.
    bounds = np.empty(2 * n + 1, np.int32)
    bounds[0 : 2 * n : 2] = starts
    bounds[1 : 2 * n : 2] = starts + sizes
    bounds[2 * n] = bounds[2 * n - 1]
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(bounds), buffer])
    fields = interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))
    if valid.all():
        return fields
    validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    _, offsets, values = fields.buffers()
    return pa.Array.from_buffers(pa.binary(), n, [validity, offsets, values or pa.py_buffer(b"")])


# -- encoding ---------------------------------------------------------------------------

_SMALL = 1 << 14  # unsigned values below this are varints of one or two bytes
_small = np.arange(_SMALL, dtype=np.int64)
_SMALL_SIZE = np.where(_small < 0x80, 1, 2).astype(np.int64)
_SMALL_LOW = ((_small & 0x7F) | np.where(_small < 0x80, 0, 0x80)).astype(np.uint8)
_SMALL_HIGH = (_small >> 7).astype(np.uint8)
del _small


class _Varints:
    """Unsigned values to write as varints, whether all are below _SMALL, and (computed
    when first asked for) their sizes."""

    __slots__ = ("values", "small", "one_byte", "_sizes")

    def __init__(self, values: Ints, bound: int) -> None:
        self.values = values
        self.small = bound < _SMALL
        self.one_byte = bound < 0x80
        self._sizes: Ints | None = None

    @property
    def sizes(self) -> Ints:
        if self._sizes is None:
            if self.small:
                self._sizes = _SMALL_SIZE[self.values]
            else:
                unsigned = self.values.view(np.uint64)
                sizes = np.searchsorted(_VARINT_LIMITS, unsigned, side="right")
                self._sizes = sizes.astype(np.int64) + 1
        return self._sizes


def _put_varints(out: npt.NDArray[np.uint8], fields: list[tuple[Ints, _Varints]]) -> None:
    """Write each field's varints at its positions. Small varints are written as two bytes
    (the second 0 for a one-byte varint, landing on the next field's first byte) before
    every first byte, so each byte ends up right in two steps of two operations."""
    for pos, varints in fields:
        if varints.small:
            out[pos + 1] = _SMALL_HIGH[varints.values]
    for pos, varints in fields:
        if varints.small:
            out[pos] = _SMALL_LOW[varints.values]
            continue
        values = varints.values.view(np.uint64)
        sizes = varints.sizes
        for k in range(int(sizes.max())):
            part = ((values >> _SHIFTS[k]) & np.uint64(0x7F)).astype(np.uint8)
            part |= (sizes > k + 1).astype(np.uint8) << np.uint8(7)
            if k == 0:
                out[pos] = part
            else:
                has = sizes > k
                out[pos[has] + k] = part[has]


class _Bytes:
    """A binary column's offsets, lengths (0 for null) and their zigzag varints (null:
    zigzag(-1) = 1), and the array itself."""

    __slots__ = ("array", "data", "offsets", "lengths", "zigzag", "_varints")

    def __init__(self, column: pa.Array) -> None:
        n = len(column)
        self.array = column
        _, offsets_buffer, data = column.buffers()
        self.data = None if data is None else np.frombuffer(data, np.uint8)
        self.offsets = offsets = np.frombuffer(offsets_buffer, np.int32, n + 1, 4 * column.offset)
        lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
        if column.null_count:
            valid = np.asarray(column.is_valid())
            lengths = np.where(valid, lengths, 0)
            self.zigzag = np.where(valid, lengths * 2, 1)
        else:
            self.zigzag = lengths * 2
        self.lengths = lengths
        self._varints: _Varints | None = None

    @property
    def longest(self) -> int:
        total = int(self.offsets[-1]) - int(self.offsets[0])
        return total if total < _SMALL // 2 else int(self.lengths.max())

    @property
    def varints(self) -> _Varints:
        if self._varints is None:
            self._varints = _Varints(self.zigzag, 2 * self.longest + 1)
        return self._varints


def _timestamps(column: pa.Array) -> Ints:
    """A timestamp[ms] (or int64) array as int64, null as -1."""
    n = len(column)
    values: Ints = np.frombuffer(column.buffers()[1], np.int64, n, 8 * column.offset)
    if column.null_count:
        values = np.where(np.asarray(column.is_valid()), values, -1)
    return values


def encode_columns(
    records: pa.RecordBatch | pa.Table,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    keys: pa.Array | None = None,
) -> bytes:
    """Rows with RECORD_SCHEMA columns (at least one) as one uncompressed RecordBatch v2
    with offset deltas 0..n-1: the bytes ``records.encode_batch`` gives for the same
    records (null timestamps as -1, null headers as none). ``keys`` replaces the key
    column (a control batch's control keys)."""
    count = records.num_rows
    if count < 1:
        raise ValueError("a record batch needs at least one record")
    key_column = _array(records.column("key") if keys is None else keys)
    value_column = _array(records.column("value"))
    headers = _array(records.column("headers"))
    timestamps = _timestamps(_array(records.column("timestamp")))
    lowest, highest = int(timestamps.min()), int(timestamps.max())
    fields = {
        "base_offset": base_offset,
        "partition_leader_epoch": partition_leader_epoch,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "base_sequence": base_sequence,
        "attributes": attributes,
    }
    if lowest < -_TS_LIMIT or highest >= _TS_LIMIT or _has_headers(headers):
        return _encode_reference(key_column, value_column, timestamps, headers, **fields)
    base_ts = int(timestamps[0])
    deltas = timestamps - base_ts
    ts = _Varints((deltas << 1) ^ (deltas >> 63), 2 * max(highest - base_ts, base_ts - lowest) + 1)
    od = _Varints(_offset_deltas(count), 2 * count)
    values = _Bytes(value_column)
    key = _Bytes(key_column) if key_column.null_count != count else None
    runs = _encode_runs(count, ts, values, key)
    payload = runs.data if runs is not None else _encode_pieces(count, ts, od, values, key)[0]
    return b"".join(
        _framed(
            payload,
            count,
            base_ts,
            highest,
            KafkaBatchFields(
                base_offset,
                partition_leader_epoch,
                producer_id,
                producer_epoch,
                base_sequence,
                attributes,
            ),
        )
    )


class KafkaBatchFields(NamedTuple):
    """The header fields of a RecordBatch v2 to encode (besides those of its records)."""

    base_offset: int
    partition_leader_epoch: int
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attributes: int = 0


def _framed(
    payload: memoryview, count: int, base_ts: int, max_ts: int, fields: KafkaBatchFields
) -> tuple[bytearray, memoryview]:
    """The batch header (with its CRC32C) for an uncompressed records section."""
    header = bytearray(
        _HEADER.pack(
            fields.base_offset,
            BATCH_HEADER_SIZE - 12 + len(payload),
            fields.partition_leader_epoch,
            2,
            0,
            (fields.attributes & ~0x07) | COMPRESSION_NONE,
            count - 1,
            base_ts,
            max_ts,
            fields.producer_id,
            fields.producer_epoch,
            fields.base_sequence,
            count,
        )
    )
    crc = crc32c(payload, crc32c(memoryview(header)[21:]))
    struct.pack_into(">I", header, 17, crc)
    return header, payload


def encode_many(batches: Sequence[tuple[pa.RecordBatch | pa.Table, KafkaBatchFields]]) -> bytes:
    """:func:`encode_columns` of each batch, concatenated (a Fetch response's records):
    the same bytes, but the records of consecutive batches without headers are encoded
    together, so the cost per batch is its header and CRC."""
    out: list[bytes | bytearray | memoryview] = []
    group: list[tuple[pa.RecordBatch | pa.Table, KafkaBatchFields]] = []
    for records, fields in batches:
        if records.num_rows and not _has_headers(_array(records.column("headers"))):
            group.append((records, fields))
            continue
        out.extend(_encode_group(group))
        group = []
        out.append(encode_columns(records, **fields._asdict()))
    out.extend(_encode_group(group))
    return b"".join(out)


def _encode_group(
    batches: list[tuple[pa.RecordBatch | pa.Table, KafkaBatchFields]],
) -> list[bytes | bytearray | memoryview]:
    if len(batches) <= 1:
        return [encode_columns(r, **f._asdict()) for r, f in batches]
    counts = np.array([r.num_rows for r, _ in batches], np.int64)
    firsts = np.zeros(len(batches), np.int64)
    np.cumsum(counts[:-1], out=firsts[1:])
    total = int(counts.sum())
    timestamps = np.concatenate([_timestamps(_array(r.column("timestamp"))) for r, _ in batches])
    lowest, highest = int(timestamps.min()), int(timestamps.max())
    if lowest < -_TS_LIMIT or highest >= _TS_LIMIT:
        return [encode_columns(r, **f._asdict()) for r, f in batches]
    base_ts = timestamps[firsts]
    deltas = timestamps - np.repeat(base_ts, counts)
    spread = max(int(deltas.max()), -int(deltas.min()))
    ts = _Varints((deltas << 1) ^ (deltas >> 63), 2 * spread + 1)
    local = np.arange(total, dtype=np.int64) - np.repeat(firsts, counts)
    od = _Varints(local << 1, 2 * int(counts.max()))
    values = _Bytes(pa.concat_arrays([_array(r.column("value")) for r, _ in batches]))
    keys = pa.concat_arrays([_array(r.column("key")) for r, _ in batches])
    key = _Bytes(keys) if keys.null_count != total else None
    stream, offsets, per_record = _encode_pieces(total, ts, od, values, key)
    # Batch b's records start where its first record's first piece does, past that
    # piece's first byte (the header count of the batch before) unless b is the first.
    starts = offsets[firsts * per_record].astype(np.int64)
    starts[1:] += 1
    bounds = [*starts.tolist(), len(stream)]
    max_ts = np.maximum.reduceat(timestamps, firsts).tolist()
    framed: list[bytes | bytearray | memoryview] = []
    for i, (_, fields) in enumerate(batches):
        framed.extend(
            _framed(
                stream[bounds[i] : bounds[i + 1]],
                int(counts[i]),
                int(base_ts[i]),
                max_ts[i],
                fields,
            )
        )
    return framed


def _encode_pieces(
    count: int, ts: _Varints, od: _Varints, values: _Bytes, key: _Bytes | None
) -> tuple[memoryview, npt.NDArray[np.int32], int]:
    """The records section for any records without headers, where in it each piece
    starts, and the pieces per record (record i's first piece is number pieces * i)."""
    # A record: length, attributes, timestamp delta, offset delta, key (length, bytes),
    # value (length, bytes), header count (0).
    body = ts.sizes + od.sizes + values.varints.sizes + values.lengths
    if key is not None:
        body += key.varints.sizes + key.lengths
        body += 2
        longest_body = 40 + key.longest + values.longest
    else:
        body += 3  # attributes, a null key (one byte), the header count
        longest_body = 40 + values.longest
    length = _Varints(body * 2, 2 * longest_body)
    # The records laid out as pieces: "glue" bytes built here (the previous record's
    # header count, then length .. key length, or .. value length without keys), and
    # the keys and values as they are; Arrow's take concatenates them.
    glue_sizes = np.empty(count + 1, np.int64)
    glue = glue_sizes[:count]
    np.add(length.sizes, ts.sizes, out=glue)
    glue += od.sizes
    if key is not None:
        glue += key.varints.sizes
        glue += 2  # header count of the previous record, attributes
    else:
        glue += values.varints.sizes
        glue += 3  # header count of the previous record, attributes, null key
    glue_sizes[0] -= 1  # the first record has no record before it
    glue_sizes[count] = 1  # the last record's header count
    glue_offsets = _offsets(glue_sizes)
    out = np.zeros(int(glue_offsets[-1]) + 1, np.uint8)  # + 1: a small varint's 2nd byte
    at = glue_offsets[:count] + 1
    at[0] = 0
    at_ts = at + length.sizes + 1
    at_od = at_ts + ts.sizes
    at_key = at_od + od.sizes
    writes = [(at, length), (at_ts, ts), (at_od, od)]
    if key is not None:
        writes.append((at_key, key.varints))
        middle_offsets = _offsets(values.varints.sizes)
        middle = np.zeros(int(middle_offsets[-1]) + 1, np.uint8)
        _put_varints(middle, [(middle_offsets[:-1].astype(np.int64), values.varints)])
        pieces = [
            _from_numpy(out, glue_offsets),
            key.array,
            _from_numpy(middle, middle_offsets),
            values.array,
        ]
    else:
        writes.append((at_key + 1, values.varints))
        pieces = [_from_numpy(out, glue_offsets), values.array]
    _put_varints(out, writes)
    if key is None:
        out[at_key] = 1  # a null key, zigzag(-1), after the writes that spill onto it
    per_record = len(pieces)
    order = np.empty(per_record * count + 1, np.int32)
    for i in range(per_record):
        first = 0 if i == 0 else count + 1 + (i - 1) * count
        order[i : per_record * count : per_record] = np.arange(first, first + count, dtype=np.int32)
    order[-1] = count
    laid_out = pc.array_take(pa.concat_arrays(pieces), pa.array(order))
    _, offsets_buffer, data = laid_out.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, len(order) + 1)
    return memoryview(data)[: int(offsets[-1])], offsets, per_record


# Offset deltas (0, 1, ...) change varint size at these record indexes.
_OD_STEPS = [1 << (7 * k - 1) for k in range(1, 5)]
_MAX_RUNS = 16


class _RunLayout:
    """One record layout of a run: its size, a template row (every byte that is the same
    in all of the run's records) and where the timestamp delta, offset delta, key bytes
    and value bytes go."""

    __slots__ = ("stride", "template", "ts", "od", "key", "value")

    def __init__(self, ts_size: int, od_size: int, key_zigzag: int, value_zigzag: int) -> None:
        row = bytearray(1)  # attributes
        self.ts = (len(row), ts_size)
        row += bytes(ts_size)
        self.od = (len(row), od_size)
        row += bytes(od_size)
        spans = []
        for zigzag in (key_zigzag, value_zigzag):
            put_uvar(row, zigzag)
            size = zigzag >> 1 if zigzag != 1 else 0
            spans.append((len(row), size))
            row += bytes(size)
        self.key, self.value = spans
        row.append(0)  # header count
        prefix = bytearray()
        put_uvar(prefix, 2 * len(row))
        shift = len(prefix)
        self.ts = (self.ts[0] + shift, ts_size)
        self.od = (self.od[0] + shift, od_size)
        self.key = (self.key[0] + shift, self.key[1])
        self.value = (self.value[0] + shift, self.value[1])
        self.template = np.frombuffer(bytes(prefix + row), np.uint8)
        self.stride = len(self.template)


_RUN_LAYOUTS: dict[tuple[int, int, int, int], _RunLayout] = {}


def _encode_runs(
    count: int, ts: _Varints, values: _Bytes, key: _Bytes | None
) -> npt.NDArray[np.uint8] | None:
    """The records section when the records fall into a few runs of one layout each
    (equal key and value sizes, timestamp and offset deltas of one size): each run is
    written as a 2-D array, a template row broadcast and the varying columns filled.
    None if there are more runs than that pays for."""
    # Where the layout changes: the timestamp delta's size, a key's or value's size.
    cuts: set[int] = set()
    for varying in (
        ts.sizes if not ts.one_byte else None,
        values.zigzag,
        key.zigzag if key is not None else None,
    ):
        if varying is None or _same(varying):
            continue
        cuts.update((np.flatnonzero(varying[1:] != varying[:-1]) + 1).tolist())
        if len(cuts) >= _MAX_RUNS:
            return None
    cuts.update(step for step in _OD_STEPS if step < count)
    bounds = [0, *sorted(cuts), count]
    runs = []
    total = 0
    for first, stop in zip(bounds, bounds[1:], strict=False):
        layout_key = (
            int(ts.sizes[first]),
            _varint_size(2 * first),
            int(key.zigzag[first]) if key is not None else 1,
            int(values.zigzag[first]),
        )
        layout = _RUN_LAYOUTS.get(layout_key)
        if layout is None:
            if len(_RUN_LAYOUTS) >= 4096:
                _RUN_LAYOUTS.clear()
            layout = _RUN_LAYOUTS[layout_key] = _RunLayout(*layout_key)
        runs.append((first, stop, layout, total))
        total += (stop - first) * layout.stride
    out = np.empty(total, np.uint8)
    value_data = values.data
    key_data = key.data if key is not None else None
    for first, stop, layout, at in runs:
        rows = out[at : at + (stop - first) * layout.stride].reshape(stop - first, layout.stride)
        rows[:] = layout.template
        _put_column_varints(rows, layout.ts, ts.values[first:stop])
        _put_column_varints(rows, layout.od, _offset_deltas(stop)[first:])
        for (column, size), data, source in (
            (layout.value, value_data, values),
            (layout.key, key_data, key),
        ):
            if size and data is not None and source is not None:
                start = int(source.offsets[first])
                block = data[start : start + (stop - first) * size]
                rows[:, column : column + size] = block.reshape(stop - first, size)
    return out


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


_OFFSET_DELTAS = np.arange(0, 2 * 65536, 2, dtype=np.int64)  # zigzag(0, 1, ...)
_OFFSET_DELTAS.flags.writeable = False


def _offset_deltas(count: int) -> Ints:
    """zigzag(i) = 2i for i in 0..count-1 (a view of a shared array when it can be)."""
    if count <= len(_OFFSET_DELTAS):
        return _OFFSET_DELTAS[:count]
    return np.arange(0, 2 * count, 2, dtype=np.int64)


def _same(values: Ints) -> bool:
    """Whether all values are equal."""
    first = values[0]
    return bool(values.min() == first == values.max())


def _put_column_varints(rows: npt.NDArray[np.uint8], where: tuple[int, int], values: Ints) -> None:
    column, size = where
    if size == 1:
        rows[:, column] = values
    elif size == 2:
        rows[:, column] = _SMALL_LOW[values]
        rows[:, column + 1] = _SMALL_HIGH[values]
    else:
        unsigned = values.view(np.uint64)
        for k in range(size):
            part = (unsigned >> _SHIFTS[k]) & np.uint64(0x7F)
            rows[:, column + k] = part | np.uint64(0x80 if k < size - 1 else 0)


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _offsets(sizes: Ints) -> npt.NDArray[np.int32]:
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _from_numpy(data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int32]) -> pa.Array:
    return pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _has_headers(headers: pa.Array) -> bool:
    """Whether some record has a header (null and empty lists encode alike: none)."""
    if headers.null_count == len(headers):
        return False
    return bool(pc.max(pc.list_value_length(headers)).as_py())


def _encode_reference(
    keys: pa.Array,
    values: pa.Array,
    timestamps: Ints,
    headers: pa.Array,
    **fields: int,
) -> bytes:
    header_lists: list[list[Header]] | None = None
    if headers.null_count != len(headers):
        header_lists = [
            [(h["key"], h["value"]) for h in hs] if hs else [] for hs in headers.to_pylist()
        ]
    return encode_batch(
        values.to_pylist(),
        keys.to_pylist(),
        timestamps.tolist(),
        header_lists,
        **fields,
    )
