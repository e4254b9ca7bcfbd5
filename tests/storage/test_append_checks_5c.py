"""The checks a leader makes of a client's batch, in their cheaper forms: a payload laid
out as the encoder writes it is read as one record batch (``records._single_batch``),
with the verdict the message-by-message reader (``records._read_messages``) gives any
payload; a header's producer fields are checked without a call in the common case, with
the verdict ``_sane_producer`` gives; a re-stamped header is the header ``_pack_header``
writes; the offset properties computed directly agree with their definitions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

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
    fileio,
)
from quorumlog.replica.storage import records as r
from quorumlog.replica.storage.batch_header import (
    COMMIT_FLAG,
    CONTROL_FLAG,
    HEADER_SIZE,
    SPARSE_OFFSETS_FLAG,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    Producer,
    _pack_header,
    _sane_producer,
    parse_header,
    restamp_header,
)
from quorumlog.replica.storage.crc import crc32


def _client_batch(n: int) -> bytes:
    return encode_batch(
        [b"v%d" % i * (i % 7) for i in range(n)],
        keys=[None if i % 3 else b"k%d" % i for i in range(n)],
        headers=[[("h", b"x")] if i % 2 else None for i in range(n)],
    )


def _reframed(batch: bytes, payload: bytes) -> bytes:
    """``batch``'s header over another payload: its length and CRC made to match, so the
    payload reaches the Arrow checks."""
    h = parse_header(batch)
    header = _pack_header(
        h.base_offset,
        h.leader_epoch,
        h.record_count,
        h.max_timestamp,
        len(payload),
        crc32(payload),
        h.flags,
        h.producer,
        h.last_offset_delta,
    )
    return header + payload


def _verdict(read: object, batch: bytes) -> pa.Table | None:
    """What ``read`` (a payload reader of records) makes of ``batch``: its rows, or None
    when it refused it."""
    h = parse_header(batch)
    try:
        batches = read(pa.py_buffer(batch), h, full=True)  # type: ignore[operator]
    except CorruptRecordError:
        return None
    return pa.Table.from_batches(batches, schema=batches[0].schema)


def _same_verdict(batch: bytes) -> pa.Table | None:
    """``batch`` as the one-batch path reads it, asserted the same as the message loop's."""
    fast, loop = _verdict(r._read_payload, batch), _verdict(r._read_messages, batch)
    assert (fast is None) == (loop is None)
    assert fast is None or loop is None or fast.equals(loop)
    return fast


def test_an_encoded_batch_is_read_as_one_record_batch() -> None:
    """The client's layout takes the one-batch path, and it reads what the message
    loop reads (the path this change added: without it _single_batch does not exist)."""
    batch = _client_batch(100)
    r.validate_arrow(batch, parse_header(batch))  # the schema's bytes become known
    h = parse_header(batch)
    payload = pa.py_buffer(batch).slice(HEADER_SIZE, h.payload_length)
    view = memoryview(payload).cast("B")
    known, schema = r._known_schema_prefix(view)
    assert known and schema is r.RECORD_SCHEMA
    single = r._single_batch(payload, view, known, schema, True)
    assert single is not None and single.num_rows == 100
    assert _same_verdict(batch) is not None


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 40),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3),
)
@example(n=5, edits=[(0, 0)])  # the schema message's continuation marker
def test_a_damaged_payload_gets_the_message_loops_verdict(
    n: int, edits: list[tuple[int, int]]
) -> None:
    """Bytes of the payload changed (its CRC made to match): the one-batch path accepts
    exactly what the message loop accepts, with the same rows."""
    batch = _client_batch(n)
    r.validate_arrow(batch, parse_header(batch))
    payload = bytearray(batch[HEADER_SIZE:])
    for at, value in edits:
        payload[at % len(payload)] = value
    damaged = _reframed(batch, bytes(payload))
    _same_verdict(damaged)


@pytest.mark.parametrize(
    "tail",
    [
        b"",  # no end-of-stream marker at all
        r._END_OF_STREAM + b"\x00" * 8,  # bytes after the end marker
    ],
)
def test_other_layouts_go_by_the_message_loop(tail: bytes) -> None:
    """A payload not ending in exactly one end marker is not the encoder's layout: it is
    read message by message, with that verdict."""
    batch = _client_batch(10)
    r.validate_arrow(batch, parse_header(batch))
    body = batch[HEADER_SIZE:]
    assert body.endswith(r._END_OF_STREAM)
    changed = _reframed(batch, body[: -len(r._END_OF_STREAM)] + tail)
    _same_verdict(changed)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_a_compressed_batch_gets_the_same_rows_on_either_path(compression: str) -> None:
    values = [b"x%d" % i * 9 for i in range(50)]
    batch = encode_batch(values, compression=compression)
    r.validate_arrow(batch, parse_header(batch))
    read = _same_verdict(batch)
    assert read is not None and read.column("value").to_pylist() == values


def test_two_record_batches_are_read_message_by_message() -> None:
    table = pa.Table.from_batches(
        [
            pa.RecordBatch.from_pylist([{"value": b"a"}, {"value": b"b"}]),
            pa.RecordBatch.from_pylist([{"value": b"c"}]),
        ]
    )
    batch = encode_arrow(table)
    read = _same_verdict(batch)
    assert read is not None and read.column("value").to_pylist() == [b"a", b"b", b"c"]


def test_a_sparse_batch_with_a_record_schema_is_refused_on_either_path() -> None:
    """The one-batch path is taken only for the schema the header's flag calls for."""
    batch = _client_batch(3)
    h = parse_header(batch)
    flagged = (
        _pack_header(
            0,
            -1,
            h.record_count,
            h.max_timestamp,
            h.payload_length,
            h.payload_crc,
            SPARSE_OFFSETS_FLAG,
            None,
            2,
        )
        + batch[HEADER_SIZE:]
    )
    assert _verdict(r._read_payload, flagged) is None


_FLAGS = [0, CONTROL_FLAG, TRANSACTIONAL_FLAG, CONTROL_FLAG | TRANSACTIONAL_FLAG, COMMIT_FLAG]
_FLAGS += [CONTROL_FLAG | TRANSACTIONAL_FLAG | COMMIT_FLAG]


@settings(max_examples=300, deadline=None)
@given(
    pid=st.sampled_from([-1, 0, 7, -2]),
    pepoch=st.sampled_from([-1, 0, 3, -2]),
    seq=st.sampled_from([-1, 0, 5, -2]),
    flags=st.sampled_from(_FLAGS),
)
def test_producer_fields_are_checked_as_sane_producer_checks_them(
    pid: int, pepoch: int, seq: int, flags: int
) -> None:
    payload = _client_batch(1)[HEADER_SIZE:]
    header = _pack_header(0, 1, 1, -1, len(payload), crc32(payload), flags, None)
    # The producer fields written as given, whatever they are (_pack_header takes a
    # whole Producer or none).
    raw = bytearray(header)
    raw[42:44] = pepoch.to_bytes(2, "little", signed=True)
    raw[44:48] = seq.to_bytes(4, "little", signed=True)
    raw[48:56] = pid.to_bytes(8, "little", signed=True)
    raw[4:8] = crc32(bytes(raw[8:])).to_bytes(4, "little")
    try:
        parse_header(bytes(raw))
        accepted = True
    except CorruptRecordError:
        accepted = False
    assert accepted == _sane_producer(pid, pepoch, seq, flags)


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(0, 2**40),
    epoch=st.integers(0, 2**31 - 1),
    producer=st.none()
    | st.builds(Producer, st.integers(0, 2**40), st.integers(0, 99), st.integers(0, 2**20)),
    sparse_delta=st.none() | st.integers(3, 1000),
)
def test_a_restamped_header_is_the_header_pack_header_writes(
    base: int, epoch: int, producer: Producer | None, sparse_delta: int | None
) -> None:
    flags = SPARSE_OFFSETS_FLAG if sparse_delta is not None else 0
    original = _pack_header(
        5, -1, 4, 123, 64, 99, flags, producer, sparse_delta if sparse_delta is not None else 0
    )
    h = parse_header(original)
    expected = _pack_header(
        base, epoch, 4, 123, 64, 99, flags, producer, sparse_delta if sparse_delta else 0
    )
    assert restamp_header(h, base, epoch) == expected
    again = parse_header(expected)
    assert (again.base_offset, again.leader_epoch, again.producer) == (base, epoch, producer)


def test_offset_properties_follow_their_definitions() -> None:
    # A dense header as a segment's scan makes one (last_offset_delta left at -1).
    dense = BatchHeader(0, 10, 0, 4, -1, 8, 0, 0)
    assert (dense.last_offset, dense.next_offset, dense.offset_span) == (13, 14, 4)
    sparse = BatchHeader(0, 10, 0, 4, -1, 8, 0, SPARSE_OFFSETS_FLAG, last_offset_delta=9)
    assert (sparse.last_offset, sparse.next_offset, sparse.offset_span) == (19, 20, 10)


class _ShortWrites(fileio.FileOps):
    """Real writes, at most ``limit`` bytes a writev (as a signal or a full pipe may cut
    one short): the caller must go on from where each stopped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls = 0

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        self.calls += 1
        data = b"".join(bytes(b) for b in buffers)[: self.limit]
        return os.write(fd, data)


@pytest.mark.parametrize("limit", [1, 100, 5000])
def test_short_writes_are_continued_where_they_stopped(tmp_path: Path, limit: int) -> None:
    batches = [encode_batch([b"r%d-%d" % (i, j) * 20 for j in range(30)]) for i in range(4)]
    short = _ShortWrites(limit)
    previous = fileio.install(short)
    try:
        leader = Log(str(tmp_path / "leader"), LogConfig())
        for batch in batches:
            leader.append_as_leader(batch, 1)
        follower = Log(str(tmp_path / "follower"), LogConfig())
        follower.append_as_follower(leader.read(0, 1 << 20))
    finally:
        fileio.install(previous)
    assert short.calls > len(batches)  # every append was cut short at least once
    for log in (leader, follower):
        values = batches_to_table(log.read(0, 1 << 20)).column("value").to_pylist()
        assert values == [b"r%d-%d" % (i, j) * 20 for i in range(4) for j in range(30)]
        log.close()
    # Read from the files, not the leader's tail of batches it keeps in memory.
    reopened = Log(str(tmp_path / "leader"), LogConfig())
    assert reopened.end_offset == 120
    assert batches_to_table(reopened.read(0, 1 << 20)).num_rows == 120
    reopened.close()
