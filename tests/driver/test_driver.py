"""The driver's rules, step by step, with its Ready executed by a minimal in-test executor
(the simulator runs the same driver under faults)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quorumlog.replica.driver import Driver, Limits, Ready
from quorumlog.replica.driver.driver import NEW_PARTITION_SPREAD_US
from quorumlog.replica.protocol import ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import (
    ElectionState,
    FetchRequest,
    FetchResponse,
    Message,
    QuorumConfig,
    VoteRequest,
)
from quorumlog.replica.storage import Log
from quorumlog.replica.storage.records import encode_batch

from tests.sim.memlog import MemLog, client_batch, decode_batches
from tests.support.messages import consumer_fetch

KEY = ("t", 0)
CONFIG = QuorumConfig()


class Nodes:
    """Drivers of nodes 1..n; flushes happen only when the test says so."""

    def __init__(
        self, n: int, config: QuorumConfig = CONFIG, log: Callable[[int], Any] | None = None
    ) -> None:
        self.now = 0
        self.config = config
        voters = list(range(1, n + 1))
        self.voters = voters
        self.logs = {i: MemLog() if log is None else log(i) for i in voters}
        self.persisted: dict[int, ElectionState | None] = dict.fromkeys(voters)
        self.drivers = {i: self.new_driver(i) for i in voters}
        self.wants_flush: set[int] = set()
        self.queue: list[Message] = []
        self.sent: list[Message] = []  # everything delivered (or dropped), in order
        self.down: set[int] = set()  # nodes whose messages are lost both ways
        self.answers: dict[int, object] = {}
        self.readies: list[tuple[int, Ready]] = []
        self.token = 0
        for i in voters:
            self.run(i, self.drivers[i].open(KEY, voters, self.logs[i], None, 0))

    def run(self, i: int, ready: Ready) -> Ready:
        self.readies.append((i, ready))
        for _, state in ready.persist:
            self.persisted[i] = state
        self.wants_flush |= {i for _ in ready.flush}
        self.queue += [msg for _, msg in ready.send]
        self.answers.update(ready.answers)
        return ready

    def flush(self, i: int) -> Ready:
        self.logs[i].flush()
        self.wants_flush.discard(i)
        return self.run(i, self.drivers[i].flushed(KEY, self.now))

    def new_driver(self, i: int) -> Driver:
        return Driver(i, "c", self.config, Limits(1 << 20, 5000), random.Random(i))

    def deliver(self) -> None:
        for _ in range(10000):
            if not self.queue:
                return
            msg = self.queue.pop(0)
            self.sent.append(msg)
            if msg.src in self.down or msg.dst in self.down:
                continue
            self.run(msg.dst, self.drivers[msg.dst].raft(KEY, msg, self.now))

    def advance(self, ms: int, *, flush: bool = True) -> None:
        end = self.now + ms
        while self.now < end:
            self.now += 10
            for i, d in self.drivers.items():
                if i in self.down:
                    continue
                self.run(i, d.tick(self.now))
                if flush and i in self.wants_flush:
                    self.flush(i)
            self.deliver()

    def leader(self) -> int:
        self.advance(3000)
        leaders = [i for i, d in self.drivers.items() if d.partitions[KEY].core.is_leader]
        assert len(leaders) == 1
        return leaders[0]

    def request(self, i: int, req: object) -> int:
        self.token += 1
        self.run(i, self.drivers[i].request(self.token, KEY, req, self.now))  # type: ignore[arg-type]
        return self.token

    def request_many(self, i: int, reqs: list[Any]) -> list[int]:
        """``reqs`` handed to node ``i``'s driver together (``Driver.request_many``)."""
        first = self.token + 1
        self.token += len(reqs)
        items = [(first + n, KEY, req) for n, req in enumerate(reqs)]
        self.run(i, self.drivers[i].request_many(items, self.now))
        return [token for token, _, _ in items]


def produce(ids: list[int], acks: int = m.ACKS_QUORUM, timeout_ms: int = 0) -> m.ProduceRequest:
    return m.ProduceRequest(
        topic="t", partition=0, acks=acks, timeout_ms=timeout_ms, records=client_batch(ids)
    )


def fetch(offset: int, epoch: int = m.NO_EPOCH, wait: int = 0) -> m.FetchRequest:
    return consumer_fetch(fetch_offset=offset, current_leader_epoch=epoch, max_wait_ms=wait)


def record_ids(records: bytes) -> list[int]:
    return [i for *_, ids in decode_batches(records) for i in ids if i > 0]


def test_acks_quorum_is_answered_only_once_a_majority_holds_the_records_durably() -> None:
    nodes = Nodes(3)
    leader = nodes.leader()
    token = nodes.request(leader, produce([7, 8]))
    nodes.deliver()  # followers fetch the records but have not flushed them yet
    nodes.advance(10, flush=False)
    assert token not in nodes.answers
    nodes.advance(200)
    resp = nodes.answers[token]
    assert isinstance(resp, m.ProduceResponse) and resp.error == 0
    assert resp.last_offset - resp.base_offset == 1
    assert nodes.drivers[leader].partitions[KEY].core.high_watermark > resp.last_offset


def test_a_follower_fetch_waits_for_its_flush() -> None:
    """Flush before send: a follower's fetch tells the leader what is durable there."""
    nodes = Nodes(3)
    leader = nodes.leader()
    nodes.request(leader, produce([1]))
    nodes.flush(leader)
    nodes.advance(10, flush=False)  # followers append, do not flush
    follower = next(i for i in nodes.drivers if i != leader)
    assert nodes.logs[follower].durable_end_offset < nodes.logs[follower].end_offset
    held = nodes.drivers[follower].partitions[KEY].held
    assert held and all(isinstance(msg, FetchRequest) for h in held for msg in h.messages)
    assert not any(
        isinstance(msg, FetchRequest) and msg.replica_id == follower for msg in nodes.queue
    )
    released = nodes.flush(follower)
    assert any(isinstance(msg, FetchRequest) for _, msg in released.send)


def test_a_vote_is_persisted_in_the_ready_that_sends_it() -> None:
    nodes = Nodes(3)
    nodes.advance(3000)
    for i, ready in nodes.readies:
        votes = [msg for _, msg in ready.send if isinstance(msg, VoteRequest) and not msg.pre_vote]
        for vote in votes:
            assert ready.persist and ready.persist[-1][1].epoch == vote.candidate_epoch, i


def test_a_consumer_is_served_committed_records_only_and_long_polls_for_more() -> None:
    nodes = Nodes(1)
    leader = nodes.leader()
    epoch = nodes.drivers[leader].partitions[KEY].core.epoch
    nodes.request(leader, produce([1, 2], acks=m.ACKS_LEADER))
    end = nodes.logs[leader].end_offset
    waiting = nodes.request(leader, fetch(1, epoch, wait=500))  # offset 1: not committed
    assert waiting not in nodes.answers
    nodes.flush(leader)  # the HWM passes the records: the waiting fetch is answered
    resp = nodes.answers[waiting]
    assert isinstance(resp, m.FetchResponse) and resp.error == 0
    assert record_ids(resp.records) == [1, 2] and resp.high_watermark == end
    expired = nodes.request(leader, fetch(end, epoch, wait=100))
    nodes.advance(90, flush=False)
    assert expired not in nodes.answers
    nodes.advance(20, flush=False)
    assert nodes.answers[expired].records == b""  # type: ignore[attr-defined]


def test_a_new_leader_answers_offset_not_available_until_its_epoch_commits() -> None:
    """After a restart every replica's HWM is 0. A leader elected then must not answer a
    consumer with that stale HWM (a reader would take the log for empty): Fetch and
    ListOffsets get OFFSET_NOT_AVAILABLE, and a long poll is held, until an entry of its
    epoch commits."""
    nodes = Nodes(3)
    leader = nodes.leader()
    nodes.request(leader, produce([1, 2, 3]))
    nodes.advance(500)
    end = nodes.drivers[leader].partitions[KEY].core.high_watermark
    assert end == nodes.logs[leader].end_offset > 3
    for i in nodes.voters:  # every node restarts: none knows the HWM
        nodes.drivers[i] = nodes.new_driver(i)
        nodes.run(i, nodes.drivers[i].open(KEY, nodes.voters, nodes.logs[i], nodes.persisted[i], 0))
    for _ in range(1000):
        leaders = [i for i, d in nodes.drivers.items() if d.partitions[KEY].core.is_leader]
        if leaders:
            break
        nodes.advance(10, flush=False)
    (new_leader,) = leaders
    assert nodes.drivers[new_leader].partitions[KEY].core.high_watermark < end
    latest = m.ListOffsetsRequest(
        topic="t", partition=0, current_leader_epoch=m.NO_EPOCH, timestamp=m.LATEST_TIMESTAMP
    )
    early = [nodes.request(new_leader, req) for req in (fetch(0), latest)]
    polled = nodes.request(new_leader, fetch(0, wait=1000))
    for token in early:
        assert nodes.answers[token].error == ErrorCode.OFFSET_NOT_AVAILABLE  # type: ignore[attr-defined]
    assert polled not in nodes.answers
    nodes.advance(500)  # the epoch's leader-change record commits
    resp = nodes.answers[polled]
    assert isinstance(resp, m.FetchResponse) and resp.error == 0
    assert record_ids(resp.records) == [1, 2, 3]
    offset = nodes.answers[nodes.request(new_leader, latest)]
    assert isinstance(offset, m.ListOffsetsResponse) and offset.error == 0
    assert offset.offset == nodes.logs[new_leader].end_offset > end


def test_consumer_fetches_are_fenced_by_leader_epoch() -> None:
    nodes = Nodes(3)
    leader = nodes.leader()
    epoch = nodes.drivers[leader].partitions[KEY].core.epoch
    follower = next(i for i in nodes.drivers if i != leader)
    cases = [
        (leader, epoch - 1, ErrorCode.FENCED_LEADER_EPOCH),
        (leader, epoch + 1, ErrorCode.UNKNOWN_LEADER_EPOCH),
        (follower, epoch, ErrorCode.NOT_LEADER),
        (follower, -1, ErrorCode.NOT_LEADER),
        (leader, epoch, ErrorCode.NONE),
    ]
    for node, asked, code in cases:
        resp = nodes.answers[nodes.request(node, fetch(0, asked))]
        assert resp.error == code, (node, asked)  # type: ignore[attr-defined]


def test_waiting_produces_fail_when_leadership_is_lost_and_expire_at_their_deadline() -> None:
    nodes = Nodes(3)
    leader = nodes.leader()
    timed = nodes.request(leader, produce([1], timeout_ms=50))
    nodes.advance(60, flush=False)
    expired = nodes.answers[timed]
    assert expired.error == ErrorCode.REQUEST_TIMED_OUT  # type: ignore[attr-defined]
    waiting = nodes.request(leader, produce([2]))
    nodes.run(leader, nodes.drivers[leader].begin_shutdown(nodes.now))
    resp = nodes.answers[waiting]
    assert resp.error == ErrorCode.NOT_LEADER  # type: ignore[attr-defined]


def test_a_backlog_of_waiting_produces_is_answered_in_order_and_each_expires_on_time() -> None:
    """Produces wait in offset order (each HWM advance answers from the front); one with
    a short timeout behind others with long ones still expires at its own deadline."""
    nodes = Nodes(3)
    leader = nodes.leader()
    p = nodes.drivers[leader].partitions[KEY]
    long = [nodes.request(leader, produce([i], timeout_ms=60_000)) for i in range(1, 200)]
    short = nodes.request(leader, produce([500], timeout_ms=50))
    assert p.next_deadline_ms() is not None and p.next_deadline_ms() <= nodes.now + 50
    nodes.advance(60, flush=False)  # nothing durable: nothing commits
    assert nodes.answers[short].error == ErrorCode.REQUEST_TIMED_OUT  # type: ignore[attr-defined]
    assert not any(t in nodes.answers for t in long)
    nodes.advance(300)
    offsets = [nodes.answers[t].base_offset for t in long]  # type: ignore[attr-defined]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(long)
    assert not p.waiters and p.waiters_due is None


def test_unknown_partitions_and_closed_ones_answer_every_request() -> None:
    nodes = Nodes(1)
    leader = nodes.leader()
    d = nodes.drivers[leader]
    ready = d.request(1, ("other", 0), fetch(0), nodes.now)
    assert ready.answers[0][1].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[attr-defined]
    waiting = nodes.request(leader, fetch(nodes.logs[leader].end_offset, wait=1000))
    nodes.run(leader, d.close(KEY))
    assert nodes.answers[waiting].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[attr-defined]


def test_a_fetch_held_for_data_that_a_repair_cut_is_dropped_not_sent() -> None:
    """A follower's fetch waits for its flush; damage found meanwhile cuts the log below
    the offset that fetch names. That fetch must never reach the leader (it would count
    records this replica no longer holds), and the replica must go on fetching."""
    nodes = Nodes(3)
    leader = nodes.leader()
    nodes.request(leader, produce([1, 2, 3]))
    nodes.flush(leader)
    follower = next(i for i in nodes.drivers if i != leader)
    nodes.advance(10, flush=False)  # the follower appends the records, holds its fetch
    p = nodes.drivers[follower].partitions[KEY]
    assert p.held
    stale_end = p.held[-1].needs
    nodes.run(follower, nodes.drivers[follower].on_corruption(KEY, 1, nodes.now))
    released = nodes.flush(follower)
    sent = [m for _, m in released.send if isinstance(m, FetchRequest)] + [
        m for m in nodes.queue if isinstance(m, FetchRequest) and m.replica_id == follower
    ]
    assert all(m.fetch_offset < stale_end for m in sent)
    nodes.advance(3000)
    assert nodes.logs[follower].end_offset == nodes.logs[leader].end_offset


def test_a_gap_in_a_producers_sequence_is_final_only_once_the_leaders_epoch_commits() -> None:
    """A leader lacking a producer's earlier batch refuses the next one, but calls it
    out of order (final: the client renumbers under a new epoch) only once an entry of
    its own epoch is committed; before, an earlier leader's uncommitted tail holding that
    batch could still be committed, and the answer is a retriable NOT_ENOUGH_REPLICAS."""
    nodes = Nodes(3)
    leader = nodes.leader()  # an empty log: its leader-change record waits for records
    gap = m.ProduceRequest(
        topic="t",
        partition=0,
        acks=m.ACKS_QUORUM,
        timeout_ms=0,
        records=client_batch([41], (9, 0, 3)),  # producer 9 at sequence 3, 0-2 not here
    )
    early = nodes.request(leader, gap)
    assert getattr(nodes.answers[early], "error", None) == ErrorCode.NOT_ENOUGH_REPLICAS
    first = nodes.request(leader, produce([7]))  # the epoch's first records commit it
    nodes.advance(300)
    assert getattr(nodes.answers[first], "error", None) == 0
    late = nodes.request(leader, gap)
    assert getattr(nodes.answers[late], "error", None) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def _stand_times(opens: list[int]) -> list[int | None]:
    """Open one new partition at each time of ``opens`` on node 1, its preferred replica:
    when each stands as a candidate."""
    d = Driver(1, "c", CONFIG, Limits(1 << 20, 5000), random.Random(1))
    for p, now in enumerate(opens):
        d.open(("t", p), [1, 2, 3], MemLog(), None, now)
    return [d.partitions[("t", p)].core.next_deadline_ms() for p in range(len(opens))]


def test_new_partitions_opened_at_once_stand_the_spread_apart() -> None:
    timeout = CONFIG.election_timeout_ms
    stands = _stand_times([0] * 1000)
    assert stands == [timeout + i * NEW_PARTITION_SPREAD_US // 1000 for i in range(1000)]


def test_new_partitions_opened_slower_than_the_spread_stand_an_election_timeout_after() -> None:
    """A node opening thousands of replicas takes longer than the spread per open: each
    stands an election timeout after its open, the spread not added on top (it was: a
    topic of 10,000 partitions whose opens took 3 s was led 3 s later than it needed)."""
    timeout = CONFIG.election_timeout_ms
    opens = list(range(1000))  # one a millisecond
    assert _stand_times(opens) == [t + timeout for t in opens]
    # Opens faster than the spread after a slow stretch: spread from the last slot.
    opens = [0, 1, 2] + [2] * 10
    assert _stand_times(opens) == [timeout, timeout + 1, timeout + 2] + [
        ((timeout + 2) * 1000 + j * NEW_PARTITION_SPREAD_US) // 1000 for j in range(1, 11)
    ]


class ThrottledNodes(Nodes):
    """Nodes whose leaders send observers 1,000 bytes a second at most."""

    def new_driver(self, i: int) -> Driver:
        limits = Limits(1 << 20, 5000, catch_up_bytes_per_s=1000)
        return Driver(i, "c", self.config, limits, random.Random(i))


class Leading:
    """The leader of ``nodes`` once ``records`` records are written and replicated, and
    a fetch of partition KEY sent to it by a replica (its answers in that step)."""

    def __init__(self, nodes: Nodes, records: int = 50) -> None:
        self.nodes = nodes
        self.id = nodes.leader()
        nodes.request(self.id, produce(list(range(records))))
        nodes.advance(200)
        self.driver = nodes.drivers[self.id]
        self.p = self.driver.partitions[KEY]
        self.epoch = self.p.core.epoch

    def fetch(
        self, replica: int, offset: int = 0, last_epoch: int = -1, max_wait_ms: int = 0
    ) -> list[FetchResponse]:
        from tests.raft.harness import fetch as raft_fetch

        req = raft_fetch(replica, self.epoch, offset, last_epoch, cluster="c", dst=self.id)
        if max_wait_ms:
            req = dataclasses.replace(req, max_wait_ms=max_wait_ms)
        ready = self.driver.raft(KEY, req, self.nodes.now)
        return [msg for _, msg in ready.send if isinstance(msg, FetchResponse)]


def test_answers_with_records_to_an_observer_are_paced_by_the_throttle() -> None:
    """A replica a reassignment is adding (an observer) catches up at the node's
    catch-up rate: each answer that carries records waits for the ones before it to have
    had their time; the voters' answers never wait."""
    nodes = ThrottledNodes(3)
    led = Leading(nodes)
    driver, p = led.driver, led.p
    first = led.fetch(9)
    assert len(first) == 1 and first[0].records  # the bucket was empty: at once
    size = len(first[0].records)
    assert led.fetch(9) == []  # paced: held for size / 1000 s
    assert [at for at, _ in p.paced.values()] == [nodes.now + size]  # 1,000 bytes a second
    # The observer asks again (its request timed out): the same turn, counted once.
    free_at = driver.throttle.free_at if driver.throttle else 0
    assert led.fetch(9) == [] and len(p.paced) == 1
    assert driver.throttle is not None and driver.throttle.free_at == free_at
    deadline = p.next_deadline_ms()
    assert deadline is not None and deadline <= nodes.now + size
    nodes.now += size + 1
    sent = driver.tick(nodes.now).send
    released = [msg for _, msg in sent if isinstance(msg, FetchResponse) and msg.dst == 9]
    assert len(released) == 1 and released[0].records and not p.paced
    # A voter's fetch is answered at once, throttle or not.
    follower = next(i for i in nodes.voters if i != led.id)
    assert any(msg.dst == follower for msg in led.fetch(follower))


def test_a_catch_up_rate_set_while_an_answer_waits_takes_effect_at_once() -> None:
    """The cluster's metadata may change the throttle while moves run (``partition
    reassign --throttle``): an answer held under the old rate goes on the next tick, and
    observers are paced by the new rate from then on (none: answered at once)."""
    nodes = ThrottledNodes(3)
    led = Leading(nodes)
    driver, p = led.driver, led.p
    assert led.fetch(9) and led.fetch(8) == []  # 8 waits behind 9's answer
    assert len(p.paced) == 1
    driver.set_catch_up_rate(0, nodes.now)  # the throttle lifted
    assert driver.throttle is None and p.throttle is None
    nodes.now += 1
    sent = driver.tick(nodes.now).send
    assert [msg.dst for _, msg in sent if isinstance(msg, FetchResponse)] == [8] and not p.paced
    assert led.fetch(7)  # unthrottled: at once
    driver.set_catch_up_rate(1000, nodes.now)  # and back on
    assert p.throttle is driver.throttle and driver.throttle is not None
    assert led.fetch(6) and led.fetch(5) == []  # paced again


def test_answers_held_under_the_throttle_are_dropped_when_the_leader_stops_leading() -> None:
    """An answer paced for an observer speaks as the leader that read its records: once
    that replica no longer leads, it is not sent (the observer fetches from the next
    leader), as a produce waiting for its quorum is failed then."""
    nodes = ThrottledNodes(3)
    led = Leading(nodes)
    driver, p = led.driver, led.p
    led.fetch(9)
    led.fetch(8)
    assert len(p.paced) == 1  # 8's answer waits behind 9's
    ready = driver.begin_shutdown(nodes.now)  # it resigns
    assert not p.core.is_leader and not p.paced
    nodes.now += 60_000
    sent = ready.send + driver.tick(nodes.now).send
    assert not [msg for _, msg in sent if isinstance(msg, FetchResponse) and msg.dst == 8]


def test_a_replicas_new_fetch_supersedes_its_fetch_parked_at_the_leader() -> None:
    """A fetch parked (long-poll) is handled again when records arrive. A newer fetch of
    the same replica supersedes it: handled after that one, the old fetch would report
    the replica where it was (a copy its node has since deleted and made anew, empty)
    as of the later time, and the leader could add the empty copy as a caught-up voter."""
    nodes = Nodes(3)
    led = Leading(nodes, records=5)
    p = led.p
    end = p.log.end_offset
    led.fetch(9, end, led.epoch, max_wait_ms=500)
    led.fetch(9, end, led.epoch, max_wait_ms=500)  # nothing new: parked
    assert 9 in [f.request.replica_id for f in p.parked]
    led.fetch(9, max_wait_ms=500)  # the copy made anew, from nothing
    assert 9 not in [f.request.replica_id for f in p.parked]
    nodes.request(led.id, produce([7]))  # records wake what is parked
    nodes.advance(50)
    row = p.core.describe(nodes.now).observers
    assert [(r.replica_id, r.end_offset) for r in row] == [(9, 0)]


def test_what_producers_append_during_a_catch_up_reaches_the_observer_unpaced() -> None:
    """The throttle paces an observer's backlog, not the writes that arrive while it
    catches up: an answer holding only records appended since that observer's previous
    answer goes at once though the throttle's turn is still ahead, so a throttle below
    the write rate slows a move but never stops it from ending. Without the rule, the
    answer below waits for the turn."""
    nodes = ThrottledNodes(3)
    led = Leading(nodes)
    driver, p = led.driver, led.p
    first = led.fetch(9)
    assert len(first) == 1 and first[0].records  # the whole backlog, charged
    caught_up = p.log.end_offset
    assert driver.throttle is not None and driver.throttle.free_at > nodes.now
    nodes.request(led.id, produce(list(range(5))))  # written during the catch-up
    nodes.advance(50)
    assert p.log.end_offset > caught_up
    assert driver.throttle.free_at > nodes.now  # the backlog's turn is still ahead
    answer = led.fetch(9, caught_up, led.epoch)
    assert len(answer) == 1 and answer[0].records and not p.paced  # sent at once
    # A backlog again (the observer asks from the start): paced as before.
    assert led.fetch(9) == [] and len(p.paced) == 1


def test_a_new_replica_of_a_move_looks_for_the_leader_at_once() -> None:
    """A replica a reassignment opens on a node outside the partition's voters (an
    observer) has no election to wait for: it asks the voters for the leader from its
    first tick. It took the hold of a new partition's follower (ten election timeouts,
    4.4 s by default), so every move's new replicas started fetching seconds late."""
    nodes = Nodes(3)
    leader = nodes.leader()
    nodes.logs[4] = MemLog()
    nodes.drivers[4] = nodes.new_driver(4)
    nodes.run(4, nodes.drivers[4].open(KEY, nodes.voters, nodes.logs[4], None, nodes.now))
    observer = nodes.drivers[4].partitions[KEY].core
    opened = nodes.now
    while observer.leader_id is None and nodes.now - opened < 10 * CONFIG.election_timeout_ms:
        nodes.advance(10)
    assert observer.leader_id == leader
    assert nodes.now - opened <= CONFIG.retry_backoff_ms + CONFIG.request_timeout_ms


def test_a_move_copies_to_one_new_replica_at_a_time() -> None:
    """Of the new replicas a move adds, one copies the partition at a time: the first
    to fetch gets records, the other's fetches are held as long-polls and answered with
    none; the other copies once the first stops fetching (a fetch timeout)."""
    nodes = Nodes(3)
    led = Leading(nodes)
    nodes.down |= {8, 9}  # replicas without a driver here: their messages are dropped
    led.driver.set_target(KEY, [led.id, 8, 9], nodes.now)
    assert led.fetch(8)[0].records  # the first new replica to fetch copies
    assert led.fetch(9, max_wait_ms=500) == []  # held: not its turn
    nodes.now += 500
    sent = led.driver.tick(nodes.now).send
    assert [m.records for _, m in sent if isinstance(m, FetchResponse) and m.dst == 9] == [b""]
    nodes.now += 100
    assert [a.records for a in led.fetch(9)] == [b""]
    nodes.now += CONFIG.fetch_timeout_ms  # 8 has stopped fetching: 9's turn
    assert led.fetch(9)[0].records
    assert [a.records for a in led.fetch(8)] == [b""]  # and it stays 9's


def test_a_reassignment_ends_with_its_preferred_replica_leading() -> None:
    """Kafka's reassignment elects the first replica of the new assignment: a partition
    a reassignment brought to its target is handed over to its preferred replica as
    soon as that one holds everything, not at the next imbalance check (none here:
    these nodes never rebalance), which left a node leading nothing and another double
    for up to half a minute after a move. Once the preferred replica has led, a later
    change of leader is left to the imbalance check."""
    nodes = Nodes(3)
    led = Leading(nodes)
    assert nodes.config.rebalance_interval_ms is None
    preferred = next(i for i in nodes.voters if i != led.id)
    target = [preferred, *(i for i in nodes.voters if i != preferred)]  # same voters
    for d in nodes.drivers.values():
        d.set_target(KEY, target, nodes.now)
    nodes.advance(2000)
    leaders = [i for i, d in nodes.drivers.items() if d.partitions[KEY].core.is_leader]
    assert leaders == [preferred]
    token = nodes.request(preferred, produce([9]))
    nodes.advance(200)
    assert nodes.answers[token].error == 0
    # Another replica takes over (as after a failover): the move does not take it back.
    p = nodes.drivers[preferred].partitions[KEY]
    ready = Ready()
    p.run(p.core.hand_over(led.id, nodes.now), nodes.now, ready)
    nodes.run(preferred, ready)
    nodes.advance(3000)
    leaders = [i for i, d in nodes.drivers.items() if d.partitions[KEY].core.is_leader]
    assert leaders == [led.id]


def test_a_move_keeps_at_most_one_voter_beyond_its_target() -> None:
    """A move of two replicas alternates: the copying replica is added once caught up,
    then a voter leaving is removed, and only then does the next new replica copy: the
    voters never outnumber the target by more than one."""
    nodes = Nodes(3)
    led = Leading(nodes)
    nodes.down |= {8, 9}  # replicas without a driver here: their messages are dropped
    first_out, second_out = sorted(i for i in nodes.voters if i != led.id)
    led.driver.set_target(KEY, [led.id, 8, 9], nodes.now)
    assert led.fetch(8)[0].records and not led.fetch(9)[0].records
    seen = [led.p.core.voters]
    for _ in range(100):
        for new in (8, 9):  # each fetches to the end of what it was sent (a voter too)
            for a in led.fetch(new, offset=led.p.log.end_offset, last_epoch=led.epoch):
                assert not a.records or new == led.p.copier or new in led.p.core.voters
        nodes.advance(50)
        if led.p.core.voters != seen[-1]:
            seen.append(led.p.core.voters)
        if seen[-1] == tuple(sorted([led.id, 8, 9])):
            break
    assert seen == [
        tuple(sorted(nodes.voters)),
        tuple(sorted([*nodes.voters, 8])),
        tuple(sorted([led.id, second_out, 8])),
        tuple(sorted([led.id, second_out, 8, 9])),
        tuple(sorted([led.id, 8, 9])),
    ], seen


def test_a_new_replica_waiting_its_turn_is_answered_without_a_read_of_the_log() -> None:
    """While one new replica of a move copies, the next one's fetches get no records,
    and its leader reads none for them: on each such fetch, and each time one parked
    ends, it read up to a fetch's worth of batches, checked them and threw them away
    (in ``perf reassign``, more bytes than the copy itself)."""
    nodes = Nodes(3)
    led = Leading(nodes)
    nodes.down |= {8, 9}
    led.driver.set_target(KEY, [led.id, 8, 9], nodes.now)
    assert led.fetch(8)[0].records  # 8 copies; 9 waits its turn
    log = led.p.core.log
    read = log.read
    reads: list[int] = []

    def counted(offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        reads.append(offset)
        return read(offset, max_bytes, max_offset)

    log.read = counted  # type: ignore[method-assign]
    assert [a.records for a in led.fetch(9)] == [b""]
    assert led.fetch(9, max_wait_ms=100) == []  # a long-poll: parked
    nodes.now += 101
    sent = led.driver.tick(nodes.now).send
    expired = [msg for _, msg in sent if isinstance(msg, FetchResponse) and msg.dst == 9]
    assert [a.records for a in expired] == [b""]
    assert reads == []
    nodes.now += CONFIG.fetch_timeout_ms  # 8 has stopped fetching: 9's turn
    assert led.fetch(9)[0].records and reads == [0]


def test_a_replica_says_in_its_fetches_whether_its_node_hosts_it_on_that_nodes_view() -> None:
    """``set_target`` is the node's view of a move: a replica whose node it leaves out
    says so in its fetches (its node may delete it as moved off, so the leader must not
    add it), and says the opposite once a target names its node again."""
    nodes = Nodes(3)
    leader = nodes.leader()
    node = next(i for i in nodes.voters if i != leader)
    others = [i for i in nodes.voters if i != node]

    def fetches_say() -> set[bool]:
        start = len(nodes.sent)
        nodes.request(leader, produce([len(nodes.sent)]))  # records: followers fetch
        nodes.advance(CONFIG.fetch_max_wait_ms + 100)
        sent = nodes.sent[start:]
        return {f.assigned for f in sent if isinstance(f, FetchRequest) and f.src == node}

    assert fetches_say() == {True}
    nodes.drivers[node].set_target(KEY, [*others, 9], nodes.now)
    assert fetches_say() == {False}
    nodes.drivers[node].set_target(KEY, nodes.voters, nodes.now)
    assert fetches_say() == {True}


def test_the_fetch_that_moves_the_hwm_is_answered_at_once_not_parked() -> None:
    """A follower's fetch at the leader's log end has no records to carry, but the
    leader learns from it that the follower holds them, and the HWM moves: the answer
    carries the new HWM at once (a follower applies committed metadata by it), rather
    than waiting out the long-poll. A fetch with nothing new at all is parked."""
    nodes = Nodes(3)
    led = Leading(nodes, records=5)
    p = led.p
    follower, other = (n for n in nodes.voters if n != led.id)
    nodes.down.add(other)  # the HWM then moves only with ``follower``
    nodes.request(led.id, produce([7, 8]))
    nodes.flush(led.id)
    end = p.log.end_offset
    (with_records,) = led.fetch(follower, p.core.high_watermark, led.epoch, max_wait_ms=500)
    assert with_records.records and with_records.high_watermark < end
    (at_end,) = led.fetch(follower, end, led.epoch, max_wait_ms=500)
    assert at_end.is_empty() and at_end.high_watermark == end == p.core.high_watermark
    assert follower not in [f.request.replica_id for f in p.parked]
    assert led.fetch(follower, end, led.epoch, max_wait_ms=500) == []  # nothing new: parked
    assert follower in [f.request.replica_id for f in p.parked]


def _counting_appends(log: Any) -> list[bytes]:
    """The records of each leader append of ``log`` from now on."""
    appended: list[bytes] = []
    append = log.append_as_leader

    def counted(records: bytes, epoch: int) -> Any:
        appended.append(records)
        return append(records, epoch)

    log.append_as_leader = counted
    return appended


def test_plain_produces_handed_in_together_are_one_append_each_answered_with_its_offsets() -> None:
    """A turn's produce requests of one partition (the node hands the driver a turn of
    its loop's appends together): plain batches are one append, one write and one
    replication round, each request answered on its own, with its own offsets and acks,
    as if appended alone one after another."""
    nodes = Nodes(3)
    leader = nodes.leader()
    appended = _counting_appends(nodes.logs[leader])
    reqs = [produce([1, 2]), produce([3], acks=m.ACKS_LEADER), produce([4, 5, 6])]
    quorum_1, leader_1, quorum_2 = nodes.request_many(leader, reqs)
    assert len(appended) == 1
    assert leader_1 in nodes.answers  # acks=leader: answered at once, with its offsets
    assert quorum_1 not in nodes.answers and quorum_2 not in nodes.answers
    nodes.advance(300)
    answers = [nodes.answers[t] for t in (quorum_1, leader_1, quorum_2)]
    assert all(isinstance(a, m.ProduceResponse) and a.error == 0 for a in answers)
    spans = [(a.base_offset, a.last_offset) for a in answers]  # type: ignore[attr-defined]
    first = spans[0][0]
    assert spans == [(first, first + 1), (first + 2, first + 2), (first + 3, first + 5)]
    held = nodes.logs[leader].read(first, 1 << 20)
    assert record_ids(held) == [1, 2, 3, 4, 5, 6]
    for i in nodes.voters:  # replicated as they were appended
        assert nodes.logs[i].end_offset == first + 6


def test_a_request_that_cannot_join_the_others_keeps_its_place() -> None:
    """An idempotent producer's batch travels alone: the plain requests before it are
    appended before it, those after it after it."""
    nodes = Nodes(3)
    leader = nodes.leader()
    appended = _counting_appends(nodes.logs[leader])
    numbered = m.ProduceRequest(
        topic="t",
        partition=0,
        acks=m.ACKS_QUORUM,
        timeout_ms=0,
        records=client_batch([3], producer=(7, 0, 0)),
    )
    reqs = [produce([1]), produce([2]), numbered, produce([4]), produce([5])]
    tokens = nodes.request_many(leader, reqs)
    assert len(appended) == 3
    nodes.advance(300)
    answers = [nodes.answers[t] for t in tokens]
    assert all(isinstance(a, m.ProduceResponse) and a.error == 0 for a in answers)
    first = answers[0].base_offset  # type: ignore[attr-defined]
    assert [a.base_offset - first for a in answers] == [0, 1, 2, 3, 4]  # type: ignore[attr-defined]
    assert record_ids(nodes.logs[leader].read(first, 1 << 20)) == [1, 2, 3, 4, 5]


def test_a_damaged_batch_among_requests_appended_together_is_refused_alone(
    tmp_path: Path,
) -> None:
    """The storage refuses a damaged batch with every batch appended with it (nothing is
    written): each request is then appended alone, so only the damaged one is refused."""
    nodes = Nodes(1, log=lambda i: Log(str(tmp_path / str(i))))
    leader = nodes.leader()
    appended = _counting_appends(nodes.logs[leader])
    good = [encode_batch([b"a", b"b"]), encode_batch([b"c"])]
    damaged = bytearray(encode_batch([b"x", b"y", b"z"]))
    damaged[-9] ^= 0xFF  # in the payload: its CRC no longer matches
    reqs = [
        m.ProduceRequest(topic="t", partition=0, acks=m.ACKS_QUORUM, timeout_ms=0, records=r)
        for r in (good[0], bytes(damaged), good[1])
    ]
    tokens = nodes.request_many(leader, reqs)
    assert len(appended) == 4  # together (refused), then each alone
    nodes.advance(300)
    ok_1, bad, ok_2 = (nodes.answers[t] for t in tokens)
    assert isinstance(bad, m.ProduceResponse) and bad.error == ErrorCode.CORRUPT_MESSAGE
    assert isinstance(ok_1, m.ProduceResponse) and ok_1.error == 0
    assert isinstance(ok_2, m.ProduceResponse) and ok_2.error == 0
    assert (ok_1.last_offset - ok_1.base_offset, ok_2.base_offset) == (1, ok_1.last_offset + 1)
    assert ok_2.last_offset == ok_2.base_offset
