"""The partition manager: the files of the replicas this node hosts (log, quorum-state),
opened and closed as the metadata log assigns them, and handed to the driver."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import or_unknown
from ..driver import Driver, PartitionKey, Ready
from ..raft import ElectionState
from ..storage import CATCH_UP_UNKNOWN, Log, LogConfig, QuorumState, QuorumStateStore
from ..storage.errors import StorageError
from .datadir import DataDir
from .metadata import METADATA_TOPIC, MetadataState

log = logging.getLogger(__name__)


class WallClockLog(Log):
    """The core is handed monotonic time; control batches get wall-clock timestamps."""

    def append_control(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> Any:
        return super().append_control(epoch, leader_id, voters, int(time.time() * 1000))


@dataclass
class Files:
    """One hosted replica's files."""

    directory: Path
    log: Log
    store: QuorumStateStore
    voters: list[int]


class PartitionManager:
    def __init__(
        self,
        node_id: int,
        datadir: DataDir,
        log_config: LogConfig,
        driver: Driver,
        execute: Callable[[Ready], None],
        now_ms: Callable[[], int],
    ) -> None:
        self.node_id = node_id
        self.datadir = datadir
        self.log_config = log_config
        self.driver = driver
        self.execute = execute
        self.now_ms = now_ms
        self.files: dict[PartitionKey, Files] = {}

    def __iter__(self) -> Iterator[tuple[PartitionKey, Files]]:
        return iter(list(self.files.items()))

    def persist(self, key: PartitionKey, state: ElectionState) -> None:
        f = self.files.get(key)
        if f is not None:
            f.store.write(_to_quorum_state(state, f.voters))

    def open(self, topic: str, partition: int, voters: list[int]) -> None:
        d = self.datadir.path / f"{topic}-{partition}"
        fresh = not d.exists()
        # repair=True: damage recovery finds mid-log is cut, with the catch-up mark, and
        # re-fetched from the leader (see RaftReplica.on_corruption), not fatal.
        lg = WallClockLog(str(d), self.log_config, repair=True)
        if fresh and self.datadir.catch_up_pending:
            # This node's directory replaced a lost one that may have held this replica.
            lg.mark_catch_up(CATCH_UP_UNKNOWN)
        store = QuorumStateStore(str(d))
        key = (topic, partition)
        self.files[key] = Files(d, lg, store, voters)
        self.execute(
            self.driver.open(key, voters, lg, _to_election_state(store.read()), self.now_ms())
        )
        log.info(
            "opened replica %s/%d (replicas %s, log end %d)",
            topic,
            partition,
            voters,
            lg.end_offset,
        )

    def close(self, key: PartitionKey) -> Files | None:
        self.execute(self.driver.close(key))
        f = self.files.pop(key, None)
        if f is not None:
            try:
                f.log.close()
            except StorageError:
                log.exception("closing %s/%d", *key)
        return f

    def close_all(self) -> None:
        for key, _ in self:
            self.close(key)

    def reopen_local(self) -> None:
        """Reopen the partition replicas this node holds on disk, with the voters their
        quorum-state recorded, so a restarted node rejoins its quorums at once instead of
        waiting for the metadata log to be re-applied."""
        for d in sorted(self.datadir.path.iterdir()):
            topic, sep, part = d.name.rpartition("-")
            if not sep or not part.isdigit() or topic == METADATA_TOPIC or not d.is_dir():
                continue
            try:
                state = QuorumStateStore(str(d)).read()
            except StorageError:
                log.exception("cannot read the quorum state of %s; waiting for metadata", d)
                continue
            if state is not None and state.voters and (topic, int(part)) not in self.files:
                self.open(topic, int(part), list(state.voters))

    def reconcile(self, metadata: MetadataState) -> None:
        """Open the replicas the metadata assigns here; delete those of deleted topics."""
        wanted: dict[PartitionKey, list[int]] = {}
        for t in metadata.topics.values():
            for p, reps in enumerate(t.replicas):
                if self.node_id in reps:
                    wanted[(t.name, p)] = reps
        for key, reps in wanted.items():
            if key not in self.files:
                self.open(key[0], key[1], reps)
        for key, _ in self:
            if key[0] in metadata.deleted and key not in wanted:
                f = self.close(key)
                if f is not None:
                    shutil.rmtree(f.directory, ignore_errors=True)
                log.info("deleted replica %s/%d", *key)


def _to_quorum_state(s: ElectionState, voters: list[int]) -> QuorumState:
    return QuorumState(
        leader_epoch=s.epoch,
        leader_id=or_unknown(s.leader_id),
        voted_id=or_unknown(s.voted_id),
        voters=tuple(voters),
    )


def _to_election_state(q: QuorumState | None) -> ElectionState | None:
    if q is None:
        return None
    return ElectionState(
        q.leader_epoch,
        None if q.leader_id < 0 else q.leader_id,
        None if q.voted_id < 0 else q.voted_id,
    )
