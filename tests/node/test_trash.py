"""A replica's directory is deleted in the background: renamed into the data directory's
``.trash`` at once (its name free again), its files unlinked by a thread of their own, so
a large replica's deletion never holds the node's event loop; what a crash leaves in the
trash is deleted when the node starts again."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest
from quorumlog.replica.driver import Driver, Limits, Ready
from quorumlog.replica.node import datadir as datadir_module
from quorumlog.replica.node.datadir import TRASH_DIR, DataDir
from quorumlog.replica.node.metadata import MetadataState
from quorumlog.replica.node.partitions import PartitionManager
from quorumlog.replica.raft import QuorumConfig
from quorumlog.replica.storage import LogConfig
from quorumlog.replica.storage.records import encode_batch

WAIT_S = 10.0


class HeldRmtree:
    """``shutil.rmtree`` as the trash calls it, recording the thread and path of each
    call, and holding every call until ``release`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        real = datadir_module.shutil.rmtree

        def rmtree(path: object, *args: object, **kwargs: object) -> None:
            self.calls.append((threading.current_thread().name, Path(str(path)).name))
            self.started.set()
            assert self.release.wait(WAIT_S)
            real(path)  # type: ignore[arg-type]

        monkeypatch.setattr(datadir_module.shutil, "rmtree", rmtree)


def make_replica_dir(path: Path, files: int = 3) -> Path:
    path.mkdir(parents=True)
    for i in range(files):
        (path / f"{i:020d}.log").write_bytes(b"x" * 4096)
    return path


def trash_entries(root: Path) -> list[str]:
    trash = root / TRASH_DIR
    return sorted(p.name for p in trash.iterdir()) if trash.is_dir() else []


def test_a_discarded_directory_is_gone_at_once_and_deleted_by_the_trash_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldRmtree(monkeypatch)
    dd = DataDir(tmp_path, "c", 1)
    victim = make_replica_dir(tmp_path / "t-0")
    dd.discard(victim)  # returns while the deletion is held
    assert not victim.exists()
    assert held.started.wait(WAIT_S)
    [(thread, name)] = held.calls
    assert thread == "trash" and name.startswith("t-0.")
    make_replica_dir(tmp_path / "t-0")  # the name is free at once (a replica made anew)
    held.release.set()
    assert dd.trash.wait(WAIT_S)
    assert trash_entries(tmp_path) == []
    assert (tmp_path / "t-0").is_dir() and dd.trash.deleted == 1


def test_what_is_put_while_a_pass_runs_is_deleted_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldRmtree(monkeypatch)
    dd = DataDir(tmp_path, "c", 1)
    dd.discard(make_replica_dir(tmp_path / "a-0"))
    assert held.started.wait(WAIT_S)  # the first pass listed the trash: a-0 only
    dd.discard(make_replica_dir(tmp_path / "b-0"))
    held.release.set()
    assert dd.trash.wait(WAIT_S)
    assert trash_entries(tmp_path) == []
    assert sorted(name.split(".")[0] for _thread, name in held.calls) == ["a-0", "b-0"]


def test_a_deletion_cut_short_is_finished_when_the_node_starts(tmp_path: Path) -> None:
    # A crash after the rename, before the trash thread unlinked everything.
    make_replica_dir(tmp_path / TRASH_DIR / "t-3.0123456789ab")
    make_replica_dir(tmp_path / "t-4")
    dd = DataDir(tmp_path, "c", 1)
    dd.lock()
    try:
        assert dd.trash.wait(WAIT_S)
        assert trash_entries(tmp_path) == []
        assert (tmp_path / "t-4").is_dir()  # a replica's directory is left alone
    finally:
        dd.unlock()


def test_a_deleted_topics_replicas_are_unlinked_off_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition manager (which runs on the node's event loop) deletes a replica
    through the trash: its directory is gone when ``reconcile`` returns, and the files
    are unlinked by the trash thread."""
    held = HeldRmtree(monkeypatch)
    driver = Driver(1, "c", QuorumConfig(), Limits(1 << 20, 5000), random.Random(1))

    def execute(ready: Ready) -> None:
        pm.persist_all(ready.persist)

    pm = PartitionManager(1, DataDir(tmp_path, "c", 1), LogConfig(), driver, execute, lambda: 0)
    pm.open("gone", 0, [1, 2, 3])
    pm.files[("gone", 0)].log.append_as_leader(encode_batch([b"v"] * 10), 1)
    pm.reconcile(MetadataState(topics={}, deleted={"gone"}))
    assert not (tmp_path / "gone-0").exists() and pm.files == {}
    assert held.started.wait(WAIT_S)
    assert [thread for thread, _name in held.calls] == ["trash"]
    held.release.set()
    assert pm.datadir.trash.wait(WAIT_S)
    assert trash_entries(tmp_path) == []
    pm.close_all()


def test_a_segment_retention_deletes_is_freed_by_the_trash_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention runs on the node's event loop (``Maintenance``): it unlinks a segment
    there, but the close that frees the file's pages (60-70 ms for 256 MiB cached) runs
    on the trash thread."""
    closes: list[tuple[str, int]] = []  # (thread, links left) of every close
    real_close = os.close

    def close(fd: int) -> None:
        try:
            links = os.fstat(fd).st_nlink
        except OSError:
            links = -1
        closes.append((threading.current_thread().name, links))
        real_close(fd)

    driver = Driver(1, "c", QuorumConfig(), Limits(1 << 20, 5000), random.Random(1))

    def execute(ready: Ready) -> None:
        pm.persist_all(ready.persist)

    config = LogConfig(segment_bytes=3000, retention_bytes=3000)
    pm = PartitionManager(1, DataDir(tmp_path, "c", 1), config, driver, execute, lambda: 0)
    pm.open("t", 0, [1])
    lg = pm.files[("t", 0)].log
    for _ in range(12):
        lg.append_as_leader(encode_batch([b"v" * 1000]), 1)
    monkeypatch.setattr(os, "close", close)
    deleted = lg.apply_retention()
    assert deleted > 0
    assert pm.datadir.trash.wait(WAIT_S)
    monkeypatch.undo()
    freed = [thread for thread, links in closes if links == 0]
    assert freed == ["trash"] * deleted
    pm.close_all()
