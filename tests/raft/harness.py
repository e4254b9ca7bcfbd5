"""A synchronous, lossless harness for unit tests: cores over in-memory logs, a message
queue the test pumps, and the driver rules (persist before send, flush before fetch);
and single cores stepped by hand: a leader made in one step, fetches to it, its answers."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from quorumlog.replica.raft import (
    ElectionState,
    FetchRequest,
    FetchResponse,
    Message,
    Output,
    QuorumConfig,
    RaftReplica,
    Role,
)

from tests.sim.memlog import MemLog, client_batch
from tests.support.messages import CLUSTER, fetch_request, vote_response

CONFIG = QuorumConfig()


def make_replica(
    node_id: int,
    voters: tuple[int, ...] = (1, 2, 3),
    log: MemLog | None = None,
    persisted: ElectionState | None = None,
    now: int = 0,
    config: QuorumConfig = CONFIG,
    seed: int = 0,
) -> RaftReplica:
    return RaftReplica(
        config,
        node_id,
        voters,
        CLUSTER,
        log if log is not None else MemLog(),
        persisted,
        random.Random(seed),
        now,
    )


def leader_log(*epochs: tuple[int, int]) -> MemLog:
    """A log holding ``count`` records in each (epoch, count), as successive leaders
    would have written them (each epoch starts with its control batch)."""
    log = MemLog()
    uid = 1
    for epoch, count in epochs:
        log.append_control(epoch, 1, [1, 2, 3], 0)
        if count > 1:
            log.append_as_leader(client_batch(list(range(uid, uid + count - 1))), epoch)
            uid += count - 1
    log.flush()
    return log


def fetch(
    src: int,
    epoch: int,
    offset: int,
    last_epoch: int,
    cluster: str = CLUSTER,
    dst: int = 1,
) -> FetchRequest:
    """Node ``src``'s fetch in ``epoch`` from ``offset`` (the record before it of
    ``last_epoch``), request id 7: an answer that does not echo it shows."""
    position = {"fetch_offset": offset, "last_fetched_epoch": last_epoch, "request_id": 7}
    return fetch_request(
        cluster_id=cluster, replica_id=src, dst=dst, current_leader_epoch=epoch, **position
    )


def answer(core: RaftReplica, req: FetchRequest, now: int = 0) -> FetchResponse:
    out = core.handle(req, now)
    (resp,) = [m for m in out.messages if isinstance(m, FetchResponse)]
    assert resp.request_id == req.request_id and resp.fetch_offset == req.fetch_offset
    return resp


def new_leader(
    log: MemLog | None = None,
    epoch: int = 2,
    voters: tuple[int, ...] = (1, 2, 3),
    config: QuorumConfig | None = None,
) -> RaftReplica:
    """Node 1 restarted as a candidate that wins with one vote."""
    kwargs = {"config": config} if config else {}
    r = make_replica(1, voters=voters, log=log, persisted=ElectionState(epoch, None, 1), **kwargs)
    for v in voters[1 : len(voters) // 2 + 1]:
        r.handle(vote_response(src=v, leader_epoch=epoch, candidate_epoch=epoch), 0)
    assert r.role is Role.LEADER
    return r


def leader_with_records(log: MemLog | None = None, epoch: int = 2) -> RaftReplica:
    """``new_leader`` that appended client records [1, 2, 3] and flushed them."""
    leader = new_leader(log, epoch=epoch)
    leader.append(client_batch([1, 2, 3]), 0)
    leader.log.flush()
    leader.on_log_flushed(0)
    return leader


def catching_up_fetch(src: int, epoch: int, offset: int, last_epoch: int) -> FetchRequest:
    return dataclasses.replace(fetch(src, epoch, offset, last_epoch), catching_up=True)


class Cluster:
    def __init__(
        self,
        voters: tuple[int, ...] = (1, 2, 3),
        observers: tuple[int, ...] = (),
        config: QuorumConfig = CONFIG,
    ) -> None:
        self.now = 0
        self.config = config
        self.voters = voters
        self.logs = {i: MemLog() for i in voters + observers}
        self.persisted: dict[int, ElectionState | None] = dict.fromkeys(voters + observers)
        self.cores: dict[int, RaftReplica] = {}
        self.queue: list[Message] = []
        self.deferred: list[Message] = []
        self.sent: list[tuple[int, Message]] = []
        self.down: set[int] = set()
        for i in voters + observers:
            self.start(i)

    def start(self, node: int) -> None:
        self.down.discard(node)
        log, persisted = self.logs[node], self.persisted[node]
        self.cores[node] = make_replica(
            node, self.voters, log, persisted, now=self.now, config=self.config, seed=node
        )
        self.apply(node, self.cores[node].startup_output())

    def crash(self, node: int) -> None:
        self.down.add(node)
        self.logs[node].crash()

    def apply(self, node: int, out: Output) -> None:
        if out.persist is not None:
            self.persisted[node] = out.persist
        if out.flush_log:
            self.logs[node].flush()
            self.apply(node, self.cores[node].on_log_flushed(self.now))
        for m in out.messages:
            self.sent.append((node, m))
            self.queue.append(m)

    def pump(self, drop: Callable[[Message], bool] = lambda m: False, limit: int = 10_000) -> None:
        """Deliver queued messages; empty fetch answers wait for the next time step,
        like a long-poll, so followers do not spin."""
        ready, self.deferred = self.deferred, []
        self.queue = ready + self.queue
        for _ in range(limit):
            if not self.queue:
                return
            m = self.queue.pop(0)
            if m.dst in self.down or m.dst not in self.cores or drop(m):
                continue
            if isinstance(m, FetchResponse) and m.is_empty() and m not in ready:
                self.deferred.append(m)
                continue
            self.apply(m.dst, self.cores[m.dst].handle(m, self.now))
        raise AssertionError("message storm")

    def flush(self, node: int) -> None:
        self.logs[node].flush()
        self.apply(node, self.cores[node].on_log_flushed(self.now))

    def advance(self, ms: int, drop: Callable[[Message], bool] = lambda m: False) -> None:
        """Move time in 10 ms steps, ticking every live core and delivering messages."""
        end = self.now + ms
        while self.now < end:
            self.now = min(end, self.now + 10)
            for i, core in self.cores.items():
                if i not in self.down:
                    self.apply(i, core.tick(self.now))
                    self.flush(i)
            self.pump(drop)

    def leader(self) -> int | None:
        leaders = [i for i, c in self.cores.items() if i not in self.down and c.role is Role.LEADER]
        return max(leaders, key=lambda i: self.cores[i].epoch) if leaders else None

    def elect(self, max_ms: int = 10_000) -> int:
        waited = 0
        while self.leader() is None and waited < max_ms:
            self.advance(100)
            waited += 100
        leader = self.leader()
        assert leader is not None, "no leader elected"
        self.advance(50)
        return leader

    def produce(self, ids: list[int]) -> int:
        leader = self.leader()
        assert leader is not None
        info, _, out = self.cores[leader].append(client_batch(ids), self.now)
        self.apply(leader, out)
        return info.last_offset


def replicated_cluster(batches: int = 5) -> tuple[Cluster, int, int]:
    """A 3-voter cluster that elected a leader and replicated ``batches`` two-record
    batches; (cluster, leader, one of its followers)."""
    c = Cluster()
    leader = c.elect()
    for i in range(batches):
        c.produce([10 * i, 10 * i + 1])
    c.advance(200)
    follower = next(n for n in c.voters if n != leader)
    return c, leader, follower
