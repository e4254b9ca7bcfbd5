"""The vectorised codec (``columnar``) against the reference codec (``records``): the same
columns from every batch, the same bytes for every record batch, the same error for every
malformed one; and each of its fast paths exact on its own."""

from __future__ import annotations

import random
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.kafka import columnar
from quorumlog.replica.kafka.columnar import (
    KafkaBatchFields,
    KafkaColumns,
    columns_from_lists,
    decode_columns,
    encode_columns,
    encode_many,
)
from quorumlog.replica.kafka.convert import kafka_to_quorumlog, quorumlog_to_kafka, table_to_kafka
from quorumlog.replica.kafka.records import (
    ATTR_CONTROL,
    BATCH_HEADER_SIZE,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    InvalidRecord,
    check_produced,
    decode_batch,
    encode_batch,
    iter_batches,
)
from quorumlog.replica.kafka.wire import KafkaDecodeError
from quorumlog.replica.storage.records import (
    HEADER_FIELD,
    RECORD_SCHEMA,
    Producer,
    encode_arrow,
)
from quorumlog.replica.storage.records import (
    encode_batch as ql_encode_batch,
)

from .strategies import BATCH_HEADER, HEADERS, OPT_BYTES

TS_BASE = st.integers(-(2**41), 2**41) | st.sampled_from([0, -1, 2**62 - 1, -(2**62), 2**63 - 1])


@st.composite
def any_records(draw: st.DrawFn) -> dict[str, list[Any]]:
    """Records of any shape the reference encodes (lengths, nulls, headers, timestamps)."""
    n = draw(st.integers(1, 40))
    base = draw(TS_BASE)
    deltas = draw(
        st.lists(
            st.integers(-(10**6), 10**9) | st.integers(-(2**62), 2**62), min_size=n, max_size=n
        )
    )
    timestamps = [max(-(2**63), min(2**63 - 1, base + d)) for d in deltas]
    # Kafka's record holds its timestamp as a varlong delta from the batch's first: keep
    # each within int64 of that one (the reference encodes nothing wider).
    first = timestamps[0]
    low, high = max(-(2**63), first - 2**63), min(2**63 - 1, first + 2**63 - 1)
    return {
        "values": draw(st.lists(OPT_BYTES, min_size=n, max_size=n)),
        "keys": draw(st.lists(OPT_BYTES, min_size=n, max_size=n)),
        "timestamps": [max(low, min(high, t)) for t in timestamps],
        "headers": draw(st.lists(HEADERS, min_size=n, max_size=n)),
    }


@st.composite
def producer_records(draw: st.DrawFn) -> dict[str, list[Any]]:
    """What producers send: many records of one value size, keys all null or all of one
    size (sometimes mixed), timestamps a few ms apart; sometimes a longer record."""
    n = draw(st.integers(1, 300) | st.sampled_from([63, 64, 65, 127, 128, 129]))
    size = draw(st.sampled_from([0, 1, 40, 63, 64, 100, 200, 8200]))
    keys_kind = draw(st.sampled_from(["null", "fixed", "mixed"]))
    key_size = draw(st.integers(0, 12))
    seed = draw(st.integers(0, 2**32))
    rng = random.Random(seed)
    values: list[bytes | None] = [rng.randbytes(size) for _ in range(n)]
    keys: list[bytes | None]
    if keys_kind == "null":
        keys = [None] * n
    elif keys_kind == "fixed":
        keys = [rng.randbytes(key_size) for _ in range(n)]
    else:
        keys = [rng.choice([None, b"", rng.randbytes(key_size)]) for _ in range(n)]
    if draw(st.booleans()):  # an odd record: longer, or null, somewhere
        values[rng.randrange(n)] = rng.choice([None, b"", rng.randbytes(size + 300)])
    base = draw(TS_BASE.filter(lambda t: t < 2**62 - 10**6))
    step = draw(st.sampled_from([0, 1, 3, 100]))
    timestamps = [base]
    for _ in range(n - 1):
        timestamps.append(timestamps[-1] + rng.randint(0, step))
    return {"values": values, "keys": keys, "timestamps": timestamps, "headers": [[]] * n}


RECORDS = any_records() | producer_records()
BATCH_FIELDS = st.fixed_dictionaries(
    {**BATCH_HEADER, "attributes": st.sampled_from([0, 0x10, ATTR_CONTROL])}
)


def _encode(cols: dict[str, list[Any]], **fields: int) -> bytes:
    return encode_batch(cols["values"], cols["keys"], cols["timestamps"], cols["headers"], **fields)


def _outcome(decode: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode(data)
    except KafkaDecodeError as exc:
        return "error", (type(exc), str(exc))


def _reference(data: bytes, verify_crc: bool = True) -> KafkaColumns:
    return columns_from_lists(decode_batch(data, verify_crc=verify_crc))


def assert_same_columns(got: KafkaColumns, want: KafkaColumns) -> None:
    assert got.records.schema == RECORD_SCHEMA
    assert got.records.equals(want.records), (got.records.to_pydict(), want.records.to_pydict())
    assert got.offset_deltas.tolist() == want.offset_deltas.tolist()
    assert columnar._fields(got) == columnar._fields(want)
    assert got.size == want.size


def _assert_same_outcome(data: bytes, verify_crc: bool = True) -> None:
    got = _outcome(lambda d: decode_columns(d, verify_crc=verify_crc), data)
    want = _outcome(lambda d: _reference(d, verify_crc), data)
    assert got[0] == want[0], (got, want)
    if got[0] == "ok":
        assert_same_columns(got[1], want[1])
    else:
        assert got[1] == want[1]


@settings(max_examples=300, deadline=None)
@given(RECORDS, BATCH_FIELDS)
def test_decode_gives_the_reference_columns(
    cols: dict[str, list[Any]], fields: dict[str, int]
) -> None:
    _assert_same_outcome(_encode(cols, **fields))


@settings(max_examples=150, deadline=None)
@given(RECORDS, BATCH_FIELDS.filter(lambda f: f["producer_id"] == -1 or min(f.values()) >= 0))
def test_produced_batches_are_stored_byte_for_byte_as_before(
    cols: dict[str, list[Any]], fields: dict[str, int]
) -> None:
    """The listener stores what it stored with the reference codec: same Arrow payload
    (no array of the decoder's larger than its batch, say), same size."""
    fields = {**fields, "attributes": 0}
    data = _encode(cols, **fields)
    want = kafka_to_quorumlog(decode_batch(data), leader_epoch=4)
    assert kafka_to_quorumlog(decode_columns(data), leader_epoch=4) == want


@settings(max_examples=40, deadline=None)
@given(
    RECORDS,
    st.sampled_from([COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]),
)
def test_decode_of_compressed_batches(cols: dict[str, list[Any]], codec: int) -> None:
    _assert_same_outcome(_encode(cols, compression=codec))


def _records_table(cols: dict[str, list[Any]]) -> pa.RecordBatch:
    headers = [hs or None for hs in cols["headers"]]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(cols["keys"], pa.binary()),
            pa.array(cols["values"], pa.binary()),
            pa.array(cols["timestamps"], pa.int64()).cast(pa.timestamp("ms")),
            pa.array(headers, pa.list_(HEADER_FIELD)),
        ],
        schema=RECORD_SCHEMA,
    )


@settings(max_examples=300, deadline=None)
@given(RECORDS, BATCH_FIELDS)
def test_encode_gives_the_reference_bytes(
    cols: dict[str, list[Any]], fields: dict[str, int]
) -> None:
    assert encode_columns(_records_table(cols), **fields) == _encode(cols, **fields)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(RECORDS, BATCH_FIELDS), min_size=1, max_size=6))
def test_batches_encoded_together_give_the_reference_bytes(
    batches: list[tuple[dict[str, list[Any]], dict[str, int]]],
) -> None:
    many = [(_records_table(cols), KafkaBatchFields(**fields)) for cols, fields in batches]
    assert encode_many(many) == b"".join(_encode(cols, **fields) for cols, fields in batches)


@settings(max_examples=100, deadline=None)
@given(producer_records(), st.data())
def test_each_fast_path_is_exact_where_it_answers(cols: dict[str, list[Any]], data: Any) -> None:
    """The paths fall through to one another, so each is checked on its own."""
    encoded = _encode(cols)
    want = _reference(encoded)
    body = encoded[BATCH_HEADER_SIZE:]
    count = len(cols["values"])
    padded = body + columnar._PAD
    arr = np.frombuffer(padded, np.uint8)
    pairs = np.ndarray((len(padded) - 1,), np.dtype("<u2"), padded, 0, (1,))
    runs = columnar._decode_runs(body, arr, count)
    if runs is not None:
        ts, od, keys, values = runs
        assert ts.tolist() == [t - cols["timestamps"][0] for t in cols["timestamps"]]
        assert od.tolist() == list(range(count))
        assert keys.equals(want.records.column("key"))
        assert values.equals(want.records.column("value"))
    bounds = columnar._record_bounds(body, pairs, count)
    assert bounds is not None
    walked = columnar._walk(body, 0, count)
    assert walked is not None
    assert [b.tolist() for b in bounds] == [w.tolist() for w in walked]
    for tier in (columnar._decode_short, columnar._decode_general):
        args = (arr, pairs, *bounds) if tier is columnar._decode_short else (body, arr, *bounds)
        try:
            got = tier(*args)
        except IndexError:  # _decode_short's way of giving up, which _decode_fast catches
            got = None
        if got is None:
            continue
        ts, od, keys, values, _ = got
        assert ts.tolist() == [t - cols["timestamps"][0] for t in cols["timestamps"]]
        assert od.tolist() == list(range(count))
        buffer = pa.py_buffer(body)
        assert columnar._binary(buffer, *keys).equals(want.records.column("key"))
        assert columnar._binary(buffer, *values).equals(want.records.column("value"))
    # Encoding: the run layout and the general layout, each against the reference.
    table = _records_table(cols)
    reference = _encode(cols)[BATCH_HEADER_SIZE:]
    original = columnar._encode_runs
    try:
        columnar._encode_runs = lambda *a: None
        general = encode_columns(table, base_offset=0, partition_leader_epoch=-1)
    finally:
        columnar._encode_runs = original
    assert general[BATCH_HEADER_SIZE:] == reference
    assert encode_columns(table, base_offset=0, partition_leader_epoch=-1) == _encode(cols)


def test_producer_batches_take_the_run_path() -> None:
    """librdkafka's shape (null keys, 100 B values, timestamps ms apart) never needs the
    slower paths: a regression to them would only show as a slow listener."""
    for n in (1, 64, 65, 200, 1000, 9000):
        ts = [1_700_000_000_000 + i // 7 for i in range(n)]
        data = encode_batch([b"v" * 100] * n, None, ts)[BATCH_HEADER_SIZE:]
        arr = np.frombuffer(data + columnar._PAD, np.uint8)
        assert columnar._decode_runs(data, arr, n) is not None, n
    table = decode_columns(encode_batch([b"v" * 100] * 500, None, list(range(500)))).records
    calls = []
    original = columnar._encode_pieces
    try:
        columnar._encode_pieces = lambda *a: calls.append(a)
        encode_columns(table, base_offset=0, partition_leader_epoch=0)
    finally:
        columnar._encode_pieces = original
    assert not calls


def _mutations(rng: random.Random, data: bytes, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        b = bytearray(data)
        kind = rng.randrange(5)
        pos = rng.randrange(BATCH_HEADER_SIZE, len(b) + 1)
        if kind == 0 and pos < len(b):
            b[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del b[pos:]
        elif kind == 2:
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == 3 and pos < len(b):
            b[pos] = rng.choice([0x00, 0x01, 0x03, 0x7F, 0x80, 0xFF])
        else:
            b[pos : pos + 2] = rng.choice([b"\xff\xff", b"\x80\x80", b"\x00\x00", b"\x01\x01"])
        if len(b) >= BATCH_HEADER_SIZE:
            struct.pack_into(">i", b, 8, len(b) - 12)
            struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
        out.append(bytes(b))
    return out


@settings(max_examples=60, deadline=None)
@given(producer_records() | any_records(), st.integers(0, 2**32))
def test_malformed_records_get_the_reference_answer(cols: dict[str, list[Any]], seed: int) -> None:
    """Mutated record bytes (with a valid CRC): whatever the reference decodes, this
    decodes the same; whatever it refuses, this refuses with the same error."""
    rng = random.Random(seed)
    for mutated in _mutations(rng, _encode(cols), 30):
        _assert_same_outcome(mutated)


@pytest.mark.parametrize("n", [1, 70, 70_000])
def test_empty_and_null_fields_in_every_record(n: int) -> None:
    for values, keys in (([b""] * n, [b""] * n), ([None] * n, [b""] * n), ([b"x"] * n, [None] * n)):
        data = encode_batch(values, keys, [7] * n)
        _assert_same_outcome(data)
        table = decode_columns(data).records
        assert encode_columns(table, base_offset=0, partition_leader_epoch=-1) == data


def test_timestamps_past_int64_are_a_decode_error() -> None:
    data = encode_batch([b"a", b"b"], None, [2**63 - 1, 2**63 - 1])
    record = bytearray(data)
    # Rewrite the second record's timestamp delta as a 9-byte varint of 2**60.
    ref = decode_batch(data)
    assert ref.timestamps == [2**63 - 1] * 2
    big = bytearray()
    v = (2**60) << 1
    while v >= 0x80:
        big.append((v & 0x7F) | 0x80)
        v >>= 7
    big.append(v)
    second = BATCH_HEADER_SIZE + 1 + (record[BATCH_HEADER_SIZE] >> 1)
    body = bytes([0]) + bytes(big) + b"\x02\x01\x02b\x00"
    record[second:] = bytes([len(body) * 2]) + body
    struct.pack_into(">i", record, 8, len(record) - 12)
    struct.pack_into(">I", record, 17, crc32c(bytes(record[21:])))
    assert decode_batch(bytes(record)).timestamps[1] == 2**63 - 1 + 2**60
    with pytest.raises(KafkaDecodeError, match="int64"):
        decode_columns(bytes(record))


def test_check_produced_reads_columns() -> None:
    batch = decode_columns(
        encode_batch([b"a", b"b"], producer_id=3, producer_epoch=0, base_sequence=0)
    )
    check_produced(batch)
    batch.offset_deltas[1] = 5
    with pytest.raises(InvalidRecord, match="offset deltas"):
        check_produced(batch)
    with pytest.raises(InvalidRecord, match="control"):
        check_produced(decode_columns(encode_batch([b"a"], attributes=ATTR_CONTROL)))


def test_iter_batches_reads_back_to_back_batches_and_a_partial_tail() -> None:
    one = encode_batch([b"x" * 10] * 3, base_offset=5)
    two = encode_batch([b"y"] * 2, [b"k", None], base_offset=8)
    got = list(columnar.iter_batches(one + two + one[:-4], allow_partial_tail=True))
    want = list(iter_batches(one + two + one[:-4], allow_partial_tail=True))
    assert len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        assert_same_columns(g, columns_from_lists(w))
    with pytest.raises(KafkaDecodeError):
        list(columnar.iter_batches(one + two[:-1]))


def test_sliced_multi_chunk_and_null_timestamp_columns_encode_as_the_reference() -> None:
    cols = {
        "values": [b"v%d" % i for i in range(20)],
        "keys": [None if i % 3 else b"k" for i in range(20)],
        "timestamps": list(range(1000, 1020)),
        "headers": [[] for _ in range(20)],
    }
    table = _records_table(cols)
    sliced = table.slice(3, 9)
    want = encode_batch(cols["values"][3:12], cols["keys"][3:12], cols["timestamps"][3:12])
    assert encode_columns(sliced, base_offset=0, partition_leader_epoch=-1) == want
    chunked = pa.Table.from_batches([table.slice(0, 5), table.slice(5)])
    assert encode_columns(chunked, base_offset=0, partition_leader_epoch=-1) == _encode(cols)
    nulls = table.set_column(2, "timestamp", pa.nulls(20, pa.timestamp("ms")))
    assert encode_columns(nulls, base_offset=0, partition_leader_epoch=-1) == encode_batch(
        cols["values"], cols["keys"], [-1] * 20
    )


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_stored_batches_become_the_reference_kafka_batches(compression: str | None) -> None:
    values = [b"value-%d" % i for i in range(50)]
    keys = [None if i % 4 else b"key" for i in range(50)]
    stamps = [1_700_000_000_000 + i for i in range(50)]
    headers = [[("h", b"1")] if i == 7 else None for i in range(50)]
    native = ql_encode_batch(
        values,
        keys=keys,
        timestamps=stamps,
        headers=headers,
        base_offset=100,
        leader_epoch=3,
        compression=compression,
        producer=Producer(7, 1, 40),
    )
    # A stored batch whose Arrow stream holds two record batches.
    table = pa.Table.from_batches(
        [
            _records_table(
                {"values": values, "keys": keys, "timestamps": stamps, "headers": [[]] * 50}
            )
        ]
    )
    two = encode_arrow(
        pa.Table.from_batches(
            [table.to_batches()[0].slice(0, 20), table.to_batches()[0].slice(20)]
        ),
        base_offset=150,
        leader_epoch=3,
    )
    out = list(iter_batches(quorumlog_to_kafka(native + two)))
    assert [(b.base_offset, b.partition_leader_epoch) for b in out] == [(100, 3), (150, 3)]
    assert out[0].values == values and out[0].keys == keys and out[0].timestamps == stamps
    assert out[0].headers == [[("h", b"1")] if i == 7 else [] for i in range(50)]
    assert (out[0].producer_id, out[0].producer_epoch, out[0].base_sequence) == (7, 1, 40)
    assert out[1].values == values and out[1].producer_id == -1
    ref = encode_batch(
        values,
        keys,
        stamps,
        [[("h", b"1")] if i == 7 else [] for i in range(50)],
        base_offset=100,
        partition_leader_epoch=3,
        producer_id=7,
        producer_epoch=1,
        base_sequence=40,
    )
    assert quorumlog_to_kafka(native) == ref


def test_control_batches_keep_their_control_key() -> None:
    table = _records_table(
        {"values": [b"x"], "keys": [b"LeaderChange"], "timestamps": [5], "headers": [[]]}
    )
    got = decode_batch(table_to_kafka(table, base_offset=9, leader_epoch=2, control=True))
    assert got.is_control and got.keys == [struct.pack(">hh", 0, 2)] and got.base_offset == 9
