"""``codec._produce_fast`` and ``codec.encode_produce_response``, Produce's own codec: for
every version served, the body ``decode_struct`` gives, the same refusal for what it
refuses, and the bytes ``encode_struct`` writes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.kafka.codec import (
    RequestHeader,
    _produce_fast,
    decode_request,
    decode_response,
    encode_produce_response,
    encode_request,
    encode_response,
)
from quorumlog.replica.kafka.messages import PRODUCE
from quorumlog.replica.kafka.schema import decode_struct, encode_struct
from quorumlog.replica.kafka.wire import KafkaDecodeError, Reader, Writer

VERSIONS = range(PRODUCE.min_version, PRODUCE.max_version + 1)

PARTITION = st.fixed_dictionaries(
    {"index": st.integers(-(2**31), 2**31 - 1), "records": st.none() | st.binary(max_size=64)}
)
TOPIC = st.fixed_dictionaries(
    {"name": st.text(max_size=20), "partition_data": st.lists(PARTITION, max_size=4)}
)
BODY = st.fixed_dictionaries(
    {
        "transactional_id": st.none() | st.text(max_size=10),
        "acks": st.sampled_from([-1, 0, 1, 7]),
        "timeout_ms": st.integers(-(2**31), 2**31 - 1),
        "topic_data": st.lists(TOPIC, max_size=4),
    }
)


def _generic(payload: bytes) -> tuple[str, Any]:
    """What the plan-walking decoder gives for the request (its header read the same way)."""
    try:
        header, api, body = decode_request(payload)  # the fast path, through the entry
    except KafkaDecodeError as exc:
        fast: tuple[str, Any] = ("error", type(exc))
    else:
        fast = ("ok", body)
    r = Reader(payload)
    r.int16(), r.int16(), r.int32(), r.nullable_string()
    try:
        if PRODUCE.is_flexible(_version(payload)):
            r.skip_tagged_fields()
        slow = decode_struct(r, PRODUCE.plan(_version(payload), True))
        if r.remaining:
            raise KafkaDecodeError("trailing bytes")
    except KafkaDecodeError as exc:
        return fast, ("error", type(exc))
    return fast, ("ok", slow)


def _version(payload: bytes) -> int:
    return int.from_bytes(payload[2:4], "big", signed=True)


@settings(max_examples=200, deadline=None)
@given(BODY, st.sampled_from(VERSIONS))
def test_every_version_decodes_as_the_plan_does(body: dict[str, Any], version: int) -> None:
    payload = encode_request(PRODUCE, version, 7, body, client_id="c")
    fast, slow = _generic(payload)
    assert fast == slow
    assert fast == ("ok", body)


@settings(max_examples=60, deadline=None)
@given(BODY, st.sampled_from(VERSIONS), st.data())
def test_cut_or_damaged_requests_are_refused_alike(
    body: dict[str, Any], version: int, data: Any
) -> None:
    payload = encode_request(PRODUCE, version, 7, body, client_id="c")
    cut = data.draw(st.integers(12, len(payload)))
    fast, slow = _generic(payload[:cut])
    assert fast[0] == slow[0]
    if fast[0] == "ok":
        assert fast == slow
    at = data.draw(st.integers(12, len(payload) - 1))
    damaged = bytearray(payload)
    damaged[at] = data.draw(st.integers(0, 255))
    fast, slow = _generic(bytes(damaged))
    assert fast[0] == slow[0]
    if fast[0] == "ok":
        assert fast == slow


@pytest.mark.parametrize("version", [v for v in VERSIONS if PRODUCE.is_flexible(v)])
def test_unknown_tagged_fields_are_skipped(version: int) -> None:
    """A flexible request may carry tagged fields the schema does not name (a newer
    client's): both decoders skip them."""
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 30000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 3, "records": b"xyz"}]}],
    }
    payload = encode_request(PRODUCE, version, 7, body, client_id="c")
    # The last byte is the body's empty tagged-field section: one field, tag 5, 2 bytes.
    assert payload[-1] == 0
    tagged = payload[:-1] + bytes([1, 5, 2]) + b"hi"
    fast, slow = _generic(tagged)
    assert fast == slow == ("ok", body)


@settings(max_examples=200, deadline=None)
@given(
    BODY,
    st.sampled_from(VERSIONS),
    st.none() | st.text(max_size=8),
    st.binary(max_size=3),
)
def test_the_produce_fast_reading_gives_the_plan_s_header_and_body(
    body: dict[str, Any], version: int, client_id: str | None, trailing: bytes
) -> None:
    """``_produce_fast`` (which ``decode_request`` takes first) reads what the plan reads,
    header included, and does read it: names and ids this short take no fallback. Bytes
    after the body are the fallback's to refuse, unless the caller ignores them."""
    payload = encode_request(PRODUCE, version, 7, body, client_id=client_id)
    header = RequestHeader(PRODUCE.key, version, 7, client_id)
    assert _produce_fast(payload, False) == (header, body)
    assert _produce_fast(memoryview(payload), False) == (header, body)
    assert _produce_fast(payload + trailing, True) == (header, body)
    if trailing:
        assert _produce_fast(payload + trailing, False) is None
        with pytest.raises(KafkaDecodeError):
            decode_request(payload + trailing)


def test_long_names_and_ids_are_read_by_the_fallback() -> None:
    """A topic name or transactional id whose compact length takes two varint bytes is
    left to the schema walk: the same body either way."""
    body = {
        "transactional_id": "x" * 200,
        "acks": -1,
        "timeout_ms": 30000,
        "topic_data": [{"name": "t" * 240, "partition_data": [{"index": 0, "records": None}]}],
    }
    for version in VERSIONS:
        payload = encode_request(PRODUCE, version, 7, body, client_id="c")
        if PRODUCE.is_flexible(version):
            assert _produce_fast(payload, False) is None
        else:
            assert _produce_fast(payload, False) is not None
        assert decode_request(payload)[2] == body
    other = encode_request(PRODUCE, 9, 7, body, client_id="c")
    assert _produce_fast(b"\x00\x03" + other[2:], False) is None  # not a Produce


PARTITION_ANSWER = st.fixed_dictionaries(
    {
        "index": st.integers(-(2**31), 2**31 - 1),
        "error_code": st.integers(-(2**15), 2**15 - 1),
        "base_offset": st.integers(-(2**63), 2**63 - 1),
        "log_append_time_ms": st.integers(-(2**63), 2**63 - 1),
        "log_start_offset": st.integers(-(2**63), 2**63 - 1),
        "record_errors": st.just([]),
        "error_message": st.none() | st.text(max_size=20),
    }
)
ANSWER = st.fixed_dictionaries(
    {
        "responses": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.text(max_size=20),
                    "partition_responses": st.lists(PARTITION_ANSWER, max_size=4),
                }
            ),
            max_size=4,
        ),
        "throttle_time_ms": st.integers(0, 2**31 - 1),
    }
)


def _by_plan(version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    w = Writer()
    w.int32(correlation_id)
    if PRODUCE.response_header_version(version) >= 1:
        w.tagged_fields()
    encode_struct(w, PRODUCE.plan(version, False), body)
    return w.getvalue()


@settings(max_examples=200, deadline=None)
@given(ANSWER, st.sampled_from(VERSIONS))
def test_answers_are_the_bytes_the_plan_writes(body: dict[str, Any], version: int) -> None:
    fast = encode_produce_response(version, 9, body)
    assert fast is not None
    assert fast == _by_plan(version, 9, body)
    assert encode_response(PRODUCE, version, 9, body) == fast
    assert decode_response(PRODUCE, version, fast) == (
        9,
        decode_response(PRODUCE, version, _by_plan(version, 9, body))[1],
    )


def test_what_the_fast_path_does_not_write_goes_by_the_plan() -> None:
    """Record errors, a partition's current leader, node endpoints: the plan writes them."""
    part = {"index": 0, "error_code": 6, "base_offset": -1}
    leader = {**part, "current_leader": {"leader_id": 2, "leader_epoch": 5}}
    errors = {**part, "record_errors": [{"batch_index": 0, "batch_index_error_message": "x"}]}
    for p in (leader, errors):
        body = {"responses": [{"name": "t", "partition_responses": [p]}]}
        assert encode_produce_response(11, 1, body) is None
        assert encode_response(PRODUCE, 11, 1, body) == _by_plan(11, 1, body)
    endpoints = {
        "responses": [],
        "node_endpoints": [{"node_id": 1, "host": "h", "port": 9, "rack": None}],
    }
    assert encode_produce_response(11, 1, endpoints) is None
