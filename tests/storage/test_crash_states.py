"""The crash-state explorer (tests/storage/crash_explorer.py) as a test: a bounded sweep
that must find no violation, and teeth tests that break recovery or the writers on
purpose and must be caught. ``make crash-sweep`` runs the deep sweep."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorumlog.replica.storage import Log, LogConfig, encode_batch, fileio, fileutil
from quorumlog.replica.storage import log as log_module
from quorumlog.replica.storage.errors import CorruptLogError

from .crash_explorer import SweepResult, sweep
from .crashfs import RecordingFileOps, Shadow, materialize

STATES = int(os.environ.get("QUORUMLOG_CRASH_STATES", "1500"))


def test_bounded_sweep_finds_no_violation(capsys: pytest.CaptureFixture[str]) -> None:
    result = sweep(STATES, first_seed=1, steps=30, per_point=10, recover_twice=40)
    with capsys.disabled():
        print(
            f"\ncrash-state sweep: {result.workloads} workloads, {result.points} crash "
            f"points, {result.states} crash states, {len(result.violations)} violations"
        )
    assert not result.violations, "\n".join(str(v) for v in result.violations)
    assert result.states >= STATES


def test_bounded_cleaner_sweep_finds_no_violation(capsys: pytest.CaptureFixture[str]) -> None:
    """Compaction's rewrite and swap (tests/storage/crash_cleaner.py)."""
    result = sweep(
        STATES, first_seed=2, steps=14, per_point=3, recover_twice=40, workload="cleaner"
    )
    with capsys.disabled():
        print(
            f"\ncleaner crash-state sweep: {result.workloads} workloads, {result.states} crash "
            f"states, {len(result.violations)} violations"
        )
    assert not result.violations, "\n".join(str(v) for v in result.violations)
    assert result.states >= STATES


def test_teeth_a_recovery_that_undoes_a_committed_swap_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recovery that deletes a swap's cleaned files and manifest instead of finishing it:
    a crash part-way through the renames leaves some groups cleaned and others not, and a
    dropped tombstone's key comes back with a value from an uncleaned segment."""
    from quorumlog.replica.storage import cleaner, log_recovery

    def rollback_only(directory: str) -> None:
        for name in os.listdir(directory):
            if name.endswith(cleaner.CLEANED_SUFFIX) or name == cleaner.SWAP_FILE:
                fileio.unlink(os.path.join(directory, name))

    monkeypatch.setattr(log_recovery, "recover_swap", rollback_only)
    result = sweep(6000, first_seed=1, steps=30, per_point=10, workload="cleaner")
    assert result.violations, f"not caught in {result.states} crash states"


def test_a_voters_checkpoint_whose_segment_a_crash_undid_is_dropped() -> None:
    """Pinned from the deep sweep (seed 17): a voter-set record appended to a new log's
    first segment, the voters checkpoint written (before the record, as it always is)
    and fsync'd, then a power loss before the segment's creation was durable. Recovery
    found no segment and kept the checkpoint: voters the log does not hold."""
    result = sweep(50, first_seed=17, steps=30, per_point=12)
    assert not result.violations, "\n".join(str(v) for v in result.violations)


def _caught(budget: int) -> SweepResult:
    """The sweep stops at its first violation."""
    return sweep(budget, first_seed=1, steps=30, per_point=10)


def test_teeth_recovery_that_keeps_segments_after_a_gap_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recovery that skips cutting the log where a later segment outlived an earlier
    one's unflushed tail (it keeps the later segments) serves a log with a hole."""
    monkeypatch.setattr(log_module.Log, "_breaks_before", lambda self, seg, nxt: False)
    result = _caught(4000)
    assert result.violations, f"not caught in {result.states} crash states"


def test_teeth_a_rename_not_made_durable_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small-file writer that trusts its rename without fsyncing the directory: a
    lowered recovery point (or a journal compaction) can come back as the old file after
    a power loss, and recovery then refuses a state it should take, or loses states."""

    def unsynced_atomic_write(path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        fd = fileio.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fileutil.write_all(fd, data)
            fileio.fsync(fd)
        finally:
            fileio.close(fd)
        fileio.replace(tmp, path)  # no directory fsync

    for module in _users_of_atomic_write():
        monkeypatch.setattr(module, "atomic_write", unsynced_atomic_write)
    result = _caught(4000)
    assert result.violations, f"not caught in {result.states} crash states"


def _users_of_atomic_write() -> Iterator[object]:
    from quorumlog.replica.storage import (
        epoch_cache,
        log_files,
        log_flush,
        quorum_journal,
        segment,
    )

    for module in (
        fileutil,
        log_module,
        log_files,
        log_flush,
        epoch_cache,
        quorum_journal,
        segment,
    ):
        if hasattr(module, "atomic_write"):
            yield module


def test_shadow_drops_unsynced_writes_and_undoes_unsynced_renames(tmp_path: Path) -> None:
    """The model itself: a crash keeps what was fsync'd, and may lose what was not."""
    root = tmp_path / "root"
    root.mkdir()
    rec = RecordingFileOps(str(root))
    previous = fileio.install(rec)
    try:
        fileutil.atomic_write(str(root / "a"), b"one")  # durable: fsync + dir fsync
        fd = fileio.open_file(str(root / "a.tmp"), os.O_WRONLY | os.O_CREAT, 0o644)
        fileutil.write_all(fd, b"two")
        fileio.fsync(fd)
        fileio.close(fd)
        fileio.replace(str(root / "a.tmp"), str(root / "a"))  # not durable yet
    finally:
        fileio.install(previous)
    shadow = Shadow(str(root))
    for op in rec.ops:
        shadow.apply(op)
    contents = {
        tree.get("a") for _d, tree in shadow.crash_states(random.Random(1), 50) if "a" in tree
    }
    assert contents == {b"one", b"two"}
    shadow.apply(("fsync_dir", str(root)))
    final = [tree for _d, tree in shadow.crash_states(random.Random(1), 50)]
    assert final == [{"a": b"two"}]


def test_recovery_cuts_at_a_gap_past_the_recovery_point_and_refuses_one_below(
    tmp_path: Path,
) -> None:
    """The rule the explorer exercises, stated directly: segments written since the last
    flush may reach the disk in any order, so past the recovery point a short segment
    followed by a later one is a crash's leftover (cut there); below it, it is damage."""
    config = LogConfig(segment_bytes=1, segment_ms=None)
    directory = str(tmp_path / "log")
    log = Log(directory, config)
    for i in range(4):
        log.append_as_leader(encode_batch([b"v%d" % i]), 0)
    log.flush()  # rolls make the recovery point 4
    for i in range(4, 8):
        log.append_as_leader(encode_batch([b"v%d" % i]), 0)
    for seg in log._segments:
        seg.close()
    os.truncate(os.path.join(directory, f"{5:020d}.log"), 0)  # lost its unflushed batch
    recovered = Log(directory, config)
    assert recovered.end_offset == 5
    assert recovered.segment_base_offsets == [0, 1, 2, 3, 4, 5]
    assert not os.path.exists(os.path.join(directory, f"{6:020d}.log"))
    recovered.close()
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, "log")
        shutil.copytree(directory, copy)
        os.unlink(os.path.join(copy, f"{2:020d}.log"))  # fsync'd data gone: damage
        os.unlink(os.path.join(copy, ".clean-shutdown"))
        with pytest.raises(CorruptLogError, match="below the recovery point"):
            Log(copy, config)


def test_materialize_writes_directories_and_files(tmp_path: Path) -> None:
    materialize({"d/": b"", "d/f": b"x", "g": b""}, str(tmp_path))
    assert (tmp_path / "d" / "f").read_bytes() == b"x"
    assert (tmp_path / "g").read_bytes() == b""
