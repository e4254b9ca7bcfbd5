"""The file layer's fault hook (``FaultyFileOps``): faults named in a JSON file a test
rewrites while the log runs; a read the disk fails is answered as damage."""

from __future__ import annotations

import errno
import json
import sys
import time
from pathlib import Path

import pytest
from quorumlog.replica.storage import CorruptDataError, DiskError, Log, LogConfig, fileio
from quorumlog.replica.storage.fileio import FaultyFileOps

from .helpers import client_batch


@pytest.fixture
def faults(tmp_path: Path) -> tuple[FaultyFileOps, Path]:
    path = tmp_path / "faults.json"
    ops = FaultyFileOps(str(path))
    previous = fileio.install(ops)
    try:
        yield ops, path
    finally:
        fileio.install(previous)


def _set(path: Path, rules: list[dict[str, object]]) -> None:
    path.write_text(json.dumps(rules))
    time.sleep(0.03)  # past the hook's 20 ms re-read interval


def test_a_write_fault_is_a_disk_error_and_leaves_nothing_half_written(
    tmp_path: Path, faults: tuple[FaultyFileOps, Path]
) -> None:
    ops, path = faults
    log = Log(str(tmp_path / "log"), LogConfig())
    log.append_as_leader(client_batch(0, 2), 1)
    _set(path, [{"op": "write", "path": "log", "errno": "ENOSPC"}])
    with pytest.raises(DiskError) as info:
        log.append_as_leader(client_batch(2, 2), 1)
    assert info.value.errno == errno.ENOSPC
    assert log.end_offset == 2 and ops.injected == 1
    _set(path, [])
    log.append_as_leader(client_batch(2, 2), 1)
    assert log.flush() == 4
    log.close()


def test_a_read_the_disk_fails_is_damage_at_that_offset(
    tmp_path: Path, faults: tuple[FaultyFileOps, Path]
) -> None:
    _ops, path = faults
    log = Log(str(tmp_path / "log"), LogConfig(), tail=None)
    log.append_as_follower(b"".join(_follower(o) for o in range(0, 6, 2)))
    log.flush()
    _set(path, [{"op": "read", "path": ".log", "errno": "EIO"}])
    with pytest.raises(CorruptDataError) as info:
        log.read(2, 1 << 20)
    assert info.value.offset == 2 and "failed the read" in str(info.value)
    _set(path, [])
    assert log.read(2, 1 << 20)
    log.close()


def test_a_slow_sync_waits_and_other_paths_are_untouched(
    tmp_path: Path, faults: tuple[FaultyFileOps, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ops, path = faults
    slept: list[float] = []  # what the file layer waited, each wait still taken
    sleep = time.sleep

    def spied_sleep(seconds: float) -> None:
        if sys._getframe(1).f_globals.get("__name__") == fileio.__name__:
            slept.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(fileio.time, "sleep", spied_sleep)
    log = Log(str(tmp_path / "lagging"), LogConfig())
    other = Log(str(tmp_path / "quick"), LogConfig())
    _set(path, [{"op": "sync", "path": "lagging", "delay": 0.3}])
    log.append_as_leader(client_batch(0, 1), 1)
    other.append_as_leader(client_batch(0, 1), 1)
    other.flush()
    assert ops.delayed == [] and slept == []
    log.flush()
    assert slept and all(s == 0.3 for s in slept)
    assert len(ops.delayed) == len(slept) and all("lagging" in p for p in ops.delayed)
    _set(path, [])
    log.close()
    other.close()


def _follower(base: int) -> bytes:
    from .helpers import follower_batch

    return follower_batch(base, 2, 1)
