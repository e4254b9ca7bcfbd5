from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quorumlog.replica.kafka import messages as m
from quorumlog.replica.kafka.codec import (
    UnsupportedRequest,
    api_versions_body,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    fetched_partition,
)
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.schema import Api
from quorumlog.replica.kafka.wire import KafkaDecodeError

from .strategies import api_versions, message_strategy

ALL = api_versions()


@st.composite
def any_message(draw: st.DrawFn) -> tuple[Api, int, bool, dict[str, Any]]:
    api, version = draw(st.sampled_from(ALL))
    request = draw(st.booleans())
    return api, version, request, draw(message_strategy(api, version, request))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_message(), st.integers(-(2**31), 2**31 - 1), st.none() | st.text(max_size=8))
def test_every_message_round_trips(
    case: tuple[Api, int, bool, dict[str, Any]], correlation_id: int, client_id: str | None
) -> None:
    api, version, request, body = case
    if request:
        payload = encode_request(api, version, correlation_id, body, client_id)
        header, got_api, got = decode_request(payload)
        assert got_api is api
        assert header == (api.key, version, correlation_id, client_id)
    else:
        payload = encode_response(api, version, correlation_id, body)
        cid, got = decode_response(api, version, payload)
        assert cid == correlation_id
    assert got == body


@pytest.mark.parametrize(("api", "version"), ALL, ids=[f"{a.name}-v{v}" for a, v in ALL])
def test_defaults_encode_in_every_version(api: Api, version: int) -> None:
    for request in (True, False):
        body = api.default_request(version) if request else api.default_response(version)
        if request:
            assert decode_request(encode_request(api, version, 7, body))[2] == body
        else:
            assert decode_response(api, version, encode_response(api, version, 7, body)) == (
                7,
                body,
            )


def test_api_versions_v3_request_known_bytes() -> None:
    # Request header v2 (client id a classic string) + compact strings + empty tag buffers.
    payload = (
        b"\x00\x12\x00\x03\x00\x00\x00\x2a"  # api key 18, version 3, correlation id 42
        + b"\x00\x07rdkafka"  # client id
        + b"\x00"  # header tagged fields
        + b"\x0blibrdkafka"  # compact string: length 10 + 1
        + b"\x072.16.1"  # compact string: length 6 + 1
        + b"\x00"  # body tagged fields
    )
    header, api, body = decode_request(payload)
    assert header == (18, 3, 42, "rdkafka")
    assert api is m.API_VERSIONS
    assert body == {"client_software_name": "librdkafka", "client_software_version": "2.16.1"}


def test_api_versions_response_uses_header_v0_and_lists_supported_apis() -> None:
    payload = encode_response(m.API_VERSIONS, 3, 9, api_versions_body(3))
    assert payload[:4] == b"\x00\x00\x00\x09"
    assert payload[4:6] == b"\x00\x00"  # error code follows the correlation id directly
    _, body = decode_response(m.API_VERSIONS, 3, payload)
    listed = {(k["api_key"], k["min_version"], k["max_version"]) for k in body["api_keys"]}
    assert listed == set(m.SUPPORTED_APIS)
    assert (0, 3, 11) in listed and (1, 4, 17) in listed and (18, 0, 4) in listed


@pytest.mark.parametrize("version", range(m.FETCH.min_version, m.FETCH.max_version + 1))
def test_a_fetched_partition_is_a_fetch_response_partition_in_every_version(version: int) -> None:
    served = fetched_partition(3, 0, 40, 7, b"batches")
    refused = fetched_partition(4, KafkaError.FENCED_LEADER_EPOCH)
    body = m.FETCH.default_response(version)
    topic = {"topic": "t", "topic_id": uuid.UUID(int=1), "partitions": [served, refused]}
    body["responses"] = [topic]
    _, back = decode_response(m.FETCH, version, encode_response(m.FETCH, version, 1, body))
    p_served, p_refused = back["responses"][0]["partitions"]
    assert (p_served["partition_index"], p_served["error_code"]) == (3, 0)
    log_start = 7 if version >= 5 else -1  # log_start_offset is in v5+ only
    assert (p_served["high_watermark"], p_served["log_start_offset"]) == (40, log_start)
    assert p_served["last_stable_offset"] == 40 and p_served["records"] == b"batches"
    assert p_refused["partition_index"] == 4
    assert p_refused["error_code"] == KafkaError.FENCED_LEADER_EPOCH
    assert (p_refused["high_watermark"], p_refused["log_start_offset"]) == (-1, -1)
    assert p_refused["records"] == b"" and p_refused["aborted_transactions"] is None


def test_unknown_api_or_version_is_reported_with_its_header() -> None:
    too_new = encode_request(m.API_VERSIONS, 3, 5, m.API_VERSIONS.default_request(3))
    too_new = too_new[:2] + b"\x00\x63" + too_new[4:]  # version 99
    with pytest.raises(UnsupportedRequest) as info:
        decode_request(too_new)
    assert info.value.header.correlation_id == 5
    assert info.value.error_code == 35  # UNSUPPORTED_VERSION
    unknown_key = b"\x03\xe7\x00\x00\x00\x00\x00\x06\xff\xff"
    with pytest.raises(UnsupportedRequest):
        decode_request(unknown_key)


def test_tagged_fields_unknown_ones_are_skipped_known_ones_read() -> None:
    body = m.FETCH.default_response(16)
    body["node_endpoints"] = [{"node_id": 1, "host": "h", "port": 9, "rack": None}]
    payload = bytearray(encode_response(m.FETCH, 16, 1, body))
    # Splice an unknown tag (7) into the top-level tagged-field section, which is last.
    tail = encode_response(m.FETCH, 16, 1, m.FETCH.default_response(16))
    assert tail.endswith(b"\x00")
    known = bytes(payload[len(tail) - 1 :])  # "\x01" count, tag 0, size, data
    assert known[0] == 1
    patched = bytes(payload[: len(tail) - 1]) + b"\x02" + known[1:] + b"\x07\x02hi"
    _, got = decode_response(m.FETCH, 16, patched)
    assert got == body


def test_fetch_v13_uses_topic_ids_and_older_versions_names() -> None:
    tid = uuid.uuid4()
    body = m.FETCH.default_request(13)
    body["topics"] = [
        {
            "topic": "",
            "topic_id": tid,
            "partitions": [
                {
                    "partition": 0,
                    "current_leader_epoch": 3,
                    "fetch_offset": 10,
                    "last_fetched_epoch": 2,
                    "log_start_offset": -1,
                    "partition_max_bytes": 1 << 20,
                }
            ],
        }
    ]
    _, _, got = decode_request(encode_request(m.FETCH, 13, 1, body))
    assert got["topics"][0]["topic_id"] == tid
    assert got["topics"][0]["partitions"][0]["last_fetched_epoch"] == 2
    old = m.FETCH.default_request(11)
    old["topics"] = [{"topic": "t", "topic_id": uuid.UUID(int=0), "partitions": []}]
    assert decode_request(encode_request(m.FETCH, 11, 1, old))[2]["topics"][0]["topic"] == "t"


def test_trailing_request_bytes_are_refused_unless_the_listener_ignores_them() -> None:
    """librdkafka's all-topics Metadata v12 request (captured) ends with 3 bytes after the
    body: a Kafka broker ignores them, and so does the listener (``trailing_ok``)."""
    captured = bytes.fromhex("0003000c00000003000772646b61666b610000000000010000")
    with pytest.raises(KafkaDecodeError, match="3 trailing bytes after Metadata v12"):
        decode_request(captured)
    header, api, body = decode_request(captured, trailing_ok=True)
    assert (api.name, header.correlation_id, body["topics"]) == ("Metadata", 3, None)
