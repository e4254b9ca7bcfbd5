"""Codec and framing: every message type round-trips through a whole frame (hypothesis
for field values); malformed frames raise FrameError, malformed bodies DecodeError."""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.protocol import ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.protocol.codec import DecodeError, decode_body, encode, positional
from quorumlog.replica.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    PREFIX,
    FrameError,
    decode_frame,
    encode_frame,
    frame_length,
)
from quorumlog.replica.raft import messages as rm

from tests.support.messages import fetch_response
from tests.support.wire import read_frame, request_frame

PROTOCOL_TYPES = [
    obj
    for obj in vars(m).values()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == m.__name__
]
RAFT_TYPES = [
    rm.VoteRequest,
    rm.VoteResponse,
    rm.BeginQuorumEpochRequest,
    rm.BeginQuorumEpochResponse,
    rm.EndQuorumEpochRequest,
    rm.EndQuorumEpochResponse,
    rm.FetchRequest,
    rm.FetchResponse,
]
ALL_TYPES = PROTOCOL_TYPES + RAFT_TYPES

ints = st.integers(-(2**63), 2**63 - 1)
scalars = st.one_of(st.none(), st.booleans(), ints, st.text(max_size=20), st.binary(max_size=20))


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in typing.get_args(tp)))
    if tp is type(None):
        return st.none()
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return st.lists(strategy_for(item), max_size=4)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
        return st.tuples(*(strategy_for(a) for a in args))
    if tp is object or tp is Any:
        return scalars
    if tp is bool:
        return st.booleans()
    if tp is int:
        return ints
    if tp is str:
        return st.text(max_size=30)
    if tp is bytes:
        return st.binary(max_size=200)
    if tp is float:
        return st.floats(allow_nan=False)
    if dataclasses.is_dataclass(tp):
        return message_strategy(tp)
    raise AssertionError(f"no strategy for {tp}")


def message_strategy(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)})


def through_wire(message: Any, correlation_id: int = 7) -> Any:
    wire = request_frame(3, message, correlation_id=correlation_id, client_id="cid", version=0)
    frame = read_frame(wire)  # the prefix's length is the frame's
    assert (frame.api_key, frame.api_version, frame.correlation_id, frame.client_id) == (
        3,
        0,
        correlation_id,
        "cid",
    )
    return decode_body(type(message), frame.body, frame.payload)


def test_every_api_has_request_and_response_types() -> None:
    assert set(m.REQUESTS) == set(m.ApiKey) - m.RAFT_KEYS - {m.ApiKey.ERROR}
    assert len(PROTOCOL_TYPES) >= 2 * len(m.REQUESTS)


@pytest.mark.parametrize(
    "cls", ALL_TYPES, ids=lambda c: f"{c.__module__.split('.')[-2]}.{c.__name__}"
)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(message_strategy(cls))
    assert through_wire(msg) == msg


def test_records_travel_as_the_raw_payload() -> None:
    records = bytes(range(256)) * 10
    body, payload = encode(
        m.ProduceRequest(topic="t", partition=0, acks=-1, timeout_ms=100, records=records)
    )
    assert payload == records and body[-1] is None
    wire = encode_frame(0, 0, 1, "c", body, payload)
    assert wire[-1] is payload  # written as it is, never copied into msgpack


def test_raft_envelope_carries_a_raft_message() -> None:
    inner = fetch_response(
        cluster_id="c",
        leader_epoch=3,
        high_watermark=10,
        diverging_epoch=(2, 5),
        records=b"batch",
        fetch_offset=9,
        request_id=4,
    )
    body, payload = encode(inner)
    env = m.RaftEnvelope(topic="t", partition=0, kind="FetchResponse", body=body, records=b"")
    env_back = through_wire(env)
    assert decode_body(rm.FetchResponse, env_back.body, payload) == inner


# ---- framing errors ------------------------------------------------------------------


def _prefix(total: int, meta_len: int) -> bytes:
    return PREFIX.pack(total, meta_len)


def test_truncated_prefix() -> None:
    with pytest.raises(FrameError, match="truncated"):
        frame_length(b"\x00\x00\x00")


def test_oversized_frame() -> None:
    with pytest.raises(FrameError) as exc:
        frame_length(_prefix(DEFAULT_MAX_FRAME_BYTES + 1, 10))
    assert exc.value.error_code == ErrorCode.MESSAGE_TOO_LARGE
    with pytest.raises(FrameError):
        frame_length(_prefix(2**32 - 1, 0))
    with pytest.raises(FrameError):
        frame_length(_prefix(1000, 10), max_frame_bytes=999)
    assert frame_length(_prefix(1000, 10), max_frame_bytes=1000) == (1000, 10)


@pytest.mark.parametrize("total,meta_len", [(0, 0), (3, 0), (10, 7), (4, 1), (100, 2**32 - 1)])
def test_bad_lengths(total: int, meta_len: int) -> None:
    with pytest.raises(FrameError) as exc:
        frame_length(_prefix(total, meta_len))
    assert exc.value.error_code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    "meta",
    [
        b"\xc1",  # never-used msgpack byte
        b"\x93\x01",  # array of 3 with one element
        msgpack.packb([1, 0, 1, "c", None]) + b"\x00",  # trailing bytes inside meta
        msgpack.packb({"api": 1}),
        msgpack.packb([1, 0, 1, "c"]),
        msgpack.packb([1, 0, 1, "c", None, None]),
        msgpack.packb(["1", 0, 1, "c", None]),
        msgpack.packb([1, 0.5, 1, "c", None]),
        msgpack.packb([1, 0, None, "c", None]),
        msgpack.packb([1, 0, 1, b"c", None], use_bin_type=True),
        msgpack.packb([1, 0, 1, 5, None]),
        msgpack.packb("just a string"),
        b"",
    ],
)
def test_bad_meta(meta: bytes) -> None:
    with pytest.raises(FrameError):
        decode_frame(meta + b"payload", len(meta))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_raise_frame_error_or_decode(blob: bytes) -> None:
    """Arbitrary bytes either parse as a frame or raise FrameError; nothing else escapes."""
    try:
        total, meta_len = frame_length(blob[: PREFIX.size])
        decode_frame(blob[PREFIX.size :].ljust(total - 4, b"\x00"), meta_len)
    except FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(body=st.recursive(scalars, lambda s: st.lists(s, max_size=5), max_leaves=12))
def test_wrong_body_shapes_raise_decode_error(body: Any) -> None:
    for cls in (m.FetchRequest, m.ProduceRequest, m.MetadataRequest, m.CreateTopicRequest):
        try:
            msg = decode_body(cls, body)
        except DecodeError:
            continue
        # It decoded: then it is a well-typed message that round-trips.
        assert through_wire(msg) == msg


@pytest.mark.parametrize(
    "cls,body",
    [
        (m.FetchRequest, ["t", 0, 0, 0, 0, 0]),  # a field short
        (m.FetchRequest, ["t", "0", 0, 0, 0, 0, 0]),  # str for int
        (m.FetchRequest, ["t", True, 0, 0, 0, 0, 0]),  # bool is not an int
        (m.FetchRequest, [b"t", 0, 0, 0, 0, 0, 0]),  # bytes for str
        (m.MetadataRequest, [[1, 2]]),  # list of int for list[str]
        (m.MetadataRequest, {"topics": None}),
        (rm.EndQuorumEpochRequest, ["c", 1, 2, 1, 1, [1, "x"]]),  # bad tuple item
        (m.DescribeQuorumResponse, [0, "", 1, 1, 1, [[1, 2, 3]], []]),  # nested too short
        (rm.FetchResponse, ["c", 1, 2, 0, None, 1, 1, 0, [1, 2, 3], None, 0, 0]),
        (m.PartitionInfo, [0, 1, 1, 1, [1, True], 0, 0, False]),  # bool in a list of int
        (m.PartitionInfo, [0, 1, 1, 1, [1, "2"], 0, 0, False]),  # str in a list of int
    ],
)
def test_decode_errors(cls: type, body: Any) -> None:
    with pytest.raises(DecodeError):
        decode_body(cls, body)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize(
    "cls", ALL_TYPES, ids=lambda c: f"{c.__module__.split('.')[-1]}.{c.__name__}"
)
def test_positional_builds_what_the_keywords_build(cls: type, data: st.DataObject) -> None:
    message = data.draw(message_strategy(cls))
    values = [getattr(message, f.name) for f in dataclasses.fields(cls)]
    built = positional(cls)(*values)
    assert type(built) is cls and built == message
    for f in dataclasses.fields(cls)[:1]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(built, f.name, values[0])  # still frozen


def test_prefix_layout() -> None:
    """u32 frame length | u32 meta length | msgpack meta | raw payload."""
    (wire,) = encode_frame(18, 0, 42, "me", [], b"")
    total, meta_len = struct.unpack(">II", wire[:8])
    assert total == len(wire) - 4
    assert msgpack.unpackb(wire[8 : 8 + meta_len]) == [18, 0, 42, "me", []]
    assert 8 + meta_len == len(wire)
