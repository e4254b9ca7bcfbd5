"""Log compaction in the simulator (issue 63): the main partition of some seeds is a
compacted topic. Its records gain keys (``key_of``: from the record id, over a few keys
so that they supersede each other; a share of tombstones, ``is_tombstone``) and their
producers' timestamps (the simulated time each id was made). Each replica cleans its
own log at random points of the run (its own random stream), as the node's cleaner
worker does: the cleanable end from ``compaction.cleanable_end`` on THAT replica's high
watermark (and durable end), last stable offset and segment layout (fixed offset ranges
of ``segment`` offsets; on some seeds in rounds, ``compaction.capped_end``), the
records kept from ``compaction.survivors`` (the product's rules, with the product's
aborted and pinned inputs: its transaction index, control batches and the producer
state's remembered batches), then the memlog rewritten keeping the survivors at their
offsets in the product's batch layout (``MemLog.apply_clean``: sparse batches, the
survivors of consecutive batches merged; counted as ``sparse_batches``). Crashes,
truncations, leader changes and followers fetching across a cleaned leader's gaps, and
reads starting inside a sparse batch's gaps, all go on.

The model: the committed history (``Simulation.committed``) read by a read_committed
reader: per key, its visible records (not transactional, or of a committed
transaction) in offset order. Invariants:

* ``compaction-dropped-latest``: a clean drops only a record superseded by a later
  visible record of its key below the cleanable end, an aborted one, or a tombstone
  older than ``delete.retention.ms`` (by the replica's clock); never a control batch;
* ``compaction-uncommitted``: a clean drops nothing at or above the committed history
  (a record not committed may be truncated, and what it superseded is gone with it);
* ``compaction-renumbered``: after a clean every record the replica holds below its high
  watermark is the committed history's at that offset (no offset renumbered);
* ``compaction-epoch-cache``: a replica's epoch cache below its high watermark is the
  committed history's, cleaned or not (``end_offset_for`` answers as before);
* ``compaction-latest``: for every key whose latest visible record in the whole
  committed history lies below a replica's high watermark (and last stable offset),
  what a read_committed reader of that replica finds there as the key's latest (through
  the replica's own transaction index) is that record, or nothing if it is a tombstone
  (expired and dropped): never an older value, nor an aborted one. (Below a later
  record of the key, a compacted log promises no prefix: Kafka's guarantee is the head's.
  A replica that lagged behind a tombstone until it expired and was cleaned away on the
  leader never gets it, and keeps the value it deleted: delete.retention.ms bounds how
  far a reader, a follower too, may lag, as in Kafka; counted as ``tombstones_missed``.)

A follower whose own clean laid a batch out otherwise, then cut its log inside it (a
damaged batch repaired there), fetches from a leader whose batch holding that offset
starts below it: it takes that batch's records from its end on, as ``storage.Log`` does (it used
to refuse it and fetch it again, stuck: found by a compacted seed). A fetched
batch a follower's log refuses is counted (``follower_misfits``); the compacted seeds'
test holds it at 0.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from quorumlog.replica.storage import compaction

from .memlog import COMMIT, CONTROL, GONE, TXN, MemLog
from .violation import Violation

if TYPE_CHECKING:
    from .cluster import SimNode, Simulation

#: Records carrying a key are the clients' (positive ids); control records have none.
_SPREAD = 2654435761


class SimCleaner:
    """The cleaner the simulator runs: the product's rules. A teeth test subclasses it
    to break one of them (``tests.sim.broken``)."""

    def cleanable_end(
        self,
        log: MemLog,
        bases: list[int],
        max_stamps: list[int],
        high_watermark: int,
        last_stable_offset: int | None,
        now_ms: int,
        lag_ms: int,
    ) -> int:
        # As the storage log's clean_point: never past what is durable.
        return compaction.cleanable_end(
            bases,
            max_stamps,
            high_watermark=min(high_watermark, log.durable_end_offset),
            last_stable_offset=last_stable_offset,
            now_ms=now_ms,
            min_compaction_lag_ms=lag_ms,
        )

    def capped_end(
        self, bases: list[int], sizes: list[int], end: int, cleaned_end: int, cap: int
    ) -> int:
        return compaction.capped_end(bases, sizes, end, cleaned_end, cap)

    def survivors(
        self,
        offsets: pa.Array,
        keys: pa.Array,
        values: pa.Array,
        stamps: pa.Array,
        *,
        end: int,
        now_ms: int,
        retention_ms: int,
        aborted: pa.Array,
        pinned: pa.Array,
    ) -> list[bool]:
        mask = compaction.survivors(
            offsets,
            keys,
            values,
            stamps,
            cleanable_end=end,
            now_ms=now_ms,
            delete_retention_ms=retention_ms,
            aborted=aborted,
            pinned=pinned,
        )
        return [bool(k) for k in mask.to_pylist()]

    def apply(self, log: MemLog, end: int, dropped: Sequence[int]) -> None:
        log.apply_clean(end, dropped)


class SimCompaction:
    def __init__(self, sim: Simulation, cleaner: SimCleaner | None = None) -> None:
        self.sim = sim
        self.cleaner = cleaner or SimCleaner()
        # Its own stream: seeds without compaction run as before.
        self.rng = random.Random(sim.seed * 7919 + 11)
        r = self.rng
        self.keys = r.choice([3, 8, 24])
        self.tombstone_every = r.choice([5, 10, 1000])
        self.segment = r.choice([4, 8, 16])
        self.lag_ms = r.choice([0, 0, 300])
        self.retention_ms = r.choice([200, 1000, 5000])
        self.min_ratio = r.choice([0.0, 0.3])
        self.every_ms = (100, 700)
        # A round's most records not cleaned yet (``compaction.capped_end``, records for
        # bytes): a backlog cleaned in rounds, or all at once.
        self.round_cap = random.Random(sim.seed * 7919 + 12).choice([1 << 30, 1 << 30, 12, 40])
        # (first record id, when) of the ids made since: a record's timestamp.
        self.uid_times: list[tuple[int, int]] = [(0, 0)]
        # The model: per key, the offsets of its visible committed records; whether a
        # committed offset is a tombstone; transactional offsets waiting for a marker.
        self.history: dict[int, list[int]] = {}
        self.visible: set[int] = set()  # offsets
        self.pending: dict[int, list[int]] = {}  # producer id -> offsets
        # Decided transactions in marker order: their marker's offset and first offset.
        self.markers: list[int] = []
        self.firsts: list[int] = []
        self.epoch_starts: list[tuple[int, int]] = []  # (epoch, offset) of the history

    # --- records ------------------------------------------------------------------
    def key_of(self, uid: int) -> int | None:
        return (uid * _SPREAD) % self.keys if uid > 0 else None

    def is_tombstone(self, uid: int) -> bool:
        return uid > 0 and (uid * 40503) % self.tombstone_every == 0

    def before_step(self) -> None:
        """Ids made in the coming step carry its time."""
        uid, now = self.sim.next_uid, self.sim.now
        last = self.uid_times[-1]
        if last[0] == uid:
            self.uid_times[-1] = (uid, now)
        elif last[1] != now:
            self.uid_times.append((uid, now))

    def stamp(self, uid: int) -> int:
        if uid <= 0:
            return 0
        i = bisect_right(self.uid_times, (uid, 1 << 62)) - 1
        return self.uid_times[i][1]

    # --- the model ------------------------------------------------------------------
    def committed(self, offset: int, log: MemLog) -> None:
        """The committed history grew by ``offset`` (read from ``log``)."""
        epoch, uid, base, flags = log.entries[offset]
        if not self.epoch_starts or self.epoch_starts[-1][0] != epoch:
            self.epoch_starts.append((epoch, offset))
        if flags & TXN:
            pid = log.producer_of[base][0][0]
            if not flags & CONTROL:
                self.pending.setdefault(pid, []).append(offset)
                return
            data = self.pending.pop(pid, [])
            if data:
                self.markers.append(offset)
                self.firsts.append(data[0])
            for o in data:
                if flags & COMMIT:
                    self.add_visible(o)
            return
        if uid > 0:
            self.add_visible(offset)

    def add_visible(self, offset: int) -> None:
        uid = self.sim.committed[offset][1]
        key = self.key_of(uid)
        if key is not None:
            insort(self.history.setdefault(key, []), offset)
            self.visible.add(offset)

    def stable(self, top: int) -> int:
        """The last stable offset of a log holding the history below ``top``: below it
        every transaction is decided by a marker below ``top``."""
        firsts = [o[0] for o in self.pending.values() if o]
        firsts += self.firsts[bisect_left(self.markers, top) :]
        return min([top, *firsts])

    def superseded(self, key: int, offset: int, below: int) -> bool:
        """A later visible record of ``key`` below ``below``."""
        offsets = self.history.get(key, [])
        i = bisect_right(offsets, offset)
        return i < len(offsets) and offsets[i] < below

    # --- cleaning -------------------------------------------------------------------
    def step(self) -> None:
        sim = self.sim
        nodes = [n for n in sim.alive_nodes() if n.core is not None]
        if nodes:
            self.clean(self.rng.choice(nodes))
            # And a reader of any replica, cleaned or holding a cleaned leader's gaps.
            self.check_log(self.rng.choice(nodes))

    def clean(self, node: SimNode) -> None:
        sim, log, core = self.sim, node.log, node.core
        assert core is not None
        now = sim.local(node)
        hwm = core.high_watermark
        lso = log.transactions().first_unstable_offset(hwm)
        seg = self.segment
        bases = list(range(0, log.end_offset // seg * seg + 1, seg))
        entries = log.entries
        # A segment's largest timestamp: its last record's (ids grow with time). Only
        # those below the high watermark can be cleanable: the others' are not read.
        stamps_of = [
            self.stamp(max((e[1] for e in entries[b : b + seg]), default=0)) if b < hwm else 0
            for b in bases
        ]
        end = self.cleaner.cleanable_end(log, bases, stamps_of, hwm, lso, now, self.lag_ms)
        if end <= 0:
            return
        if self.round_cap < 1 << 30:
            sizes = [
                sum(1 for e in entries[b : b + seg] if e[2] != GONE) if b < end else 0
                for b in bases
            ]
            end = self.cleaner.capped_end(bases, sizes, end, log.cleaned_end, self.round_cap)
        rows = [o for o in range(min(end, len(entries))) if entries[o][2] != GONE]
        dirty = sum(1 for o in rows if o >= log.cleaned_end)
        if not compaction.should_clean(
            clean_bytes=len(rows) - dirty,
            dirty_bytes=dirty,
            min_cleanable_dirty_ratio=self.min_ratio,
            oldest_dirty_timestamp=-1,
            now_ms=now,
            max_compaction_lag_ms=None,
        ):
            return
        pinned_bases = log.producers.kept_batch_offsets()
        aborted_txns = list(log.transactions().aborted)
        keys: list[int | None] = []
        values: list[bytes | None] = []
        aborted: list[bool] = []
        pinned: list[bool] = []
        for o in rows:
            _, uid, base, flags = entries[o]
            keys.append(self.key_of(uid))
            values.append(None if self.is_tombstone(uid) else b"v")
            pinned.append(bool(flags & CONTROL) or base in pinned_bases)
            aborted.append(_aborted(log, base, flags, aborted_txns))
        keep = self.cleaner.survivors(
            pa.array(rows, pa.int64()),
            pa.array(keys, pa.int64()),
            pa.array(values, pa.binary()),
            pa.array([self.stamp(entries[o][1]) for o in rows], pa.int64()),
            end=end,
            now_ms=now,
            retention_ms=self.retention_ms,
            aborted=pa.array(aborted),
            pinned=pa.array(pinned),
        )
        dropped = [o for o, k in zip(rows, keep, strict=True) if not k]
        self.check_dropped(node, end, dropped, now)
        self.cleaner.apply(log, end, dropped)
        sim.stats["cleans"] = sim.stats.get("cleans", 0) + 1
        sim.stats["cleaned_records"] = sim.stats.get("cleaned_records", 0) + len(dropped)
        self.check_log(node)

    # --- invariants -----------------------------------------------------------------
    def check_dropped(self, node: SimNode, end: int, dropped: list[int], now: int) -> None:
        committed = self.sim.committed
        entries = node.log.entries
        for o in dropped:
            if o >= len(committed):
                raise Violation(
                    "compaction-uncommitted",
                    f"node {node.id} cleaned offset {o}, above the committed history "
                    f"({len(committed)})",
                )
            _, uid, _, flags = entries[o]
            if flags & CONTROL:
                raise Violation(
                    "compaction-dropped-latest", f"node {node.id} dropped a control batch at {o}"
                )
            if committed[o][1] != uid or o not in self.visible:
                continue  # not a visible committed record (an aborted one): log-matching's
            key = self.key_of(uid)
            assert key is not None
            if self.superseded(key, o, end):
                continue
            if self.is_tombstone(uid) and self.stamp(uid) < now - self.retention_ms:
                continue
            raise Violation(
                "compaction-dropped-latest",
                f"node {node.id} cleaning below {end} dropped record {uid} at {o}, the "
                f"latest of key {key} there"
                + (" (a tombstone not yet expired)" if self.is_tombstone(uid) else ""),
            )

    def check_log(self, node: SimNode) -> None:
        """Offsets, the epoch cache and the latest record of each key of ``node``'s log
        below its high watermark (and the model's last stable offset)."""
        sim, log, core = self.sim, node.log, node.core
        if core is None or sim.unclean:
            return
        committed = sim.committed
        top = min(core.high_watermark, len(committed), log.end_offset)
        entries = log.entries
        latest: dict[int, int] = {}
        aborted_txns = list(log.transactions().aborted)
        stable = self.stable(top)
        for o in range(top):
            epoch, uid, base, flags = entries[o]
            if base == GONE:
                continue
            if (epoch, uid) != committed[o]:
                raise Violation(
                    "compaction-renumbered",
                    f"node {node.id} holds {(epoch, uid)} at offset {o}, the committed "
                    f"history {committed[o]}",
                )
            if o >= stable or uid <= 0 or _aborted(log, base, flags, aborted_txns):
                continue
            key = self.key_of(uid)
            if key is not None:
                latest[key] = o
        self.check_epochs(node, top)
        for key, offsets in self.history.items():
            i = bisect_left(offsets, stable)
            if i == 0 or i < len(offsets):
                continue  # no record of the key there, or superseded later: no guarantee
            model, seen = offsets[i - 1], latest.get(key)
            if seen == model or (seen is None and self.is_tombstone(committed[model][1])):
                continue
            if self.is_tombstone(committed[model][1]) and entries[model][:3] == (
                committed[model][0],
                0,
                GONE,
            ):
                # The tombstone expired and was cleaned away on the leader before this
                # replica, lagging behind it, copied it (a gap): the value it deleted
                # stays here. delete.retention.ms is how long a reader (a follower too)
                # may lag behind a tombstone and still see it, as in Kafka.
                sim.stats["tombstones_missed"] = sim.stats.get("tombstones_missed", 0) + 1
                continue
            raise Violation(
                "compaction-latest",
                f"node {node.id}'s latest record of key {key} below {stable} is "
                + (f"at {seen} ({committed[seen][1]})" if seen is not None else "none")
                + f", the history's latest at {model} ({committed[model][1]}"
                + (", a tombstone)" if self.is_tombstone(committed[model][1]) else ")"),
            )

    def check_epochs(self, node: SimNode, top: int) -> None:
        starts = [(e, o) for e, o in node.log.epochs if o < top]
        want = [(e, o) for e, o in self.epoch_starts if o < top]
        if starts != want:
            raise Violation(
                "compaction-epoch-cache",
                f"node {node.id}'s epoch starts below {top} are {starts}, the committed "
                f"history's {want}",
            )

    def final_check(self) -> None:
        stats = self.sim.stats
        for node in self.sim.nodes.values():
            stats["gaps_copied"] = stats.get("gaps_copied", 0) + node.log.gaps_copied
            stats["sparse_batches"] = stats.get("sparse_batches", 0) + node.log.sparse_made
            if node.log.misfits:  # see the module's docstring: a follower left stuck
                stats["follower_misfits"] = stats.get("follower_misfits", 0) + node.log.misfits
            if node.alive:
                self.check_log(node)


def _aborted(log: MemLog, base: int, flags: int, aborted_txns: Sequence[object]) -> bool:
    """As the storage cleaner reads it: a transactional data batch inside an aborted
    transaction of its producer (the log's transaction index)."""
    if not flags & TXN or flags & CONTROL:
        return False
    producer = log.producer_of.get(base)
    if producer is None:
        return False  # no producer known for it: no abort can name it
    pid = producer[0][0]
    return any(
        t.producer_id == pid and t.first_offset <= base < t.last_offset  # type: ignore[attr-defined]
        for t in aborted_txns
    )
