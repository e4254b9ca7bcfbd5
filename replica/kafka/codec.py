"""Kafka requests and responses as bytes <-> (header, message dict); sans-I/O.

Framing (the INT32 size prefix) is ``wire.frame`` / ``wire.FrameDecoder``; the functions
here take and return one frame's payload.

Request header v1: api_key INT16, api_version INT16, correlation_id INT32, client_id
NULLABLE_STRING; v2 adds a tagged-field section (client_id stays a classic string).
Response header v0: correlation_id INT32; v1 adds tagged fields. ApiVersions responses
always use v0.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .errors import KafkaError
from .messages import API_BY_KEY, API_VERSIONS, PRODUCE, SUPPORTED_APIS
from .schema import Api, Message, decode_struct, encode_struct
from .wire import Buffer, KafkaDecodeError, Reader, Writer, put_uvar

__all__ = [
    "RequestHeader",
    "UnsupportedRequest",
    "api_versions_body",
    "decode_request",
    "decode_request_header",
    "decode_response",
    "encode_produce_response",
    "encode_request",
    "encode_response",
    "fetched_partition",
]


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class UnsupportedRequest(KafkaDecodeError):
    """A well-formed header naming an api key or version we do not serve. The connection
    can live on: answer ``header.correlation_id`` with UNSUPPORTED_VERSION (for
    ApiVersions, an ApiVersions v0 response listing what we serve)."""

    error_code = KafkaError.UNSUPPORTED_VERSION

    def __init__(self, header: RequestHeader) -> None:
        super().__init__(
            f"unsupported api key {header.api_key} version {header.api_version} "
            f"(correlation id {header.correlation_id})"
        )
        self.header = header


def decode_request_header(payload: Buffer) -> tuple[RequestHeader, Api | None, Reader]:
    """The header, the Api it names (None if unknown) and a reader at the body."""
    r = Reader(payload)
    api_key = r.int16()
    api_version = r.int16()
    correlation_id = r.int32()
    client_id = r.nullable_string()
    header = RequestHeader(api_key, api_version, correlation_id, client_id)
    api = API_BY_KEY.get(api_key)
    if api is not None and api.supports(api_version) and api.is_flexible(api_version):
        r.skip_tagged_fields()
    return header, api, r


def decode_request(
    payload: Buffer, *, trailing_ok: bool = False
) -> tuple[RequestHeader, Api, Message]:
    """Decode one request. Raises UnsupportedRequest for an api/version we do not serve,
    KafkaDecodeError for anything malformed (then drop the connection). ``trailing_ok``:
    bytes after the body are ignored, as a Kafka broker ignores them (librdkafka's
    all-topics Metadata v12 carries 3 such bytes)."""
    fast = _produce_fast(payload, trailing_ok)
    if fast is not None:
        return fast[0], PRODUCE, fast[1]
    header, api, r = decode_request_header(payload)
    if api is None or not api.supports(header.api_version):
        raise UnsupportedRequest(header)
    body = decode_struct(r, api.plan(header.api_version, True))
    if r.remaining and not trailing_ok:
        raise KafkaDecodeError(
            f"{r.remaining} trailing bytes after {api.name} v{header.api_version} request"
        )
    return header, api, body


_HEADER = struct.Struct(">hhih")  # api key, version, correlation id, client id's length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


def _produce_fast(payload: Buffer, trailing_ok: bool) -> tuple[RequestHeader, Message] | None:
    """A Produce request's header and body as ``decode_request`` gives them, read with
    no Reader and no call per field (a producer under a backlog sends thousands a
    second, and the Reader's calls were most of their cost); None for any other request
    and for anything this reading does not expect (a tagged field, a short or damaged
    request): ``decode_request``'s walk of the schema then answers, or says what is
    wrong."""
    try:
        api_key, version, correlation_id, n = _HEADER.unpack_from(payload, 0)
        if api_key != PRODUCE.key or not PRODUCE.min_version <= version <= PRODUCE.max_version:
            return None
        size = len(payload)
        client_id, pos = _string(payload, 10, n, size)
        compact = version >= 9
        if compact:
            pos = _no_tags(payload, pos)  # the header's
        n, pos = _string_length(payload, pos, compact)
        transactional_id, pos = _string(payload, pos, n, size)
        acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(payload, pos)
        pos += 6
        topics, pos = _count(payload, pos, compact)
        if topics < 0 or topics > size - pos:
            return None
        topic_data = []
        for _ in range(topics):
            n, pos = _string_length(payload, pos, compact)
            if n < 0:
                return None
            name, pos = _string(payload, pos, n, size)
            partitions, pos = _count(payload, pos, compact)
            if partitions < 0 or partitions > size - pos:
                return None
            partition_data = []
            for _ in range(partitions):
                (index,) = _I32.unpack_from(payload, pos)
                n, pos = _count(payload, pos + 4, compact)
                records = None
                if n != -1:
                    if n < 0 or pos + n > size:
                        return None
                    records = bytes(payload[pos : pos + n])
                    pos += n
                if compact:
                    pos = _no_tags(payload, pos)
                partition_data.append({"index": index, "records": records})
            if compact:
                pos = _no_tags(payload, pos)
            topic_data.append({"name": name, "partition_data": partition_data})
        if compact:
            pos = _no_tags(payload, pos)
        if pos != size and not trailing_ok:
            return None
    except (_Unexpected, IndexError, struct.error, UnicodeDecodeError):
        return None
    header = RequestHeader(api_key, version, correlation_id, client_id)
    body = {
        "transactional_id": transactional_id,
        "acks": acks,
        "timeout_ms": timeout_ms,
        "topic_data": topic_data,
    }
    return header, body


class _Unexpected(Exception):
    """What ``_produce_fast`` leaves to the schema's walk."""


def _string(payload: Buffer, pos: int, n: int, size: int) -> tuple[str | None, int]:
    """The string of ``n`` bytes at ``pos`` (None: ``n`` is -1, a null) and where it ends."""
    if n == -1:
        return None, pos
    if n < 0 or pos + n > size:
        raise _Unexpected
    return str(payload[pos : pos + n], "utf-8"), pos + n


def _short_length(payload: Buffer, pos: int) -> tuple[int, int]:
    """A compact string length of one varint byte (a name or id under 127 bytes; a
    longer one is the schema walk's), and where it ends."""
    b = payload[pos]
    if b & 0x80:
        raise _Unexpected
    return b - 1, pos + 1


def _string_length(payload: Buffer, pos: int, compact: bool) -> tuple[int, int]:
    """A string's length (-1: null): compact, ``_short_length``; classic, INT16."""
    if compact:
        return _short_length(payload, pos)
    return _I16.unpack_from(payload, pos)[0], pos + 2


def _no_tags(payload: Buffer, pos: int) -> int:
    """Past an empty tagged-field section (one with fields is the schema walk's)."""
    if payload[pos]:
        raise _Unexpected
    return pos + 1


def _count(payload: Buffer, pos: int, compact: bool) -> tuple[int, int]:
    """A classic INT32 length or count, or a compact one (UNSIGNED_VARINT N+1, up to 4
    bytes here: a longer one is refused by reading on, as -2), and where it ends."""
    if not compact:
        return _I32.unpack_from(payload, pos)[0], pos + 4
    value = 0
    for shift in (0, 7, 14, 21):
        b = payload[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value - 1, pos
    return -2, pos


def encode_request(
    api: Api, version: int, correlation_id: int, body: Message, client_id: str | None = None
) -> bytes:
    w = Writer()
    w.int16(api.key)
    w.int16(version)
    w.int32(correlation_id)
    w.nullable_string(client_id)
    if api.request_header_version(version) >= 2:
        w.tagged_fields()
    encode_struct(w, api.plan(version, True), body)
    return w.getvalue()


def encode_response(api: Api, version: int, correlation_id: int, body: Message) -> bytes:
    if api is PRODUCE:
        fast = encode_produce_response(version, correlation_id, body)
        if fast is not None:
            return fast
    w = Writer()
    w.int32(correlation_id)
    if api.response_header_version(version) >= 1:
        w.tagged_fields()
    encode_struct(w, api.plan(version, False), body)
    return w.getvalue()


def encode_produce_response(version: int, correlation_id: int, body: Message) -> bytes | None:
    """A Produce response written field by field: the bytes ``encode_response`` writes
    by its plan, for what the listener answers (no record errors, no tagged fields set);
    None for anything else, which the plan then writes. A partition's fixed fields are
    packed at once (answers go out by the thousand a second under a backlog)."""
    if body.get("node_endpoints"):
        return None
    compact = version >= 9
    fixed = _PARTITION_V5 if version >= 5 else _PARTITION_V3
    out = bytearray(_I32.pack(correlation_id))
    if compact:
        out.append(0)
    try:
        responses = body.get("responses", [])
        _put_length(out, len(responses), compact)
        for topic in responses:
            _put_string(out, topic["name"], compact)
            parts = topic["partition_responses"]
            _put_length(out, len(parts), compact)
            for p in parts:
                if p.get("record_errors") or "current_leader" in p:
                    return None
                packed = (p["index"], p["error_code"], p["base_offset"])
                append_time = p.get("log_append_time_ms", -1)  # v2 on: every version served
                if version >= 5:
                    out += fixed.pack(*packed, append_time, p.get("log_start_offset", -1))
                else:
                    out += fixed.pack(*packed, append_time)
                if version >= 8:
                    _put_length(out, 0, compact)  # no record errors
                    _put_string(out, p.get("error_message"), compact)
                if compact:
                    out.append(0)
            if compact:
                out.append(0)
        out += _I32.pack(body.get("throttle_time_ms", 0))
    except struct.error:
        return None  # a value out of its field's range: the plan says which
    if compact:
        out.append(0)
    return bytes(out)


_PARTITION_V3 = struct.Struct(">ihqq")  # index, error, base offset, log append time
_PARTITION_V5 = struct.Struct(">ihqqq")  # and the log start offset


def _put_length(out: bytearray, n: int, compact: bool) -> None:
    """A length or count: compact, UNSIGNED_VARINT n + 1; classic, INT32 (strings' INT16
    lengths are ``_put_string``'s)."""
    if compact:
        put_uvar(out, n + 1)
    else:
        out += _I32.pack(n)


def _put_string(out: bytearray, text: str | None, compact: bool) -> None:
    """A (nullable) string: compact, UNSIGNED_VARINT length + 1 (0: null); classic, INT16
    length (-1: null)."""
    if text is None:
        out += b"\x00" if compact else b"\xff\xff"
        return
    data = text.encode("utf-8")
    if len(data) > 0x7FFF:
        raise struct.error(f"string of {len(data)} bytes exceeds INT16 length")
    if compact:
        _put_length(out, len(data), True)
    else:
        out += _I16.pack(len(data))
    out += data


def decode_response(api: Api, version: int, payload: Buffer) -> tuple[int, Message]:
    """(correlation id, body) of a response to a request of ``api`` at ``version``."""
    r = Reader(payload)
    correlation_id = r.int32()
    if api.response_header_version(version) >= 1:
        r.skip_tagged_fields()
    body = decode_struct(r, api.plan(version, False))
    if r.remaining:
        raise KafkaDecodeError(f"{r.remaining} trailing bytes after {api.name} v{version} response")
    return correlation_id, body


def api_versions_body(
    version: int,
    supported: tuple[tuple[int, int, int], ...] = SUPPORTED_APIS,
    error_code: int = KafkaError.NONE,
) -> Message:
    """An ApiVersions response body listing ``supported`` (api key, min, max)."""
    body = API_VERSIONS.default_response(version)
    body["error_code"] = int(error_code)
    body["api_keys"] = [
        {"api_key": key, "min_version": low, "max_version": high} for key, low, high in supported
    ]
    return body


def fetched_partition(
    index: int,
    error_code: int,
    high_watermark: int = -1,
    log_start_offset: int = -1,
    records: bytes = b"",
    *,
    last_stable_offset: int | None = None,
    aborted_transactions: list[tuple[int, int]] | None = None,
) -> Message:
    """One partition of a Fetch response body. ``last_stable_offset``: the first offset
    an open transaction holds (default: the high watermark); ``aborted_transactions``:
    (producer id, first offset) of those aborted in the records, for a read_committed
    fetch (None: a null list). No preferred read replica. An error answer leaves the
    offsets at -1 and the records empty."""
    aborted = (
        None
        if aborted_transactions is None
        else [{"producer_id": pid, "first_offset": first} for pid, first in aborted_transactions]
    )
    return {
        "partition_index": index,
        "error_code": int(error_code),
        "high_watermark": high_watermark,
        "last_stable_offset": high_watermark if last_stable_offset is None else last_stable_offset,
        "log_start_offset": log_start_offset,
        "aborted_transactions": aborted,
        "preferred_read_replica": -1,
        "records": records,
    }
