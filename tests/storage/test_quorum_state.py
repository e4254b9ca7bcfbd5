from __future__ import annotations

from pathlib import Path

import pytest
from quorumlog.replica.storage import CorruptCheckpointError, QuorumState, QuorumStateStore


def test_absent_then_round_trip(tmp_path: Path) -> None:
    store = QuorumStateStore(str(tmp_path))
    assert store.read() is None
    state = QuorumState(
        leader_epoch=4, leader_id=2, voted_id=2, voters=(1, 2, 3), extra={"role": "x"}
    )
    store.write(state)
    assert store.read() == state
    store.write(QuorumState(leader_epoch=5))
    assert store.read() == QuorumState(leader_epoch=5, leader_id=-1, voted_id=-1)
    assert [p.name for p in tmp_path.iterdir()] == ["quorum-state"]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b"[]",
        b'{"version": 1}',
        b'{"version": 1, "leader_epoch": "1", "leader_id": 1, "voted_id": 1}',
        b'{"version": 9}',
        b"\xff\xfe",
    ],
)
def test_corrupt_file_names_it(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "quorum-state").write_bytes(content)
    with pytest.raises(CorruptCheckpointError, match="quorum-state"):
        QuorumStateStore(str(tmp_path)).read()


def test_remove_deletes_the_file_once_migrated(tmp_path: Path) -> None:
    store = QuorumStateStore(str(tmp_path))
    assert not store.exists()
    store.write(QuorumState(leader_epoch=1))
    assert store.exists()
    store.remove()
    assert not store.exists() and store.read() is None
    store.remove()  # already gone: nothing to do
