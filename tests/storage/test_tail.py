"""The tail: a leader's newest batches served from memory, exactly as the file would
serve them, and dropped whenever the log changes in a way it does not follow."""

from __future__ import annotations

from pathlib import Path

import pytest
from quorumlog.replica.defaults import TAIL_LOG_BATCHES
from quorumlog.replica.storage import DiskError, Log, LogConfig, iter_batches, log_append
from quorumlog.replica.storage.segment import Segment
from quorumlog.replica.storage.tail import Tail, TailBudget

from .helpers import client_batch, follower_batch, read_all_values, summary, values_for

ONE_SEGMENT = LogConfig(segment_bytes=1 << 30)


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the preads segments make (the real pread still runs)."""
    calls: list[int] = []
    real = Segment.pread

    def counting(self: Segment, size: int, position: int) -> bytes:
        calls.append(size)
        return real(self, size, position)

    monkeypatch.setattr(Segment, "pread", counting)
    return calls


def fill(log: Log, batches: int, epoch: int = 1) -> list[int]:
    """Append ``batches`` leader batches of 1-3 records; their base offsets."""
    bases = []
    for i in range(batches):
        bases.append(log.end_offset)
        log.append_as_leader(client_batch(log.end_offset, 1 + i % 3), epoch)
    return bases


def test_a_leader_serves_what_it_just_appended_without_reading_the_file(
    tmp_path: Path, preads: list[int]
) -> None:
    log = Log(str(tmp_path / "kept"), ONE_SEGMENT, tail=TailBudget(1 << 20))
    fill(log, 6)
    preads.clear()
    data = log.read(0, 1 << 20)
    assert preads == []
    assert summary(data) == [(0, 1, 1), (1, 2, 1), (3, 3, 1), (6, 1, 1), (7, 2, 1), (9, 3, 1)]
    assert read_all_values(log) == values_for(0, 12)
    # Without a tail, the same read costs preads.
    bare = Log(str(tmp_path / "bare"), ONE_SEGMENT, tail=TailBudget(0))
    fill(bare, 6)
    preads.clear()
    assert summary(bare.read(0, 1 << 20)) == summary(data)
    assert preads


def test_reads_from_the_tail_equal_reads_from_the_file(tmp_path: Path) -> None:
    """Every offset, with max_bytes below, at and past batch sizes and every max_offset:
    the same bytes as the file gives once the log is reopened without a tail."""
    log = Log(str(tmp_path), ONE_SEGMENT, tail=TailBudget(1 << 20))
    bases = fill(log, 7)
    end = log.end_offset
    size = len(client_batch(0, 2))
    shapes = [
        (offset, max_bytes, max_offset)
        for offset in range(end)
        for max_bytes in (0, 1, size, 2 * size + size // 2, 1 << 20)
        for max_offset in [None, *bases[1:], end]
    ]
    kept = [log.read(*shape) for shape in shapes]
    log.close()
    reopened = Log(str(tmp_path), ONE_SEGMENT, tail=TailBudget(0))
    assert [reopened.read(*shape) for shape in shapes] == kept
    assert sum(1 for data in kept if len(list(iter_batches(data))) > 1) > 50


def test_truncation_and_follower_appends_clear_the_tail(tmp_path: Path) -> None:
    log = Log(str(tmp_path), ONE_SEGMENT, tail=TailBudget(1 << 20))
    bases = fill(log, 4)
    log.truncate_to(bases[2])  # offsets 3.. go; new records take their place
    assert log._tail.nbytes == 0
    log.append_as_leader(client_batch(100, 2), 2)
    assert summary(log.read(bases[1], 1 << 20)) == [(1, 2, 1), (3, 2, 2)]
    assert read_all_values(log) == values_for(0, 3) + values_for(100, 2)
    # As a follower it keeps nothing; what it holds is read from the file.
    log.append_as_follower(follower_batch(5, 2, 3))
    assert log._tail.nbytes == 0
    assert summary(log.read(3, 1 << 20)) == [(3, 2, 2), (5, 2, 3)]


def test_a_write_failing_part_way_clears_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batches in one append, the second rolling a segment whose write fails: the
    first is in the log, so the tail (which ended before it) must not be extended past
    it later."""
    size = len(client_batch(0, 1))
    log = Log(str(tmp_path), LogConfig(segment_bytes=2 * size), tail=TailBudget(1 << 20))
    log.append_as_leader(client_batch(0, 1), 1)
    writes = []
    real = log_append._writev_all

    def second_fails(fd: int, buffers: list[bytes | memoryview]) -> None:
        writes.append(fd)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        real(fd, buffers)

    monkeypatch.setattr(log_append, "_writev_all", second_fails)
    with pytest.raises(DiskError) as info:
        log.append_as_leader(client_batch(1, 1) + client_batch(2, 1), 1)
    assert info.value.errno == 28
    monkeypatch.setattr(log_append, "_writev_all", real)
    assert log.end_offset == 2
    log.append_as_leader(client_batch(2, 1), 1)
    assert [summary(log.read(o, 1)) for o in range(3)] == [[(o, 1, 1)] for o in range(3)]
    assert read_all_values(log) == values_for(0, 3)


def test_a_tail_keeps_its_newest_batches_up_to_its_limit() -> None:
    budget = TailBudget(1000)
    tail = Tail(budget, limit=300)
    tail.extend([(0, b"a" * 100), (10, b"b" * 100)])
    tail.extend([(20, b"c" * 150)])
    assert (tail.start, tail.nbytes, budget.used) == (10, 250, 250)
    assert tail.read(15, 1000, None) == b"b" * 100 + b"c" * 150
    assert tail.read(15, 120, None) == b"b" * 100  # at least one batch, no more than asked
    assert tail.read(25, 0, None) == b"c" * 150
    assert tail.read(15, 1000, 20) == b"b" * 100
    assert tail.read(20, 1000, 20) == b""
    assert tail.read(9, 1000, None) is None  # below it: the file's business
    tail.extend([(30, b"d" * 301)])  # over the limit: not kept, nor what came before
    assert (tail.start, tail.nbytes, budget.used) == (None, 0, 0)
    tail.extend([(40 + i, b"e") for i in range(TAIL_LOG_BATCHES + 2)])  # and a few batches
    assert (tail.start, tail.nbytes, budget.used) == (42, TAIL_LOG_BATCHES, TAIL_LOG_BATCHES)


def test_the_budget_drops_the_least_recently_appended_tails(tmp_path: Path) -> None:
    size = len(client_batch(0, 1))
    budget = TailBudget(3 * size)
    first = Log(str(tmp_path / "first"), ONE_SEGMENT, tail=budget)
    second = Log(str(tmp_path / "second"), ONE_SEGMENT, tail=budget)
    for _ in range(2):
        first.append_as_leader(client_batch(first.end_offset, 1), 1)
    second.append_as_leader(client_batch(0, 1), 1)
    assert (first._tail.nbytes, second._tail.nbytes) == (2 * size, size)
    second.append_as_leader(client_batch(1, 1), 1)  # over the budget: the older tail goes
    assert (first._tail.nbytes, second._tail.nbytes, budget.used) == (0, 2 * size, 2 * size)
    assert read_all_values(first) == values_for(0, 2)
    for _ in range(3):  # alone over the budget, a tail gives up its own oldest batches
        second.append_as_leader(client_batch(second.end_offset, 1), 1)
    assert (second._tail.start, second._tail.nbytes, budget.used) == (2, 3 * size, 3 * size)
    assert read_all_values(second) == values_for(0, 5)
    second.close()
    assert budget.used == 0
