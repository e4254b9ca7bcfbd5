"""A node's partition replicas under the driver rules, stepped by its executor."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator

from ..protocol import ErrorCode
from ..protocol import messages as m
from ..raft import UNCLEAN_EPOCH_GAP, ElectionState, Message, QuorumConfig, RaftReplica
from . import queries
from .errors import error_response
from .partition import Limits, PartitionDriver, ServedLog
from .ready import PartitionKey, Ready

log = logging.getLogger(__name__)

CoreFactory = Callable[..., RaftReplica]

# The client requests a partition serves, by type; each is answered through Ready.answers.
Request = (
    m.ProduceRequest
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
    ``peer_unreachable`` and ``begin_shutdown``. Nothing here touches sockets, files or clocks."""

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
        """Open a replica over ``log_`` with its last persisted election state. A new
        partition (nothing persisted) whose first replica is another node holds its
        timers for two election timeouts, so that preferred replica stands first."""
        core = self.core_factory(
            self.quorum, self.node_id, voters, self.cluster_id, log_, persisted, self.rng, now
        )
        hold = 0
        if persisted is None and voters and voters[0] != self.node_id:
            hold = now + 2 * self.quorum.election_timeout_ms
        p = self.partition_class(key, core, log_, self.limits, hold)
        self.partitions[key] = p
        ready = Ready()
        p.run(core.startup_output(), now, ready)
        return ready

    def close(self, key: PartitionKey) -> Ready:
        ready = Ready()
        p = self.partitions.pop(key, None)
        if p is not None:
            p.close(ready)
        return ready

    # ------------------------------------------------------------------ steps
    def raft(self, key: PartitionKey, msg: Message, now: int) -> Ready:
        ready = Ready()
        p = self.get(key)
        if p is not None and msg.dst == self.node_id:
            p.on_raft(msg, now, ready)
        return ready

    def tick(self, now: int) -> Ready:
        ready = Ready()
        for p in self:
            if not p.closed:
                p.tick(now, ready)
        return ready

    def next_deadline_ms(self) -> int | None:
        times = [t for p in self if (t := p.next_deadline_ms()) is not None]
        return min(times) if times else None

    def flushed(self, key: PartitionKey, now: int) -> Ready:
        ready = Ready()
        p = self.partitions.get(key)
        if p is not None:
            p.flushed(now, ready)
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
        elif isinstance(req, m.ProduceRequest):
            p.produce(token, req, now, ready)
        elif isinstance(req, m.FetchRequest):
            p.fetch(token, req, now, ready)
        elif isinstance(req, m.ListOffsetsRequest):
            queries.list_offsets(p, token, req, now, ready)
        elif isinstance(req, m.OffsetsForLeaderEpochRequest):
            queries.offsets_for_leader_epoch(p, token, req, ready)
        elif isinstance(req, m.DescribeQuorumRequest):
            queries.describe(p, token, now, ready)
        else:
            self._force_leader(token, p, req, now, ready)
        return ready

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
            p.on_corruption(offset, now, ready)
        return ready

    def begin_catch_up(self, now: int) -> Ready:
        """This node's data directory replaced a lost one: every replica catches up with
        an unknown floor before it votes, stands or counts again."""
        ready = Ready()
        for p in self:
            if not p.closed:
                p.run(p.core.begin_catch_up(now), now, ready)
        return ready

    def peer_unreachable(self, peer: int, now: int) -> Ready:
        """The transport found ``peer``'s node refusing connections (its process is
        gone): followers of that leader stand without waiting for their fetch timeout."""
        ready = Ready()
        for p in self:
            if not p.closed and p.core.leader_id == peer:
                p.run(p.core.on_peer_unreachable(peer, now), now, ready)
        return ready

    def begin_shutdown(self, now: int) -> Ready:
        """Graceful stop: leaders resign (EndQuorumEpoch with ranked successors)."""
        ready = Ready()
        for p in self:
            if not p.closed and p.core.is_leader:
                p.run(p.core.begin_shutdown(now), now, ready)
        return ready
