"""Quiescence: an idle partition stops fetching, one heartbeat per pair of nodes stands
for it, and everything that needs the partition again wakes it (records, a silent or
restarted leader node). Run through the driver, as the nodes and the simulator run it."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from quorumlog.replica.driver import Driver, Limits, NodeHeartbeat, Ready
from quorumlog.replica.driver.driver import (
    PEER_NEWS_PARTITIONS,
    REBALANCE_BATCH,
    REBALANCE_STEP_MS,
    TICK_PARTITIONS,
)
from quorumlog.replica.driver.liveness import NODE_KEY
from quorumlog.replica.driver.ready import PartitionKey
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    Message,
    QuorumConfig,
    RaftReplica,
    WakeRequest,
)

from tests.sim.memlog import MemLog

from .test_driver import KEY, Nodes, produce, record_ids

QUIET = QuorumConfig(quiesce=True)
REBALANCING = QuorumConfig(quiesce=True, rebalance_interval_ms=3000)


def cores(nodes: Nodes) -> dict[int, object]:
    return {i: d.partitions[KEY].core for i, d in nodes.drivers.items()}


def quiet_cluster() -> tuple[Nodes, int]:
    nodes = Nodes(3, QUIET)
    leader = nodes.leader()
    token = nodes.request(leader, produce([1, 2]))
    nodes.advance(3 * QUIET.fetch_max_wait_ms + 500)
    assert nodes.answers[token].error == 0
    assert all(c.quiesced for c in cores(nodes).values())
    return nodes, leader


def test_an_idle_partition_quiesces_and_then_costs_no_timer_and_no_frame() -> None:
    nodes, leader = quiet_cluster()
    # No partition deadline is left in any driver's heap: a tick has nothing to do.
    for d in nodes.drivers.values():
        assert d._next_partition_deadline() is None
    mark = len(nodes.sent)
    nodes.advance(10_000)
    window = nodes.sent[mark:]
    assert window and all(isinstance(msg, NodeHeartbeat) for msg in window)
    # Every node heartbeats each of its 2 peers every heartbeat_ms, whatever the partitions.
    assert len(window) <= 3 * 2 * (10_000 // QUIET.heartbeat_ms + 1)
    # The leader stayed leader (check-quorum counted the heartbeats) in the same epoch.
    assert cores(nodes)[leader].is_leader


def test_a_new_partition_settles_quiesced_in_one_fetch_without_writing() -> None:
    """A partition nobody produced to: its first leader writes nothing (no record, no
    flush) and quiesces each follower at its first fetch, so creating thousands costs an
    election and one fetch round trip each."""
    nodes = Nodes(3, QUIET)
    nodes.advance(3 * QUIET.election_timeout_ms)
    assert all(c.quiesced for c in cores(nodes).values())
    assert all(lg.end_offset == 0 for lg in nodes.logs.values())
    assert not any(r.flush for _, r in nodes.readies)
    fetches = [msg for msg in nodes.sent if isinstance(msg, FetchRequest)]
    assert len(fetches) == 2 and all(r.quiesce for r in nodes.sent if isinstance(r, FetchResponse))
    # Records still wake the followers and commit.
    leader = next(i for i, c in cores(nodes).items() if c.is_leader)  # type: ignore[attr-defined]
    token = nodes.request(leader, produce([1]))
    nodes.advance(100)
    assert nodes.answers[token].error == 0  # type: ignore[attr-defined]


def test_the_same_cluster_without_quiescence_keeps_fetching() -> None:
    """The control: without quiescence the idle followers long-poll for ever."""
    nodes = Nodes(3, QuorumConfig(quiesce=False))
    nodes.leader()
    mark = len(nodes.sent)
    nodes.advance(10_000)
    fetches = [msg for msg in nodes.sent[mark:] if isinstance(msg, FetchRequest)]
    assert len(fetches) >= 2 * 10_000 // QUIET.fetch_max_wait_ms - 4


def test_records_wake_quiesced_followers_and_an_acks_quorum_produce_is_answered() -> None:
    nodes, leader = quiet_cluster()
    mark = len(nodes.sent)
    token = nodes.request(leader, produce([3]))
    nodes.advance(100)
    resp = nodes.answers[token]
    assert isinstance(resp, m.ProduceResponse) and resp.error == 0
    wakes = [msg for msg in nodes.sent[mark:] if isinstance(msg, WakeRequest)]
    assert sorted(w.dst for w in wakes) == sorted(i for i in nodes.voters if i != leader)
    for i in nodes.voters:
        assert nodes.logs[i].end_offset == nodes.logs[leader].end_offset


def test_a_late_copy_of_the_quiesced_fetch_does_not_stop_the_wake_up() -> None:
    nodes, leader = quiet_cluster()
    follower = next(i for i in nodes.voters if i != leader)
    # The fetch the leader answered with ``quiesce``, as a network might deliver it again.
    quiesced = [
        msg
        for msg in nodes.sent
        if isinstance(msg, FetchRequest)
        and msg.replica_id == follower
        and any(
            isinstance(r, FetchResponse) and r.quiesce and r.request_id == msg.request_id
            for r in nodes.sent
        )
    ][-1]
    lead = nodes.drivers[leader]
    nodes.down.add(follower)  # the wake is lost
    nodes.request(leader, produce([4]))
    nodes.advance(20)
    nodes.down.discard(follower)
    nodes.run(leader, lead.raft(KEY, quiesced, nodes.now))  # the late copy arrives
    st = lead.partitions[KEY].core._state
    assert follower in st.wake_unacked  # still to be woken: the copy is not a new fetch
    nodes.advance(QUIET.request_timeout_ms + 100)  # the wake is resent
    assert nodes.logs[follower].end_offset == nodes.logs[leader].end_offset


def test_a_silent_leader_node_unquiesces_its_followers_and_they_elect_another() -> None:
    nodes, leader = quiet_cluster()
    epoch = cores(nodes)[leader].epoch
    nodes.down.add(leader)  # a hung or cut-off node: no refused connection to hint it
    nodes.advance(QUIET.fetch_timeout_ms + 3 * QUIET.election_timeout_ms + 1000)
    others = [c for i, c in cores(nodes).items() if i != leader]
    assert any(c.is_leader and c.epoch > epoch for c in others)


def test_a_restarted_leader_node_is_known_by_its_new_incarnation() -> None:
    """A leader node restarted within a heartbeat gap: its old heartbeats vouched for a
    leader that is gone (it restarts resigned), and its followers must not keep trusting
    it. They resume; a leader is elected again."""
    nodes, leader = quiet_cluster()
    epoch = cores(nodes)[leader].epoch
    old = nodes.drivers[leader]
    new = nodes.new_driver(leader)
    new.incarnation = old.incarnation + 1
    nodes.drivers[leader] = new
    nodes.run(
        leader, new.open(KEY, nodes.voters, nodes.logs[leader], nodes.persisted[leader], nodes.now)
    )
    nodes.advance(QUIET.fetch_timeout_ms + 3 * QUIET.election_timeout_ms + 1000)
    leaders = [c for c in cores(nodes).values() if c.is_leader]
    assert len(leaders) == 1 and leaders[0].epoch > epoch


def test_a_leader_whose_quiesced_followers_go_silent_resigns() -> None:
    """Check-quorum still holds for a quiesced leader: its followers' nodes fall silent,
    and it stops leading."""
    nodes, leader = quiet_cluster()
    nodes.down |= {i for i in nodes.voters if i != leader}
    nodes.advance(QUIET.fetch_timeout_ms + QUIET.check_quorum_timeout_ms + 500)
    assert not cores(nodes)[leader].is_leader


def test_a_leader_keeps_its_quorum_with_one_quiesced_follower_and_one_silent() -> None:
    """One follower's node falls silent: the leader counts the other, quiesced one by its
    heartbeats (it does not fetch) and keeps leading; no election."""
    nodes, leader = quiet_cluster()
    epoch = cores(nodes)[leader].epoch
    nodes.down.add(next(i for i in nodes.voters if i != leader))
    nodes.advance(4 * QUIET.check_quorum_timeout_ms)
    core = cores(nodes)[leader]
    assert core.is_leader and core.epoch == epoch


def test_a_leader_elected_while_a_voter_is_silent_keeps_no_timer_for_it() -> None:
    """A leader elected while a voter's node is silent sends that voter nothing and keeps
    no timer once its live follower quiesces (check-quorum rides on that follower's
    heartbeats, BeginQuorumEpoch waits): a dead node costs its peers' partitions
    nothing. When the node is heard again, the leader announces its epoch to it."""
    nodes, leader = quiet_cluster()
    nodes.down.add(leader)
    nodes.advance(QUIET.fetch_timeout_ms + 3 * QUIET.election_timeout_ms + 1000)
    new = next(i for i, c in cores(nodes).items() if i != leader and c.is_leader)
    nodes.advance(3 * QUIET.fetch_max_wait_ms + 1000)
    assert nodes.drivers[new]._next_partition_deadline() is None
    mark = len(nodes.sent)
    nodes.advance(10_000)
    assert all(isinstance(msg, NodeHeartbeat) for msg in nodes.sent[mark:] if msg.src == new)
    assert cores(nodes)[new].is_leader
    nodes.down.discard(leader)
    mark = len(nodes.sent)
    nodes.advance(2 * QUIET.heartbeat_ms)
    told = [
        msg
        for msg in nodes.sent[mark:]
        if isinstance(msg, BeginQuorumEpochRequest) and msg.src == new and msg.dst == leader
    ]
    assert told and told[0].leader_epoch == cores(nodes)[new].epoch
    nodes.advance(1000)
    assert cores(nodes)[leader].leader_id == new


def test_a_leader_with_one_voter_silent_resigns_when_the_other_falls_silent() -> None:
    """Check-quorum sleeps while the leader and a quiesced voter are a majority; the
    second voter's node falling silent starts it again, and the leader resigns."""
    nodes, leader = quiet_cluster()
    first, second = (i for i in nodes.voters if i != leader)
    nodes.down.add(first)
    nodes.advance(4 * QUIET.check_quorum_timeout_ms)
    assert cores(nodes)[leader].is_leader
    nodes.down.add(second)
    nodes.advance(QUIET.fetch_timeout_ms + QUIET.check_quorum_timeout_ms + 500)
    assert not cores(nodes)[leader].is_leader


def test_leadership_returns_to_the_preferred_replica_once_it_is_caught_up() -> None:
    """auto.leader.rebalance: node 1 (every partition's first replica here) was away
    while another node led; back and caught up, it leads again within one interval."""
    config = QuorumConfig(quiesce=True, rebalance_interval_ms=3000)
    nodes = Nodes(3, config)
    nodes.down.add(1)
    nodes.advance(8000)  # the others hold back for the preferred replica first
    leader = next(i for i, c in cores(nodes).items() if c.is_leader)
    assert leader != 1
    token = nodes.request(leader, produce([5, 6]))
    nodes.advance(200)
    assert nodes.answers[token].error == 0
    nodes.down.discard(1)
    nodes.advance(2 * config.rebalance_interval_ms + 1000)
    now_leading = [i for i, c in cores(nodes).items() if c.is_leader]
    assert now_leading == [1]
    assert record_ids(nodes.logs[1].read(0, 1 << 20)) == [5, 6]


def test_no_hand_over_to_a_preferred_replica_that_lacks_records() -> None:
    nodes = Nodes(3, QuorumConfig(quiesce=True))
    nodes.down.add(1)
    nodes.advance(8000)  # the others hold back for the preferred replica first
    leader = next(i for i, c in cores(nodes).items() if c.is_leader)
    nodes.request(leader, produce([7]))
    nodes.advance(200)
    core = cores(nodes)[leader]
    assert core.hand_over(1, nodes.now).messages == []  # node 1 has not fetched them
    assert core.is_leader


class Partitions:
    """Drivers of nodes 1..3 hosting many partitions, messages delivered in order each
    tick; nodes in ``down`` neither tick nor send nor receive, and ``lost`` messages are
    dropped."""

    def __init__(
        self,
        assignments: dict[PartitionKey, list[int]],
        lost: Callable[[Message], bool] = lambda _: False,
    ) -> None:
        self.drivers = {
            i: Driver(i, "c", REBALANCING, Limits(1 << 20, 5000), random.Random(i))
            for i in (1, 2, 3)
        }
        self.lost = lost
        self.down: set[int] = set()
        self.now = 0
        self.queue: list[tuple[PartitionKey, Message]] = []
        for d in self.drivers.values():
            for k, replicas in assignments.items():
                self.queue += d.open(k, replicas, MemLog(), None, 0).send

    def tick(self) -> None:
        self.now += 10
        for i, d in self.drivers.items():
            if i not in self.down:
                self.queue += d.tick(self.now).send
        assert len(self.queue) < 20_000, f"a message storm at {self.now} ms"
        for _ in range(5_000):
            if not self.queue:
                break
            key, msg = self.queue.pop(0)
            if msg.src not in self.down and msg.dst not in self.down and not self.lost(msg):
                self.queue += self.drivers[msg.dst].raft(key, msg, self.now).send

    def core(self, node: int, key: PartitionKey) -> RaftReplica:
        return self.drivers[node].partitions[key].core


def returning_node(
    keys: list[PartitionKey],
    until: int,
    each_tick: Callable[[int, dict[int, Driver]], None],
    lost: Callable[[Message], bool] = lambda _: False,
) -> None:
    """Node 1, every partition's preferred replica, is away for 8 s while the others
    elect among themselves, then back; ``each_tick`` sees the drivers after every tick's
    deliveries. Messages ``lost`` are dropped."""
    c = Partitions({k: [1, 2, 3] for k in keys}, lost=lost)
    c.down = {1}
    while c.now < until:
        c.tick()
        if c.now == 8000:
            assert not any(c.core(1, k).is_leader for k in keys)
            c.down.clear()
        each_tick(c.now, c.drivers)


def test_leaderships_go_back_to_a_returning_node_a_batch_per_step() -> None:
    """A node away while its partitions elected others takes them back as a stream of
    REBALANCE_BATCH hand-overs per leader node per step, not all in one burst."""
    keys = [("t", i) for i in range(2 * REBALANCE_BATCH + 50)]
    led: list[tuple[int, int]] = []  # (time, partitions node 1 leads)

    def count(now: int, drivers: dict[int, Driver]) -> None:
        led.append((now, sum(drivers[1].partitions[k].core.is_leader for k in keys)))

    returning_node(keys, 30_000, count)
    assert led[-1][1] == len(keys)
    # Within any step, at most a batch from each of the two other nodes.
    span = (REBALANCE_STEP_MS - 10) // 10
    counts = [n for _, n in led]
    assert max(b - a for a, b in zip(counts, counts[span:], strict=False)) <= 2 * REBALANCE_BATCH
    first = next(t for t, n in led if n > 0)
    done = next(t for t, n in led if n == len(keys))
    assert done - first >= REBALANCE_STEP_MS  # more than one step


def test_a_node_hands_several_batches_back_after_one_look_at_its_partitions() -> None:
    """The rebalance looks at every partition once and works through what it found a
    batch per step: a node handing back several batches does not look at all its
    partitions again at each step (with 100,000 partitions, two scans every step held
    the event loop while topics were created)."""
    keys = [("t", i) for i in range(6 * REBALANCE_BATCH)]
    looks: dict[int, list[int]] = {2: [], 3: []}  # per leader node, its looks per tick
    handed: dict[int, list[int]] = {2: [], 3: []}  # and the partitions it leads

    def count(now: int, drivers: dict[int, Driver]) -> None:
        for i in (2, 3):
            looks[i].append(drivers[i].rebalance_looks)
            handed[i].append(sum(drivers[i].partitions[k].core.is_leader for k in keys))

    returning_node(keys, 30_000, count)
    for i in (2, 3):
        assert handed[i][-1] == 0
        # The ticks from its first hand-over back to its last: more than two batches.
        peak = handed[i].index(max(handed[i]))
        assert handed[i][peak] > 2 * REBALANCE_BATCH
        first = next(t for t in range(peak, len(handed[i])) if handed[i][t] < handed[i][peak])
        last = handed[i].index(0, peak)
        # One look found them all; the step that handed the last back looked again
        # (for partitions whose preferred replica was not caught up at the first).
        assert looks[i][last] - looks[i][first - 1] <= 2


def test_a_node_keeps_at_most_a_batch_of_hand_overs_in_flight() -> None:
    """Hand-overs that do not complete (here their EndQuorumEpoch is lost, so nobody
    stands until the resigned leaders' own timers run out) hold the next ones back: a
    node has at most REBALANCE_BATCH in flight however many steps pass."""
    keys = [("t", i) for i in range(3 * REBALANCE_BATCH)]
    resigned: list[int] = []  # most partitions resigned on one node, per tick

    def count(now: int, drivers: dict[int, Driver]) -> None:
        resigned.append(
            max(
                sum(drivers[i].partitions[k].core.state_name == "resigned" for k in keys)
                for i in (2, 3)
            )
        )

    returning_node(keys, 12_000, count, lambda msg: isinstance(msg, EndQuorumEpochRequest))
    assert max(resigned) == REBALANCE_BATCH


def _hand_over(c: Partitions, key: PartitionKey, src: int, dst: int) -> None:
    d = c.drivers[src]
    p = d.partitions[key]
    ready = Ready()
    p.run(p.core.hand_over(dst, c.now), c.now, ready)
    d._schedule(p)
    c.queue += ready.send


@pytest.mark.parametrize(("moved", "back"), [(1, False), (2, False), (3, True)])
def test_a_node_takes_its_partitions_back_only_past_the_imbalance_threshold(
    moved: int, back: bool
) -> None:
    """leader.imbalance.per.broker.percentage: node 1 prefers 20 partitions; with 1 or 2
    of them (5%, 10%) led by node 2 nothing moves (no election for a small imbalance);
    with 3 (15%) all of them go back to node 1."""
    assert REBALANCING.rebalance_imbalance_pct == 10
    keys = [("t", i) for i in range(20)]
    c = Partitions({k: [1, 2, 3] for k in keys})
    while c.now < 5000:
        c.tick()
    assert all(c.core(1, k).is_leader for k in keys)
    for k in keys[:moved]:
        _hand_over(c, k, 1, 2)
    while c.now < 5500:  # before node 2's next rebalance check (every 3 s from 0)
        c.tick()
    assert [k for k in keys if c.core(2, k).is_leader] == keys[:moved]
    end = c.now + 2 * REBALANCING.rebalance_interval_ms + 1000
    while c.now < end:
        c.tick()
    led_by_2 = [k for k in keys if c.core(2, k).is_leader]
    assert led_by_2 == ([] if back else keys[:moved])
    assert all(c.core(1, k).is_leader for k in keys if k not in led_by_2)


def test_a_node_past_the_threshold_takes_all_its_partitions_back() -> None:
    """Once past the threshold, every partition preferring the node goes back to it (as
    Kafka elects every preferred leader of an imbalanced broker), not only enough to
    get under the threshold again."""
    keys = [("t", i) for i in range(20)]
    c = Partitions({k: [1, 2, 3] for k in keys})
    while c.now < 5000:
        c.tick()
    for k in keys[:3]:
        _hand_over(c, k, 1, 2)
    while c.now < 5500:
        c.tick()
    d2 = c.drivers[2]
    assert d2._imbalanced() == {1}  # 15% of node 1's partitions led elsewhere
    for k in keys[:2]:
        _hand_over(c, k, 2, 1)
    while c.now < 5900:  # node 2's rebalance checks at 3 s, 6 s, ...
        c.tick()
    assert [k for k in keys if c.core(2, k).is_leader] == keys[2:3]
    assert d2._imbalanced() == {1}  # 5% left: still taking them back
    while c.now < 6500:
        c.tick()
    assert all(c.core(1, k).is_leader for k in keys)
    assert d2._imbalanced() == set()


def test_the_survivors_of_a_dead_leader_stand_in_assignment_order_without_splitting() -> None:
    """Node 3, leader of every partition, is gone (its connections refused): of the two
    survivors the first in the partition's assignment stands first, so each partition
    is led again in the next epoch (no split vote), by the node its assignment puts
    first; the dead node's leaderships spread as the assignments do."""
    keys = [("t", i) for i in range(200)]
    assignments = {k: [3, 1, 2] if k[1] % 2 else [3, 2, 1] for k in keys}
    c = Partitions(assignments)
    while c.now < 5000:
        c.tick()
    assert all(c.core(3, k).is_leader and c.core(3, k).epoch == 1 for k in keys)
    c.down = {3}
    for i in (1, 2):
        sent = c.drivers[i].peer_unreachable(3, c.now).send
        # No fetch to the dead node: its quiesced followers resume without one.
        assert not [msg for _, msg in sent if isinstance(msg, FetchRequest) and msg.dst == 3]
        c.queue += sent
    while c.now < 7000:
        c.tick()
    for k in keys:
        first = assignments[k][1]
        assert c.core(first, k).is_leader and c.core(first, k).epoch == 2, k


def _second_leader_dies_as_the_first_restarts() -> tuple[Nodes, int, int, Driver]:
    """The leader (``first``) dies and another voter (``second``) takes over; then
    ``second`` dies as ``first`` comes back, with a new driver (``new``) over its log."""
    nodes, first = quiet_cluster()
    nodes.down.add(first)
    for i in nodes.voters:
        if i != first:
            nodes.run(i, nodes.drivers[i].peer_unreachable(first, nodes.now))
    nodes.advance(QUIET.fetch_timeout_ms)
    live = cores(nodes)
    (second,) = [i for i in nodes.voters if i != first and live[i].is_leader]  # type: ignore[attr-defined]
    new = nodes.new_driver(first)
    new.incarnation = nodes.drivers[first].incarnation + 1
    nodes.drivers[first] = new
    nodes.down = {second}
    nodes.run(
        first, new.open(KEY, nodes.voters, nodes.logs[first], nodes.persisted[first], nodes.now)
    )
    return nodes, first, second, new


def test_a_survivor_does_not_wait_for_a_node_restarted_a_moment_ago() -> None:
    """The leader dies as the node that led before it comes back, before its
    announcement reached that node. The restarted node, ranked first among the
    survivors, is resigned in its old epoch (what it sent while its links were coming up
    was lost) and does not follow the new leader, so it takes no hint and does not
    stand. The other survivor's node heard its new incarnation less than a fetch
    timeout ago (``PeerLiveness.settled``) and does not wait a fetch timeout for it: a
    leader within half an election timeout (without the rule, none before the fetch
    timeout)."""
    nodes, first, second, new = _second_leader_dies_as_the_first_restarts()
    (other,) = [i for i in nodes.voters if i not in (first, second)]
    order = [v for v in nodes.voters if v != second]
    assert order.index(first) < order.index(other)  # the restarted node is ranked ahead
    epoch = nodes.drivers[second].partitions[KEY].core.epoch  # its epoch as it died
    nodes.queue = [msg for msg in nodes.queue if msg.src != first]  # no link up yet
    nodes.advance(10)  # then its heartbeat reaches the other survivor
    assert new.partitions[KEY].core.leader_id != second
    nodes.run(other, nodes.drivers[other].peer_unreachable(second, nodes.now))
    nodes.advance(QUIET.election_timeout_ms // 2)
    now_led = cores(nodes)
    assert now_led[other].is_leader and now_led[other].epoch == epoch + 1  # type: ignore[attr-defined]


def test_a_tick_steps_at_most_tick_partitions_and_leaves_the_rest_due() -> None:
    """Thousands of timers falling due together are stepped TICK_PARTITIONS per tick, so
    one tick (which sends the node's heartbeats) never stalls the node."""
    d = Driver(1, "c", QuorumConfig(quiesce=True), Limits(1 << 20, 5000), random.Random(1))
    keys = [("t", i) for i in range(2 * TICK_PARTITIONS + 100)]
    for k in keys:
        d.open(k, [1, 2, 3], MemLog(), None, 0)  # node 1 stands first for each
    stood: list[set[PartitionKey]] = []
    for now in (5000, 5010, 5020, 5030):
        stood.append({k for k, msg in d.tick(now).send if not isinstance(msg, NodeHeartbeat)})
    assert [len(s) for s in stood] == [TICK_PARTITIONS, TICK_PARTITIONS, 100, 0]
    assert set().union(*stood) == set(keys)


def test_a_peer_change_reaches_its_partitions_a_tick_at_a_time_and_each_once() -> None:
    """A node of thousands of partitions tells them of a peer's change
    PEER_NEWS_PARTITIONS per tick (one step telling all held its loop for a third of a
    second); a restart noticed by the heartbeat that also ends the peer's silence is one
    change, and a change that comes while an earlier one is being told replaces it."""
    told: list[tuple[int, int]] = []

    class Counting(RaftReplica):
        def on_peer_change(self, peer: int, now_ms: int) -> object:
            told.append((id(self), peer))
            return super().on_peer_change(peer, now_ms)

    d = Driver(1, "c", QUIET, Limits(1 << 20, 5000), random.Random(1), Counting)
    n = 2 * PEER_NEWS_PARTITIONS + 100
    for i in range(n):
        d.open(("t", i), [2, 3, 1], MemLog(), None, 0)

    def heartbeat(src: int, incarnation: int, now: int) -> None:
        d.raft(
            NODE_KEY, NodeHeartbeat(cluster_id="c", src=src, dst=1, incarnation=incarnation), now
        )

    heartbeat(2, 5, 100)
    heartbeat(3, 7, 100 + QUIET.fetch_timeout_ms - 50)
    d.tick(100 + QUIET.fetch_timeout_ms)  # node 2 (last heard at 100) is suspect
    silent_at = 110 + QUIET.fetch_timeout_ms  # ... and silent
    per_step = []
    for now in range(silent_at, silent_at + 40, 10):
        if now == silent_at + 10:
            # Node 2 restarted: it is back, under a new incarnation. The step that
            # notices it tells the first partitions of it at once.
            mark = len(told)
            heartbeat(2, 6, now)
            per_step.append(len(told) - mark)
        mark = len(told)
        d.tick(now)
        per_step.append(len(told) - mark)
        if now < silent_at + 20:
            assert d.next_deadline_ms() == now  # more to tell: due at once
    batch = PEER_NEWS_PARTITIONS
    # The silence: a batch told at its tick. The restart: a batch by its step, then a
    # batch and 100 by ticks.
    assert per_step == [batch, batch, batch, 100, 0]
    assert {peer for _, peer in told} == {2}
    latest = told[PEER_NEWS_PARTITIONS:]
    assert len({core for core, _ in latest}) == len(latest) == n


def test_a_silent_peer_is_declared_by_the_second_tick_that_finds_it_silent() -> None:
    """A tick may come before the node reads frames that waited in its socket while its
    loop was busy: the first tick that finds a peer silent only suspects it, and what
    the node reads before the next tick clears it. A peer still unheard then is stale,
    and its partitions are told."""
    d = Driver(1, "c", QUIET, Limits(1 << 20, 5000), random.Random(1))
    d.open(KEY, [1, 2, 3], MemLog(), None, 0)

    def heartbeat(src: int, now: int) -> None:
        d.raft(NODE_KEY, NodeHeartbeat(cluster_id="c", src=src, dst=1, incarnation=src), now)

    timeout = QUIET.fetch_timeout_ms
    heartbeat(2, 0)
    heartbeat(3, 0)
    d.tick(timeout)
    assert d.liveness.stale == set() and d.liveness.suspect == {2, 3}
    heartbeat(2, timeout + 5)  # read after the tick: it was waiting in the socket
    heartbeat(3, timeout + 5)
    d.tick(timeout + 10)
    assert d.liveness.stale == set() and d.liveness.suspect == set()
    heartbeat(3, 2 * timeout)
    d.tick(2 * timeout + 5)  # node 2: silent since timeout + 5
    assert d.liveness.suspect == {2} and d.liveness.stale == set()
    d.tick(2 * timeout + 15)
    assert d.liveness.stale == {2} and d.liveness.suspect == set()


def test_a_replica_that_follows_a_leader_found_refusing_takes_the_hint_then() -> None:
    """The transport tells a refusal once. A replica whose node found the leader refusing
    before the replica followed it (its node had just restarted and learnt of the
    leader's epoch from another voter afterwards) is told when it follows: it stands at
    once instead of waiting out its fetch timeout, while the voters ranked behind it
    wait for it to stand."""
    nodes, first, second, new = _second_leader_dies_as_the_first_restarts()
    nodes.run(first, new.peer_unreachable(second, nodes.now))  # before it follows anyone
    core = new.partitions[KEY].core
    assert core.leader_id != second
    end = nodes.now + 5 * QUIET.election_timeout_ms
    while core.leader_id != second and nodes.now < end:
        nodes.advance(10)
    assert core.leader_id == second, "it never learnt of the new leader"
    assert core._state.leader_unreachable  # type: ignore[union-attr]
