"""Group commit across logs: ``Log.flush`` in two halves and ``flush_logs`` (one syncfs
for many dirty logs, per-file syncs for few or on failure, each log's outcome its own)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from quorumlog.replica.storage import (
    CATCH_UP_UNKNOWN,
    FdCache,
    Log,
    LogConfig,
    StorageError,
    flush_logs,
    groupflush,
    log_flush,
    syncfs_available,
)
from quorumlog.replica.storage import syncfs as syncfs_module

from tests.support.pages import resident_pages
from tests.support.spies import record_calls

from .helpers import client_batch, crash, read_all_values, values_for

needs_syncfs = pytest.mark.skipif(not syncfs_available(), reason="needs Linux >= 5.8 syncfs")


def append(lg: Log, count: int) -> None:
    lg.append_as_leader(client_batch(lg.end_offset, count), 1)


def make_logs(tmp_path: Path, n: int, cache: FdCache | None = None) -> list[Log]:
    cache = cache or FdCache(64)
    return [Log(str(tmp_path / f"p-{i}"), files=cache) for i in range(n)]


def test_the_two_halves_make_durable_exactly_what_was_appended_before_the_first(
    tmp_path: Path,
) -> None:
    (lg,) = make_logs(tmp_path, 1)
    append(lg, 10)
    pending = lg.begin_flush()
    append(lg, 5)  # after the capture: not claimed by this flush
    pending.sync_files()
    assert pending.complete() == 10
    assert lg.durable_end_offset == 10
    assert lg.flush() == 15
    lg.close()


def test_an_abandoned_flush_claims_nothing_and_the_next_one_syncs_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lg = Log(str(tmp_path / "p"), LogConfig(segment_bytes=1024), files=FdCache(8))
    while len(lg.segment_base_offsets) < 2:
        append(lg, 10)  # rolls: a new directory entry to make durable
    pending = lg.begin_flush()
    assert pending.dir_dirty
    pending.abandon()
    pending.abandon()  # idempotent
    assert lg.durable_end_offset == 0
    dirs = record_calls(monkeypatch, log_flush, "fsync_dir")
    assert lg.flush() == lg.end_offset
    # The log made its directory with its first write: the entry of that goes too.
    assert dirs == [lg.directory, str(tmp_path)]
    append(lg, 30)  # rolls again: the log's directory, never its parent again
    assert lg.flush() == lg.end_offset
    assert dirs[2:] == [lg.directory]
    lg.close()


@needs_syncfs
def test_many_dirty_logs_cost_one_syncfs_and_each_durable_end_is_exact(tmp_path: Path) -> None:
    logs = make_logs(tmp_path, 20)
    flush_logs(logs, syncfs_min=3)  # new logs: their directories are synced once first
    for i, lg in enumerate(logs):
        if i % 4:
            append(lg, i + 1)
    result = flush_logs(logs, syncfs_min=3)
    # One syncfs for the data and the changed epoch checkpoints (staged in temporary
    # files), one for their renames.
    assert result.syncfs_calls == 2
    assert result.file_synced_logs == 0
    assert result.dirty_logs == 15
    assert result.outcomes == [lg.end_offset for lg in logs]
    assert [lg.durable_end_offset for lg in logs] == [lg.end_offset for lg in logs]
    # Nothing new: no sync at all.
    again = flush_logs(logs, syncfs_min=3)
    assert (again.syncfs_calls, again.file_synced_logs, again.dirty_logs) == (0, 0, 0)
    for lg in logs:
        lg.close()


def test_few_dirty_logs_or_syncfs_off_sync_file_by_file(tmp_path: Path) -> None:
    logs = make_logs(tmp_path, 5)
    flush_logs(logs, syncfs_min=3)  # new logs: their directories are synced once first
    append(logs[0], 3)
    append(logs[1], 4)
    result = flush_logs(logs, syncfs_min=3)
    assert (result.syncfs_calls, result.file_synced_logs) == (0, 2)
    assert result.outcomes == [3, 4, 0, 0, 0]
    for lg in logs:
        append(lg, 2)
    result = flush_logs(logs, syncfs_min=0)
    assert (result.syncfs_calls, result.file_synced_logs) == (0, 5)
    assert result.outcomes == [5, 6, 2, 2, 2]
    for lg in logs:
        lg.close()


@needs_syncfs
def test_a_failed_syncfs_falls_back_to_per_file_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = make_logs(tmp_path, 4)
    for lg in logs:
        append(lg, 7)

    def failing(device: int) -> OSError:
        return OSError(errno.EIO, "injected")

    monkeypatch.setattr(groupflush, "syncfs", failing)
    result = flush_logs(logs, syncfs_min=2)
    assert (result.syncfs_calls, result.syncfs_failures, result.file_synced_logs) == (1, 1, 4)
    assert result.outcomes == [7, 7, 7, 7]
    for lg in logs:
        lg.close()


@pytest.mark.parametrize("syncfs_min", [0, 2])
def test_one_failing_log_does_not_change_the_others_outcomes(
    tmp_path: Path, syncfs_min: int
) -> None:
    if syncfs_min and not syncfs_available():
        pytest.skip("needs syncfs")
    logs = make_logs(tmp_path, 6)
    for lg in logs:
        append(lg, 5)
    logs[4].flush()
    append(logs[4], 1)
    # A writeback error the cache met when it closed this log's active segment.
    logs[2]._segments[-1]._file.error = OSError(errno.EIO, "injected writeback error")
    closed = logs[5]
    closed.close()
    result = flush_logs(logs, syncfs_min=syncfs_min)
    assert isinstance(result.outcomes[2], StorageError)
    assert isinstance(result.outcomes[5], StorageError)
    assert result.outcomes[:2] == [5, 5] and result.outcomes[3:5] == [5, 6]
    assert logs[2].durable_end_offset == 0
    assert len(result.errors) == 2
    # The failed log's lock was released: it still appends and reads.
    append(logs[2], 1)
    assert read_all_values(logs[2]) == values_for(0, 6)
    for lg in logs[:2] + logs[3:5]:
        lg.close()
    crash(logs[2])


def test_a_log_listed_twice_is_flushed_once(tmp_path: Path) -> None:
    a, b = make_logs(tmp_path, 2)
    append(a, 2)
    append(b, 3)
    result = flush_logs([a, b, a], syncfs_min=0)
    assert result.outcomes == [2, 3, 2]
    assert result.file_synced_logs == 2
    a.close()
    b.close()


@needs_syncfs
def test_what_syncfs_made_durable_survives_a_crash(tmp_path: Path) -> None:
    """The syncfs path records the sync like fdatasync does: a simulated power failure
    keeping nothing unsynced loses nothing the group flush reported durable."""
    logs = make_logs(tmp_path, 4)
    for lg in logs:
        append(lg, 9)
    result = flush_logs(logs, syncfs_min=2)
    assert result.syncfs_calls == 2  # the data and staged checkpoints, then their renames
    for lg in logs:
        append(lg, 4)  # not flushed: lost below
        crash(lg, keep_unflushed=0)
    for i in range(4):
        with Log(str(tmp_path / f"p-{i}"), files=FdCache(4)) as lg:
            assert read_all_values(lg) == values_for(0, 9)


@needs_syncfs
def test_syncfs_keeps_one_directory_descriptor_opened_with_the_first_log(tmp_path: Path) -> None:
    logs = make_logs(tmp_path, 3)
    assert syncfs_module._fds.get(logs[0].device) is not None  # before any write
    for lg in logs:
        append(lg, 1)  # each log's first write opens its segment file (the cache keeps it)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        for lg in logs:
            append(lg, 1)
        flush_logs(logs, syncfs_min=1)
    assert len(os.listdir("/proc/self/fd")) == before
    for lg in logs:
        lg.close()


@needs_syncfs
def test_changed_epoch_checkpoints_cost_no_fsync_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of new leaders each change their epoch checkpoint: with syncfs those
    are staged, synced with the data, renamed and synced once more, not 2 fsyncs each."""
    logs = make_logs(tmp_path, 6)
    flush_logs(logs, syncfs_min=3)
    for lg in logs:
        append(lg, 2)
    calls = record_calls(monkeypatch, os, "fsync")
    result = flush_logs(logs, syncfs_min=3)
    assert (result.syncfs_calls, calls) == (2, [])
    for lg in logs:
        path = os.path.join(lg.directory, "leader-epoch-checkpoint")
        assert open(path).read().split("\n")[1] == "1"  # one epoch entry, on disk
        assert not os.path.exists(path + ".tmp")
        lg.close()


def append_and_flush(lg: Log, batches: int) -> tuple[int, int]:
    """Append ``batches`` batches of 500 records to ``lg`` and flush it alone: (pages of
    its one segment in the page cache, pages of it)."""
    for _ in range(batches):
        append(lg, 500)
    [outcome] = flush_logs([lg]).outcomes
    assert not isinstance(outcome, BaseException)
    [segment] = sorted(Path(lg.directory).glob("*.log"))
    return resident_pages(segment)


@pytest.mark.parametrize("drop", [False, True])
def test_drop_synced_pages_takes_a_flushed_segment_out_of_the_page_cache(
    tmp_path: Path, drop: bool
) -> None:
    """With ``drop_synced_pages`` (serve --page-cache drop) a flush leaves none of what it
    synced in the page cache, so that the memory is reused at once; the records read back
    from the disk the same. Without it the kernel keeps the pages."""
    lg = Log(str(tmp_path / "p"), LogConfig(drop_synced_pages=drop))
    try:
        resident, pages = append_and_flush(lg, 40)
        assert pages > 100
        if drop:
            assert resident <= 1, f"{resident} of {pages} pages still cached"
        else:
            assert resident == pages
        assert read_all_values(lg) == values_for(0, 40 * 500)
    finally:
        lg.close()


def test_a_log_catching_up_drops_what_it_synced_and_keeps_its_pages_once_caught_up(
    tmp_path: Path,
) -> None:
    """A copy a move adds (catching up, as ``PartitionManager.open`` marks it) writes
    history as fast as its leader sends it: each flush drops what it synced from the page
    cache even with ``drop_synced_pages`` off, so that the copy reuses the same memory and
    leaves the node's recent data cached. Once caught up, the log keeps its pages."""
    lg = Log(str(tmp_path / "p"), LogConfig(drop_synced_pages=False))
    try:
        lg.mark_catch_up(CATCH_UP_UNKNOWN)
        resident, copied = append_and_flush(lg, 20)
        assert copied > 50
        assert resident <= 1, f"{resident} of {copied} pages of the copy still cached"
        lg.mark_catch_up(lg.end_offset)  # its leader's end: reached, so caught up
        assert lg.catch_up_offset == -1
        resident, pages = append_and_flush(lg, 20)
        assert resident >= pages - copied - 1, (resident, pages, copied)
        assert read_all_values(lg) == values_for(0, 40 * 500)
    finally:
        lg.close()
