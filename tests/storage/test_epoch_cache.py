from __future__ import annotations

import os
from pathlib import Path

import pytest
from quorumlog.replica.storage import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    CorruptCheckpointError,
    EpochEndOffset,
    LeaderEpochCache,
    OffsetAndEpoch,
)


def cache_with(tmp_path: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(str(tmp_path / "leader-epoch-checkpoint"))
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def pairs(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.offset) for e in cache.entries]


def test_assign_ignores_duplicates_and_keeps_monotonic(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert not cache.assign(2, 15)  # same epoch, later offset: no-op
    assert pairs(cache) == [(1, 0), (2, 10)]
    assert cache.assign(2, 5)  # same epoch, earlier offset: replaces
    assert pairs(cache) == [(1, 0), (2, 5)]
    assert cache.assign(4, 3)  # start below existing entries removes them
    assert pairs(cache) == [(1, 0), (4, 3)]
    assert cache.assign(3, 8)  # lower epoch removes higher epochs (Kafka)
    assert pairs(cache) == [(1, 0), (3, 8)]
    assert cache.latest_epoch == 3
    with pytest.raises(ValueError):
        cache.assign(-1, 0)


def test_end_offset_for_kafka_semantics(tmp_path: Path) -> None:
    empty = cache_with(tmp_path)
    assert empty.end_offset_for(1, 10) == EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    cache = cache_with(tmp_path, (2, 5), (4, 20), (7, 30))
    assert cache.end_offset_for(7, 42) == EpochEndOffset(7, 42)  # latest -> LEO
    assert cache.end_offset_for(4, 42) == EpochEndOffset(4, 30)
    assert cache.end_offset_for(5, 42) == EpochEndOffset(4, 30)  # floor epoch, next start
    assert cache.end_offset_for(3, 42) == EpochEndOffset(2, 20)
    assert cache.end_offset_for(1, 42) == EpochEndOffset(1, 5)  # below all
    assert cache.end_offset_for(8, 42) == EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 42) == EpochEndOffset(
        UNDEFINED_EPOCH, UNDEFINED_OFFSET
    )
    assert [cache.epoch_for_offset(o) for o in (0, 5, 19, 20, 35)] == [-1, 2, 2, 4, 7]


def test_truncate_from_end_and_start(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (3, 20))
    cache.truncate_from_end(25)
    assert pairs(cache) == [(1, 0), (2, 10), (3, 20)]
    cache.truncate_from_end(20)
    assert pairs(cache) == [(1, 0), (2, 10)]
    cache.truncate_from_start(12)
    assert pairs(cache) == [(2, 12)]
    cache.truncate_from_start(5)
    assert pairs(cache) == [(2, 12)]
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    cache.truncate_from_start(10)
    assert pairs(cache) == [(2, 10)]


def test_checkpoint_format_and_reload(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (3, 17))
    text = Path(cache.path).read_text()
    assert text == "0\n2\n1 0\n3 17\n"
    assert LeaderEpochCache(cache.path).entries == [OffsetAndEpoch(0, 1), OffsetAndEpoch(17, 3)]
    assert not os.path.exists(cache.path + ".tmp")


@pytest.mark.parametrize(
    "content",
    ["", "1\n0\n", "0\n2\n1 0\n", "0\n1\n1 0", "0\n2\n3 0\n2 5\n", "0\n1\nx y\n", "0\n1\n1 -1\n"],
)
def test_corrupt_checkpoint_names_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text(content)
    with pytest.raises(CorruptCheckpointError, match="leader-epoch-checkpoint"):
        LeaderEpochCache(str(path))


def test_every_prefix_of_a_checkpoint_is_rejected(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (3, 17), (12, 345))
    data = Path(cache.path).read_bytes()
    for cut in range(len(data)):
        Path(cache.path).write_bytes(data[:cut])
        with pytest.raises(CorruptCheckpointError):
            LeaderEpochCache(cache.path)
