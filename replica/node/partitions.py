"""The partition manager: the files of the replicas this node hosts (their logs, and the
node's one quorum-state journal holding every replica's election state), opened and closed
as the metadata log assigns them, and handed to the driver."""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import or_unknown
from ..driver import Driver, PartitionKey, Ready
from ..raft import ElectionState
from ..storage import (
    CATCH_UP_UNKNOWN,
    Log,
    LogConfig,
    QuorumJournal,
    QuorumState,
    QuorumStateStore,
)
from ..storage.errors import DiskError, StorageError
from .datadir import DataDir
from .diskspace import DiskSpace
from .metadata import METADATA_TOPIC, MetadataState
from .topic_configs import log_config_for

log = logging.getLogger(__name__)

# Replicas opened (or deleted) per slice of a topic change at most, their first steps
# executed together (one journal write for their first election states); and the time a
# slice may take, after which the event loop runs its other work (heartbeats, fetches,
# requests) before the next. A topic of 10,000 partitions opens in 100 slices or more.
# A slice's turn of the loop is its opens, then its journal write (one fdatasync) and
# first sends: with 250 replicas and 30 ms a slice, that turn took 50-70 ms and a client's
# Metadata answer waited for one or two of them (p99 170-230 ms while a topic of 10,000
# was created); with 100 and 10 ms, p99 98-140 ms, and the topic led as soon.
OPEN_CHUNK = 100
SLICE_BUDGET_S = 0.01
# After a slice, the task waits this many times as long as the slice took: the opens
# take at most half of the loop's time, and the work they bring (the new replicas'
# elections, their peers' frames) comes at half the pace. Back to back, they kept three
# nodes on two cores busy throughout a create, every turn of the loop long (a Metadata
# answer's p50 60 ms, p99 170 ms while topics of 10,000 were created); paced, p50 12 ms,
# p99 47-60 ms, a topic led in 4.7-6.2 s instead of 4.2-4.9.
SLICE_PAUSE_RATIO = 1.0


class WallClockLog(Log):
    """The core is handed monotonic time; control batches get wall-clock timestamps.
    Appends are refused while the node's data disk is full (``DiskSpace``), and a write
    that finds it full tells the node."""

    def __init__(self, *args: Any, space: DiskSpace | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.space = space

    def append_control(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> Any:
        return self._guarded(
            super().append_control, epoch, leader_id, voters, int(time.time() * 1000)
        )

    def append_voters(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> Any:
        return self._guarded(
            super().append_voters, epoch, leader_id, voters, int(time.time() * 1000)
        )

    def append_as_leader(self, records: bytes, epoch: int) -> Any:
        return self._guarded(super().append_as_leader, records, epoch)

    def append_as_follower(self, batches: bytes) -> Any:
        return self._guarded(super().append_as_follower, batches)

    def _guarded(self, append: Callable[..., Any], *args: Any) -> Any:
        space = self.space
        if space is None:
            return append(*args)
        space.check_write(self.directory)
        try:
            return append(*args)
        except DiskError as exc:
            space.saw(exc)
            raise


@dataclass
class Files:
    """One hosted replica's files."""

    directory: Path
    log: Log
    voters: list[int]
    # The replica's quorum-state file of a previous version, until its state is in the
    # journal.
    legacy: QuorumStateStore | None = None


class PartitionManager:
    def __init__(
        self,
        node_id: int,
        datadir: DataDir,
        log_config: LogConfig,
        driver: Driver,
        execute: Callable[[Ready], None],
        now_ms: Callable[[], int],
        space: DiskSpace | None = None,
        settle_gc: Callable[[], None] | None = None,
    ) -> None:
        self.node_id = node_id
        #: Called once thousands of replicas were opened (their objects live as long as
        #: the replicas): the node takes them out of the collector's scans.
        self.settle_gc = settle_gc
        self.space = space
        self.datadir = datadir
        self.log_config = log_config
        self.driver = driver
        self.execute = execute
        self.now_ms = now_ms
        self.files: dict[PartitionKey, Files] = {}
        self._metadata: MetadataState | None = None
        #: The storage settings of topics that set some of their own (retention.ms, ...).
        self._topic_log_configs: dict[str, LogConfig] = {}
        self._journal: QuorumJournal | None = None
        #: The partitions of each topic open here: a topic's change looks at its own.
        self._by_topic: dict[str, set[int]] = {}
        #: Topics whose replicas here may have to open or go, in the order they changed
        #: (a dict as an ordered set); ``_reconciler`` works through them.
        self._changed: dict[str, None] = {}
        self._reconciler: asyncio.Task[None] | None = None
        #: What the changes cost: partitions looked at, slices run, the largest slice.
        self.examined = 0
        self.slices = 0
        self.slice_max = 0

    def __iter__(self) -> Iterator[tuple[PartitionKey, Files]]:
        return iter(list(self.files.items()))

    @property
    def journal(self) -> QuorumJournal:
        """The election states of every replica here, opened (replayed) on first use,
        which is after the node has locked its data directory."""
        if self._journal is None:
            self._journal = QuorumJournal(str(self.datadir.path))
        return self._journal

    def persist_all(self, items: Sequence[tuple[PartitionKey, ElectionState]]) -> None:
        """Make the election states of one Ready durable with one fsync, before anything
        of that Ready is sent. Replicas migrated from per-replica files lose theirs then."""
        writes = [
            (key, _to_quorum_state(state, f.voters))
            for key, state in items
            if (f := self.files.get(key)) is not None
        ]
        if not writes:
            return
        try:
            self.journal.write_many(writes)
        except OSError as exc:
            if self.space is None or exc.errno != errno.ENOSPC:
                raise
            self.space.saw(exc)  # releases the reserve: the journal has room again
            self.journal.write_many(writes)
        for key, _ in writes:
            f = self.files.get(key)
            if f is not None and f.legacy is not None:
                f.legacy.remove()
                f.legacy = None

    def open(
        self, topic: str, partition: int, voters: list[int], ready: Ready | None = None
    ) -> None:
        """Open one replica; its first driver step goes into ``ready`` when given (many
        opened at once are executed together: one journal write), else is executed."""
        d = self._directory((topic, partition))
        # repair=True: damage recovery finds mid-log is cut, with the catch-up mark, and
        # re-fetched from the leader (see RaftReplica.on_corruption), not fatal.
        lg = WallClockLog(
            str(d),
            self.log_config_of(topic),
            repair=True,
            space=self.space,
            close_deleted=self.datadir.trash.close_later,
        )
        fresh = not lg.existed
        if fresh and (self.datadir.catch_up_pending or self.node_id not in voters):
            # This node's directory replaced a lost one that may have held this replica;
            # or a move adds it (an observer), and this node may have held a copy it
            # deleted once removed, which a stale voter still counts as a voter: either
            # way no vote until it is durably past the leader's end at its first answer.
            lg.mark_catch_up(CATCH_UP_UNKNOWN)
        key = (topic, partition)
        state = self.journal.get(key)
        # A previous version kept the state in a file in the replica's directory (so
        # there is none without a directory).
        old = None if fresh else QuorumStateStore(str(d))
        legacy: QuorumStateStore | None = None
        if old is not None and state is None:
            # A data directory of a previous version: the state stays in the replica's own
            # file until its next write, which moves it to the journal.
            state = old.read()
            legacy = old if state is not None else None
        elif old is not None and old.exists():
            old.remove()  # moved to the journal, and a crash came before the removal
        self.files[key] = Files(d, lg, voters, legacy)
        self._by_topic.setdefault(topic, set()).add(partition)
        step = self.driver.open(key, voters, lg, _to_election_state(state), self.now_ms())
        if ready is None:
            self.execute(step)
        else:
            ready.merge(step)
        log.log(
            logging.INFO if ready is None else logging.DEBUG,
            "opened replica %s/%d (replicas %s, log end %d)",
            topic,
            partition,
            voters,
            lg.end_offset,
        )

    def _forget(self, key: PartitionKey) -> Files | None:
        """The driver closes the replica and this node stops hosting it: its files, still
        open, for the caller to close."""
        self.execute(self.driver.close(key))
        f = self.files.pop(key, None)
        hosted = self._by_topic.get(key[0])
        if hosted is not None:
            hosted.discard(key[1])
            if not hosted:
                del self._by_topic[key[0]]
        return f

    def close(self, key: PartitionKey) -> Files | None:
        f = self._forget(key)
        if f is not None:
            try:
                f.log.close()
            except StorageError:
                log.exception("closing %s/%d", *key)
        return f

    def close_all(self) -> None:
        if self._reconciler is not None:
            self._reconciler.cancel()
            self._reconciler = None
        for key, _ in self:
            self.close(key)
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def reopen_local(self) -> None:
        """Reopen the partition replicas this node holds on disk, with the voters their
        quorum state recorded (in the journal, or in a previous version's per-replica
        file), so a restarted node rejoins its quorums at once instead of waiting for the
        metadata log to be re-applied."""
        directories: dict[PartitionKey, Path] = {}
        for d in self.datadir.path.iterdir():
            topic, sep, part = d.name.rpartition("-")
            if sep and part.isdigit() and d.is_dir():
                directories[(topic, int(part))] = d
        found: dict[PartitionKey, list[int]] = {}
        for key, state in self.journal.states().items():
            # A replica's directory gone (removed by hand, or a deletion cut short before
            # its state was forgotten): metadata decides whether it comes back.
            if state.voters and key in directories:
                found[key] = list(state.voters)
        for key, d in directories.items():
            if key in self.journal or key in self.files:
                continue
            try:
                old = QuorumStateStore(str(d)).read()
            except StorageError:
                log.exception("cannot read the quorum state of %s; waiting for metadata", d)
                continue
            if old is not None and old.voters:
                found[key] = list(old.voters)
        self._open_many([(k, found[k]) for k in sorted(found) if k[0] != METADATA_TOPIC])

    def _open_many(self, items: list[tuple[PartitionKey, list[int]]]) -> None:
        """Open these replicas not open yet, executing their first steps together per
        chunk (at start, or without an event loop: at once)."""
        todo = [(k, reps) for k, reps in items if k not in self.files]
        t0 = time.monotonic()
        for start in range(0, len(todo), OPEN_CHUNK):
            self._open_slice(todo[start : start + OPEN_CHUNK], deadline=None)
        if len(todo) > 1:
            log.info("opened %d replicas in %.2f s", len(todo), time.monotonic() - t0)
        if len(todo) > OPEN_CHUNK and self.settle_gc is not None:
            self.settle_gc()

    def _open_slice(
        self, items: Sequence[tuple[PartitionKey, list[int]]], deadline: float | None
    ) -> int:
        """Open replicas of ``items`` in order, until all are or ``deadline`` (monotonic)
        passed, their first steps executed together: how many of ``items`` were done."""
        ready = Ready()
        done = 0
        for key, reps in items:
            if key not in self.files:
                self.open(key[0], key[1], reps, ready)
            done += 1
            if deadline is not None and time.monotonic() >= deadline:
                break
        self.execute(ready)
        self._count_slice(done)
        return done

    def _count_slice(self, size: int) -> None:
        self.slices += 1
        self.slice_max = max(self.slice_max, size)

    def log_config_of(self, topic: str) -> LogConfig:
        """The storage settings ``topic``'s replicas run with: the node's, with what the
        topic sets itself."""
        return self._topic_log_configs.get(topic, self.log_config)

    def compacted(self) -> list[tuple[PartitionKey, Files]]:
        """The replicas here of compacted topics (the log cleaner's candidates), found
        topic by topic: a node holding 100,000 replicas of topics that do not compact
        looks at none of them (a look at every replica each second cost an idle node
        ~8% of a core)."""
        found: list[tuple[PartitionKey, Files]] = []
        for topic, hosted in self._by_topic.items():
            if topic == METADATA_TOPIC or not self.log_config_of(topic).compacted:
                continue
            for partition in hosted:
                f = self.files.get((topic, partition))
                if f is not None:
                    found.append(((topic, partition), f))
        return found

    @property
    def any_retention(self) -> bool:
        """Whether any replica here may have something for retention to delete."""
        return any(
            c.retention_bytes is not None or c.retention_ms is not None
            for c in (self.log_config, *self._topic_log_configs.values())
        )

    def _apply_topic_configs(self, metadata: MetadataState) -> None:
        """Topics' configs changed (or are first known): their open replicas take them."""
        configs = {
            t.name: log_config_for(self.log_config, t.configs)
            for t in metadata.topics.values()
            if t.configs
        }
        before = self._topic_log_configs
        if configs == before:
            return
        self._topic_log_configs = configs
        for topic in configs.keys() | before.keys():
            wanted = configs.get(topic, self.log_config)
            if wanted == before.get(topic, self.log_config):
                continue
            for partition in self._by_topic.get(topic, ()):
                f = self.files[(topic, partition)]
                if f.log.config != wanted:
                    f.log.config = wanted

    def reconcile(self, metadata: MetadataState, topics: Collection[str] | None = None) -> None:
        """Open the replicas the metadata assigns here (with their topic's configs); delete
        those of deleted topics. ``topics``: the topics that changed since the last call
        (None: every topic, and every deleted one), the only ones looked at, so that a
        change costs what it changes, not what the cluster holds.

        Small changes are done here. On the event loop, a big one (more than
        ``OPEN_CHUNK`` replicas of a topic to open or delete) is done by a task, a slice
        at a time (``OPEN_CHUNK`` replicas, ``SLICE_BUDGET_S``), the loop's other work
        running between slices: a topic of 10,000 partitions never holds heartbeats,
        fetches or Metadata answers back for long. Without a loop (tests, tools) all of
        it is done here."""
        self._metadata = metadata
        self._apply_topic_configs(metadata)
        names = (
            [*metadata.topics, *sorted(metadata.deleted - metadata.topics.keys())]
            if topics is None
            else topics
        )
        for name in names:
            if name != METADATA_TOPIC:
                self._changed[name] = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._reconciler is not None and not self._reconciler.done():
            return  # it takes the changes in their turn
        deadline = time.monotonic() + SLICE_BUDGET_S
        while self._changed and (loop is None or time.monotonic() < deadline):
            name = next(iter(self._changed))
            deletes, opens, targets = self._plan(name, metadata)
            if loop is not None and max(len(deletes), len(opens)) > OPEN_CHUNK:
                break  # for the task, which plans it again
            del self._changed[name]
            self._delete(deletes, "its topic was deleted")
            self._open_many(opens)
            self._set_targets(targets)
        if self._changed and loop is not None:
            self._reconciler = loop.create_task(self._reconcile_changes())

    def _plan(
        self, name: str, metadata: MetadataState
    ) -> tuple[
        list[PartitionKey],
        list[tuple[PartitionKey, list[int]]],
        list[tuple[PartitionKey, list[int]]],
    ]:
        """What topic ``name``'s change asks of this node: the replicas to delete (its
        topic deleted), those to open (with their voters), and the targets of those
        moving (set once they are open)."""
        t = metadata.topics.get(name)
        hosted = self._by_topic.get(name, set())
        if t is None:
            self.examined += len(hosted)
            gone = name in metadata.deleted
            return ([(name, p) for p in sorted(hosted)] if gone else []), [], []
        self.examined += len(t.replicas)
        opens: list[tuple[PartitionKey, list[int]]] = []
        targets: list[tuple[PartitionKey, list[int]]] = []
        for p, reps in enumerate(t.replicas):
            key = (name, p)
            if p in t.previous:
                if self.node_id not in t.hosts(p) or not self._keeps(key, reps):
                    continue
                targets.append((key, reps))
                if p not in hosted:
                    opens.append((key, t.voters(p)))
            elif self.node_id in reps and p not in hosted:
                opens.append((key, reps))
        return [], opens, targets

    def _set_targets(self, targets: list[tuple[PartitionKey, list[int]]]) -> None:
        now = self.now_ms()
        for key, reps in targets:
            self.driver.set_target(key, reps, now)

    async def _reconcile_changes(self) -> None:
        """The changed topics, one at a time in the order they changed, a slice per turn
        of the event loop, each followed by a pause as long as itself
        (``SLICE_PAUSE_RATIO``). A topic that changes again while its slices run is planned
        anew (from the metadata as it is then) when its turn comes again."""
        while self._changed and self._metadata is not None:
            name = next(iter(self._changed))
            del self._changed[name]
            try:
                await self._reconcile_topic(name, self._metadata)
            except (StorageError, OSError):
                log.exception("opening or deleting the replicas of topic %s", name)

    async def _reconcile_topic(self, name: str, metadata: MetadataState) -> None:
        deletes, opens, targets = self._plan(name, metadata)
        done = 0
        while done < len(deletes) and name not in self._changed:
            part = deletes[done : done + OPEN_CHUNK]
            await self._delete_slice(part)
            done += len(part)
        done = 0
        while done < len(opens) and name not in self._changed:
            began = time.monotonic()
            done += self._open_slice(opens[done : done + OPEN_CHUNK], began + SLICE_BUDGET_S)
            await asyncio.sleep((time.monotonic() - began) * SLICE_PAUSE_RATIO)
        if name not in self._changed:
            self._set_targets(targets)
        if len(opens) > 1:
            log.info("opened %d replicas of topic %s", done, name)
        if done > OPEN_CHUNK and self.settle_gc is not None:
            self.settle_gc()

    async def _delete_slice(self, keys: list[PartitionKey]) -> None:
        """Delete these replicas (their topic was deleted), the files' closing and the
        directories' renaming into the trash in a worker thread: closing a log that was
        written syncs its index and markers, many fsyncs for thousands of replicas. Their
        election states are forgotten after, as ``_delete`` does."""
        closed = []
        for key in keys:
            f = self._forget(key)
            if f is not None:
                closed.append(f)
        await asyncio.get_running_loop().run_in_executor(None, self._discard, closed)
        self.journal.forget_many(keys)
        self._count_slice(len(keys))
        log.info("deleted %d replica(s) of topic %s: it was deleted", len(keys), keys[0][0])

    def _discard(self, closed: list[Files]) -> None:
        for f in closed:
            try:
                f.log.close()
            except StorageError:
                log.exception("closing %s", f.directory)
            self.datadir.discard(Path(f.directory))

    def _delete(self, keys: list[PartitionKey], why: str) -> None:
        """Close these replicas and delete their directories (renamed into the trash,
        their files unlinked in the background: ``DataDir.discard``), then forget their
        election states (after the directories: a crash in between leaves states without
        a directory, which reopen_local skips)."""
        for key in keys:
            f = self.close(key)
            if f is not None:
                self.datadir.discard(Path(f.directory))
            log.info("deleted replica %s/%d: %s", *key, why)
        self.journal.forget_many(keys)

    def _directory(self, key: PartitionKey) -> Path:
        return self.datadir.path / f"{key[0]}-{key[1]}"

    def _keeps(self, key: PartitionKey, replicas: list[int]) -> bool:
        """A replica a move takes off this node is kept while it is open or its files
        are here (it may still be a voter); never made anew (an empty replica that took
        itself for a voter could help elect a leader without the committed data)."""
        if self.node_id in replicas or key in self.files:
            return True
        return self._directory(key).is_dir()

    def drop_removed(self) -> list[PartitionKey]:
        """Close and delete the replicas a move took off this node once their removal
        from the voters is committed (they are observers then, and nobody needs their
        data); returns them."""
        metadata = self._metadata
        if metadata is None:
            return []
        dropped: list[PartitionKey] = []
        for t in metadata.topics.values():
            for p in t.previous:
                key = (t.name, p)
                if key not in self.files or self.node_id in t.replicas[p]:
                    continue
                d = self.driver.get(key)
                # Not a voter, nor one that may still be needed (``electable``).
                if d is not None and d.log.voters is not None and not d.core.electable:
                    dropped.append(key)
        self._delete(dropped, "moved off this node")
        return dropped


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
