"""Deterministic simulation of one partition's quorum on N whole simulated nodes: each
runs the nodes' own ``replica.driver.Driver`` (the same rules: persist before send, flush
before a follower fetch, group commit, long-polls, answers at the high watermark) over
an in-memory disk; a lossy network, clients (acks=quorum produces, fenced consumer
fetches) and a fault injector, all driven by one seed. This module only executes what
the driver hands out (``Ready``), as the asyncio node does: it holds no rule of its own.

Invariants, checked after every event:

* ``one-leader-per-epoch``: at most one node is ever leader of a given epoch;
* ``epoch-monotonic``: a node's epoch never decreases (memory and persisted file agree);
* ``hwm-monotonic``: a node's HWM never decreases while it runs;
* ``majority-holds``: every majority of the voters holds (durably) every offset below
  the highest HWM any node has reported;
* ``log-matching``: every node's log below its HWM equals the committed history;
* ``persist-before-send``: after every step a node's durable election state is the one
  it runs (and may have sent messages in); none stands for a fresh replica's (epoch 0,
  no leader, no vote);
* ``acked-lost``: an acknowledged produce is committed at the offsets it was acked at;
* ``duplicate-record``: no record is committed twice, though idempotent producers
  retry every batch (same producer id, epoch and sequence) until it is acknowledged,
  after timeouts and failovers, to whichever node leads then;
* ``idempotent-refused``: the current leader (of the highest epoch yet) never refuses an
  idempotent producer's retry or next batch as out of order (a stale one may: it lacks
  what its successor committed, and the producer retries elsewhere); of a pipelining
  producer, the batch behind an unacknowledged one may be (the leader lacks that one);
* ``producer-gap``: a pipelining producer's batch is never committed before the batch
  ahead of it (a client takes the earlier batch as written when a later one is);
* ``consumer-above-hwm``: a consumer fetch never returns a record at or above the
  answering node's high watermark, nor one the committed history does not hold there;
* ``consumer-fenced``: a consumer fetch naming a leader epoch is served records only by
  the leader of that very epoch;
* transactions (``transactions``, ``txn``): transactional producers write batches in
  transactions that a transaction coordinator ends (``coordinator``: the product's rules
  of ``replica.kafka.txn``, its state in a replicated log of its own beside the main
  partition, its markers through the driver), while coordinators, partition leaders and
  producers are killed at its crucial steps; read_committed consumers fetch too. The
  invariants (``txn_checks``): ``txn-marker-undecided``, ``txn-decision-reversed``,
  ``txn-undecided`` (after the heal, within the transaction timeout and a failover),
  ``consumer-above-lso``, ``txn-uncommitted-visible``, ``txn-committed-hidden``,
  ``lso-monotonic``;
* ``truncated-below-hwm``: a follower never truncates below its HWM;
* ``corrupt-served``: no damaged batch is ever sent, to a follower or to a consumer
  (consumers fetch through the driver, which reports damage it reads to the core);
* ``quiet-silent-leader``: a quiesced follower resumes (fetches, and may stand) within a
  fetch timeout of its leader's node going down or out of its reach;
* ``lone-leader``: a leader that hears from less than a majority of the voters (their
  nodes down, or their messages to it lost: a one-way cut the other way is not seen by
  check-quorum) stops leading within two check-quorum periods, or a fetch
  timeout and one when its voters were quiesced (check-quorum sleeps only while the
  quiesced voters whose nodes it hears make a majority);
* ``quiet-behind``: once faults stop, a quiesced follower is woken within a request
  timeout and a heartbeat when its leader appends records it lacks;
* ``timers-advance``: a driver's tick leaves no partition with a timer still due (a
  timer its core cannot act on would spin the node's loop);
* ``progress``: a run stays within MAX_EVENTS events (no message or timer storm);
* ``liveness``: after faults stop (all nodes up, network healed) a leader commits a new
  client record within ``liveness_bound_ms``.

Requests handed in together (``together``, half the seeds): now and then a client
append hands the node 2-4 produce requests at once, as a node hands its driver a turn of
its loop's appends (``Driver.request_many``, which appends a partition's plain batches as
one): ``acked-lost`` checks each is answered with its own offsets.

Membership changes (``membership`` > 0): a fault now and then moves the partition to new
voters (add an observer, remove a voter, or replace one or two: two or four steps), as
the controller does with every node's driver (``Driver.set_target``); the leader steps
the voter set there one voter at a time, its new replicas copying one at a time. A node
a move adds may learn of it late (``target_lag``): its old copy, removed, follows on
meanwhile, and the node may then delete it as moved off and make it anew.
``majority-holds`` then counts the voter set in force at the committed offset (the
latest committed voter-set record below it), and more hold:

* ``voter-changes-pending``: no log holds more than one voter-set record above the
  committed history;
* ``voter-step``: each committed voter set differs from the one before by one voter;
* ``voters-within-target``: a leader adds a voter only while the voters do not
  outnumber its target: never more than one voter beyond it;
* ``deleted-copy-uncounted``: a node that learns of a move late (``target_lag``) may
  delete its old copy as moved off; no leader counts such a copy for records above its
  high watermark.

Latent corruption (``corruption`` > 0): a fault damages one batch durably held by one
voter; that voter finds it by a scrub a little later, or sooner when it reads it to serve
a fetch, and repairs (``on_corruption``). Until it has caught back up it may lack
acknowledged records: ``majority-holds`` counts it as physically damaged, as a lost disk,
and every other invariant stays on. One damaged replica at a time (a second one, while
the first catches up, can leave no majority able to elect: a real loss of availability).

Log compaction (``compaction``, half the seeds, not with an unclean election): the
partition is a compacted topic whose records carry keys and tombstones, and each replica
cleans its own log at random points with the product's rules (``tests.sim.compaction``,
its invariants ``compaction-*`` there); gaps a clean leaves count as held by
``majority-holds`` and as matching in ``log-matching`` (what a clean may drop is checked
there).

With an injected unclean election (``force_leader``) the data invariants are off and
``truncation-visible`` takes over: a reader positioned after a committed record that a
log no longer holds learns it from that log's ``end_offset_for``.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quorumlog.replica.driver import Driver, Limits, Ready
from quorumlog.replica.protocol import ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import (
    CATCH_UP_UNKNOWN,
    UNCLEAN_EPOCH_GAP,
    ElectionState,
    FetchResponse,
    Message,
    QuorumConfig,
    RaftReplica,
    Role,
)
from quorumlog.replica.raft.state import LeaderState

from .compaction import SimCleaner, SimCompaction
from .coordinator import TXN_KEY, CoordinatorClass, Later, SimCoordinator
from .memlog import (
    TXN as TXN_FLAG,
)
from .memlog import (
    MemLog,
    client_batch,
    decode_batches,
    decode_sim_batches,
    is_voter_record,
    marker_of,
    voter_of,
)
from .txn import SimTxns
from .violation import Violation

CLUSTER_ID = "sim-cluster"
KEY = ("sim", 0)
LIMITS = Limits(max_fetch_bytes=256, produce_timeout_ms=3000)
# Odd seeds run their leaders under a catch-up throttle (2 KiB/s: a 256-byte answer to an
# observer every ~125 ms at most, beside writes of several hundred bytes a second), so
# every invariant is checked while the replicas a membership change adds catch up paced.
# (No invariant says a catch-up ends: tests/driver's throttle tests show that rule.)
THROTTLED_LIMITS = dataclasses.replace(LIMITS, catch_up_bytes_per_s=2048)
# The election state a fresh replica runs, for which nothing is persisted.
FRESH = ElectionState(0)

# Event kinds (ints keep the heap cheap).
(
    DELIVER,
    TICK,
    FLUSH,
    CLIENT,
    FAULT,
    RESTART,
    STOP,
    UNFAULT,
    HEAL,
    SCRUB,
    CONSUME,
    REFUSED,
    IDEMPOTENT,
    PAUSE,
    LEARN,
    TXN,
    COORD,
    CLEAN,
) = range(18)
KIND_NAMES = [
    "deliver",
    "tick",
    "flush",
    "client",
    "fault",
    "restart",
    "stop",
    "unfault",
    "heal",
    "scrub",
    "consume",
    "refused",
    "idempotent",
    "pause",
    "learn",
    "txn",
    "coord",
    "clean",
]
#: An idempotent producer resends a batch left unanswered this long (the node may have
#: died with it): longer than the produce timeout a leader answers within.
RETRY_AFTER_MS = LIMITS.produce_timeout_ms + 500

#: A run's events are bounded by its simulated time; a seed far past this count is a
#: message or timer storm (the busiest seeds run about 11,000).
MAX_EVENTS = 300_000

ReplicaFactory = Callable[..., RaftReplica]
DriverClass = type[Driver]
CleanerClass = type[SimCleaner]


@dataclass
class SimParams:
    voters: int = 3
    observers: int = 0
    fault_ms: int = 8_000
    # After heal: fetch timeout (followers notice a dead leader) + 2 x max election
    # timeout (one split vote) + election back-off max + 1 s of round trips and flushes.
    liveness_bound_ms: int = 6_000
    loss: float = 0.0  # baseline loss during the fault phase
    dup: float = 0.02
    delay_ms: tuple[int, int] = (1, 8)
    fault_every_ms: tuple[int, int] = (300, 1500)
    client_every_ms: tuple[int, int] = (10, 60)
    disk_loss: bool = False
    unclean: bool = False
    corruption: float = 0.0  # chance that a fault damages a batch (3+ voters only)
    # Chance that a fault is a disk fault on one voter: its disk fills (appends refused)
    # or its flushes become slow, for a while.
    disk_faults: float = 0.0
    # Chance that a fault is a reassignment of the partition to a new voter set (one
    # voter added or removed, one or two replaced), where no disk loss, unclean
    # election or corruption runs.
    membership: float = 0.0
    # A copy a move makes anew starts catching up (no vote) as PartitionManager.open
    # marks it; False breaks that on purpose (a teeth test).
    new_copies_catch_up: bool = True
    # Chance that a node a move adds learns of the move late (its view of the
    # controller's records lags the leader's): until then its old copy, removed, still
    # follows as an observer, and then it may delete that copy as moved off
    # (``PartitionManager.drop_removed``, on its own log's view) and make it anew.
    target_lag: float = 0.0
    # Clients pause now and then (before the heal), long enough for the partition to
    # quiesce; then the next record must wake it.
    pauses: bool = False
    # Idle partitions on the same nodes (no clients; their messages share the frames,
    # their quiescence the heartbeats): the invariants watch the main one (``KEY``).
    extra_partitions: int = 0
    # Transactional producers and read_committed consumers (``transactions`` above).
    transactions: bool = False
    # A compacted topic (``compaction``): keyed records, each replica cleaning its log.
    compaction: bool = False
    # Chance that a client append hands the node 2-4 produce requests together, as a
    # node's turn of its event loop hands the driver its appends (``request_many``).
    together: float = 0.0
    # The cleaner's rules (a teeth test breaks one: ``tests.sim.broken``).
    cleaner: CleanerClass = SimCleaner
    config: QuorumConfig = field(default_factory=lambda: QuorumConfig(quiesce=True))

    @classmethod
    def for_seed(cls, seed: int) -> SimParams:
        """Vary the cluster shape and fault mix by seed (its own RNG stream)."""
        r = random.Random(seed * 7919 + 1)
        # Its own stream, so every other choice stays what it was before it existed.
        corruption = random.Random(seed * 7919 + 2).choice([0.0, 0.0, 0.2])
        disk_faults = random.Random(seed * 7919 + 4).choice([0.0, 0.0, 0.25])
        membership = random.Random(seed * 7919 + 5).choice([0.0, 0.0, 0.3])
        target_lag = random.Random(seed * 7919 + 6).choice([0.0, 0.5])
        transactions = random.Random(seed * 7919 + 8).random() < 0.5
        compacted = random.Random(seed * 7919 + 10).random() < 0.5
        together = random.Random(seed * 7919 + 13).choice([0.0, 0.3])
        idle = random.Random(seed * 7919 + 3)
        quiesce, pauses = idle.random() < 0.8, idle.random() < 0.6
        extra = idle.choice([0, 1, 2])
        rebalance = idle.choice([None, 1500, 4000])
        fast = QuorumConfig(
            election_timeout_ms=300,
            fetch_timeout_ms=800,
            election_backoff_max_ms=300,
            request_timeout_ms=300,
            fetch_max_wait_ms=200,
            quiesce=quiesce,
            rebalance_interval_ms=rebalance,
        )
        slow = QuorumConfig(quiesce=quiesce, rebalance_interval_ms=rebalance)
        return cls(
            config=r.choice([slow, slow, fast]),
            voters=r.choice([1, 3, 3, 3, 5, 5]),
            observers=r.choice([0, 0, 1]),
            loss=r.choice([0.0, 0.0, 0.01, 0.05]),
            dup=r.choice([0.0, 0.02, 0.1]),
            delay_ms=r.choice([(1, 5), (1, 20), (5, 60)]),
            disk_loss=r.random() < 0.15,
            unclean=r.random() < 0.05,
            corruption=corruption,
            disk_faults=disk_faults,
            membership=membership,
            target_lag=target_lag,
            pauses=pauses,
            extra_partitions=extra,
            transactions=transactions,
            compaction=compacted,
            together=together,
        )


@dataclass(eq=False)
class SimBatch:
    """One batch of an idempotent producer, until an answer acknowledges it."""

    sequence: int
    ids: list[int]
    token: int | None = None  # its latest send, None once answered with an error
    sent_at: int = 0
    sends: int = 0


@dataclass
class SimProducer:
    """An idempotent producer: it resends each unacknowledged batch (same id, epoch,
    sequence) after an error or a silence until one answer acknowledges it. ``window``:
    its batches in flight at once; a pipelining one (window 2, as librdkafka keeps up to
    5), each batch sent to whichever node it picks, also starts over now and then as a
    new producer id (the first batches of an id are where a new leader knows nothing of
    it)."""

    producer_id: int
    window: int = 1
    next_sequence: int = 0  # of the next new batch
    batches: list[SimBatch] = field(default_factory=list)  # in sequence order
    acked_batches: int = 0


@dataclass
class SimNode:
    id: int
    voter: bool
    log: MemLog = field(default_factory=MemLog)
    driver: Driver | None = None
    persisted: ElectionState | None = None
    alive: bool = False
    incarnation: int = 0
    tick_at: int | None = None
    flush_at: int | None = None
    max_epoch: int = 0
    last_hwm: int = 0
    checked_upto: int = 0
    skew: int = 0
    disk_lost: bool = False
    stopping: bool = False
    # The idle partitions' logs and election states, and the logs a pending flush covers.
    extra_logs: dict[tuple[str, int], MemLog] = field(default_factory=dict)
    extra_persisted: dict[tuple[str, int], ElectionState] = field(default_factory=dict)
    flush_keys: set[tuple[str, int]] = field(default_factory=set)
    # The voters its replica opens with (None: the partition's first ones): a replica a
    # move makes anew opens with the voters before the move, not among them.
    open_voters: tuple[int, ...] | None = None
    # Its voter-set records checked as its own adds while it led: (offset, epoch).
    adds_checked: set[tuple[int, int]] = field(default_factory=set)
    # Disk faults: flushes are slow until then; when its full disk first refused an
    # append; refusals seen; (when, log end) of the oldest flush asked and not done.
    slow_until: int = 0
    refused_at: tuple[int, int] | None = None  # (when, in which epoch it led)
    refusals_seen: int = 0
    flush_asked: tuple[int, int] | None = None
    ahead_since: tuple[tuple[int, int], int] | None = None

    @property
    def core(self) -> RaftReplica | None:
        p = self.driver.get(KEY) if self.driver is not None else None
        return p.core if p is not None else None

    def begin_incarnation(self) -> None:
        """A (re)started process: running, no timer pending, its HWM checks from scratch."""
        self.incarnation += 1
        self.alive, self.stopping = True, False
        self.tick_at = self.flush_at = None
        self.flush_asked = None
        self.last_hwm = self.checked_upto = 0


@dataclass
class SimResult:
    seed: int
    violation: Violation | None
    trace: list[str]
    faults: list[str]
    stats: dict[str, Any]

    def report(self) -> str:
        lines = [f"seed {self.seed}: {self.violation}"]
        lines.append("faults injected:")
        lines += [f"  {f}" for f in self.faults] or ["  (none)"]
        lines.append(f"last {len(self.trace)} events:")
        lines += [f"  {t}" for t in self.trace]
        lines.append(f"replay: make sim SEED={self.seed}")
        return "\n".join(lines)


class Simulation:
    def __init__(
        self,
        seed: int,
        params: SimParams | None = None,
        factory: ReplicaFactory = RaftReplica,
        trace_len: int = 60,
        driver_class: DriverClass = Driver,
        log_factory: Callable[[], MemLog] = MemLog,
        coordinator_class: CoordinatorClass = SimCoordinator,
    ) -> None:
        self.seed = seed
        self.p = params or SimParams.for_seed(seed)
        self.factory = factory
        self.driver_class = driver_class
        self.log_factory = log_factory
        self.rng = random.Random(seed)
        self.now = 0
        self.seq = 0
        self.events: list[tuple[int, int, int, Any]] = []
        self.voter_ids = list(range(1, self.p.voters + 1))
        ids = self.voter_ids + [100 + i for i in range(self.p.observers)]
        self.nodes = {i: SimNode(i, i in self.voter_ids, log_factory()) for i in ids}
        self.blocked: set[tuple[int, int]] = set()
        self.loss = self.p.loss
        self.dup = self.p.dup
        self.committed: list[tuple[int, int]] = []
        self.committed_ids: set[int] = set()
        self.producers = [SimProducer(1000), SimProducer(2000, window=2)]
        # A pipelined batch's first record id -> the record ids of the batch before it.
        self.follows: dict[int, list[int]] = {}
        # Acknowledged records above the committed history known so far: checked when
        # it grows past them.
        self.acked: dict[int, tuple[int, int]] = {}
        # Client requests in flight, by token: what was asked and of which node.
        self.requests: dict[int, tuple[int, int, Any]] = {}
        self.next_token = 1
        self.epoch_leaders: dict[int, int] = {}
        self.next_uid = 1
        self.unclean = False
        self.unclean_snapshot: list[tuple[int, int]] = []
        self.disk_lost_once = False
        self.healed_at: int | None = None
        self.live_at: int | None = None
        self.heal_uid = 0  # records with this id or above were sent after the heal
        self.paused_until = 0  # clients send nothing before this (a quiet spell)
        # Quiesced followers whose leader is out of reach / ahead of them, since when.
        self.quiet_silent: dict[int, int] = {}
        self.lone_since: dict[int, int] = {}  # node -> since when it leads cut off
        self.lone_reach: dict[int, frozenset[int]] = {}  # node -> the voters it heard then
        self.quiet_behind: dict[int, int] = {}
        self.trace: deque[tuple[int, int, Any]] = deque(maxlen=trace_len)
        self.faults: list[str] = []
        self.stats = {"events": 0, "acked": 0, "elections": 0, "messages": 0}
        self.corrupt_on = (
            self.p.corruption > 0
            and len(self.voter_ids) >= 3
            and not self.p.disk_loss
            and not self.p.unclean
        )
        self.membership_on = (
            self.p.membership > 0
            and not self.corrupt_on
            and not self.p.disk_loss
            and not self.p.unclean
        )
        # The voters the partition is being moved to (the controller's target), and the
        # committed voter-set records: (offset, voters).
        self.target: tuple[int, ...] = tuple(self.voter_ids)
        # Nodes that have not learnt the target yet (``target_lag``) -> the target they
        # know, drawn from a stream of their own so that seeds without lag run as before.
        self.lagging: dict[int, tuple[int, ...]] = {}
        self.lag_rng = random.Random(seed * 7919 + 7)
        self.committed_voters: list[tuple[int, tuple[int, ...]]] = []
        # Transactions, on a random stream of their own (seeds without them run as
        # before): producers, and the highest last stable offset reported (epoch, LSO).
        self.txn_rng = random.Random(seed * 7919 + 9)
        self.txns = SimTxns(self, coordinator_class) if self.p.transactions else None
        # Answers read before a damage, by id (kept, so that no other takes the id).
        self.read_before_damage: dict[int, Any] = {}
        # A compacted topic (not with an unclean election: its data invariants are off).
        self.compaction = (
            SimCompaction(self, self.p.cleaner())
            if self.p.compaction and not self.p.unclean
            else None
        )

    # ------------------------------------------------------------------ plumbing

    def push(self, at: int, kind: int, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, data))

    def push_later(self, at: int, later: Later) -> None:
        self.push(at, COORD, later)

    def local(self, node: SimNode) -> int:
        return self.now + node.skew

    def fault(self, text: str) -> None:
        self.faults.append(f"t={self.now} {text}")

    # ------------------------------------------------------------------ run

    def run(self) -> SimResult:
        violation: Violation | None = None
        try:
            for node in self.nodes.values():
                self.start(node)
            self.push(self.rng.randint(*self.p.fault_every_ms), FAULT, None)
            self.push(self.rng.randint(*self.p.client_every_ms), CLIENT, None)
            self.push(self.p.fault_ms, HEAL, None)
            self.push(self.rng.randint(50, 300), CONSUME, None)
            self.push(self.rng.randint(20, 80), IDEMPOTENT, None)
            if self.p.pauses:
                self.push(self.rng.randint(200, 1500), PAUSE, None)
            if self.txns is not None:
                self.push(self.txn_rng.randint(20, 80), TXN, None)
                self.txns.start()
            if self.compaction is not None:
                self.push(self.compaction.rng.randint(*self.compaction.every_ms), CLEAN, None)
            end = self.p.fault_ms + self.p.liveness_bound_ms
            if self.txns is not None:
                end += self.txns.extra_ms  # until the transactions settle
            while self.events:
                at, _, kind, data = heapq.heappop(self.events)
                if at > end:
                    break
                self.now = at
                self.stats["events"] += 1
                if self.stats["events"] > MAX_EVENTS:
                    raise Violation("progress", f"over {MAX_EVENTS} events by t={at} (a storm)")
                self.trace.append((at, kind, data))
                if self.compaction is not None:
                    self.compaction.before_step()
                self.step(kind, data)
                if (
                    self.live_at is not None
                    and self.now > self.live_at + 1000
                    and (self.txns is None or self.txns.settled())
                ):
                    break
            if self.live_at is None:
                raise Violation(
                    "liveness",
                    f"no new record committed within {self.p.liveness_bound_ms} ms "
                    f"after faults stopped at t={self.p.fault_ms}",
                )
            if self.unclean:
                for node in self.nodes.values():
                    self.check_truncation_visible(node)
            if self.txns is not None:
                self.txns.check_undecided(final=True)
            if self.compaction is not None:
                self.compaction.final_check()
        except Violation as v:
            violation = v
        self.stats["committed"] = len(self.committed)
        self.stats["liveness_ms"] = (
            self.live_at - self.p.fault_ms if self.live_at is not None else None
        )
        return SimResult(
            self.seed,
            violation,
            [self.describe_event(*t) for t in self.trace],
            self.faults,
            self.stats,
        )

    def describe_event(self, at: int, kind: int, data: Any) -> str:
        if kind == DELIVER:
            texts = []
            for _, msg in data[0]:
                text = repr(msg)
                if isinstance(msg, FetchResponse) and msg.records:
                    ids = [i for *_, batch in decode_batches(msg.records) for i in batch]
                    text = text.replace(repr(msg.records), f"<ids {ids}>")
                texts.append(text)
            return f"t={at} deliver " + (texts[0] if len(texts) == 1 else f"frame {texts}")
        if kind in (TICK, FLUSH, RESTART, STOP, SCRUB):
            node = self.nodes[data[0]]
            core = node.core
            state = f"{core.state_name} e{core.epoch} hwm{core.high_watermark}" if core else "down"
            return f"t={at} {KIND_NAMES[kind]} node {data[0]} ({state}, leo {node.log.end_offset})"
        return f"t={at} {KIND_NAMES[kind]} {data!r}"

    def step(self, kind: int, data: Any) -> None:
        if kind == DELIVER:
            self.deliver(*data)
        elif kind == TICK:
            node = self.nodes[data[0]]
            if node.driver is not None and node.tick_at == self.now and node.incarnation == data[1]:
                node.tick_at = None
                self.execute(node, node.driver.tick(self.local(node)))
        elif kind == FLUSH:
            node = self.nodes[data[0]]
            if (
                node.driver is not None
                and node.incarnation == data[1]
                and node.flush_at == self.now
            ):
                node.flush_at = None
                node.flush_asked = None
                keys, node.flush_keys = sorted(node.flush_keys), set()
                for key in keys:  # one flush cycle covers every log written (group commit)
                    node.log.flush() if key == KEY else node.extra_logs[key].flush()
                for key in keys:
                    self.execute(node, node.driver.flushed(key, self.local(node)))
        elif kind == CLIENT:
            if self.now >= self.paused_until:
                self.client_append()
            self.push(self.now + self.rng.randint(*self.p.client_every_ms), CLIENT, None)
        elif kind == FAULT:
            if self.now < self.p.fault_ms:
                self.inject_fault()
                self.push(self.now + self.rng.randint(*self.p.fault_every_ms), FAULT, None)
        elif kind == UNFAULT:
            self.unfault(data)
        elif kind == RESTART:
            node = self.nodes[data[0]]
            if not node.alive and node.incarnation == data[1]:
                self.start(node)
        elif kind == STOP:
            node = self.nodes[data[0]]
            if node.alive and node.incarnation == data[1]:
                node.log.flush()  # a graceful stop flushes
                self.stop(node, lose_unflushed=False)
                self.push(
                    self.now + self.rng.randint(100, 2000), RESTART, (node.id, node.incarnation)
                )
        elif kind == HEAL:
            self.heal()
        elif kind == SCRUB:
            self.scrub(self.nodes[data[0]])
        elif kind == REFUSED:
            node, peer = self.nodes[data[0]], self.nodes[data[1]]
            if node.driver is not None and node.incarnation == data[2] and not peer.alive:
                self.stats["refused"] = self.stats.get("refused", 0) + 1
                self.execute(node, node.driver.peer_unreachable(peer.id, self.local(node)))
        elif kind == CONSUME:
            self.consume()
            self.push(self.now + self.rng.randint(50, 300), CONSUME, None)
        elif kind == PAUSE:
            if self.now < self.p.fault_ms:
                self.paused_until = min(self.now + self.rng.randint(400, 2500), self.p.fault_ms)
                self.push(self.paused_until + self.rng.randint(300, 2000), PAUSE, None)
        elif kind == LEARN:
            self.learn_target(*data)
        elif kind == TXN:
            assert self.txns is not None
            self.txns.step()
            self.push(self.now + self.txn_rng.randint(20, 80), TXN, None)
        elif kind == COORD:
            data.fn()
        elif kind == CLEAN:
            assert self.compaction is not None
            self.compaction.step()
            self.push(
                self.now + self.compaction.rng.randint(*self.compaction.every_ms), CLEAN, None
            )
        elif kind == IDEMPOTENT:
            if self.now >= self.paused_until:
                for producer in self.producers:
                    self.idempotent_send(producer)
            self.push(self.now + self.rng.randint(20, 80), IDEMPOTENT, None)
        self.check_global()
        self.check_quiet()
        self.check_lone_leader()

    # ------------------------------------------------------------------ executor

    def start(self, node: SimNode) -> None:
        node.begin_incarnation()
        node.driver = self.driver_class(
            node.id,
            CLUSTER_ID,
            self.p.config,
            THROTTLED_LIMITS if self.seed % 2 else LIMITS,
            random.Random(self.rng.getrandbits(64)),
            self.factory,
        )
        # A peer's change reaches one partition per step, and the idle partitions are
        # opened first: the main one hears it ticks later, as thousands of partitions do
        # on a real node.
        node.driver.news_partitions = 1
        opened = Ready()  # carried out together, as a node does the steps of one turn
        keys = [("idle", i) for i in range(self.p.extra_partitions)]
        for key in keys + ([TXN_KEY] if self.txns is not None else []):
            lg = node.extra_logs.setdefault(key, MemLog())
            persisted = node.extra_persisted.get(key)
            opened.merge(node.driver.open(key, self.voter_ids, lg, persisted, self.local(node)))
        voters = list(node.open_voters or self.voter_ids)
        opened.merge(node.driver.open(KEY, voters, node.log, node.persisted, self.local(node)))
        known = self.lagging.get(node.id, self.target)  # the target this node knows
        if known != tuple(self.voter_ids) or node.id in self.lagging:
            node.driver.set_target(KEY, known, self.local(node))
        self.execute(node, opened)
        for other in self.nodes.values():
            if not other.alive and other is not node:
                self.refuse(node, other)
        if node.disk_lost and node.driver is not None:
            # Told by a peer before anything else; durable in its log from here on.
            node.disk_lost = False
            self.stats["replaced_directories"] = self.stats.get("replaced_directories", 0) + 1
            self.execute(node, node.driver.begin_catch_up(self.local(node)))

    def stop(self, node: SimNode, lose_unflushed: bool) -> None:
        node.alive = False
        node.driver = None  # its clients' requests go unanswered (they time out)
        if lose_unflushed:
            node.log.crash()
            for lg in node.extra_logs.values():
                lg.crash()
        for other in self.nodes.values():
            if other.alive:
                self.refuse(other, node)

    def crash(self, node: SimNode, why: str, restart_in: int) -> None:
        self.fault(f"crash node {node.id}: {why}")
        self.stop(node, lose_unflushed=True)
        self.push(self.now + restart_in, RESTART, (node.id, node.incarnation))

    def refuse(self, node: SimNode, peer: SimNode) -> None:
        """``node``'s link to a stopped ``peer`` finds it refusing connections (as TCP
        does when no process listens), unless the network between them is cut."""
        if (node.id, peer.id) not in self.blocked and (peer.id, node.id) not in self.blocked:
            at = self.now + self.rng.randint(1, 20)
            self.push(at, REFUSED, (node.id, peer.id, node.incarnation))

    def execute(self, node: SimNode, ready: Ready) -> None:
        """Do what the driver asks, in the Ready's order, as the asyncio node does."""
        if node.driver is None:
            return
        for key, state in ready.persist:
            # Durable before any send below.
            if key == KEY:
                node.persisted = state
            else:
                node.extra_persisted[key] = state
        for key in ready.flush:
            node.flush_keys.add(key)
            if key == KEY and node.flush_asked is None:
                node.flush_asked = (self.now, node.log.end_offset)
            if self.now < node.slow_until:
                if node.flush_at is None or node.flush_at < self.now:
                    node.flush_at = self.now + self.rng.randint(1200, 2500)  # a slow disk
                    self.push(node.flush_at, FLUSH, (node.id, node.incarnation))
                continue
            node.flush_at = self.now + self.rng.randint(1, 5)  # an fsync takes a while
            self.push(node.flush_at, FLUSH, (node.id, node.incarnation))
        frames: dict[int, list[tuple[tuple[str, int], Message]]] = {}
        for key, msg in ready.send:
            frames.setdefault(msg.dst, []).append((key, msg))  # type: ignore[arg-type]
        for dst, msgs in frames.items():
            self.send(node, dst, msgs)
        for _, offset in ready.repaired:
            # The log lost data on purpose (damage repaired): restart the HWM checks.
            self.stats["repairs"] = self.stats.get("repairs", 0) + 1
            core = node.core
            node.last_hwm = core.high_watermark if core is not None else 0
            node.checked_upto = min(node.checked_upto, offset)
        for _, offset, committed_lost in ready.truncated:
            if committed_lost and not self.unclean:
                raise Violation("truncated-below-hwm", f"node {node.id} truncated to {offset}")
            if committed_lost:
                self.stats["committed_truncations"] = self.stats.get("committed_truncations", 0) + 1
            if node.log.cleaned_end > 0:  # a clean (or its gaps copied) below the cut
                self.stats["cleaned_truncations"] = self.stats.get("cleaned_truncations", 0) + 1
            node.checked_upto = min(node.checked_upto, offset)
            if self.unclean:
                self.check_truncation_visible(node)
        self.check_node(node)
        if self.txns is not None:
            self.txns.check_state(node)
        for token, resp in ready.answers:
            self.answered(node, token, resp)
        self.schedule(node)

    def schedule(self, node: SimNode) -> None:
        if node.driver is None:
            return
        deadline = node.driver.next_deadline_ms()
        if deadline is not None:
            at = max(self.now + 1, deadline - node.skew)
            if node.tick_at is None or at < node.tick_at or node.tick_at < self.now:
                node.tick_at = at
                self.push(at, TICK, (node.id, node.incarnation))

    def send(self, node: SimNode, dst: int, msgs: list[tuple[tuple[str, int], Message]]) -> None:
        """One frame: what one step of ``node`` sends ``dst`` (as the node batches it).
        Whole frames are lost, duplicated and reordered (each its own delay); parts of a
        frame are lost, and a frame's messages are shuffled, too."""
        for key, msg in msgs:
            if (
                key == KEY
                and isinstance(msg, FetchResponse)
                and msg.records
                and id(msg) not in self.read_before_damage
            ):
                self.check_undamaged(node, msg.records, f"to node {msg.dst}")
            kind = type(msg).__name__
            if kind in ("WakeRequest", "NodeHeartbeat") or getattr(msg, "quiesce", False):
                name = "quiesce" if kind == "FetchResponse" else kind
                self.stats[name] = self.stats.get(name, 0) + 1
        if dst not in self.nodes or (node.id, dst) in self.blocked:
            return
        if self.loss and self.rng.random() < self.loss:
            return
        if len(msgs) > 1:
            self.stats["frames"] = self.stats.get("frames", 0) + 1
            if self.loss:
                msgs = [msg for msg in msgs if self.rng.random() >= self.loss / 2]
            if self.dup and self.rng.random() < self.dup:
                msgs = self.rng.sample(msgs, len(msgs))
        self.stats["messages"] += len(msgs)
        copies = 2 if self.dup and self.rng.random() < self.dup else 1
        for _ in range(copies):
            delay = self.rng.randint(*self.p.delay_ms)
            self.push(self.now + delay, DELIVER, (tuple(msgs), node.incarnation))

    def deliver(self, msgs: tuple[tuple[tuple[str, int], Message], ...], inc: int) -> None:
        if not msgs:
            return
        first = msgs[0][1]
        node = self.nodes[first.dst]
        if node.driver is None or (first.src, node.id) in self.blocked:
            return
        self.execute(node, node.driver.raft_many(list(msgs), self.local(node)))

    # ------------------------------------------------------------------ clients

    def submit(self, node: SimNode, req: Any, what: Any, key: tuple[str, int] = KEY) -> None:
        assert node.driver is not None
        token = self.track(node, what)
        self.execute(node, node.driver.request(token, key, req, self.local(node)))

    def track(self, node: SimNode, what: Any) -> int:
        """A new request's token, its answer awaited from ``node``."""
        token = self.next_token
        self.next_token += 1
        self.requests[token] = (node.id, node.incarnation, what)
        return token

    def pick_producer_target(self) -> SimNode | None:
        """Mostly a leader, now and then a node that is not."""
        alive = [n for n in self.nodes.values() if n.driver is not None]
        leaders = [n for n in alive if n.core and n.core.role is Role.LEADER]
        if not alive or (not leaders and self.rng.random() < 0.9):
            return None
        return self.rng.choice(leaders if leaders and self.rng.random() < 0.9 else alive)

    def new_ids(self) -> list[int]:
        ids = [self.next_uid + i for i in range(self.rng.randint(1, 3))]
        self.next_uid += len(ids)
        return ids

    def produce_request(self, records: bytes) -> m.ProduceRequest:
        return m.ProduceRequest(
            topic=KEY[0],
            partition=KEY[1],
            acks=m.ACKS_QUORUM,
            timeout_ms=LIMITS.produce_timeout_ms,
            records=records,
        )

    def client_append(self) -> None:
        """A producer (acks=quorum) that never retries. With ``together``, now and then several
        requests reach the node at once, as a node's turn of its event loop hands them to the
        driver (``Driver.request_many``: a partition's plain batches appended as one,
        each answered with its own offsets)."""
        node = self.pick_producer_target()
        if node is None:
            return
        if not self.p.together or self.rng.random() >= self.p.together:
            ids = self.new_ids()
            self.submit(node, self.produce_request(client_batch(ids)), ("produce", ids))
            return
        assert node.driver is not None
        items = []
        for _ in range(self.rng.randint(2, 4)):
            ids = self.new_ids()
            token = self.track(node, ("produce", ids))
            items.append((token, KEY, self.produce_request(client_batch(ids))))
        self.stats["produced_together"] = self.stats.get("produced_together", 0) + len(items)
        self.execute(node, node.driver.request_many(items, self.local(node)))

    def idempotent_send(self, producer: SimProducer) -> None:
        """Resend each batch answered with an error or left unanswered too long, then
        send a new one while the window has room."""
        if not producer.batches and producer.window > 1 and producer.acked_batches >= 3:
            producer.producer_id += 1  # start over as a new producer id
            producer.next_sequence = producer.acked_batches = 0
        for batch in producer.batches:
            if batch.token is None or self.now - batch.sent_at >= RETRY_AFTER_MS:
                self.send_batch(producer, batch)
        if len(producer.batches) < producer.window:
            batch = SimBatch(producer.next_sequence, self.new_ids())
            if producer.batches:
                self.follows[batch.ids[0]] = producer.batches[-1].ids
            producer.next_sequence += len(batch.ids)
            producer.batches.append(batch)
            self.send_batch(producer, batch)

    def send_batch(self, producer: SimProducer, batch: SimBatch) -> None:
        node = self.pick_producer_target()
        if node is None:
            return
        if batch.sends:
            self.stats["idempotent_retries"] = self.stats.get("idempotent_retries", 0) + 1
        records = client_batch(batch.ids, (producer.producer_id, 0, batch.sequence))
        batch.token, batch.sent_at = self.next_token, self.now
        batch.sends += 1
        self.submit(node, self.produce_request(records), ("idempotent", (producer, batch)))

    def idempotent_answered(self, node: SimNode, resp: m.ProduceResponse, what: Any) -> None:
        producer, batch = what
        current = node.core is not None and node.core.epoch == max(self.epoch_leaders, default=-1)
        head = bool(producer.batches) and producer.batches[0] is batch
        # A batch behind an unacknowledged one may be refused: the leader may lack that one.
        if (
            resp.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
            and head
            and current
            and not self.unclean
        ):
            raise Violation(
                "idempotent-refused",
                f"producer {producer.producer_id} sequence {batch.sequence}: {resp.error_message}",
            )
        if resp.error == 0:
            self.acknowledged(resp, batch.ids)
        if batch not in producer.batches:
            return  # an answer to an earlier send of a batch acknowledged since
        if resp.error == 0:
            # The batches before it are acknowledged with it, as librdkafka takes them
            # (a log holds a producer's batches without gaps: ``producer-gap``).
            done = producer.batches.index(batch) + 1
            del producer.batches[:done]
            producer.acked_batches += done
        else:
            batch.token = None  # resent at the next round

    def consume(self) -> None:
        """A consumer fetches from any node: at the epoch it knows (now and then a stale
        one, or none), from a committed offset or the HWM (a long-poll)."""
        alive = [n for n in self.nodes.values() if n.driver is not None and n.core is not None]
        if not alive:
            return
        node = self.rng.choice(alive)
        core = node.core
        assert core is not None
        epoch = self.rng.choice([core.epoch, core.epoch, core.epoch, core.epoch - 1, -1])
        offset = self.rng.randint(0, core.high_watermark)
        req = m.FetchRequest(
            topic=KEY[0],
            partition=KEY[1],
            current_leader_epoch=epoch,
            fetch_offset=offset,
            max_wait_ms=self.rng.choice([0, 50, 200]),
            min_bytes=1,
            max_bytes=64,
        )
        if self.txns is not None and self.txn_rng.random() < 0.5:
            req = dataclasses.replace(req, isolation_level=m.READ_COMMITTED)
        self.submit(node, req, ("consume", req))

    def answered(self, node: SimNode, token: int, resp: Any) -> None:
        asked = self.requests.pop(token, None)
        if asked is None:
            return
        node_id, incarnation, (kind, what) = asked
        assert node_id == node.id and incarnation == node.incarnation, (asked, node.id)
        if kind == "idempotent":
            self.idempotent_answered(node, resp, what)
            return
        if kind in ("txn-batch", "txn-marker", "txn-state"):
            assert self.txns is not None
            self.txns.answered(node, kind, resp, what)
            return
        if resp.error != 0:
            return
        if kind == "produce":
            self.acknowledged(resp, what)
        else:
            self.served(node, what, resp)

    def acknowledged(self, resp: m.ProduceResponse, ids: list[int]) -> None:
        offsets = range(resp.base_offset, resp.last_offset + 1)
        if len(offsets) != len(ids):
            raise Violation(
                "acked-lost",
                f"records {ids} acked at offsets {resp.base_offset}-{resp.last_offset}",
            )
        for off, uid in zip(offsets, ids, strict=True):
            rec = (resp.leader_epoch, uid)
            self.stats["acked"] += 1
            if off < len(self.committed):
                if not self.unclean and self.committed[off] != rec:
                    raise Violation(
                        "acked-lost",
                        f"record {uid} acked at offset {off} epoch {resp.leader_epoch}, "
                        f"committed history has {self.committed[off]}",
                    )
            else:
                self.acked[off] = rec
            if self.live_at is None and self.healed_at is not None and uid >= self.heal_uid:
                self.live_at = self.now

    def served(self, node: SimNode, req: m.FetchRequest, resp: m.FetchResponse) -> None:
        self.stats["fetches"] = self.stats.get("fetches", 0) + 1
        if req.isolation_level == m.READ_COMMITTED and resp.error == 0:
            assert self.txns is not None
            self.txns.check_read_committed(node, resp)
        if not resp.records:
            return
        self.stats["fetched"] = self.stats.get("fetched", 0) + 1
        core = node.core
        assert core is not None
        self.check_undamaged(node, resp.records, "to a consumer")
        if req.current_leader_epoch != -1 and (
            resp.leader_epoch != req.current_leader_epoch
            or self.epoch_leaders.get(resp.leader_epoch) != node.id
        ):
            raise Violation(
                "consumer-fenced",
                f"node {node.id} served records for epoch {req.current_leader_epoch} "
                f"while in epoch {resp.leader_epoch} (leader {self.epoch_leaders.get(resp.leader_epoch)})",
            )
        for batch in decode_sim_batches(resp.records):
            epoch = batch.epoch
            for off, uid in zip(batch.offsets, batch.ids, strict=True):
                if off >= resp.high_watermark or off >= core.high_watermark:
                    raise Violation(
                        "consumer-above-hwm",
                        f"node {node.id} served offset {off} with HWM {core.high_watermark}",
                    )
                if not self.unclean and self.committed[off] != (epoch, uid):
                    raise Violation(
                        "log-matching",
                        f"node {node.id} served {(epoch, uid)} at committed offset {off}, "
                        f"committed history has {self.committed[off]}",
                    )

    def check_undamaged(self, node: SimNode, data: bytes, where: str) -> None:
        for base, *_ in decode_batches(data):
            if base in node.log.damaged:
                raise Violation(
                    "corrupt-served", f"node {node.id} sent its damaged batch {base} {where}"
                )

    def scrub(self, node: SimNode) -> None:
        if node.driver is None:
            if node.log.damaged:
                self.push(self.now + self.rng.randint(200, 1000), SCRUB, (node.id,))
            return
        found = node.log.first_damage()
        if found is not None:
            self.execute(node, node.driver.on_corruption(KEY, found, self.local(node)))

    # ------------------------------------------------------------------ faults

    def alive_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive and not n.stopping]

    def inject_fault(self) -> None:
        if self.membership_on and self.rng.random() < self.p.membership:
            self.reassign()
            return
        if self.corrupt_on and self.rng.random() < self.p.corruption:
            self.inject_corruption()
            return
        if self.p.disk_faults and self.rng.random() < self.p.disk_faults:
            self.inject_disk_fault()
            return
        r = self.rng.random()
        alive = self.alive_nodes()
        ids = list(self.nodes)
        if r < 0.22 and alive:
            node = self.rng.choice(alive)
            self.fault(f"crash node {node.id} (unflushed data lost)")
            self.stop(node, lose_unflushed=True)
            self.push(self.now + self.rng.randint(100, 3000), RESTART, (node.id, node.incarnation))
        elif r < 0.32 and alive:
            node = self.rng.choice(alive)
            assert node.core is not None
            self.fault(f"graceful shutdown of node {node.id} ({node.core.state_name})")
            node.stopping = True
            assert node.driver is not None
            self.execute(node, node.driver.begin_shutdown(self.local(node)))
            self.push(self.now + self.rng.randint(20, 300), STOP, (node.id, node.incarnation))
        elif r < 0.52 and len(ids) > 1:
            node_id = self.rng.choice(ids)
            links = {(node_id, o) for o in ids if o != node_id}
            links |= {(o, node_id) for o in ids if o != node_id}
            self.fault(f"partition node {node_id} from all others")
            self.blocked |= links
            self.push(self.now + self.rng.randint(200, 4000), UNFAULT, ("links", frozenset(links)))
        elif r < 0.64 and len(ids) > 1:
            a, b = self.rng.sample(ids, 2)
            self.fault(f"one-way partition {a} -> {b}")
            self.blocked.add((a, b))
            self.push(
                self.now + self.rng.randint(200, 4000), UNFAULT, ("links", frozenset({(a, b)}))
            )
        elif r < 0.72:
            self.loss = self.rng.choice([0.1, 0.3, 0.6])
            self.fault(f"message loss {self.loss}")
            self.push(self.now + self.rng.randint(200, 2000), UNFAULT, ("loss", None))
        elif r < 0.82 and alive:
            node = self.rng.choice(alive)
            jump = self.rng.randint(1, 1500)
            self.fault(f"clock of node {node.id} jumps +{jump} ms")
            node.skew += jump
            if node.driver is not None:
                self.execute(node, node.driver.tick(self.local(node)))
        elif r < 0.90 and self.p.disk_loss and not self.disk_lost_once and len(self.voter_ids) > 1:
            node = self.nodes[self.rng.choice(self.voter_ids)]
            # It comes back under its voter id with an empty log and no quorum state. Its
            # peers remember its old data directory (the node's directory-id exchange), so
            # it starts catching up with an unknown floor before it handles any message.
            # Without that rule, a stale leader could count the wiped copy and commit over
            # what it acked before (seed 3225).
            self.fault(f"disk loss on node {node.id}: returns empty under its id")
            self.disk_lost_once = True
            if node.alive:
                self.stop(node, lose_unflushed=True)
            node.log = self.log_factory()
            node.persisted = None
            node.extra_logs.clear()
            node.extra_persisted.clear()
            node.max_epoch = 0  # its epoch was on the lost disk
            node.disk_lost = True
            self.push(self.now + self.rng.randint(100, 2000), RESTART, (node.id, node.incarnation))
        elif r < 0.95 and self.p.unclean and not self.unclean:
            voters = [n for n in alive if n.voter and not n.disk_lost]
            if not voters:
                return
            node = self.rng.choice(voters)
            assert node.core is not None
            # The operator tool asks every replica for its epoch and goes well above.
            top = max((n.persisted.epoch for n in self.nodes.values() if n.persisted), default=0)
            self.fault(f"operator forces node {node.id} to lead epoch > {top} (unclean)")
            self.unclean = True
            self.unclean_snapshot = list(self.committed)
            assert node.driver is not None
            p = node.driver.partitions[KEY]
            ready = Ready()
            now = self.local(node)
            p.run(p.core.force_leader(now, min_epoch=top + UNCLEAN_EPOCH_GAP), now, ready)
            self.execute(node, ready)

    def reassign(self) -> None:
        """Move the partition to a new voter set one voter away from the target before
        (an add, a removal), or two or four (one or two voters replaced), on every
        running node's driver (the controller's record, applied; a node that starts
        later gets it with its partition)."""
        ids = sorted(self.nodes)
        now_in = set(self.target)
        out = [i for i in ids if i not in now_in]
        r = self.rng.random()
        if r < 0.4 and out and len(now_in) < 5:
            new = now_in | {self.rng.choice(out)}
        elif r < 0.65 and len(now_in) > 1:
            new = now_in - {self.rng.choice(sorted(now_in))}
        elif out and (r < 0.85 or len(out) == 1 or len(now_in) == 1):
            new = (now_in - {self.rng.choice(sorted(now_in))}) | {self.rng.choice(out)}
        elif out:  # two replaced: the new replicas copy one at a time
            new = (now_in - set(self.rng.sample(sorted(now_in), 2))) | set(self.rng.sample(out, 2))
        else:
            return
        before, self.target = self.target, tuple(sorted(new))
        self.fault(f"reassign to voters {list(self.target)}")
        for node_id in sorted(set(self.target) - set(before)):
            if self.lag_rng.random() < self.p.target_lag:
                self.lagging.setdefault(node_id, before)
                self.push(self.now + self.lag_rng.randint(20, 600), LEARN, (node_id, before))
            else:
                self.maybe_made_anew(self.nodes[node_id], before)
        for node in self.alive_nodes():
            if node.driver is not None and node.id not in self.lagging:
                node.driver.set_target(KEY, self.target, self.local(node))

    def learn_target(self, node_id: int, before: tuple[int, ...]) -> None:
        """A node whose view of a move lagged learns it: first, as
        ``PartitionManager.drop_removed`` may on that view, it may delete its copy if its
        own log says it is no voter (the leader may have added it meanwhile, on that
        copy's fetches, were its fetches not saying that the node does not host it
        yet: ``FetchRequest.assigned``), then it takes the target."""
        if self.lagging.pop(node_id, None) is None:
            return
        node = self.nodes[node_id]
        if (
            node_id in self.target
            and node.log.voters is not None  # it has seen a voter set (without it)
            and _holds_a_removed_copy(node)
            and self.lag_rng.random() < 0.5
        ):
            self.check_deleted_copy_uncounted(node)
            self.make_anew(node, before, "as moved off, on a view of the move that lagged")
        if node.driver is not None:
            node.driver.set_target(KEY, self.target, self.local(node))

    def check_deleted_copy_uncounted(self, node: SimNode) -> None:
        """``deleted-copy-uncounted``: no leader counts a copy that its node deletes for
        records above its high watermark (they would be committed on a copy gone)."""
        for other in self.alive_nodes():
            core = other.core
            st = core._state if core is not None else None
            if core is None or not isinstance(st, LeaderState):
                continue
            row = st.progress.get(node.id)
            if row is not None and core.counts(row) and row.end_offset > core.high_watermark:
                raise Violation(
                    "deleted-copy-uncounted",
                    f"node {node.id} deleted its copy while leader {other.id} counts it at "
                    f"{row.end_offset}, above its high watermark {core.high_watermark}",
                )

    def maybe_made_anew(self, node: SimNode, before: tuple[int, ...]) -> None:
        """A node a move brings back may have deleted its copy once its removal was
        committed (``PartitionManager.drop_removed``): then the move makes it anew, empty,
        opening with the voters ``before`` the move (an observer), while the leader may
        still hold the removed voter's row for it."""
        if not _holds_a_removed_copy(node):
            return
        top = len(self.committed)
        if node.id in self.voters_at(top - 1) or any(
            o >= top and node.id in voters
            for n in self.nodes.values()
            for o, voters in n.log.voter_sets
        ):
            return  # its removal is not committed (its own log may just not say so yet)
        if self.rng.random() < 0.5:
            return
        self.make_anew(node, before, "after its removal")

    def make_anew(self, node: SimNode, before: tuple[int, ...], why: str) -> None:
        self.fault(f"node {node.id} deleted its copy {why}: made anew, empty")
        self.stats["made_anew"] = self.stats.get("made_anew", 0) + 1
        # What the copy sent leaves the network: deleted long after its removal
        # committed, nothing of it is in flight; deleted on a view that lagged, its last
        # fetches said its node did not host it, so the leader adds nothing on them. (A
        # fetch of it delayed past the new copy's first would still stand for the new
        # copy's row: only an id of each copy in its fetches, as KIP-853's directory id,
        # tells them apart.)
        for i, (at, seq, kind, data) in enumerate(self.events):
            if kind == DELIVER:
                msgs, inc = data
                kept = tuple((k, msg) for k, msg in msgs if k != KEY or msg.src != node.id)
                self.events[i] = (at, seq, kind, (kept, inc))
        self.stop(node, lose_unflushed=True)
        node.log = self.log_factory()
        # As PartitionManager.open marks a new replica a move adds: no vote until it has
        # caught up past its first leader's end. A stale voter still counts the deleted
        # copy, and the empty one's vote elected it beside the real leader (seed 532 of
        # the membership mix, 0.4).
        if self.p.new_copies_catch_up:
            node.log.mark_catch_up(CATCH_UP_UNKNOWN)
        node.persisted = None
        node.max_epoch = 0  # its epoch went with the copy
        node.open_voters = before
        node.adds_checked.clear()
        self.start(node)

    def inject_disk_fault(self) -> None:
        node = self.nodes[self.rng.choice(self.voter_ids)]
        until = self.now + self.rng.randint(300, 3000)
        if self.rng.random() < 0.5:
            self.fault(f"disk of node {node.id} full until {until}")
            node.log.full = True
            for lg in node.extra_logs.values():
                lg.full = True
            self.push(until, UNFAULT, ("disk", node.id))
        else:
            self.fault(f"disk of node {node.id} slow until {until}")
            node.slow_until = until

    def inject_corruption(self) -> None:
        if any(n.log.damaged or n.log.catch_up_offset >= 0 for n in self.nodes.values() if n.voter):
            return  # one damaged replica at a time
        candidates = [self.nodes[v] for v in self.voter_ids if self.nodes[v].log.durable > 0]
        if not candidates:
            return
        node = self.rng.choice(candidates)
        offset = self.rng.randrange(node.log.durable)
        base = node.log.damage(offset)
        # Answers the driver read before the damage and holds (an observer's paced
        # answer, one waiting for a flush) carry the bytes as they were read, intact.
        part = node.driver.get(KEY) if node.driver is not None else None
        if part is not None:
            held = [resp for _, resp in part.paced.values()]
            held += [msg for h in part.held for msg in h.messages]
            self.read_before_damage.update((id(msg), msg) for msg in held)
        self.fault(f"damage node {node.id}'s batch at {base} (durable end {node.log.durable})")
        self.push(self.now + self.rng.randint(50, 3000), SCRUB, (node.id,))

    def unfault(self, data: tuple[str, Any]) -> None:
        kind, value = data
        if kind == "disk":
            self.disk_room(self.nodes[value])
        elif kind == "links":
            self.blocked -= value
        elif kind == "loss" and self.healed_at is None:
            self.loss = self.p.loss  # bursts may overlap: always back to the baseline

    def disk_room(self, node: SimNode) -> None:
        node.log.full = False
        for lg in node.extra_logs.values():
            lg.full = False
        node.refused_at = None

    def heal(self) -> None:
        self.fault("faults stop: network healed, down nodes restart")
        self.healed_at = self.now
        self.heal_uid = self.next_uid
        self.blocked.clear()
        for n in self.nodes.values():
            self.disk_room(n)
            n.slow_until = 0
        self.loss = 0.0
        self.dup = 0.0
        for node in list(self.nodes.values()):
            if not node.alive:
                self.start(node)

    # ------------------------------------------------------------------ invariants

    def check_node(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        if core.epoch < node.max_epoch:
            raise Violation(
                "epoch-monotonic", f"node {node.id} epoch {core.epoch} < {node.max_epoch}"
            )
        node.max_epoch = core.epoch
        if node.driver is not None and node.driver.stuck_timers:
            raise Violation("timers-advance", f"node {node.id}: a timer stayed due after its tick")
        # No durable state stands for epoch 0 without a vote: a fresh replica's.
        if (node.persisted or FRESH) != core.election_state:
            raise Violation(
                "persist-before-send",
                f"node {node.id} persisted {node.persisted} but runs {core.election_state}",
            )
        self.check_disk_faults(node, core)
        if core.role is Role.LEADER:
            if core.epoch not in self.epoch_leaders:
                self.stats["elections"] += 1
            leader = self.epoch_leaders.setdefault(core.epoch, node.id)
            if leader != node.id:
                raise Violation(
                    "one-leader-per-epoch",
                    f"nodes {leader} and {node.id} both led epoch {core.epoch}",
                )
        hwm = core.high_watermark
        if hwm < node.last_hwm and not self.unclean:
            raise Violation("hwm-monotonic", f"node {node.id} HWM {node.last_hwm} -> {hwm}")
        node.last_hwm = hwm
        if hwm > node.checked_upto and not self.unclean:
            log = node.log
            for off in range(node.checked_upto, hwm):
                rec = log.record(off)
                if off < len(self.committed):
                    if self.committed[off] != rec and not log.gone(off):
                        raise Violation(
                            "log-matching",
                            f"node {node.id} holds {rec} at committed offset {off}, "
                            f"committed history has {self.committed[off]}",
                        )
                else:
                    if log.gone(off):
                        raise Violation(
                            "compaction-uncommitted",
                            f"node {node.id} holds a gap a clean left at offset {off}, "
                            "above the committed history",
                        )
                    # A marker's id names its producer and outcome: one per transaction.
                    if rec[1] in self.committed_ids and marker_of(rec[1]) is None:
                        raise Violation(
                            "duplicate-record",
                            f"record {rec[1]} committed at offset {off} and before it",
                        )
                    before = self.follows.get(rec[1], ())
                    if any(uid not in self.committed_ids for uid in before):
                        raise Violation(
                            "producer-gap",
                            f"record {rec[1]} committed at offset {off} before the "
                            f"producer's previous batch {before}",
                        )
                    self.committed.append(rec)
                    self.committed_ids.add(rec[1])
                    if self.txns is not None and log.entries[off][3] & TXN_FLAG:
                        self.txns.key_committed(log, off)
                    if is_voter_record(rec[1]) and log.entries[off][2] == off:
                        self.commit_voters(off, log)
                    if self.compaction is not None:
                        self.compaction.committed(off, log)
                    acked = self.acked.pop(off, None)
                    if acked is not None and acked != rec:
                        raise Violation(
                            "acked-lost",
                            f"record {acked[1]} acked at offset {off} epoch {acked[0]}, "
                            f"committed history has {rec}",
                        )
            node.checked_upto = hwm
        if core.role is Role.LEADER:
            self.check_added_voters(node, core)
        pending = [o for o, _ in node.log.voter_sets if o >= len(self.committed)]
        if len(pending) > 1:
            raise Violation(
                "voter-changes-pending",
                f"node {node.id}'s log holds voter-set records at {pending} above the "
                f"committed offset {len(self.committed)}",
            )

    def check_added_voters(self, node: SimNode, core: RaftReplica) -> None:
        """A voter a leader adds holds, durably, what the leader counts it for: the
        leader's row for it is of the replica there is now, not of one that was deleted
        (a row it kept from before would count records the new, empty replica lacks)."""
        sets = node.log.voter_sets
        st = core._state
        if not isinstance(st, LeaderState) or not sets:
            return
        for i in range(len(sets) - 1, -1, -1):
            offset, voters = sets[i]
            if offset < st.epoch_start_offset or (offset, core.epoch) in node.adds_checked:
                break  # not this leader's change, or checked already (and those before)
            node.adds_checked.add((offset, core.epoch))
            prior = sets[i - 1][1] if i else tuple(node.open_voters or self.voter_ids)
            target = node.driver.partitions[KEY].target if node.driver is not None else None
            if (
                target is not None
                and node.log.entries[offset][0] == core.epoch  # its own, checked as it is
                and len(prior) < len(voters) > len(target) + 1
            ):
                raise Violation(
                    "voters-within-target",
                    f"leader {node.id} added a voter at offset {offset}: {list(voters)}, "
                    f"more than one beyond the target {list(target)}",
                )
            for added in sorted(set(voters) - set(prior)):
                row = st.progress.get(added)
                held = self.nodes[added].log.durable_end_offset
                if row is not None and row.end_offset > held:
                    raise Violation(
                        "added-voter-holds",
                        f"leader {node.id} added voter {added} at offset {offset} counting "
                        f"it at {row.end_offset}; its log holds {held}",
                    )

    def voters_at(self, offset: int) -> tuple[int, ...]:
        """The voter set in force at committed ``offset``."""
        before = [v for o, v in self.committed_voters if o <= offset]
        return before[-1] if before else tuple(self.voter_ids)

    def commit_voters(self, base: int, log: MemLog) -> None:
        batch = [e[1] for e in log.entries[base:] if e[2] == base]
        voters = tuple(sorted(voter_of(i) for i in batch))
        before = self.voters_at(base)
        changed = set(voters) ^ set(before)
        if len(changed) != 1:
            raise Violation(
                "voter-step",
                f"committed voters {list(before)} -> {list(voters)} at offset {base}",
            )
        self.committed_voters.append((base, voters))
        self.stats["voter_changes"] = self.stats.get("voter_changes", 0) + 1

    def check_disk_faults(self, node: SimNode, core: RaftReplica) -> None:
        """A leader whose disk refused a write hands over at once; a leader whose flush
        has run a fetch timeout (and a tick) while a follower already holds its target
        hands over too (a slow disk must not hold every producer)."""
        if node.log.refusals != node.refusals_seen:
            self.stats["disk_refusals"] = (
                self.stats.get("disk_refusals", 0) + node.log.refusals - node.refusals_seen
            )
            node.refusals_seen = node.log.refusals
            # Refused while it leads (not just before it stood again, as a replica may
            # once its fault expires: its disk may have room by then).
            led = node.refused_at[1] if node.refused_at is not None else None
            if core.role is Role.LEADER and led != core.epoch:
                node.refused_at = (self.now, core.epoch)
        st = core._state
        if not isinstance(st, LeaderState):
            return
        if node.refused_at is not None and node.refused_at[1] == core.epoch:
            waited = self.now - node.refused_at[0]
            if waited > 50:
                raise Violation(
                    "disk-fault-leader",
                    f"node {node.id} leads epoch {core.epoch} {waited} ms after its full "
                    "disk refused an append in that epoch",
                )
        if node.flush_asked is not None:
            asked, target = node.flush_asked
            ahead = [r.replica_id for r in st.progress.values() if r.end_offset >= target]
            if not ahead:
                node.ahead_since = None
                return
            if node.ahead_since is None or node.ahead_since[0] != node.flush_asked:
                node.ahead_since = (node.flush_asked, self.now)
            waited = self.now - asked
            due = max(asked + core.config.fetch_timeout_ms, node.ahead_since[1])
            if self.now - due > core.config.retry_backoff_ms + 100:
                raise Violation(
                    "slow-flush-leader",
                    f"node {node.id} leads with a flush to {target} running {waited} ms "
                    f"while {ahead} hold it",
                )

    def check_global(self) -> None:
        if self.unclean or not self.committed:
            return
        top = len(self.committed) - 1
        rec = self.committed[top]
        holders = 0
        wiped = 0
        voters = self.voters_at(top)
        for v in voters:
            log = self.nodes[v].log
            if log.holds(top, rec):
                holders += 1
            elif self.nodes[v].disk_lost:
                wiped += 1  # a lost disk is a physical fault, not a protocol one,
            elif any(b <= top for b in log.damaged) or log.catch_up > top:
                wiped += 1  # as is damage, until the replica has caught back up
        # Every majority of the voters in force there must include a holder (for an odd
        # count, a majority holds it; an even count one fewer), or a leader without it
        # could be elected.
        if holders + wiped < len(voters) - len(voters) // 2:
            raise Violation(
                "majority-holds",
                f"only {holders} of voters {list(voters)} hold committed offset {top} "
                f"{rec} durably",
            )

    def check_lone_leader(self) -> None:
        cfg = self.p.config
        cq = cfg.check_quorum_timeout_ms
        bound = max(cfg.fetch_timeout_ms + cq, 2 * cq) + cfg.heartbeat_ms
        bound += 2 * self.p.delay_ms[1] + 20
        for node in self.alive_nodes():
            core = node.core
            # A leader forced by an unclean election keeps leading until a majority
            # has followed it (its operator chose it): not a lone leader.
            lone = core is not None and core.is_leader and not core.forced
            if lone:
                # Heard from: check-quorum counts what a leader receives (KIP-595's
                # fetches, the quiesced voters' heartbeats). A voter whose messages reach
                # it while its answers are lost cannot be told apart from a follower, as
                # in Kafka: such a voter, if it can be elected elsewhere, fences it.
                voters = core.voters  # its own voter set, as its check-quorum counts
                reach = frozenset(
                    v
                    for v in voters
                    if v == node.id or (self.nodes[v].alive and (v, node.id) not in self.blocked)
                )
                lone = len(reach) < len(voters) // 2 + 1
                # Check-quorum counts the voters heard within a period: one that comes
                # back into reach while another left it may make a period's count a
                # majority though both were never reached at once. The episode the bound
                # applies to starts again then.
                if lone and not reach <= self.lone_reach.get(node.id, reach):
                    self.lone_since[node.id] = self.now
                self.lone_reach[node.id] = reach
            if not lone:
                if self.lone_since.pop(node.id, None) is not None:
                    self.stats["lone"] = self.stats.get("lone", 0) + 1  # an episode ended
            elif self.now - self.lone_since.setdefault(node.id, self.now) > bound:
                raise Violation(
                    "lone-leader",
                    f"node {node.id} leads epoch {core.epoch} heard from by less than a "
                    f"majority of the voters since t={self.lone_since[node.id]}",
                )

    def check_quiet(self) -> None:
        cfg = self.p.config
        slack = 2 * self.p.delay_ms[1] + 20
        for node in self.alive_nodes():
            core = node.core
            leader = self.nodes.get(core.leader_id) if core and core.leader_id else None
            if core is None or leader is None or not core.quiesced:
                self.quiet_silent.pop(node.id, None)
                self.quiet_behind.pop(node.id, None)
                continue
            if leader.alive and (leader.id, node.id) not in self.blocked:
                self.quiet_silent.pop(node.id, None)
            elif (
                self.now - self.quiet_silent.setdefault(node.id, self.now)
                > cfg.fetch_timeout_ms + slack
            ):
                raise Violation(
                    "quiet-silent-leader",
                    f"node {node.id} stayed quiesced under node {leader.id}, out of its "
                    f"reach since t={self.quiet_silent[node.id]}",
                )
            lc = leader.core
            behind = (
                self.healed_at is not None
                and lc is not None
                and lc.is_leader
                and lc.epoch == core.epoch
                and leader.log.end_offset > node.log.end_offset
            )
            if not behind:
                self.quiet_behind.pop(node.id, None)
            elif (
                self.now - self.quiet_behind.setdefault(node.id, self.now)
                > cfg.request_timeout_ms + cfg.heartbeat_ms + slack
            ):
                raise Violation(
                    "quiet-behind",
                    f"node {node.id} stayed quiesced since t={self.quiet_behind[node.id]} "
                    f"while its leader {leader.id} holds records up to {leader.log.end_offset} "
                    f"and it up to {node.log.end_offset}",
                )

    def check_truncation_visible(self, node: SimNode) -> None:
        """A reader at (offset after a committed record, its epoch) must see, through
        end_offset_for, when this log no longer holds that record."""
        snap = self.unclean_snapshot
        log = node.log
        for off in range(len(snap)):
            if off + 1 < len(snap) and snap[off + 1][0] == snap[off][0]:
                continue  # check the last committed record of each epoch
            epoch, _ = snap[off]
            if off < log.end_offset and log.record(off) == snap[off]:
                continue
            answer = log.end_offset_for(epoch)
            if answer.epoch == epoch and answer.end_offset > off:
                raise Violation(
                    "truncation-visible",
                    f"node {node.id} lost committed offset {off} (epoch {epoch}) but "
                    f"end_offset_for({epoch}) = {answer} hides it",
                )


def run_seed(
    seed: int,
    factory: ReplicaFactory = RaftReplica,
    driver_class: DriverClass = Driver,
    log_factory: Callable[[], MemLog] = MemLog,
    coordinator_class: CoordinatorClass = SimCoordinator,
    **overrides: Any,
) -> SimResult:
    params = SimParams.for_seed(seed)
    for key, value in overrides.items():
        setattr(params, key, value)
    sim = Simulation(
        seed,
        params,
        factory,
        driver_class=driver_class,
        log_factory=log_factory,
        coordinator_class=coordinator_class,
    )
    return sim.run()


def _holds_a_removed_copy(node: SimNode) -> bool:
    """The node runs a copy that is no voter, nor may stand, and holds records: one
    ``PartitionManager.drop_removed`` may delete."""
    core = node.core
    return core is not None and not core.electable and node.log.end_offset > 0
