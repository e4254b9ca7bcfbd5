"""Where a keyed record goes: partitioners by librdkafka's names, hashing whole columns of
keys at once.

``murmur2_random`` (the default) is the Java client's partitioner, and so Kafka Streams'
and Flink's: ``(murmur2(key) & 0x7fffffff) % partitions``, with the seed and constants of
Kafka's ``Utils.murmur2``. ``consistent_random`` is librdkafka's default:
``crc32(key) % partitions``. As in librdkafka, "random" names what a record without a key
gets: here the topic's sticky partition (KIP-480), which moves on when its batch closes.
librdkafka's ``consistent_random`` treats an empty key as no key; ``murmur2_random``
hashes it.

A key's hash is a pure function of its bytes, so a record lands on the same partition
whatever client wrote it, as long as the partition count is the same.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "DEFAULT_PARTITIONER",
    "PARTITIONERS",
    "UNKEYED",
    "key_partitions",
    "murmur2",
    "murmur2_many",
    "partitions_for",
    "unkeyed",
]

#: The partitioners by librdkafka's names (its ``partitioner`` setting).
PARTITIONERS = ("murmur2_random", "consistent_random")
#: The producer's default: the Java client's, so a key lands where JVM clients put it.
DEFAULT_PARTITIONER = "murmur2_random"
#: ``key_partitions``' answer for a row the partitioner does not hash (no key).
UNKEYED = -1

_MASK = 0xFFFFFFFF
_M = 0x5BD1E995
_SEED = 0x9747B28C


def murmur2(key: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of ``key``, as an unsigned 32-bit int (one key; the
    producer hashes whole columns with ``murmur2_many``)."""
    length = len(key)
    h = (_SEED ^ length) & _MASK
    words = length // 4
    for i in range(0, words * 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = key[words * 4 :]
    if tail:
        for shift, byte in enumerate(tail):
            h ^= byte << (8 * shift)
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def murmur2_many(keys: pa.Array) -> Any:
    """``murmur2`` of every key of a binary Arrow array (a null hashes as an empty key),
    a numpy uint32 array: a loop over the longest key's 4-byte words, each step over
    every key at once."""
    if keys.type != pa.binary():
        keys = keys.cast(pa.binary())
    n = len(keys)
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=keys.offset * 4)
    raw = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    if n and not keys.null_count and (np.diff(offsets) == offsets[1] - offsets[0]).all():
        length = int(offsets[1] - offsets[0])
        return _murmur2_equal_lengths(raw[offsets[0] : offsets[-1]].reshape(n, length))
    data = np.concatenate([raw, np.zeros(4, np.uint8)]).astype(np.uint32)  # room past the end
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    if keys.null_count:
        lengths[keys.is_null().to_numpy(zero_copy_only=False)] = 0
    m = np.uint32(_M)
    h = np.uint32(_SEED) ^ lengths.astype(np.uint32)
    words = lengths // 4
    last = len(data) - 4
    with np.errstate(over="ignore"):
        for w in range(int(words.max(initial=0))):
            pos = np.minimum(starts + 4 * w, last)
            k = data[pos] | (data[pos + 1] << 8) | (data[pos + 2] << 16) | (data[pos + 3] << 24)
            k *= m
            k ^= k >> np.uint32(24)
            k *= m
            h = np.where(words > w, (h * m) ^ k, h)
        rest = lengths & 3
        tail_at = np.minimum(starts + words * 4, last)
        tail = np.where(rest >= 3, data[tail_at + 2] << 16, 0).astype(np.uint32)
        tail ^= np.where(rest >= 2, data[tail_at + 1] << 8, 0).astype(np.uint32)
        tail ^= np.where(rest >= 1, data[tail_at], 0).astype(np.uint32)
        h = np.where(rest > 0, (h ^ tail) * m, h)
        h ^= h >> np.uint32(13)
        h *= m
        h ^= h >> np.uint32(15)
    return h.astype(np.uint32)


def _murmur2_equal_lengths(keys: Any) -> Any:
    """``murmur2`` of keys all of one length, the rows of a numpy uint8 matrix: its
    4-byte words read as little-endian uint32 columns, one step a column (no gathers, no
    per-key masks: a producer's keys are often of one length)."""
    n, length = keys.shape
    words = length // 4
    m = np.uint32(_M)
    h = np.full(n, (_SEED ^ length) & _MASK, np.uint32)
    with np.errstate(over="ignore"):
        if words:
            block = np.ascontiguousarray(keys[:, : words * 4]).view("<u4")
            for w in range(words):
                k = block[:, w] * m
                k ^= k >> np.uint32(24)
                k *= m
                h *= m
                h ^= k
        if length & 3:
            for shift in range(length & 3):
                h ^= keys[:, words * 4 + shift].astype(np.uint32) << np.uint32(8 * shift)
            h *= m
        h ^= h >> np.uint32(13)
        h *= m
        h ^= h >> np.uint32(15)
    return h


def unkeyed(partitioner: str, keys: pa.Array) -> Any:
    """Which of ``keys`` the partitioner does not hash (a numpy bool array): nulls, and
    for ``consistent_random`` empty keys too (librdkafka partitions both randomly)."""
    missing = keys.is_null().to_numpy(zero_copy_only=False)
    if partitioner == "consistent_random":
        lengths = np.asarray(pa.compute.binary_length(keys).fill_null(0))
        missing = missing | (lengths == 0)
    return missing


def partitions_for(
    partitioner: str, keys: pa.Array, partitions: int, key_list: Sequence[bytes | None] = ()
) -> Any:
    """The partition of each key (numpy int64; meaningless where ``unkeyed``). ``key_list``:
    the same keys as Python bytes, if the caller has them (crc32 is one C call a key)."""
    if partitioner == "murmur2_random":
        hashes = (murmur2_many(keys) & np.uint32(0x7FFFFFFF)).astype(np.int64)
    elif partitioner == "consistent_random":
        source = key_list if len(key_list) == len(keys) else keys.to_pylist()
        crc = zlib.crc32
        hashes = np.fromiter((crc(k) if k else 0 for k in source), np.int64, len(keys))
    else:
        raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {partitioner!r}")
    return hashes % partitions


def key_partitions(
    partitioner: str, keys: pa.Array, partitions: int, key_list: Sequence[bytes | None] = ()
) -> Any:
    """Each row's partition by its key, or ``UNKEYED`` for a row the partitioner does not
    hash (numpy int64): what the producer does with a column of keys, and the Spark sink
    with a column of rows, so both put a key where the other would."""
    missing = unkeyed(partitioner, keys)
    lanes = np.full(len(keys), UNKEYED, np.int64)
    if not missing.all():
        hashed = partitions_for(partitioner, keys, partitions, key_list)
        lanes = np.where(missing, UNKEYED, hashed)
    return lanes
