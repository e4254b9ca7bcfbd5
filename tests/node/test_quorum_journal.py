"""The partition manager keeps every hosted replica's election state in the node's one
quorum journal: one fsync per Ready, replicas found again from it at restart, and data
directories of the previous version (a quorum-state file per replica) migrated."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from quorumlog.replica.driver import Driver, Limits, Ready
from quorumlog.replica.node.datadir import DataDir
from quorumlog.replica.node.metadata import MetadataState, TopicAssignment
from quorumlog.replica.node.partitions import PartitionManager
from quorumlog.replica.raft import ElectionState, QuorumConfig
from quorumlog.replica.storage import (
    QUORUM_JOURNAL_FILE,
    QUORUM_STATE_FILE,
    LogConfig,
    QuorumJournal,
    QuorumState,
    QuorumStateStore,
)

from tests.storage.helpers import follower_batch
from tests.support.spies import record_calls

VOTERS = (1, 2, 3)


def manager(path: Path) -> PartitionManager:
    driver = Driver(1, "c", QuorumConfig(), Limits(1 << 20, 5000), random.Random(1))

    def execute(ready: Ready) -> None:
        pm.persist_all(ready.persist)

    pm = PartitionManager(1, DataDir(path, "c", 1), LogConfig(), driver, execute, lambda: 0)
    return pm


def election_state(pm: PartitionManager, key: tuple[str, int]) -> ElectionState:
    p = pm.driver.get(key)
    assert p is not None
    return p.core.election_state


def write_one(pm: PartitionManager, key: tuple[str, int]) -> None:
    """A record in the replica's log, which makes its directory."""
    pm.files[key].log.append_as_follower(follower_batch(0, 1, 1))


def old_layout(path: Path, states: dict[tuple[str, int], QuorumState]) -> None:
    """A data directory as the previous version left it: one quorum-state file per
    replica, no journal."""
    for (topic, partition), state in states.items():
        QuorumStateStore(str(path / f"{topic}-{partition}")).write(state)


def test_a_data_directory_of_the_previous_version_is_read_then_migrated(tmp_path: Path) -> None:
    old_layout(
        tmp_path,
        {
            ("t", 0): QuorumState(7, 2, 2, VOTERS),
            ("t", 1): QuorumState(4, -1, 1, VOTERS),
            ("u", 0): QuorumState(2, 1, 1, ()),  # no voters recorded: metadata reopens it
        },
    )
    pm = manager(tmp_path)
    pm.reopen_local()
    assert sorted(pm.files) == [("t", 0), ("t", 1)]
    assert election_state(pm, ("t", 0)) == ElectionState(7, 2, 2)
    assert election_state(pm, ("t", 1)) == ElectionState(4, None, 1)

    pm.persist_all([(("t", 0), ElectionState(8, None, 1))])
    assert not (tmp_path / "t-0" / QUORUM_STATE_FILE).exists()  # moved to the journal
    assert (tmp_path / "t-1" / QUORUM_STATE_FILE).exists()  # not written yet: stays
    pm.close_all()

    pm = manager(tmp_path)
    pm.reopen_local()
    assert sorted(pm.files) == [("t", 0), ("t", 1)]
    assert election_state(pm, ("t", 0)) == ElectionState(8, None, 1)
    assert election_state(pm, ("t", 1)) == ElectionState(4, None, 1)
    pm.close_all()


def test_the_journal_wins_over_a_file_left_by_a_crash_during_migration(tmp_path: Path) -> None:
    old_layout(tmp_path, {("t", 0): QuorumState(3, -1, 3, VOTERS)})
    j = QuorumJournal(str(tmp_path))
    j.write(("t", 0), QuorumState(5, 2, 2, VOTERS))  # durable; the crash came before unlink
    j.close()
    pm = manager(tmp_path)
    pm.reopen_local()
    assert election_state(pm, ("t", 0)) == ElectionState(5, 2, 2)
    assert not (tmp_path / "t-0" / QUORUM_STATE_FILE).exists()
    pm.close_all()


def test_one_fsync_per_ready_however_many_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pm = manager(tmp_path)
    keys = [("t", p) for p in range(100)]
    for key in keys:
        pm.open(key[0], key[1], list(VOTERS))
        write_one(pm, key)  # a directory: reopened at restart (see the test below)
    calls = record_calls(monkeypatch, os, "fsync", "fdatasync")
    pm.persist_all([(key, ElectionState(3, None, 2)) for key in keys])
    assert len(calls) == 1
    monkeypatch.undo()
    pm.close_all()
    pm = manager(tmp_path)
    pm.reopen_local()
    assert sorted(pm.files) == keys
    assert {election_state(pm, key) for key in keys} == {ElectionState(3, None, 2)}
    assert [p.name for p in tmp_path.glob(f"*/{QUORUM_STATE_FILE}")] == []
    pm.close_all()


def test_a_deleted_topics_states_are_forgotten(tmp_path: Path) -> None:
    pm = manager(tmp_path)
    for p in range(3):
        pm.open("gone", p, list(VOTERS))
        write_one(pm, ("gone", p))
    pm.open("kept", 0, list(VOTERS))
    write_one(pm, ("kept", 0))
    pm.persist_all([(("gone", p), ElectionState(2, None, 1)) for p in range(3)])
    pm.persist_all([(("kept", 0), ElectionState(2, None, 1))])
    pm.reconcile(
        MetadataState(topics={"kept": TopicAssignment("kept", [list(VOTERS)])}, deleted={"gone"})
    )
    assert sorted(pm.files) == [("kept", 0)]
    assert sorted(pm.journal.states()) == [("kept", 0)]
    assert not (tmp_path / "gone-0").exists()
    pm.close_all()
    pm = manager(tmp_path)
    pm.reopen_local()
    assert sorted(pm.files) == [("kept", 0)]
    pm.close_all()


def test_a_state_whose_directory_is_gone_is_not_reopened_but_kept(tmp_path: Path) -> None:
    """No directory: removed by hand, a deletion cut short, or a replica never written.
    Metadata decides whether it comes back, and it comes back with its vote."""
    j = QuorumJournal(str(tmp_path))
    j.write(("t", 0), QuorumState(6, -1, 2, VOTERS))
    j.close()
    pm = manager(tmp_path)
    pm.reopen_local()
    assert pm.files == {}
    # Metadata assigns it again: it comes back remembering its vote.
    pm.open("t", 0, list(VOTERS))
    assert election_state(pm, ("t", 0)) == ElectionState(6, None, 2)
    pm.close_all()
    assert (tmp_path / QUORUM_JOURNAL_FILE).exists()


def test_opening_a_new_replica_leaves_nothing_on_disk_until_it_is_written(
    tmp_path: Path,
) -> None:
    """Thousands of idle replicas cost no directory each (only the journal holds their
    votes); a record makes the directory."""
    pm = manager(tmp_path)
    pm.open("t", 0, list(VOTERS))
    assert not (tmp_path / "t-0").exists()
    pm.persist_all([(("t", 0), ElectionState(1, 2, 2))])
    assert not (tmp_path / "t-0").exists()
    write_one(pm, ("t", 0))
    assert (tmp_path / "t-0").is_dir()
    pm.close_all()
