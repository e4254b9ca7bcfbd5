"""A node's partition replicas under the driver rules, stepped by its executor."""

from __future__ import annotations

import heapq
import logging
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..logcontext import about
from ..protocol import ErrorCode
from ..protocol import messages as m
from ..raft import UNCLEAN_EPOCH_GAP, ElectionState, Message, QuorumConfig, RaftReplica
from . import queries
from .errors import error_response
from .liveness import NODE_KEY, NodeHeartbeat, PeerLiveness
from .partition import Limits, PartitionDriver, Produced, ServedLog, Throttle
from .ready import PartitionKey, Ready

log = logging.getLogger(__name__)

CoreFactory = Callable[..., RaftReplica]

#: A partition's plain produce requests handed in together are appended as one up to
#: this many bytes of records (``request_many``): more go in the next append.
MERGE_BYTES = 1 << 20
# New partitions stand at least this far apart (us): 10,000 opened at once over 3 s.
NEW_PARTITION_SPREAD_US = 300
# A new partition's other replicas hold their timers this many election timeouts past
# its slot while the preferred replica's node is heard: nodes busy electing thousands
# must not start rival elections for partitions whose preferred replica has yet to
# stand. Its first message (or its node falling silent) ends the hold.
NEW_PARTITION_HOLD_TIMEOUTS = 10
# Ticks of one partition in one Driver.tick call before a timer that stays due is a bug
# (a core's tick runs a few rounds of its own; a chain of state changes is short).
STUCK_TICKS = 8
# The preferred-leader rebalance keeps at most this many hand-overs of a node in flight
# (handed over, no leader of a later epoch known yet), looking again every
# REBALANCE_STEP_MS: a node back from a restart takes its thousands back as a stream of
# elections at the pace the nodes complete them, not a burst that overloads them all.
# A hand-over not completed within REBALANCE_GIVE_UP_MS no longer counts.
REBALANCE_BATCH = 100
REBALANCE_STEP_MS = 500
REBALANCE_GIVE_UP_MS = 10_000
# Partitions one tick steps at most; the rest stay due for the next tick. A node's tick
# (its heartbeats go out in it) never stalls on thousands of timers falling due at once.
TICK_PARTITIONS = 500
# Partitions a change of a peer's node (silent, restarted, heard again) reaches per driver
# step (the step that notices it, then each tick). With thousands of partitions, telling
# them all in one step held the node's loop for 250-330 ms and made a Ready of up to
# 10,000 messages, so its heartbeats went out late and its peers in turn found it silent
# (an election storm after a node restarted, `quorumlog perf partitions`).
PEER_NEWS_PARTITIONS = 500
# While a reassignment is under way on a partition this node leads, its leader looks this
# often whether it may take the next voter step (a new replica caught up, the previous
# change committed).
REASSIGN_STEP_MS = 100
# With every target reached, how often it looks whether one moved off its target again.
REASSIGN_IDLE_MS = 1000

# The client requests a partition serves, by type; each is answered through Ready.answers.
Request = (
    m.ProduceRequest
    | m.WriteTxnMarkerRequest
    | m.FetchRequest
    | m.ListOffsetsRequest
    | m.OffsetsForLeaderEpochRequest
    | m.DescribeQuorumRequest
    | m.ForceLeaderRequest
)


class Driver:
    """Every step takes the time (``now``, monotonic ms) and returns a ``Ready``.

    Steps: ``open``/``close`` a partition replica, ``raft`` (a message from a peer),
    ``tick`` (timers: elections, fetches, long-poll and produce expiry), ``flushed`` (a
    flush the Ready asked for completed), ``request`` (a client request, answered by the
    token it came with), and the node events ``on_corruption``, ``begin_catch_up``,
    ``peer_unreachable`` and ``begin_shutdown``. Nothing here touches sockets, files or clocks.

    Timers live in a heap of each partition's next deadline, so a tick costs only what is
    due: a quiesced partition has none. The node-level heartbeats (``NodeHeartbeat``, to
    every peer every ``QuorumConfig.heartbeat_ms``, under ``NODE_KEY``) keep
    ``PeerLiveness``, which the cores read for their quiesced replicas; a peer silent for
    a fetch timeout (at two ticks in a row), restarted, or heard again after that is
    handed to every core (``RaftReplica.on_peer_change``), ``news_partitions`` per step."""

    partition_class = PartitionDriver  # the simulator's teeth tests break it on purpose

    def __init__(
        self,
        node_id: int,
        cluster_id: str,
        quorum: QuorumConfig,
        limits: Limits,
        rng: random.Random,
        core_factory: CoreFactory = RaftReplica,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.quorum = quorum
        self.limits = limits
        self.rng = rng
        self.core_factory = core_factory
        self.partitions: dict[PartitionKey, PartitionDriver] = {}
        rate = limits.catch_up_bytes_per_s
        self.throttle = Throttle(rate) if rate > 0 else None  # shared by its partitions
        self.incarnation = rng.getrandbits(62)
        self.liveness = PeerLiveness(quorum.fetch_timeout_ms)
        self._peers: Counter[int] = Counter()  # peer -> partitions shared with it
        self._heartbeat_at: int | None = None
        self._rebalance_at: int | None = None
        self._rebalancing: set[int] = set()  # peers taking their preferred partitions back
        # Hand-overs in flight: partition -> (the epoch handed over, when).
        self._handing: dict[PartitionKey, tuple[int, int]] = {}
        # The last look's partitions to hand over not tried yet (``_rebalance``), and
        # how many looks at every partition the rebalance took.
        self._candidates: deque[PartitionKey] = deque()
        self.rebalance_looks = 0
        self._last_slot_us = -(1 << 62)  # the slot of the newest partition opened (us)
        # (deadline, seq, key): lazily invalidated; _due holds each key's live deadline.
        self._heap: list[tuple[int, int, PartitionKey]] = []
        self._due: dict[PartitionKey, int] = {}
        self._seq = 0
        self.stuck_timers = 0  # ticks that left their partition's timer due (must stay 0)
        # Peer changes still to hand to partitions: peer -> partitions not told yet.
        self._news: dict[int, deque[PartitionKey]] = {}
        self._news_at: int | None = None  # while news is left: due (the last step's time)
        self.news_partitions = PEER_NEWS_PARTITIONS  # the simulator tells fewer per step
        # Partitions a reassignment gave a target (kept once reached: see _reassign), and
        # when next to look at them.
        self._targeted: set[PartitionKey] = set()
        self._reassign_at: int | None = None

    def __iter__(self) -> Iterator[PartitionDriver]:
        return iter(list(self.partitions.values()))

    def get(self, key: PartitionKey) -> PartitionDriver | None:
        p = self.partitions.get(key)
        return None if p is None or p.closed else p

    # ------------------------------------------------------------------ lifecycle
    def open(
        self,
        key: PartitionKey,
        voters: list[int],
        log_: ServedLog,
        persisted: ElectionState | None,
        now: int,
    ) -> Ready:
        """Open a replica over ``log_`` with its last persisted election state. A voter
        of a new partition (nothing persisted) gets a slot: its first (preferred) replica
        stands then, as a candidate at once (``RaftReplica.stand_first``), and its other
        replicas hold their timers NEW_PARTITION_HOLD_TIMEOUTS election timeouts longer
        (until a message of the partition, or the preferred replica's node going silent),
        so leadership follows the assignment. Slots of partitions opened together are
        NEW_PARTITION_SPREAD_US apart at least: a topic of 10,000 partitions elects over
        seconds, not in one storm. A slot is an election timeout after the open, or the
        spread after the slot before it if that is later: opens slower than the spread are
        spread by themselves (a node opening 10,000 replicas takes seconds), and their
        slots do not add the spread on top. A replica outside ``voters`` (a move's new
        replica, a joining node's metadata replica) has no election to wait for: it looks
        for the leader from its first tick."""
        with about(key):
            core = self.core_factory(
                self.quorum, self.node_id, voters, self.cluster_id, log_, persisted, self.rng, now
            )
        hold = 0
        if persisted is None and self.node_id in voters:
            # New partitions opened together (one topic of thousands) stand one after
            # another, NEW_PARTITION_SPREAD_US apart, not all in one election timeout.
            self._last_slot_us = max(
                (now + self.quorum.election_timeout_ms) * 1000,
                self._last_slot_us + NEW_PARTITION_SPREAD_US,
            )
            slot = self._last_slot_us // 1000
            if voters[0] == self.node_id:
                core.stand_first(slot)
            else:
                hold = slot + NEW_PARTITION_HOLD_TIMEOUTS * self.quorum.election_timeout_ms
        core.peer_seen = self.liveness.seen
        # Until a target names this node (``set_target``: the node's view of a move), a
        # replica outside the voters it opens with may not be added: a copy a move took
        # off, reopened before the metadata is applied again, may yet be deleted.
        core.assigned = self.node_id in voters
        p = self.partition_class(key, core, log_, self.limits, hold)
        p.throttle = self.throttle
        p.assignment = list(voters)
        old = self.partitions.get(key)
        if old is not None:
            self._forget_peers(old)
        self.partitions[key] = p
        self._sync_peers(p, now)
        if self._heartbeat_at is None:
            self._heartbeat_at = now
        interval = self.quorum.rebalance_interval_ms
        if self._rebalance_at is None and interval is not None:
            self._rebalance_at = now + interval
        ready = Ready()
        with about(key):
            p.run(core.startup_output(), now, ready)
        self._schedule(p)
        return ready

    def close(self, key: PartitionKey) -> Ready:
        ready = Ready()
        p = self.partitions.pop(key, None)
        if p is not None:
            p.close(ready)
            self._forget_peers(p)
            self._due.pop(key, None)
        return ready

    def _forget_peers(self, p: PartitionDriver) -> None:
        for v in p.counted_voters:
            if v != self.node_id:
                self._peers[v] -= 1
                if self._peers[v] <= 0:
                    del self._peers[v]
        p.counted_voters = ()

    def _sync_peers(self, p: PartitionDriver, now: int) -> None:
        """Count ``p``'s voters as this node's peers (heartbeats, liveness), again when a
        voter-set change in its log replaced them."""
        voters = p.core.voters
        if voters is p.counted_voters:
            return
        self._forget_peers(p)
        for v in voters:
            if v != self.node_id:
                self._peers[v] += 1
                self.liveness.seen.setdefault(v, now)
        p.counted_voters = voters

    # ------------------------------------------------------------------ reassignment
    def set_catch_up_rate(self, bytes_per_s: int, now: int) -> None:
        """The catch-up throttle this node's leaders pace observers by from now on
        (0: none), as the cluster's metadata sets it while moves run. Answers held under
        the old rate go at once: each waited for a rate that no longer holds, and the new
        one counts from now."""
        current = self.throttle.bytes_per_s if self.throttle is not None else 0
        if bytes_per_s == current:
            return
        self.throttle = Throttle(bytes_per_s) if bytes_per_s > 0 else None
        for p in self.partitions.values():
            p.throttle = self.throttle
            if p.paced:
                p.paced = {replica: (now, resp) for replica, (_, resp) in p.paced.items()}
                self._schedule(p)

    def set_target(self, key: PartitionKey, target: Iterable[int], now: int) -> None:
        """A reassignment moves partition ``key`` to the voters ``target`` (a
        cancellation's target is its voters before the move). While this node leads it,
        it steps the voter set there one voter at a time (``PartitionDriver.next_voters``);
        the first of ``target`` becomes its preferred leader. New target replicas must
        host it (as observers) to catch up."""
        p = self.get(key)
        if p is None:
            return
        wanted = tuple(sorted(set(target)))
        assignment = list(dict.fromkeys(target))
        retargeted = wanted != p.target
        if retargeted or assignment != p.assignment:
            p.settle_leader = True
        if retargeted:
            p.target, p.target_since = wanted, now
        p.core.assigned = self.node_id in wanted
        p.assignment = assignment
        self._targeted.add(key)
        if self._reassign_at is None or (p.moving and self._reassign_at > now):
            self._reassign_at = now

    def _reassign(self, now: int, ready: Ready) -> None:
        """One voter step on each moving partition this node leads that may take one.
        Partitions keep their target once there: a truncation (an uncommitted change
        lost with a leader) or a new leadership may move them off it again."""
        moving = False
        for key in list(self._targeted):
            p = self.get(key)
            if p is None:
                self._targeted.discard(key)
                continue
            if not p.moving:
                if p.settle_leader and self._settle_leader(p, now, ready):
                    moving = True  # its hand-over waits: look again soon
                continue
            moving = True
            if p.core.is_leader:
                with about(key):
                    p.step_voters(now, ready)
                self._sync_peers(p, now)
                self._schedule(p)
        if not self._targeted:
            self._reassign_at = None
        else:
            self._reassign_at = now + (REASSIGN_STEP_MS if moving else REASSIGN_IDLE_MS)

    def _settle_leader(self, p: PartitionDriver, now: int, ready: Ready) -> bool:
        """A partition a reassignment brought to its target ends with its preferred
        replica (the first of the target) leading, as Kafka's reassignment elects it:
        its leader hands over (``RaftReplica.hand_over``, once that replica holds
        everything, all of it committed) at once, not at the next imbalance check
        (``_rebalance``), which may be half a minute away and leaves a node that led
        nothing meanwhile, another leading double. Done once the preferred replica is
        seen leading; True while this node leads and waits to hand over."""
        core = p.core
        if core.leader_id == p.preferred or p.preferred not in core.voters:
            p.settle_leader = False
            return False
        if not core.is_leader:
            return False
        if not self._hand_over(p, now, ready):
            return True  # not caught up yet
        p.settle_leader = False
        return False

    # ------------------------------------------------------------------ timers
    def _schedule(self, p: PartitionDriver) -> None:
        """Keep ``p``'s entry in the deadline heap current (after any step on it)."""
        if p.closed or self.partitions.get(p.key) is not p:
            return
        at = p.next_deadline_ms()
        if at is None:
            self._due.pop(p.key, None)
        elif self._due.get(p.key) != at:
            self._set_due(p.key, at)

    def _set_due(self, key: PartitionKey, at: int) -> None:
        self._due[key] = at
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, key))

    def _schedule_all(self, ps: Iterable[PartitionDriver]) -> None:
        for p in ps:
            self._schedule(p)

    def _next_partition_deadline(self) -> int | None:
        heap = self._heap
        while heap and self._due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # superseded or closed
        return heap[0][0] if heap else None

    # ------------------------------------------------------------------ steps
    def raft(self, key: PartitionKey, msg: Message | NodeHeartbeat, now: int) -> Ready:
        """A message from a peer: a partition's raft message, or (under ``NODE_KEY``) a
        node heartbeat. Any of them proves the sender's process runs."""
        return self.raft_many([(key, msg)], now)

    def raft_many(
        self, items: Iterable[tuple[PartitionKey, Message | NodeHeartbeat]], now: int
    ) -> Ready:
        """Messages that came in one frame (many partitions, one peer): one Ready."""
        ready = Ready()
        for key, msg in items:
            self._raft(key, msg, now, ready)
        if self._news:
            self._tell_news(now, ready)  # a change this step noticed, at once (in part)
        return ready

    def _raft(
        self, key: PartitionKey, msg: Message | NodeHeartbeat, now: int, ready: Ready
    ) -> None:
        if msg.dst != self.node_id or msg.src == self.node_id:
            return
        if isinstance(msg, NodeHeartbeat):
            if msg.cluster_id == self.cluster_id and msg.src in self._peers:
                if self.liveness.restarted(msg.src, msg.incarnation, now):
                    # What its old incarnation's heartbeats vouched for is gone.
                    self._peer_changed(msg.src, now)
                self._heard(msg.src, now)
            return
        if msg.src in self._peers:
            self._heard(msg.src, now)
        p = self.get(key)
        if p is not None:
            with about(key):
                p.on_raft(msg, now, ready)
            self._sync_peers(p, now)
            self._schedule(p)
            if self.liveness.refused and p.core.leader_id in self.liveness.refused:
                self._hint_refused(p, now, ready)

    def _heard(self, peer: int, now: int) -> None:
        if self.liveness.heard(peer, now):
            self._peer_changed(peer, now)  # back after being stale

    def _peer_changed(self, peer: int, now: int) -> None:
        """Queue ``peer``'s change for every partition it is a replica of; each step that
        finds changes queued (``raft_many``, ``tick``) hands out ``news_partitions`` of
        them. A later change of the same peer before they all heard replaces it (each
        partition is told once, of the latest: a restart noticed by a heartbeat that
        also ends a silence is one change)."""
        self._news[peer] = deque(
            key
            for key, p in self.partitions.items()
            if p.preferred == peer or peer in p.core.voters
        )
        if self._news_at is None:
            self._news_at = now

    def _tell_news(self, now: int, ready: Ready) -> None:
        budget = self.news_partitions
        for peer, keys in list(self._news.items()):
            while keys and budget > 0:
                budget -= 1
                p = self.get(keys.popleft())
                if p is None:
                    continue
                if p.preferred == peer and p.ticks_from_ms > now:
                    p.ticks_from_ms = now  # the preferred replica may never stand: elect
                if peer in p.core.voters:
                    with about(p.key):
                        p.run(p.core.on_peer_change(peer, now), now, ready)
                self._schedule(p)
            if not keys:
                del self._news[peer]
        self._news_at = now if self._news else None

    def tick(self, now: int) -> Ready:
        ready = Ready()
        heap = self._heap
        ticked: Counter[PartitionKey] = Counter()
        while heap and heap[0][0] <= now and len(ticked) < TICK_PARTITIONS:
            at, _, key = heapq.heappop(heap)
            p = self.partitions.get(key)
            if p is None or self._due.get(key) != at:
                continue  # superseded or closed
            del self._due[key]
            if p.closed:
                continue
            if ticked[key] >= STUCK_TICKS:
                # Its timer stays due however often it ticks: a core bug. The node's loop
                # must go on: it is counted (the simulator fails the seed) and retried a
                # millisecond later.
                self.stuck_timers += 1
                log.error("%s: a timer stays due after its tick (at %d, now %d)", p.name, at, now)
                self._set_due(key, now + 1)
                continue
            ticked[key] += 1
            with about(key):
                p.tick(now, ready)
            self._schedule(p)
        if self._heartbeat_at is not None and now >= self._heartbeat_at:
            self._heartbeat_at = now + self.quorum.heartbeat_ms
            for peer in sorted(self._peers):
                hb = NodeHeartbeat(
                    cluster_id=self.cluster_id,
                    src=self.node_id,
                    dst=peer,
                    incarnation=self.incarnation,
                )
                ready.send.append((NODE_KEY, hb))
        for peer in self.liveness.newly_stale(set(self._peers), now):
            log.info("node %d silent for %d ms", peer, self.liveness.stale_after_ms)
            self._peer_changed(peer, now)
        if self._news:
            self._tell_news(now, ready)
        if self._reassign_at is not None and now >= self._reassign_at:
            self._reassign(now, ready)
        interval = self.quorum.rebalance_interval_ms
        if interval is not None and self._rebalance_at is not None and now >= self._rebalance_at:
            more = self._rebalance(now, ready)
            self._rebalance_at = now + (min(REBALANCE_STEP_MS, interval) if more else interval)
        return ready

    def _rebalance(self, now: int, ready: Ready) -> bool:
        """Leaders of partitions whose preferred replica (the first of the assignment) is
        another node hand over to it when it is caught up and that node is imbalanced
        (``_imbalanced``: a node back from a restart takes its share of leadership
        again), while fewer than REBALANCE_BATCH of this node's hand-overs are in
        flight; True if that many are (more may wait).

        One look at every partition (``_look``) finds the candidates; the steps after
        it work through them, REBALANCE_BATCH at a time, and the step that has tried
        them all looks again (one whose preferred replica was not caught up may be by
        then): a node with 100,000 partitions handing thousands back looks at them all
        once per list of candidates, not twice every REBALANCE_STEP_MS."""
        for key, (epoch, at) in list(self._handing.items()):
            p = self.partitions.get(key)
            if (
                p is None
                or p.closed
                or (p.core.epoch > epoch and p.core.leader_id is not None)
                or now - at >= REBALANCE_GIVE_UP_MS
            ):
                del self._handing[key]
        if len(self._handing) >= REBALANCE_BATCH:
            return True
        queue = self._candidates
        looked = False
        while True:
            if not queue:
                if looked:
                    return False
                # Those found before are all tried: look again (a partition whose
                # preferred replica was not caught up then may be now).
                queue.extend(self._look()[1])
                looked = True
                continue
            p = self.partitions.get(queue.popleft())
            if (
                p is None
                or p.closed
                or not p.core.is_leader
                or p.preferred not in self._rebalancing
            ):
                continue
            if not self._hand_over(p, now, ready):
                continue  # the preferred replica is not caught up
            if len(self._handing) >= REBALANCE_BATCH:
                return True

    def _hand_over(self, p: PartitionDriver, now: int, ready: Ready) -> bool:
        """``p``'s leader hands over to its preferred replica (``RaftReplica.hand_over``)
        and the hand-over counts as in flight; False if it did not (that replica does
        not hold everything yet, or is not heard)."""
        assert p.preferred is not None
        epoch = p.core.epoch
        with about(p.key):
            out = p.core.hand_over(p.preferred, now)
        if p.core.is_leader:
            return False
        with about(p.key):
            p.run(out, now, ready)
        self._schedule(p)
        self._handing[p.key] = (epoch, now)
        return True

    def _imbalanced(self) -> set[int]:
        """The peers whose preferred partitions go back to them (Kafka's per-broker
        imbalance check, as this node sees the partitions it hosts): a peer joins once
        more than ``rebalance_imbalance_pct`` of its preferred partitions are led by
        another node (or none), and stays until none are."""
        return self._look()[0]

    def _look(self) -> tuple[set[int], list[PartitionKey]]:
        """One look at every partition: the imbalanced peers (``_imbalanced``), and the
        partitions this node leads whose preferred replica is one of them."""
        self.rebalance_looks += 1
        preferred: Counter[int] = Counter()
        elsewhere: Counter[int] = Counter()
        led: list[tuple[PartitionKey, int]] = []
        me = self.node_id
        for p in self.partitions.values():
            peer = p.preferred
            if p.closed or peer is None or peer == me:
                continue
            preferred[peer] += 1
            leader = p.core.leader_id
            if leader != peer:
                elsewhere[peer] += 1
                if leader == me:
                    led.append((p.key, peer))
        pct = self.quorum.rebalance_imbalance_pct
        for peer, n in preferred.items():
            if elsewhere[peer] * 100 > pct * n:
                self._rebalancing.add(peer)
        self._rebalancing &= {peer for peer in preferred if elsewhere[peer]}
        imbalanced = self._rebalancing
        return imbalanced, [key for key, peer in led if peer in imbalanced]

    def next_deadline_ms(self) -> int | None:
        times = [
            self._next_partition_deadline(),
            self._heartbeat_at,
            self._rebalance_at,
            self._reassign_at,
            self._news_at,
            self.liveness.next_stale_ms(set(self._peers)),
        ]
        present = [t for t in times if t is not None]
        return min(present) if present else None

    def flushed(self, key: PartitionKey, now: int) -> Ready:
        ready = Ready()
        p = self.partitions.get(key)
        if p is not None:
            with about(key):
                p.flushed(now, ready)
            self._schedule(p)
        return ready

    def request(self, token: int, key: PartitionKey, req: Request, now: int) -> Ready:
        """A client request for one partition; its answer comes in this Ready's
        ``answers`` or a later one's (acks=quorum produces and long-poll fetches wait)."""
        ready = Ready()
        p = self.get(key)
        if p is None:
            ready.answers.append(
                (
                    token,
                    error_response(
                        type(req), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "not hosted here"
                    ),
                )
            )
        elif isinstance(req, (m.ProduceRequest, m.WriteTxnMarkerRequest)):
            with about(key):
                p.produce(token, req, now, ready)
        elif isinstance(req, m.FetchRequest):
            with about(key):
                p.fetch(token, req, now, ready)
        elif isinstance(req, m.ListOffsetsRequest):
            queries.list_offsets(p, token, req, now, ready)
        elif isinstance(req, m.OffsetsForLeaderEpochRequest):
            queries.offsets_for_leader_epoch(p, token, req, ready)
        elif isinstance(req, m.DescribeQuorumRequest):
            queries.describe(p, token, now, ready)
        else:
            with about(key):
                self._force_leader(token, p, req, now, ready)
        if p is not None:
            self._schedule(p)
        return ready

    def request_many(self, items: Sequence[tuple[int, PartitionKey, Request]], now: int) -> Ready:
        """Client requests handed in together (token, partition, request), each taken as
        ``request`` takes it, in order, but for a partition's plain produce requests
        (client batches without producer fields: the log's ``plain_span``): those in a row are
        appended as one (``PartitionDriver.produce_together``), up to ``MERGE_BYTES``
        of records, each still answered on its own. One write, one flush and one wake
        of the followers where the requests came one after another would cost one
        each; the node hands in a turn of its event loop's appends so."""
        ready = Ready()
        # A partition's plain requests in a row, their bytes of records.
        runs: dict[PartitionKey, tuple[PartitionDriver, list[Produced], int]] = {}
        for token, key, req in items:
            plain = self._plain_produce(key, req)
            if plain is None:
                if key in runs:  # appended before it, in order
                    before, run, _size = runs.pop(key)
                    self._produce_run(before, run, now, ready)
                ready.merge(self.request(token, key, req, now))
                continue
            p, produce, span = plain
            _, run, size = runs.get(key, (p, [], 0))
            if run and size + len(produce.records) > MERGE_BYTES:
                self._produce_run(p, run, now, ready)
                run, size = [], 0
            run.append((token, produce, span))
            runs[key] = (p, run, size + len(produce.records))
        for p, run, _size in runs.values():
            self._produce_run(p, run, now, ready)
        return ready

    def _plain_produce(
        self, key: PartitionKey, req: Request
    ) -> tuple[PartitionDriver, m.ProduceRequest, int] | None:
        """A produce request of plain batches, with its partition and the offsets its
        batches span (the log's ``plain_span``); None for any other request."""
        if not isinstance(req, m.ProduceRequest):
            return None
        p = self.get(key)
        span = None if p is None else p.log.plain_span(req.records)
        return None if p is None or span is None else (p, req, span)

    def _produce_run(self, p: PartitionDriver, run: list[Produced], now: int, ready: Ready) -> None:
        with about(p.key):
            p.produce_together(run, now, ready)
        self._schedule(p)

    def _force_leader(
        self, token: int, p: PartitionDriver, req: m.ForceLeaderRequest, now: int, ready: Ready
    ) -> None:
        if not req.confirm:
            resp = error_response(
                type(req), ErrorCode.INVALID_REQUEST, "force-leader needs confirm=true"
            )
        else:
            log.warning(
                "%s: UNCLEAN leader election forced by an operator (log end %d, HWM %d)",
                p.name,
                p.log.end_offset,
                p.core.high_watermark,
            )
            # The forced epoch must not be reachable by ordinary elections among the
            # voters this node cannot reach (they may come back): skip that many epochs.
            p.run(p.core.force_leader(now, p.core.epoch + UNCLEAN_EPOCH_GAP), now, ready)
            resp = m.ForceLeaderResponse(error=0, error_message="", leader_epoch=p.core.epoch)
        ready.answers.append((token, resp))

    def on_corruption(self, key: PartitionKey, offset: int, now: int) -> Ready:
        """Damage found outside the driver (a scrub, the metadata controller's read)."""
        ready = Ready()
        p = self.get(key)
        if p is not None:
            with about(key):
                p.on_corruption(offset, now, ready)
            self._schedule(p)
        return ready

    def begin_catch_up(self, now: int) -> Ready:
        """This node's data directory replaced a lost one: every replica catches up with
        an unknown floor before it votes, stands or counts again."""
        ready = Ready()
        for p in self:
            if not p.closed:
                with about(p.key):
                    p.run(p.core.begin_catch_up(now), now, ready)
                self._schedule(p)
        return ready

    def peer_unreachable(self, peer: int, now: int) -> Ready:
        """The transport found ``peer``'s node refusing connections (its process is
        gone): followers of that leader stand without waiting for their fetch timeout,
        ranked by the assignment's order without ``peer`` (the first stands first, and
        the others defer to it), so the survivors do not split a vote and take over the
        dead node's leaderships evenly, as assignments spread them. A survivor does not
        wait for those ranked ahead of it that this node does not know to be settled
        (``PeerLiveness.settled``: restarted less than a fetch timeout ago, silent, or
        refusing connections): they may never stand."""
        self.liveness.refused.add(peer)
        ready = Ready()
        for p in self:
            if not p.closed and p.core.leader_id == peer:
                p.hinted = None  # a new refusal: told again
                self._hint_refused(p, now, ready)
        return ready

    def _hint_refused(self, p: PartitionDriver, now: int, ready: Ready) -> None:
        """Tell ``p``'s follower that its leader's node refuses connections (see
        ``peer_unreachable``), once per leader, epoch and refusal. A replica that learns
        of its leader only after the refusal (its node restarted, and heard of the new
        epoch from another voter) is told then: the transport tells a refusal once, and
        without the hint it would wait out its fetch timeout while the voters ranked
        behind it wait for it to stand."""
        leader = p.core.leader_id
        if leader is None or p.hinted == (leader, p.core.epoch):
            return
        p.hinted = (leader, p.core.epoch)
        unsettled = frozenset(q for q in self._peers if not self.liveness.settled(q, now))
        survivors = tuple(v for v in p.assignment if v != leader)
        with about(p.key):
            p.run(p.core.on_peer_unreachable(leader, now, survivors, unsettled), now, ready)
        self._schedule(p)

    def begin_shutdown(self, now: int) -> Ready:
        """Graceful stop: leaders resign (EndQuorumEpoch with ranked successors)."""
        ready = Ready()
        for p in self:
            if not p.closed and p.core.is_leader:
                with about(p.key):
                    p.run(p.core.begin_shutdown(now), now, ready)
                self._schedule(p)
        return ready
