"""Hostile input: random bytes and mutations of valid encodings raise only KafkaDecodeError."""

from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.kafka import columnar
from quorumlog.replica.kafka import messages as m
from quorumlog.replica.kafka.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from quorumlog.replica.kafka.records import decode_batch, encode_batch, iter_batches
from quorumlog.replica.kafka.wire import FrameDecoder, KafkaDecodeError

from .strategies import api_versions, message_strategy

ALL = api_versions()


def _only_decode_errors(decode: Callable[[bytes], object], data: bytes) -> None:
    try:
        decode(data)
    except KafkaDecodeError:
        pass


def _mutations(rng: random.Random, data: bytes, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        b = bytearray(data)
        kind = rng.randrange(5)
        if kind == 0 and b:  # flip bits
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            del b[rng.randrange(len(b) + 1) :]
        elif kind == 2:  # insert junk
            pos = rng.randrange(len(b) + 1)
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == 3 and b:  # extreme bytes (huge lengths, long varints)
            b[rng.randrange(len(b))] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
        else:  # overwrite a run
            pos = rng.randrange(len(b) + 1)
            b[pos : pos + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x80"])
        out.append(bytes(b))
    return out


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_as_requests_frames_and_batches(data: bytes) -> None:
    _only_decode_errors(decode_request, data)
    _only_decode_errors(lambda d: FrameDecoder(max_frame=1 << 16).feed(d), data)
    _only_decode_errors(lambda d: list(iter_batches(d, verify_crc=False)), data)
    _only_decode_errors(lambda d: list(columnar.iter_batches(d, verify_crc=False)), data)
    _only_decode_errors(lambda d: decode_batch(b"\x00" * 16 + b"\x02" + d, verify_crc=False), data)
    _only_decode_errors(
        lambda d: columnar.decode_columns(b"\x00" * 16 + b"\x02" + d, verify_crc=False), data
    )


@settings(max_examples=100, deadline=None)
@given(st.data(), st.sampled_from(ALL), st.integers(0, 2**32))
def test_mutated_requests_and_responses(data: st.DataObject, case: tuple, seed: int) -> None:
    api, version = case
    rng = random.Random(seed)
    request = encode_request(api, version, 1, data.draw(message_strategy(api, version, True)))
    for mutated in _mutations(rng, request, 20):
        _only_decode_errors(decode_request, mutated)
    body = data.draw(message_strategy(api, version, False))
    response = encode_response(api, version, 1, body)
    for mutated in _mutations(rng, response, 20):
        _only_decode_errors(lambda d: decode_response(api, version, d), mutated)


def test_mutated_record_batches() -> None:
    rng = random.Random(15)
    batch = encode_batch(
        [b"value-%d" % i for i in range(20)],
        [None if i % 3 else b"k" for i in range(20)],
        list(range(1000, 1020)),
        [[("h", b"v"), ("n", None)] if i % 2 else [] for i in range(20)],
        producer_id=5,
    )
    gz = encode_batch([b"x" * 50] * 5, compression=1)
    snappy = encode_batch([b"y" * 50] * 5, compression=2)
    for source in (batch, gz, snappy):
        for mutated in _mutations(rng, source, 3000):
            # Skip the CRC so mutations reach the record parser.
            _only_decode_errors(lambda d: list(iter_batches(d, verify_crc=False)), mutated)
            _only_decode_errors(lambda d: list(iter_batches(d)), mutated)
            _only_decode_errors(lambda d: list(columnar.iter_batches(d, verify_crc=False)), mutated)


def test_metadata_request_with_a_huge_array_count_is_refused_without_allocating() -> None:
    payload = encode_request(m.METADATA, 12, 1, m.METADATA.default_request(12))
    header_len = len(payload) - 4  # body: compact topics (1 byte) + 2 bools + tags
    hostile = payload[:header_len] + b"\xff\xff\xff\xff\x0f" + payload[header_len + 1 :]
    try:
        decode_request(hostile)
    except KafkaDecodeError as exc:
        assert "array" in str(exc) or "varint" in str(exc) or "bytes" in str(exc)
    else:
        raise AssertionError("decoded a 4-billion-element array from 10 bytes")
