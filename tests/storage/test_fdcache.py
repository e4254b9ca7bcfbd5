"""The node-wide segment file-descriptor cache: bounded, safe under a concurrent flush
thread, syncing dirty files it closes, and invisible to what a log reads back."""

from __future__ import annotations

import errno
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorumlog.replica.storage import FdCache, Log, LogConfig, StorageError, fdcache, flush_logs

from tests.support.spies import record_calls

from .helpers import client_batch, read_all_values, values_for


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs when there is one: thousands of logs cost thousands of
    fsyncs to create and close, and what is tested here does not depend on the disk."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="fdcache-", dir="/dev/shm"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def append(lg: Log, count: int) -> None:
    lg.append_as_leader(client_batch(lg.end_offset, count), 1)


def two_logs(tmp_path: Path) -> tuple[FdCache, Log, Log]:
    """Logs ``a`` and ``b`` sharing a cache of one descriptor: using one evicts the other's."""
    cache = FdCache(1)
    return cache, Log(str(tmp_path / "a"), files=cache), Log(str(tmp_path / "b"), files=cache)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_thousands_of_logs_stay_within_the_cap(fast_dir: Path) -> None:
    cap = 64
    cache = FdCache(cap)
    before = open_fds()
    # Small segments: some logs roll, so sealed segments are read back too.
    config = LogConfig(segment_bytes=4096)
    logs = [Log(str(fast_dir / f"p-{i}"), config, files=cache) for i in range(3000)]
    # One more descriptor than the cap while a victim is being closed, plus the
    # transient ones of checkpoint writes and the syncfs directory descriptor.
    bound = before + cap + 4
    assert open_fds() <= bound
    rng = random.Random(14)
    for step in range(3000):
        lg = logs[rng.randrange(len(logs))]
        op = rng.random()
        if op < 0.5:
            append(lg, rng.randint(1, 20))
        elif op < 0.75:
            assert read_all_values(lg) == values_for(0, lg.end_offset)
        elif op < 0.9:
            assert lg.flush() == lg.end_offset
        else:
            group = rng.sample(logs, 40)
            result = flush_logs(group)
            assert result.outcomes == [g.end_offset for g in group]
        if step % 97 == 0:
            assert open_fds() <= bound
    assert open_fds() <= bound
    stats = cache.stats()
    assert stats["peak_open_files"] <= cap + 1
    assert stats["evictions"] > 1000  # logs not written yet hold no descriptor
    for lg in logs:
        assert read_all_values(lg) == values_for(0, lg.end_offset)
    ends = [lg.end_offset for lg in logs]
    for lg in logs:
        lg.close()
    assert cache.open_files == 0
    assert open_fds() <= before + 1  # the syncfs directory descriptor, kept for good
    # Everything appended, through descriptors opened and closed many times, is there.
    for i in rng.sample(range(len(logs)), 200):
        with Log(str(fast_dir / f"p-{i}"), config, files=cache) as lg:
            assert lg.end_offset == ends[i]
            assert read_all_values(lg) == values_for(0, ends[i])


def test_reopened_descriptor_appends_at_the_end(tmp_path: Path) -> None:
    cache, a, b = two_logs(tmp_path)
    append(a, 5)
    append(b, 3)  # evicts a's descriptor
    append(a, 7)  # reopened (O_APPEND): lands after the first batch
    append(b, 2)
    assert read_all_values(a) == values_for(0, 12)
    assert read_all_values(b) == values_for(0, 5)
    a.close()
    b.close()
    with Log(str(tmp_path / "a"), files=cache) as a2:
        assert read_all_values(a2) == values_for(0, 12)
    assert cache.open_files == 0


def test_a_dirty_descriptor_is_synced_before_eviction_and_a_clean_one_costs_no_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, a, b = two_logs(tmp_path)
    append(a, 4)
    syncs = record_calls(monkeypatch, os, "fdatasync")
    append(b, 2)  # evicts a's unsynced descriptor: synced first
    assert len(syncs) == 1
    assert cache.eviction_syncs == 1
    assert a.flush() == 4  # already synced by the eviction: no second fdatasync
    assert len(syncs) == 1
    assert b.flush() == 2
    assert len(syncs) == 2
    assert b.flush() == 2  # nothing new: no sync
    assert len(syncs) == 2
    a.close()
    b.close()


def test_a_failed_eviction_sync_fails_that_logs_flushes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, a, b = two_logs(tmp_path)
    append(a, 4)
    real = os.fdatasync

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "injected writeback error")

    monkeypatch.setattr(os, "fdatasync", eio)
    append(b, 1)  # evicts a's dirty descriptor; its sync fails
    monkeypatch.setattr(os, "fdatasync", real)
    assert cache.eviction_syncs == 1
    with pytest.raises(StorageError, match="earlier sync failed"):
        a.flush()
    assert a.durable_end_offset == 0  # never claimed
    assert b.flush() == 1
    result = flush_logs([a, b], syncfs_min=1)  # syncfs succeeds, but a's failure stands
    assert isinstance(result.outcomes[0], StorageError)
    assert result.outcomes[1] == 1
    assert a.durable_end_offset == 0
    # Appends still work (reads too): only durability is refused.
    append(a, 1)
    assert read_all_values(a) == values_for(0, 5)
    b.close()
    with pytest.raises(StorageError):
        a.close()  # close flushes first


def test_a_pinned_descriptor_is_never_closed_under_its_user(tmp_path: Path) -> None:
    cache = FdCache(1)
    first = tmp_path / "first"
    second = tmp_path / "second"
    first.write_bytes(b"first file")
    second.write_bytes(b"second file")
    h1 = cache.handle(str(first))
    h2 = cache.handle(str(second))
    with cache.pin(h1) as fd1:
        # Every descriptor is pinned: the cache goes over its cap instead of closing one.
        with cache.pin(h2) as fd2:
            assert cache.open_files == 2
            assert os.pread(fd1, 5, 0) == b"first"
            assert os.pread(fd2, 6, 0) == b"second"
        assert cache.open_files == 1  # back under the cap once h2 is idle
        cache.release(h1)  # released while pinned: closed when the pin ends
        assert os.pread(fd1, 5, 0) == b"first"
    assert cache.open_files == 0
    with pytest.raises(OSError):
        os.fstat(fd1)
    with pytest.raises(StorageError, match="closed"):
        with cache.pin(h1):
            pass


def test_capacity_is_at_most_a_quarter_of_the_soft_nofile_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fdcache, "nofile_limit", lambda: 1024)
    assert FdCache(512).capacity == 256
    assert FdCache(100).capacity == 100
    monkeypatch.setattr(fdcache, "nofile_limit", lambda: None)
    assert FdCache(512).capacity == 512
    assert FdCache(0).capacity == 1


def test_no_descriptor_outlives_close_truncation_or_retention(tmp_path: Path) -> None:
    cache = FdCache(8)
    config = LogConfig(segment_bytes=2048, retention_bytes=4096)
    lg = Log(str(tmp_path / "p"), config, files=cache)
    for _ in range(40):
        append(lg, 10)
    lg.flush()
    assert len(lg.segment_base_offsets) > 4
    assert lg.apply_retention() > 0
    lg.truncate_to(lg.end_offset - 15)
    lg.truncate_to(lg.start_offset - 1 if lg.start_offset else 0)
    append(lg, 3)
    lg.close()
    assert cache.open_files == 0


def test_concurrent_flush_thread_with_a_tiny_cap(tmp_path: Path) -> None:
    """A worker thread flushes (one log, and groups) while the owner thread appends and
    reads with 2 descriptors for 6 logs: no EBADF, no read or fsync through a number
    reused for another file, every durable end exact, every log reads back whole."""
    cache = FdCache(2)
    config = LogConfig(segment_bytes=8192)
    logs = [Log(str(tmp_path / f"p-{i}"), config, files=cache) for i in range(6)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        rng = random.Random(1)
        try:
            while not stop.is_set():
                if rng.random() < 0.5:
                    lg = rng.choice(logs)
                    before = lg.end_offset
                    durable = lg.flush()
                    assert before <= durable <= lg.end_offset
                else:
                    group = rng.sample(logs, 3)
                    befores = [g.end_offset for g in group]
                    result = flush_logs(group, syncfs_min=rng.choice([0, 1, 3]))
                    for before, outcome, g in zip(befores, result.outcomes, group, strict=True):
                        assert isinstance(outcome, int), outcome
                        assert before <= outcome <= g.end_offset
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=flusher)
    thread.start()
    rng = random.Random(2)
    try:
        for _ in range(1500):
            lg = rng.choice(logs)
            if rng.random() < 0.6:
                append(lg, rng.randint(1, 30))
            else:
                offset = rng.randrange(lg.end_offset + 1)
                data = lg.read(offset, rng.randint(1, 4096))
                if offset < lg.end_offset:
                    assert data  # at least one batch, CRC-checked by read
            if errors:
                break
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[0]
    assert cache.eviction_syncs > 0 or cache.evictions > 0
    for lg in logs:
        assert read_all_values(lg) == values_for(0, lg.end_offset)
        assert lg.flush() == lg.end_offset
        lg.close()
    assert cache.open_files == 0


def test_eviction_takes_the_least_recently_used_idle_and_prefers_a_clean_one(
    tmp_path: Path,
) -> None:
    cache = FdCache(2)
    paths = []
    for name in "abcd":
        path = tmp_path / name
        path.write_bytes(name.encode())
        paths.append(str(path))
    a, b, c, d = (cache.handle(p) for p in paths)
    for h in (a, b, a):
        with cache.pin(h):
            pass
    with cache.pin(c):  # b is the least recently used: closed
        pass
    assert (a.is_open, b.is_open, c.is_open) == (True, False, True)
    with cache.pin(a, write=True) as fd:
        os.write(fd, b"!")
    with cache.pin(c):  # now a (dirty) is the least recently used
        pass
    with cache.pin(d):  # ... but clean c goes first: no sync on this thread
        pass
    assert (a.is_open, c.is_open, d.is_open) == (True, False, True)
    assert cache.eviction_syncs == 0
    cache.sync(a)  # a use too: d is now the least recently used
    with cache.pin(b):
        pass
    assert (a.is_open, b.is_open, d.is_open) == (True, True, False)
    assert cache.eviction_syncs == 0
    for h in (a, b, c, d):
        cache.release(h)
    assert cache.open_files == 0


def test_a_failed_flush_sync_is_never_retried_into_durability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsyncgate: after a failed fdatasync the kernel may have dropped the dirty pages
    and a retry may succeed over the hole, so nothing written before the failure is ever
    reported durable, however often the flush is tried again."""
    cache, a, b = two_logs(tmp_path)
    append(a, 3)
    real = os.fdatasync

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "injected writeback error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(StorageError, match="fdatasync failed"):
        a.flush()
    monkeypatch.setattr(os, "fdatasync", real)
    for _ in range(3):
        with pytest.raises(StorageError, match="earlier sync failed"):
            a.flush()
    assert a.durable_end_offset == 0
    append(b, 2)
    assert b.flush() == 2  # the other log's durability is unaffected
    b.close()
    with pytest.raises(StorageError):
        a.close()
