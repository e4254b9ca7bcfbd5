from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from quorumlog.replica.kafka.wire import (
    FrameDecoder,
    KafkaDecodeError,
    Reader,
    Writer,
    frame,
    zigzag_decode,
    zigzag_encode,
)

from .strategies import TEXT

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def test_zigzag_matches_kafka() -> None:
    # ByteUtils: 0 -> 0, -1 -> 1, 1 -> 2, -2 -> 3, MAX_INT -> 2^32 - 2, MIN_INT -> 2^32 - 1
    pairs = [(0, 0), (-1, 1), (1, 2), (-2, 3), (2**31 - 1, 2**32 - 2), (-(2**31), 2**32 - 1)]
    for signed, unsigned in pairs:
        assert zigzag_encode(signed) == unsigned
        assert zigzag_decode(unsigned) == signed


def test_known_varint_bytes() -> None:
    w = Writer()
    w.unsigned_varint(300)
    w.varint(-1)
    w.varlong(-(2**63))
    assert w.getvalue() == b"\xac\x02" + b"\x01" + b"\xff" * 9 + b"\x01"


@given(
    st.integers(-(2**7), 2**7 - 1),
    st.integers(-(2**15), 2**15 - 1),
    INT32,
    INT64,
    st.integers(0, 2**32 - 1),
    INT32,
    INT64,
    st.booleans(),
    st.uuids(),
    st.floats(allow_nan=False),
    st.integers(0, 2**16 - 1),
)
def test_fixed_and_varint_round_trip(
    i8: int,
    i16: int,
    i32: int,
    i64: int,
    uv: int,
    v32: int,
    v64: int,
    b: bool,
    u: uuid.UUID,
    f: float,
    u16: int,
) -> None:
    w = Writer()
    w.int8(i8)
    w.int16(i16)
    w.int32(i32)
    w.int64(i64)
    w.unsigned_varint(uv)
    w.varint(v32)
    w.varlong(v64)
    w.boolean(b)
    w.uuid(u)
    w.float64(f)
    w.uint16(u16)
    r = Reader(w.getvalue())
    got = (
        r.int8(),
        r.int16(),
        r.int32(),
        r.int64(),
        r.unsigned_varint(),
        r.varint(),
        r.varlong(),
        r.boolean(),
        r.uuid(),
        r.float64(),
        r.uint16(),
    )
    assert got == (i8, i16, i32, i64, uv, v32, v64, b, u, f, u16)
    assert r.remaining == 0


@given(
    st.booleans(),
    TEXT,
    st.none() | TEXT,
    st.binary(max_size=300),
    st.none() | st.binary(max_size=300),
    st.none() | st.integers(0, 200),
)
def test_strings_bytes_arrays_round_trip(
    compact: bool, s: str, ns: str | None, b: bytes, nb: bytes | None, n: int | None
) -> None:
    w = Writer()
    w.string(s, compact)
    w.nullable_string(ns, compact)
    w.bytes_(b, compact)
    w.nullable_bytes(nb, compact)
    w.array_length(n, compact)
    w.raw(b"\x00" * (n or 0))  # array elements take at least a byte each
    w.tagged_fields({5: b"x", 1: b"", 300: b"yz"})
    r = Reader(w.getvalue())
    assert r.string(compact) == s
    assert r.nullable_string(compact) == ns
    assert r.bytes_(compact) == b
    assert r.nullable_bytes(compact) == nb
    assert r.array_length(compact, nullable=True) == (-1 if n is None else n)
    r.raw(n or 0)
    assert r.skip_tagged_fields() == {1: b"", 5: b"x", 300: b"yz"}
    assert r.remaining == 0


def test_lengths_bounded_by_remaining_bytes() -> None:
    with pytest.raises(KafkaDecodeError):
        Reader(b"\x7f\xff\xff\xff").bytes_()  # 2 GiB claimed, nothing there
    with pytest.raises(KafkaDecodeError):
        Reader(b"\x7f\xff\xff\xff").array_length()
    with pytest.raises(KafkaDecodeError):
        Reader(b"\xff\xff\xff\xff\x0f").array_length(compact=True)
    with pytest.raises(KafkaDecodeError):
        Reader(b"\xff\xff").string()  # null for a non-nullable string
    with pytest.raises(KafkaDecodeError):
        Reader(b"\x80" * 6).unsigned_varint()  # over-long varint
    with pytest.raises(KafkaDecodeError):
        Reader(b"\xff\xff\xff\xff\x7f").unsigned_varint()  # > 32 bits
    with pytest.raises(KafkaDecodeError):
        Reader(b"\x00\x02\xc3\x28").string()  # not UTF-8
    with pytest.raises(KafkaDecodeError):
        Reader(b"\x02\x05\x00\x01\x00").skip_tagged_fields()  # tags out of order


@given(st.lists(st.binary(max_size=50), max_size=10), st.integers(1, 7))
def test_frame_decoder_reassembles_any_chunking(payloads: list[bytes], chunk: int) -> None:
    stream = b"".join(frame(p) for p in payloads)
    decoder = FrameDecoder()
    got: list[bytes] = []
    for i in range(0, len(stream), chunk):
        got.extend(decoder.feed(stream[i : i + chunk]))
    assert got == payloads
    assert decoder.buffered == 0


def test_frame_decoder_refuses_hostile_sizes() -> None:
    with pytest.raises(KafkaDecodeError):
        FrameDecoder().feed(b"\xff\xff\xff\xff")
    with pytest.raises(KafkaDecodeError):
        FrameDecoder(max_frame=1024).feed(b"\x00\x00\x04\x01")
