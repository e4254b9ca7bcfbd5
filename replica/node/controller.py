"""The metadata controller: commits topic changes to the cluster-metadata log (as KRaft's
``__cluster_metadata``) and applies what is committed, on every node."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from ..constants import UNKNOWN, or_unknown
from ..driver import Driver, Ready
from ..protocol import ErrorCode
from ..protocol import messages as m
from ..storage import batches_to_table
from ..storage.errors import CorruptDataError
from ..storage.records import encode_batch, iter_batches
from .config import MAX_TOPIC_PARTITIONS, NodeConfig, check_max_message_bytes, partitions_problem
from .datadir import DataDir
from .metadata import (
    INTERNAL_TOPICS,
    METADATA_TOPIC,
    MetadataState,
    NodeRegistration,
    assign_replicas,
    decode_record,
    encode_record,
    validate_topic_name,
)
from .nodes import NodeBook
from .partitions import PartitionManager
from .topic_configs import MAX_MESSAGE_BYTES, config_problem

log = logging.getLogger(__name__)

METADATA_KEY = (METADATA_TOPIC, 0)
Submit = Callable[[tuple[str, int], Any], Awaitable[Any]]


class _Ask(NamedTuple):
    """What a create asks for, the replication factor resolved; ``internal``: the node
    itself asks (for one of ``INTERNAL_TOPICS``, whose names clients may not create)."""

    partitions: int
    replication_factor: int
    configs: tuple[tuple[str, str | None], ...]
    internal: bool


#: What a topic change is refused with: an error code and its text.
Problem = tuple[ErrorCode, str]
NOT_LEADER: Problem = (ErrorCode.NOT_LEADER, "not the metadata leader")
NOT_COMMITTED: Problem = (ErrorCode.REQUEST_TIMED_OUT, "metadata record not committed")
#: How often a change waiting for the log to settle looks whether this node still leads.
SETTLE_POLL_S = 0.05
#: The metadata records that change a topic (its ``name``'s replicas).
TOPIC_OPS = frozenset({"create_topic", "alter_topic", "reassign", "delete_topic"})

_R = TypeVar(
    "_R",
    m.CreateTopicResponse,
    m.DeleteTopicResponse,
    m.AlterTopicResponse,
    m.ReassignResponse,
    m.ChangeVoterResponse,
    m.RegisterNodeResponse,
    m.RetireNodeResponse,
)


#: What a change decides: the record to commit (None: nothing changes) or why not.
Decision = tuple[dict[str, Any] | None, Problem | None]


def _answer(cls: type[_R], problem: Problem) -> _R:
    return cls(error=int(problem[0]), error_message=problem[1])


def _exists(name: str) -> Problem:
    return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"


class MetadataController:
    def __init__(
        self,
        config: NodeConfig,
        datadir: DataDir,
        driver: Driver,
        partitions: PartitionManager,
        submit: Submit,
        execute: Callable[[Ready], None],
        now_ms: Callable[[], int],
        book: NodeBook,
    ) -> None:
        self.config = config
        self.book = book
        #: The voters the metadata quorum started with (its voter-set records, once it
        #: has any, replace them): every node's, as a joining node learns them.
        self.first_voters = list(config.metadata_voters or sorted(config.voters))
        self.datadir = datadir
        self.driver = driver
        self.partitions = partitions
        self.submit = submit
        self.execute = execute
        self.now_ms = now_ms
        self.state = MetadataState()
        #: Creates being committed: each one's ask (partitions, replication factor, limit,
        #: whether the node itself asked) and its answer to come, which a retry of the
        #: same ask waits for.
        self._pending_topics: dict[str, tuple[_Ask, asyncio.Future[m.CreateTopicResponse]]] = {}
        #: One topic change decided and committed at a time, each against a settled log.
        self._changing = asyncio.Lock()
        #: Set by ``apply``: a change waiting for the log to settle looks again.
        self._applied = asyncio.Event()
        #: The registrations this node, leading, took: each id's incarnation and when.
        self._registrations: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ applying
    def start(self) -> None:
        """Open the metadata replica and re-apply its log up to the last offset this node
        knew to be committed, so it knows every topic before the quorum answers."""
        self.partitions.open(METADATA_TOPIC, 0, self.first_voters)
        upto = self.datadir.metadata_applied()
        if upto is not None:
            self.apply(upto)

    def apply(self, upto: int | None = None) -> None:
        """Apply committed metadata records up to the HWM (or ``upto``, an offset known
        to be committed), record how far, and reconcile the hosted replicas."""
        p = self.driver.get(METADATA_KEY)
        if p is None:
            return
        hwm = p.core.high_watermark if upto is None else min(upto, p.log.end_offset)
        state = self.state
        before = state.applied_offset
        # The topics the records applied change: only their replicas are reconciled.
        changed: dict[str, None] = {}
        while state.applied_offset < hwm:
            try:
                data = p.log.read(state.applied_offset, 1 << 20, max_offset=hwm)
            except CorruptDataError as exc:
                self.execute(self.driver.on_corruption(METADATA_KEY, exc.offset, self.now_ms()))
                break
            if not data:
                break
            table = batches_to_table(data)
            offsets = table.column("offset").to_pylist()
            values = table.column("value").to_pylist()
            for off, value in zip(offsets, values, strict=True):
                if state.applied_offset <= off < hwm:
                    try:
                        record = decode_record(value)
                        state.apply(record)
                        if record.get("op") in TOPIC_OPS:
                            changed[str(record["name"])] = None
                    except (ValueError, KeyError, TypeError):
                        log.exception("bad metadata record at offset %d", off)
            ends = [h.next_offset for h in iter_batches(data)]
            if not ends:
                break
            state.applied_offset = min(hwm, ends[-1])
        if state.applied_offset > before and upto is None:
            self.datadir.save_metadata_applied(state.applied_offset)
        self.book.update(state)
        self.partitions.reconcile(state, changed)
        if state.quorum_voters is not None:
            self.driver.set_target(METADATA_KEY, state.quorum_voters, self.now_ms())
        self.driver.set_catch_up_rate(self.catch_up_rate(), self.now_ms())
        self.maybe_end_catch_up_pending()
        self._applied.set()

    def maybe_end_catch_up_pending(self) -> None:
        p = self.driver.get(METADATA_KEY)
        if (
            self.datadir.catch_up_pending
            and p is not None
            and not p.core.catching_up
            and self.state.applied_offset >= p.log.durable_end_offset
        ):
            self.datadir.end_catch_up_pending()

    def max_message_bytes(self, topic: str) -> int:
        t = self.state.topics.get(topic)
        if t is not None and t.max_message_bytes is not None:
            return t.max_message_bytes
        return self.config.max_message_bytes

    # ------------------------------------------------------------------ changing
    def is_leader(self) -> bool:
        p = self.driver.get(METADATA_KEY)
        return p is not None and p.core.is_leader

    def settled(self) -> bool:
        """The metadata leader, with every record of its log committed and applied: the
        topics it knows are the cluster's, and no record it does not know of can still
        commit (one an earlier leader wrote that this leader's epoch will commit, or an
        attempt of its own whose answer timed out). Only a settled leader decides a topic
        change: before, a new leader took a committed topic for unknown, and a create
        could write a second record for a name, whose replicas would replace the first's."""
        p = self.driver.get(METADATA_KEY)
        return p is not None and p.core.is_leader and self.state.applied_offset >= p.log.end_offset

    async def _settle(self) -> Problem | None:
        """Wait, within a commit's timeout, until ``settled``; else what to answer (a
        retriable code). Called holding ``_changing``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.produce_timeout_ms / 1000
        while not self.settled():
            left = deadline - loop.time()
            if not self.is_leader():
                return NOT_LEADER
            if left <= 0:
                return (
                    ErrorCode.REQUEST_TIMED_OUT,
                    "metadata records of the leader not committed yet",
                )
            self._applied.clear()
            try:  # a leadership lost without an apply is seen within a poll
                await asyncio.wait_for(self._applied.wait(), min(left, SETTLE_POLL_S))
            except TimeoutError:
                pass
        return None

    def leader_id(self) -> int:
        p = self.driver.get(METADATA_KEY)
        return UNKNOWN if p is None else or_unknown(p.core.leader_id)

    async def commit(self, record: dict[str, Any]) -> Problem | None:
        req = m.ProduceRequest(
            topic=METADATA_TOPIC,
            partition=0,
            acks=m.ACKS_QUORUM,
            timeout_ms=self.config.produce_timeout_ms,
            records=encode_batch([encode_record(record)]),
        )
        resp = await self.submit(METADATA_KEY, req)
        if resp.error:
            return ErrorCode(resp.error), NOT_COMMITTED[1]
        # Apply on this node before answering, so a Metadata request that follows sees it.
        self.apply()
        return None

    async def _change(self, decide: Callable[[], Decision], *, dry_run: bool = False) -> Decision:
        """One change of the metadata, decided by ``decide`` (the record to commit, None
        for nothing, or why not) on the settled log and committed, one at a time: what
        was committed (None: nothing) or why not. ``dry_run``: decided, not committed."""
        if not self.is_leader():
            return None, NOT_LEADER
        async with self._changing:
            problem = await self._settle()
            if problem is not None:
                return None, problem
            record, problem = decide()
            if problem is None and record is not None and not dry_run:
                problem = await self.commit(record)
        return (None, problem) if problem is not None else (record, None)

    async def create_topic(
        self, req: m.CreateTopicRequest, *, internal: bool = False
    ) -> m.CreateTopicResponse:
        """``internal``: the node itself creates one of ``INTERNAL_TOPICS`` (their names
        are reserved to clients). A create asking what one still being committed asks (a
        client's retry after its first attempt timed out) gets that create's answer, not
        TOPIC_ALREADY_EXISTS for a topic no Metadata answer shows yet."""
        ask = self._ask(req, internal)
        pending = self._pending_topics.get(req.name)
        if pending is not None and pending[0] == ask and self.is_leader():
            return await asyncio.shield(pending[1])
        problem = self.create_problem(req, internal=internal)
        if problem is not None:
            return _answer(m.CreateTopicResponse, problem)
        answer: asyncio.Future[m.CreateTopicResponse] = asyncio.get_running_loop().create_future()
        self._pending_topics[req.name] = (ask, answer)
        resp = _answer(m.CreateTopicResponse, NOT_COMMITTED)  # if the commit raises
        try:
            async with self._changing:
                resp = await self._create(req, ask)
            return resp
        finally:
            del self._pending_topics[req.name]
            answer.set_result(resp)  # also when cancelled: a waiting retry gets an answer

    async def _create(self, req: m.CreateTopicRequest, ask: _Ask) -> m.CreateTopicResponse:
        """Decided on the settled log, holding ``_changing``."""
        problem = await self._settle()
        if problem is None and req.name in self.state.topics:  # its record committed first
            problem = _exists(req.name)
        if problem is not None:
            return _answer(m.CreateTopicResponse, problem)
        nodes = self.book.placeable()
        replicas = assign_replicas(
            req.name, req.partitions, ask.replication_factor, nodes, self.book.placeable_racks()
        )
        record: dict[str, Any] = {
            "op": "create_topic",
            "name": req.name,
            "replicas": replicas,
            "configs": {k: v for k, v in ask.configs if v is not None},
        }
        problem = await self.commit(record)
        if problem is not None:
            return _answer(m.CreateTopicResponse, problem)
        log.info(
            "created topic %s: %d partition(s), replicas %s", req.name, req.partitions, replicas
        )
        return m.CreateTopicResponse(
            error=0, error_message="", warning=self.book.rack_warning(self.state, req.name)
        )

    def _ask(self, req: m.CreateTopicRequest, internal: bool = False) -> _Ask:
        rf = req.replication_factor or min(3, len(self.book.placeable()))
        return _Ask(req.partitions, rf, _create_configs(req), internal)

    def create_problem(
        self, req: m.CreateTopicRequest, *, internal: bool = False
    ) -> Problem | None:
        if not self.is_leader():
            return NOT_LEADER
        problem = (
            None if internal and req.name in INTERNAL_TOPICS else validate_topic_name(req.name)
        )
        if problem:
            return ErrorCode.INVALID_TOPIC, problem
        problem = partitions_problem(req.partitions)
        if problem:
            return ErrorCode.INVALID_PARTITIONS, problem
        n = len(self.book.placeable())
        rf = self._ask(req).replication_factor
        if not 1 <= rf <= n:
            return (
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor must be 1..{n} (the number of nodes), got {rf}",
            )
        if req.max_message_bytes:
            problem = check_max_message_bytes(
                req.max_message_bytes, self.config.max_frame_bytes, "max.message.bytes"
            )
            if problem:
                return ErrorCode.INVALID_REQUEST, problem
        problem = config_problem(dict(_create_configs(req)), self.config.max_frame_bytes)
        if problem:
            return ErrorCode.INVALID_CONFIG, problem
        if req.name in self.state.topics or req.name in self._pending_topics:
            return _exists(req.name)
        return None

    async def delete_topic(self, req: m.DeleteTopicRequest) -> m.DeleteTopicResponse:
        _, problem = await self._change(lambda: self._deleted(req.name))
        if problem is not None:
            return _answer(m.DeleteTopicResponse, problem)
        log.info("deleted topic %s", req.name)
        return m.DeleteTopicResponse(error=0, error_message="")

    def _deleted(self, name: str) -> Decision:
        if name not in self.state.topics:
            return None, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        if name in INTERNAL_TOPICS:
            text = f"topic {name!r} is internal and cannot be deleted"
            return None, (ErrorCode.INVALID_TOPIC, text)
        return {"op": "delete_topic", "name": name}, None

    async def alter_topic(self, req: m.AlterTopicRequest) -> m.AlterTopicResponse:
        """Grow a topic's partitions and change its configs in one ``alter_topic`` record,
        decided on the settled log. New partitions continue the topic's assignment (as
        if it had been created with that many), so leaders keep spreading over nodes."""
        record, problem = await self._change(lambda: self._altered(req), dry_run=req.validate_only)
        if problem is not None:
            return _answer(m.AlterTopicResponse, problem)
        if record is not None and not req.validate_only:
            log.info(
                "altered topic %s: %d partition(s), configs %s",
                req.name,
                len(record["replicas"]),
                record["configs"],
            )
        grew = record is not None and not req.validate_only and req.partitions
        warning = self.book.rack_warning(self.state, req.name) if grew else ""
        return m.AlterTopicResponse(error=0, error_message="", warning=warning)

    def _altered(self, req: m.AlterTopicRequest) -> Decision:
        """The ``alter_topic`` record ``req`` asks for (None: nothing changes), or why not."""
        t = self.state.topics.get(req.name)
        if t is None:
            return None, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {req.name!r}")
        if req.name in INTERNAL_TOPICS:
            return None, (ErrorCode.INVALID_TOPIC, f"topic {req.name!r} is internal")
        have = len(t.replicas)
        wanted = req.partitions or have
        if wanted < have or wanted > MAX_TOPIC_PARTITIONS:
            return None, (
                ErrorCode.INVALID_PARTITIONS,
                f"topic {req.name!r} has {have} partition(s): it can grow to at most "
                f"{MAX_TOPIC_PARTITIONS}, never shrink (asked for {wanted})",
            )
        changes = {c.name: c.value for c in req.configs}
        problem = config_problem(changes, self.config.max_frame_bytes)
        if problem:
            return None, (ErrorCode.INVALID_CONFIG, problem)
        configs = dict(t.configs)
        for name, value in changes.items():
            if value is None:
                configs.pop(name, None)
            else:
                configs[name] = value
        problem = config_problem(configs, self.config.max_frame_bytes)  # the whole (lags)
        if problem:
            return None, (ErrorCode.INVALID_CONFIG, problem)
        replicas = [list(r) for r in t.replicas]
        if wanted > have:
            nodes = self.book.placeable()
            rf = len(t.replicas[0]) if t.replicas else min(3, len(nodes))
            racks = self.book.placeable_racks()
            replicas += assign_replicas(req.name, wanted, rf, nodes, racks)[have:]
        if replicas == t.replicas and configs == t.configs:
            return None, None
        record = {"op": "alter_topic", "name": req.name, "replicas": replicas, "configs": configs}
        return record, None

    async def reassign(self, req: m.ReassignRequest) -> m.ReassignResponse:
        """Move partitions to new replicas (or, ``cancel``, back to those they had before
        their latest move) in one ``reassign`` record, decided on the settled log. Each
        partition's leader then changes its voter set one voter at a time
        (``Driver.set_target``); the nodes leaving keep their replica until it is no
        longer a voter and that is committed."""
        record, problem = await self._change(lambda: self._reassigned(req))
        if problem is not None:
            return _answer(m.ReassignResponse, problem)
        if record is not None:
            for partition, replicas, before in record["moves"]:
                log.info("reassigned %s/%d: %s -> %s", req.topic, partition, before, replicas)
        return m.ReassignResponse(error=0, error_message="")

    def _reassigned(self, req: m.ReassignRequest) -> Decision:
        """The ``reassign`` record ``req`` asks for (None: nothing moves), or why not."""
        t = self.state.topics.get(req.topic)
        if t is None:
            return None, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {req.topic!r}")
        nodes = set(self.book.ids())
        moves: list[list[Any]] = []
        for move in req.moves:
            p = move.partition
            if not 0 <= p < len(t.replicas):
                return None, (
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {req.topic!r} has no partition {p}",
                )
            current = t.replicas[p]
            if req.cancel:
                if p not in t.previous:
                    return None, (
                        ErrorCode.INVALID_REQUEST,
                        f"{req.topic}/{p} was never moved: nothing to cancel",
                    )
                target = t.previous[p]
            else:
                target = list(move.replicas)
                unknown = sorted(set(target) - nodes)
                if not target or len(set(target)) != len(target) or unknown:
                    return None, (
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"{req.topic}/{p}: replicas {target} must be distinct nodes of "
                        f"the cluster {sorted(nodes)}"
                        + (f" (unknown: {unknown})" if unknown else ""),
                    )
                retired = sorted(n for n in target if n in self.book.retired and n not in current)
                if retired:
                    return None, (
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"{req.topic}/{p}: node(s) {retired} are decommissioned and take "
                        "no new replicas",
                    )
            if target != current:
                moves.append([p, target, current])
        if not moves:
            return None, None
        return {"op": "reassign", "name": req.topic, "moves": moves}, None

    async def change_voter(self, req: m.ChangeVoterRequest) -> m.ChangeVoterResponse:
        """Add a node to the metadata quorum's voters or remove one (KIP-853's AddRaftVoter
        and RemoveRaftVoter): a ``quorum_voters`` record every node applies; the metadata
        leader then changes its voter set there (it catches an added node up first, and
        leads on if it removes itself until that commits)."""
        record, problem = await self._change(lambda: self._voters_changed(req))
        if problem is not None or record is None:
            return _answer(m.ChangeVoterResponse, problem or NOT_COMMITTED)
        log.info("metadata quorum voters -> %s", record["voters"])
        return m.ChangeVoterResponse(error=0, error_message="", voters=record["voters"])

    def _voters_changed(self, req: m.ChangeVoterRequest) -> Decision:
        p = self.driver.get(METADATA_KEY)
        assert p is not None  # this node leads it
        current = set(self.state.quorum_voters or p.core.voters)
        problem = self._unknown_node(req.node_id)
        if problem is not None:
            return None, problem
        if req.add == (req.node_id in current):
            state = "a voter already" if req.add else "not a voter"
            return None, (ErrorCode.INVALID_REQUEST, f"node {req.node_id} is {state}")
        if not req.add and len(current) == 1:
            return None, (ErrorCode.INVALID_REQUEST, "the last voter cannot be removed")
        return {"op": "quorum_voters", "voters": sorted(current ^ {req.node_id})}, None

    async def catch_up_throttle(self, req: m.CatchUpThrottleRequest) -> m.CatchUpThrottleResponse:
        """Set every node's catch-up throttle (or give each its own again): a
        ``catch_up_throttle`` record, which each node's leaders pace new replicas by once
        applied, moves under way included."""
        record, problem = await self._change(lambda: self._throttle_set(req))
        if problem is not None:
            return _answer(m.CatchUpThrottleResponse, problem)
        if record is not None:
            rate = record["bytes_per_s"]
            log.info("catch-up throttle: %s", "each node's own" if rate is None else rate)
        return m.CatchUpThrottleResponse(error=0, error_message="")

    def _throttle_set(self, req: m.CatchUpThrottleRequest) -> Decision:
        if req.bytes_per_s < UNKNOWN:
            text = f"a throttle is bytes per second, 0 or more, not {req.bytes_per_s}"
            return None, (ErrorCode.INVALID_REQUEST, text)
        rate = None if req.bytes_per_s == UNKNOWN else req.bytes_per_s
        if rate == self.state.catch_up_bytes_per_s:
            return None, None
        return {"op": "catch_up_throttle", "bytes_per_s": rate}, None

    def catch_up_rate(self) -> int:
        """The throttle this node's leaders pace new replicas by: the cluster's, where an
        operator set one, else this node's own."""
        rate = self.state.catch_up_bytes_per_s
        return self.config.catch_up_bytes_per_second if rate is None else rate

    # ------------------------------------------------------------------ nodes
    def _unknown_node(self, node_id: int) -> Problem | None:
        """Why ``node_id`` cannot be named by a change, if it is not a node of the cluster."""
        if node_id in self.book.native:
            return None
        text = f"node {node_id} is not a node of the cluster {self.book.ids()}"
        return ErrorCode.INVALID_REQUEST, text

    async def register_node(self, req: m.RegisterNodeRequest) -> m.RegisterNodeResponse:
        """A node that starts (or joins with ``serve --join``) says who it is and where it
        listens: a ``register_node`` record every node applies (its address book), unless
        it says what its registration already does. Refused while another process holds
        the id with another data directory (``_held_by_another``): two processes must
        never speak as one node. Answers the
        cluster's id, every node's addresses and the metadata quorum's first voters."""
        _, problem = await self._change(lambda: self._registered(req))
        if problem is not None:
            return _answer(m.RegisterNodeResponse, problem)
        book = self.book
        return m.RegisterNodeResponse(
            error=0,
            error_message="",
            cluster_id=self.config.cluster_id,
            nodes=[
                m.NodeAddress(
                    node_id=n,
                    host=book.native[n][0],
                    port=book.native[n][1],
                    kafka_host=book.kafka[n][0] if n in book.kafka else "",
                    kafka_port=book.kafka[n][1] if n in book.kafka else 0,
                )
                for n in book.ids()
            ],
            metadata_voters=self.first_voters,
        )

    def _registered(self, req: m.RegisterNodeRequest) -> Decision:
        reg = NodeRegistration.of_request(req)
        if req.node_id < 0 or not req.directory or not 0 < req.port < 65536:
            return None, (ErrorCode.INVALID_REQUEST, f"malformed registration {reg}")
        known = self.state.nodes.get(req.node_id)
        if known == reg:
            return None, None
        same_directory = known is not None and known.directory == req.directory
        if not same_directory and self._held_by_another(req.node_id, req.incarnation):
            held = f"data directory {known.directory}" if known else "another data directory"
            return None, (
                ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                f"node id {req.node_id} is held by a live node with {held}, not "
                f"{req.directory}: give this node another --node-id, or stop the other "
                "one first",
            )
        log.info(
            "registering node %d (directory %s) at %s:%d", reg.node_id, reg.directory, *reg.address
        )
        self._registrations[req.node_id] = (req.incarnation, self.now_ms())
        return reg.record(), None

    def _held_by_another(self, node_id: int, incarnation: int) -> bool:
        """Whether a process other than the one of ``incarnation`` serves as node
        ``node_id``: it registered within the fetch timeout, or its heartbeats (another
        incarnation) were heard within it, or, for a node that sends this one none (an
        observer), it fetched the metadata log within it."""
        if node_id == self.config.node_id:
            return incarnation != self.driver.incarnation
        now = self.now_ms()
        recent = now - self.config.fetch_timeout_ms
        registered, when = self._registrations.get(node_id, (incarnation, UNKNOWN))
        if registered != incarnation and when >= recent:
            return True  # registered lately, maybe not heard from yet
        liveness = self.driver.liveness
        if node_id in liveness.incarnations:
            heard = liveness.seen.get(node_id, UNKNOWN) >= recent
            return heard and liveness.incarnations[node_id] != incarnation
        p = self.driver.get(METADATA_KEY)
        if p is None:
            return False
        q = p.core.describe(now)
        rows = q.voters + q.observers
        return any(r.replica_id == node_id and r.last_fetch_ms >= recent for r in rows)

    async def retire_node(self, req: m.RetireNodeRequest) -> m.RetireNodeResponse:
        """Decommission a node: it is given no new replicas (``cluster decommission`` then
        moves its replicas off and removes it from the metadata quorum's voters); or,
        ``req.retired`` false, take it back (``cluster recommission``)."""
        record, problem = await self._change(lambda: self._retired(req))
        if problem is not None:
            return _answer(m.RetireNodeResponse, problem)
        if record is not None:
            state = "takes no new replicas" if req.retired else "takes new replicas again"
            log.info("node %d %s", req.node_id, state)
        return m.RetireNodeResponse(error=0, error_message="")

    def _retired(self, req: m.RetireNodeRequest) -> Decision:
        problem = self._unknown_node(req.node_id)
        if problem is not None:
            return None, problem
        if (req.node_id in self.state.retired) == req.retired:
            return None, None
        if req.retired and len(self.book.placeable()) <= 1:
            return None, (ErrorCode.INVALID_REQUEST, "the last node cannot be retired")
        return {"op": "retire_node", "node_id": req.node_id, "retired": req.retired}, None


def _create_configs(req: m.CreateTopicRequest) -> tuple[tuple[str, str | None], ...]:
    """The configs a create sets: its ``configs``, and its ``max_message_bytes`` field
    (which an explicit config of that name overrides)."""
    configs: dict[str, str | None] = {}
    if req.max_message_bytes:
        configs[MAX_MESSAGE_BYTES] = str(req.max_message_bytes)
    configs.update((c.name, c.value) for c in req.configs)
    return tuple(sorted(configs.items()))
