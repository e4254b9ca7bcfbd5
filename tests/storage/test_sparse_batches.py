"""Sparse batches (``records.SPARSE_OFFSETS_FLAG``): a batch with gaps inside, each
record's offset delta in its payload and the last one in its header. Headers alone give
where a batch ends; readers take each record's offset from its delta; a damaged or
inconsistent delta column is refused; a client never sends one; a log whose active
segment ends in one recovers to its end; a producer's sparse batch has the last sequence
base_sequence + last_offset_delta."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from quorumlog.replica.storage import (
    CorruptRecordError,
    Log,
    LogConfig,
    batches_to_table,
    encode_arrow,
    encode_batch,
    iter_batches,
    parse_header,
    restamp_header,
)
from quorumlog.replica.storage.batch_header import _pack_header
from quorumlog.replica.storage.crc import crc32
from quorumlog.replica.storage.records import (
    HEADER_SIZE,
    RECORD_SCHEMA,
    SPARSE_OFFSETS_FLAG,
    SPARSE_SCHEMA,
    Producer,
    _frame,
    _ipc_payload,
    validate_arrow,
)

from .helpers import crash, read_everything


def sparse(base: int, deltas: list[int], epoch: int = 1, producer: Producer | None = None) -> bytes:
    values = [b"v%d" % (base + d) for d in deltas]
    table = pa.table({"value": pa.array(values, pa.binary())})
    return encode_arrow(
        table,
        base_offset=base,
        leader_epoch=epoch,
        producer=producer,
        offset_deltas=np.array(deltas),
    )


@st.composite
def batch_layouts(draw: st.DrawFn) -> list[list[int]]:
    """Per batch its offset deltas: dense (0..n-1) or with gaps."""
    layouts = []
    for _ in range(draw(st.integers(1, 6))):
        steps = draw(st.lists(st.integers(1, 1000), max_size=30))
        layouts.append([0, *np.cumsum(steps).tolist()])
    return layouts


@settings(max_examples=60, deadline=None)
@given(batch_layouts(), st.integers(0, 10**12), st.lists(st.integers(0, 50), max_size=6))
@example([[0], [0, 1, 2]], 0, [])  # only dense batches
@example([[0, 2**31 - 1]], 5, [])  # the largest delta
def test_sparse_batches_round_trip(layouts: list[list[int]], start: int, holes: list[int]) -> None:
    buf = b""
    expected: list[int] = []
    base = start
    for i, deltas in enumerate(layouts):
        buf += sparse(base, deltas, epoch=i)
        expected += [base + d for d in deltas]
        base += deltas[-1] + 1 + (holes[i] if i < len(holes) else 0)
    headers = list(iter_batches(buf, verify_crc=True))
    for header, deltas in zip(headers, layouts, strict=True):
        assert header.is_sparse and header.record_count == len(deltas)
        assert header.last_offset_delta == deltas[-1]
        assert header.next_offset == header.base_offset + deltas[-1] + 1
        validate_arrow(buf, header)
        moved = parse_header(restamp_header(header, header.base_offset + 7, 99))
        assert (moved.next_offset, moved.is_sparse) == (header.next_offset + 7, True)
    table = batches_to_table(buf)
    assert table.column("offset").to_pylist() == expected
    assert table.column("value").to_pylist() == [b"v%d" % o for o in expected]
    assert table.schema.names[:4] == RECORD_SCHEMA.names


def test_dense_and_sparse_batches_read_together() -> None:
    buf = (
        encode_batch([b"a", b"b"], base_offset=3)
        + sparse(10, [0, 5])
        + encode_batch([b"c"], base_offset=20)
    )
    assert batches_to_table(buf).column("offset").to_pylist() == [3, 4, 10, 15, 20]
    assert [h.next_offset for h in iter_batches(buf)] == [5, 16, 21]


def _reframed(payload: bytes, flags: int, last_delta: int, count: int) -> bytes:
    """A batch of ``payload`` whatever it holds, its header saying ``flags`` and
    ``last_delta`` (a CRC-valid header over inconsistent contents)."""
    return _frame(
        payload,
        record_count=count,
        max_timestamp=-1,
        base_offset=0,
        leader_epoch=1,
        flags=flags,
        producer=None,
        last_offset_delta=last_delta,
    )


def _payload(deltas: list[int] | None) -> bytes:
    table = pa.table({"value": pa.array([b"x"] * 3, pa.binary())})
    data = encode_arrow(table)
    records = batches_to_table(data).select(RECORD_SCHEMA.names).to_batches()[0]
    if deltas is None:
        return bytes(_ipc_payload(records, None))
    with_deltas = records.append_column(
        SPARSE_SCHEMA.field("offset_delta"), pa.array(deltas, pa.int32())
    )
    return bytes(_ipc_payload(with_deltas, None))


@pytest.mark.parametrize(
    ("deltas", "flags", "last", "why"),
    [
        ([0, 2, 2], SPARSE_OFFSETS_FLAG, 2, "offset deltas"),  # not strictly ascending
        ([1, 2, 3], SPARSE_OFFSETS_FLAG, 3, "offset deltas"),  # not from 0
        ([0, 2, 3], SPARSE_OFFSETS_FLAG, 4, "offset deltas"),  # header's last says 4
        ([0, 2, 3], 0, 0, "schema"),  # the column without the flag
        (None, SPARSE_OFFSETS_FLAG, 2, "schema"),  # the flag without the column
    ],
)
def test_an_inconsistent_offset_delta_column_is_refused(
    deltas: list[int] | None, flags: int, last: int, why: str
) -> None:
    batch = _reframed(_payload(deltas), flags, last, 3)
    header = parse_header(batch)
    with pytest.raises(CorruptRecordError, match=why):
        batches_to_table(batch)
    with pytest.raises(CorruptRecordError, match=why):
        validate_arrow(batch, header)


def test_a_null_offset_delta_is_refused() -> None:
    table = pa.table({"value": pa.array([b"x"] * 2, pa.binary())})
    records = batches_to_table(encode_arrow(table)).select(RECORD_SCHEMA.names).to_batches()[0]
    with_nulls = records.append_column(
        SPARSE_SCHEMA.field("offset_delta"), pa.array([0, None], pa.int32())
    )
    batch = _reframed(bytes(_ipc_payload(with_nulls, None)), SPARSE_OFFSETS_FLAG, 1, 2)
    with pytest.raises(CorruptRecordError, match="null offset delta"):
        batches_to_table(batch)


def _header_only(flags: int, last_delta: int, count: int = 3) -> bytes:
    return _pack_header(0, 1, count, -1, 8, 0, flags, None, last_delta) + bytes(8)


@pytest.mark.parametrize(
    ("flags", "last"),
    [
        (SPARSE_OFFSETS_FLAG, 1),  # spans fewer offsets than it has records
        (SPARSE_OFFSETS_FLAG | 0x1, 5),  # a control batch is never sparse
        (SPARSE_OFFSETS_FLAG, 2**31),  # past an int32 delta
    ],
)
def test_an_insane_sparse_header_is_refused(flags: int, last: int) -> None:
    with pytest.raises(CorruptRecordError, match="insane"):
        parse_header(_header_only(flags, last))


def test_a_dense_header_with_a_last_delta_is_refused() -> None:
    header = bytearray(_header_only(SPARSE_OFFSETS_FLAG, 5))
    # The flag cleared (the header CRC recomputed): the reserved field must be zero.
    good = _pack_header(0, 1, 3, -1, 8, 0, 0, None, 0)
    assert parse_header(good + bytes(8)).last_offset_delta == 2
    tail = bytearray(header[8:HEADER_SIZE])
    tail[32:34] = (0).to_bytes(2, "little")  # flags
    rebuilt = header[:4] + crc32(bytes(tail)).to_bytes(4, "little") + tail
    with pytest.raises(CorruptRecordError, match="insane"):
        parse_header(bytes(rebuilt) + bytes(8))


def test_a_leader_refuses_a_client_batch_with_the_sparse_flag(tmp_path: Path) -> None:
    lg = Log(str(tmp_path / "p"))
    with pytest.raises(CorruptRecordError, match="sparse"):
        lg.append_as_leader(sparse(0, [0, 3]), 1)
    assert lg.end_offset == 0


def test_a_log_whose_active_segment_ends_in_a_sparse_batch_recovers_to_its_end(
    tmp_path: Path,
) -> None:
    lg = Log(str(tmp_path / "p"), LogConfig(segment_bytes=1 << 20))
    data = encode_batch([b"a"], base_offset=0, leader_epoch=1) + sparse(1, [0, 4, 9])
    assert lg.append_as_follower(data) is not None
    assert lg.end_offset == 11
    lg.flush()
    crash(lg)
    lg = Log(str(tmp_path / "p"), LogConfig(segment_bytes=1 << 20))
    assert lg.end_offset == 11
    table = batches_to_table(read_everything(lg))
    assert table.column("offset").to_pylist() == [0, 1, 5, 10]
    lg.append_as_leader(encode_batch([b"next"]), 2)
    assert batches_to_table(lg.read(11, 1 << 16)).column("offset").to_pylist() == [11]
    lg.close()


def test_a_producer_s_sparse_batch_ends_at_base_sequence_plus_last_delta(
    tmp_path: Path,
) -> None:
    lg = Log(str(tmp_path / "p"))
    batch = sparse(0, [0, 2, 6], producer=Producer(7, 0, 10))
    lg.append_as_follower(batch)
    entry = lg.producer_state().last_batch(7)
    assert entry is not None
    assert (entry.first_sequence, entry.last_sequence, entry.last_offset) == (10, 16, 6)
    lg.flush()
    lg.close()
    lg = Log(str(tmp_path / "p"))
    entry = lg.producer_state().last_batch(7)
    assert entry is not None
    assert (entry.first_sequence, entry.last_sequence, entry.last_offset) == (10, 16, 6)
    lg.close()


@pytest.mark.parametrize(("held", "expected"), [(5, [5, 8]), (4, [5, 8]), (3, [3, 5, 8])])
def test_a_follower_ending_inside_a_leader_s_sparse_batch_takes_its_records_from_its_end(
    tmp_path: Path, held: int, expected: list[int]
) -> None:
    """A follower holding offsets below ``held`` fetches a leader's sparse batch whose
    offsets (2, 3, 5, 8) span its end, a record or a gap: it appends the records from its
    end on, at their offsets, as a batch of their own."""
    lg = Log(str(tmp_path / "p"))
    lg.append_as_follower(encode_batch([b"v"] * held, base_offset=0, leader_epoch=1))
    lg.append_as_follower(sparse(2, [0, 1, 3, 6], producer=Producer(4, 0, 20)))
    assert lg.end_offset == 9
    data = lg.read(held, 1 << 16)
    table = batches_to_table(data)
    assert table.column("offset").to_pylist() == expected
    assert table.column("value").to_pylist() == [b"v%d" % o for o in expected]
    (header,) = list(iter_batches(data))
    assert header.base_sequence == 20 + expected[0] - 2  # sequences moved with the records
    entry = lg.producer_state().last_batch(4)
    assert entry is not None and (entry.last_sequence, entry.last_offset) == (26, 8)
