"""``columnar.decode_joined``: several produced batches decoded in one pass give exactly
the rows decoding each alone gives, and never accept what one of them alone refuses (the
Kafka listener decodes a turn's batches with it)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.kafka import columnar
from quorumlog.replica.kafka.columnar import decode_columns, decode_joined
from quorumlog.replica.kafka.records import (
    BATCH_HEADER_SIZE,
    check_produced,
    encode_batch,
    read_frame,
)
from quorumlog.replica.kafka.wire import KafkaDecodeError

from .test_columnar import _encode, _mutations, any_records, producer_records


def _sections(batches: list[bytes]) -> list[tuple[int, bytes, int]]:
    out = []
    for raw in batches:
        batch, data, count = read_frame(raw)
        out.append((batch.base_timestamp, data, count))
    return out


def _alone(raw: bytes) -> pa.RecordBatch | None:
    """What the batch decodes to alone and checked as a producer's, None if refused."""
    try:
        batch = decode_columns(raw)
        check_produced(batch)
    except KafkaDecodeError:
        return None
    return batch.records


def _fast_alone(raw: bytes) -> bool:
    batch, data, count = read_frame(raw)
    return columnar._decode_fast(data, count, batch.base_timestamp) is not None


@settings(max_examples=150, deadline=None)
@given(st.lists(producer_records() | any_records(), min_size=1, max_size=6))
def test_joined_rows_are_each_batch_alone_in_turn(batches: list[dict[str, list[Any]]]) -> None:
    raws = [_encode(cols) for cols in batches]
    joined = decode_joined(_sections(raws))
    alone = [_alone(raw) for raw in raws]
    if all(_fast_alone(raw) for raw in raws) and all(a is not None for a in alone):
        assert joined is not None  # what the fast paths read alone, they read together
    if joined is not None:
        assert all(a is not None for a in alone)
        want = pa.Table.from_batches([a for a in alone if a is not None]).combine_chunks()
        assert pa.Table.from_batches([joined]).combine_chunks().equals(want)


def _backlog(rng: random.Random, batches: int, most: int, value: int = 100) -> list[bytes]:
    """Keyed records of 16-byte keys in batches of 1..``most``, as librdkafka sends them
    under a backlog: a record grows a byte once its offset delta reaches 64, or its
    timestamp delta (a millisecond every 9 records) does."""
    raws = []
    for b in range(batches):
        n = rng.randint(1, most)
        keys = [b"%016d" % (b * 1000 + i) for i in range(n)]
        stamps = [1_700_000_000_000 + i // 9 for i in range(n)]
        raws.append(encode_batch([b"v" * value] * n, keys, stamps))
    return raws


def _decoded_alone(raws: list[bytes]) -> pa.Table:
    return pa.Table.from_batches([decode_columns(r).records for r in raws]).combine_chunks()


@pytest.mark.parametrize("most", [40, 80, 300, 1500])
def test_librdkafka_batches_of_a_backlog_are_decoded_together(most: int) -> None:
    """Dozens of such batches, of records of one length (at most 64 records a batch) or
    of two, three or four (offset deltas past 64 and 8,192, timestamp deltas past 64):
    the joined decode answers, with each batch's rows in turn."""
    raws = _backlog(random.Random(most), 70, most)
    joined = decode_joined(_sections(raws))
    assert joined is not None
    assert pa.Table.from_batches([joined]).combine_chunks().equals(_decoded_alone(raws))


def test_a_batch_of_long_records_among_short_ones_is_read_record_by_record() -> None:
    """A record of 10 KB has a length varint of three bytes: its batch is walked one record
    at a time, the batches around it read together, the rows as alone."""
    rng = random.Random(3)
    raws = _backlog(rng, 10, 90)
    raws[4:4] = [encode_batch([b"x" * 10_000, b"y" * 20], [b"k1", b"k2"], [5, 6])]
    joined = decode_joined(_sections(raws))
    assert joined is not None
    assert pa.Table.from_batches([joined]).combine_chunks().equals(_decoded_alone(raws))


def test_a_record_running_into_the_next_batch_is_refused() -> None:
    """Two batches whose counts are off by one in opposite directions hold, together,
    as many records as they claim: each alone is refused, so the joined decode is too."""
    first = encode_batch([b"a" * 10] * 3, None, [5, 5, 5])
    second = encode_batch([b"b" * 10] * 3, None, [9, 9, 9])
    (f_batch, f_data, _), (s_batch, s_data, _) = read_frame(first), read_frame(second)
    sections = [(f_batch.base_timestamp, f_data, 4), (s_batch.base_timestamp, s_data, 2)]
    assert decode_joined(sections) is None
    # and records moved across the boundary, counts right for the bytes
    record = f_data[len(f_data) // 3 * 2 :]
    moved = [(5, f_data[: len(f_data) - len(record)], 3), (9, record + s_data, 3)]
    assert decode_joined(moved) is None


@settings(max_examples=40, deadline=None)
@given(producer_records() | any_records(), st.integers(0, 2**32))
def test_malformed_batches_are_never_accepted_together(
    cols: dict[str, list[Any]], seed: int
) -> None:
    """Mutated batches (CRC made valid) beside good ones: whatever the joined decode
    accepts, each batch alone accepts, with the same rows."""
    rng = random.Random(seed)
    good = _encode(cols)
    for mutated in _mutations(rng, good, 15):
        if len(mutated) < BATCH_HEADER_SIZE:
            continue
        try:
            sections = _sections([good, mutated, good])
        except KafkaDecodeError:
            continue  # refused by its framing before any record is read
        joined = decode_joined(sections)
        if joined is None:
            continue
        alone = [_alone(raw) for raw in (good, mutated, good)]
        assert all(a is not None for a in alone)
        want = pa.Table.from_batches([a for a in alone if a is not None]).combine_chunks()
        assert pa.Table.from_batches([joined]).combine_chunks().equals(want)
