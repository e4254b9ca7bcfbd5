from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.storage import (
    HEADER_SIZE,
    OUTPUT_SCHEMA,
    RECORD_SCHEMA,
    CorruptRecordError,
    batches_to_table,
    decode_leader_change,
    encode_arrow,
    encode_batch,
    encode_control_batch,
    iter_batches,
    null_array,
    parse_header,
    restamp_header,
    rewrite_header,
    validate_payload,
)


def test_round_trip_lists() -> None:
    buf = encode_batch(
        [b"a", None, b"ccc"],
        keys=[b"k", b"k2", None],
        timestamps=[1000, 3000, 2000],
        headers=[[("h", b"1"), ("g", None)], None, []],
        base_offset=10,
        leader_epoch=4,
    )
    (header,) = list(iter_batches(buf, verify_crc=True))
    assert (header.base_offset, header.record_count, header.leader_epoch) == (10, 3, 4)
    assert header.max_timestamp == 3000 and not header.is_control
    assert header.payload_length % 8 == 0 and header.size == len(buf)
    table = batches_to_table(buf)
    assert table.schema.equals(OUTPUT_SCHEMA)
    assert table.to_pydict() == {
        "key": [b"k", b"k2", None],
        "value": [b"a", None, b"ccc"],
        "timestamp": [datetime.datetime(1970, 1, 1, 0, 0, s) for s in (1, 3, 2)],
        "headers": [[{"key": "h", "value": b"1"}, {"key": "g", "value": None}], None, []],
        "offset": [10, 11, 12],
        "leaderEpoch": [4, 4, 4],
    }


def test_encode_arrow_fills_missing_columns_and_casts() -> None:
    table = pa.table({"value": pa.array(["x", "y"], pa.string()), "timestamp": [5, 7]})
    out = batches_to_table(encode_arrow(table, base_offset=3, compression="zstd"))
    assert out.column("value").to_pylist() == [b"x", b"y"]
    assert out.column("key").null_count == 2
    assert parse_header(encode_arrow(table)).max_timestamp == 7
    with pytest.raises(ValueError, match="subset"):
        encode_arrow(pa.table({"nope": [1]}))
    with pytest.raises(ValueError, match="at least one"):
        encode_batch([])


def test_records_without_headers_carry_no_bytes_for_them() -> None:
    # 100 B values: value and its offset, the null key's offset, the timestamp and the
    # null headers' offset are 120 B a record. pa.nulls would give the headers list a
    # child of n null entries, two more offsets each: 128 B on the wire and every disk.
    n = 1000
    buf = encode_batch([b"v" * 100] * n)
    assert len(buf) <= n * 120 + 2048
    headers = batches_to_table(buf).column("headers").chunk(0)
    assert headers.null_count == n and len(headers.values) == 0
    for type_ in (RECORD_SCHEMA.field("headers").type, pa.binary(), pa.timestamp("ms")):
        for rows in (1, 7, 8, 1000):
            got = null_array(rows, type_)
            got.validate(full=True)
            assert got.type == type_ and got.equals(pa.nulls(rows, type_))


def test_encode_arrow_takes_a_batch_already_in_shape_as_it_is() -> None:
    # A batch with exactly RECORD_SCHEMA (the Kafka listener's) skips the casts; the bytes
    # are those of the same rows given in other types, and the max timestamp is right
    # with nulls among the timestamps too.
    loose = pa.table({"value": pa.array(["x", "y", "z"]), "timestamp": [5, None, 9]})
    shaped = batches_to_table(encode_arrow(loose)).select(RECORD_SCHEMA.names)
    (exact,) = shaped.cast(RECORD_SCHEMA).to_batches()
    assert encode_arrow(exact, base_offset=2) == encode_arrow(loose, base_offset=2)
    assert parse_header(encode_arrow(exact)).max_timestamp == 9
    no_time = pa.RecordBatch.from_arrays(
        [*exact.columns[:2], pa.nulls(3, pa.timestamp("ms")), exact.column(3)],
        schema=RECORD_SCHEMA,
    )
    assert parse_header(encode_arrow(no_time)).max_timestamp == -1


def test_encode_arrow_of_a_sliced_batch_is_the_stream_writers_bytes() -> None:
    # An uncompressed record batch is framed without a stream writer: the same bytes as
    # the writer's (a table of the same rows), and the max timestamp of the slice's own
    # rows (its timestamps sit at an offset in the column's buffer).
    whole = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([b"a", None, b"c", b"d", b"e"], pa.binary()),
            "value": pa.array([b"1", b"22", None, b"4444", b"5"], pa.binary()),
            "timestamp": pa.array([50, 10, 30, 20, 90], pa.timestamp("ms")),
            "headers": null_array(5, RECORD_SCHEMA.field("headers").type),
        },
        schema=RECORD_SCHEMA,
    )
    part = whole.slice(1, 3)
    as_table = pa.Table.from_batches([part])
    assert encode_arrow(part, base_offset=7) == encode_arrow(as_table, base_offset=7)
    assert parse_header(encode_arrow(part)).max_timestamp == 30
    assert batches_to_table(encode_arrow(part)).column("value").to_pylist() == [
        b"22",
        None,
        b"4444",
    ]


def test_restamp_keeps_payload_and_offsets_follow() -> None:
    buf = encode_batch([b"a", b"b"])
    header = parse_header(buf)
    moved = restamp_header(header, 100, 7) + buf[HEADER_SIZE:]
    new = parse_header(moved)
    assert (new.base_offset, new.leader_epoch, new.payload_crc) == (100, 7, header.payload_crc)
    writable = bytearray(buf)
    rewrite_header(writable, 0, 50, 2)
    assert batches_to_table(bytes(writable)).column("offset").to_pylist() == [50, 51]


def test_offsets_and_epochs_over_many_batches_skip_control() -> None:
    parts = []
    base = 0
    expected_offsets: list[int] = []
    expected_epochs: list[int] = []
    for i, n in enumerate([1, 5, 2, 1, 7]):
        parts.append(encode_batch([b"v"] * n, base_offset=base, leader_epoch=i // 2))
        expected_offsets += range(base, base + n)
        expected_epochs += [i // 2] * n
        base += n
        if i == 2:
            parts.append(encode_control_batch(1, [1, 2, 3], 9, leader_epoch=5, base_offset=base))
            base += 1
    buf = b"".join(parts)
    table = batches_to_table(buf)
    assert table.column("offset").to_pylist() == expected_offsets
    assert table.column("leaderEpoch").to_pylist() == expected_epochs
    assert batches_to_table(buf, include_control=True).num_rows == len(expected_offsets) + 1
    assert batches_to_table(b"").num_rows == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=8), st.integers(0, 1000))
def test_offset_columns_property(counts: list[int], start: int) -> None:
    buf = b""
    base = start
    for epoch, n in enumerate(counts):
        buf += encode_batch([b"%d" % i for i in range(n)], base_offset=base, leader_epoch=epoch)
        base += n + epoch  # gaps are allowed between fetched batches (e.g. compaction)
    table = batches_to_table(buf)
    expected = []
    base = start
    for epoch, n in enumerate(counts):
        expected += [(base + i, epoch) for i in range(n)]
        base += n + epoch
    offsets = table.column("offset").to_pylist()
    got = list(zip(offsets, table.column("leaderEpoch").to_pylist(), strict=True))
    assert got == expected


def test_control_batch_round_trip() -> None:
    buf = encode_control_batch(3, [1, 2, 3], 1234, leader_epoch=9, base_offset=40)
    header = parse_header(buf)
    assert header.is_control and header.leader_epoch == 9
    change = decode_leader_change(buf)
    assert (change.leader_id, change.voters, change.timestamp_ms) == (3, [1, 2, 3], 1234)
    with pytest.raises(ValueError, match="not a control batch"):
        decode_leader_change(encode_batch([b"x"]))


def test_corruption_detected_everywhere() -> None:
    buf = encode_batch([b"a" * 100, b"b"], base_offset=1, leader_epoch=1)
    for i in range(len(buf)):
        bad = bytearray(buf)
        bad[i] ^= 0x40
        with pytest.raises(CorruptRecordError):
            header = parse_header(bad)
            validate_payload(bad, header)
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(iter_batches(buf[:-1]))
    with pytest.raises(CorruptRecordError, match="CRC"):
        bad = bytearray(buf)
        bad[-20] ^= 1
        batches_to_table(bytes(bad))


def test_payload_is_zero_copy() -> None:
    buf = encode_batch([b"x" * 1000] * 4)
    table = batches_to_table(buf)
    column = table.column("value").chunk(0)
    data_address = column.buffers()[2].address
    base = pa.py_buffer(buf).address
    assert base <= data_address < base + len(buf)
