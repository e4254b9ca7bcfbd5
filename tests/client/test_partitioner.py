"""Partitioners by librdkafka's names: murmur2 as Kafka's ``Utils.murmur2`` (its own test
values), the column-at-a-time hash equal to the one-key one, and which keys each
partitioner leaves to the sticky partition. ``test_partitioner_agreement`` checks both
against librdkafka itself."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.client.partitioner import (
    murmur2,
    murmur2_many,
    partitions_for,
    unkeyed,
)

# Kafka's UtilsTest.testMurmur2: the Java client's values (signed ints there).
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("key", list(JAVA_MURMUR2))
def test_murmur2_is_the_java_clients(key: bytes) -> None:
    assert murmur2(key) == JAVA_MURMUR2[key] & 0xFFFFFFFF


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=200), st.integers(0, 5))
def test_a_column_hashes_as_each_key_alone(keys: list[bytes | None], skip: int) -> None:
    column = pa.array(keys, pa.binary()).slice(min(skip, len(keys)))  # an offset too
    assert murmur2_many(column).tolist() == [murmur2(k or b"") for k in keys[skip:]]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 13), st.lists(st.binary(min_size=13, max_size=13), max_size=50))
def test_keys_of_one_length_hash_as_each_key_alone(length: int, blobs: list[bytes]) -> None:
    # Keys of one length take a path of their own (the rows of a matrix).
    keys = [blob[:length] for blob in blobs]
    column = pa.array([b"-" * length, *keys], pa.binary()).slice(1)  # an offset too
    assert murmur2_many(column).tolist() == [murmur2(k) for k in keys]


def test_partitions_by_name_and_what_each_leaves_unkeyed() -> None:
    keys = [b"k%d" % i for i in range(100)] + [b"", None]
    column = pa.array(keys, pa.binary())
    by_murmur = partitions_for("murmur2_random", column, 7).tolist()
    by_crc = partitions_for("consistent_random", column, 7, keys).tolist()
    assert by_murmur[:100] == [(murmur2(k) & 0x7FFFFFFF) % 7 for k in keys[:100]]  # type: ignore[arg-type]
    assert by_crc[:100] == [zlib.crc32(k) % 7 for k in keys[:100]]  # type: ignore[arg-type]
    assert by_crc == partitions_for("consistent_random", column, 7).tolist()
    assert unkeyed("murmur2_random", column).tolist() == [False] * 101 + [True]
    assert unkeyed("consistent_random", column).tolist() == [False] * 100 + [True, True]
    with pytest.raises(ValueError, match="partitioner"):
        partitions_for("random", column, 7)
