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
from .config import NodeConfig, check_max_message_bytes
from .datadir import DataDir
from .metadata import (
    INTERNAL_TOPICS,
    METADATA_TOPIC,
    MetadataState,
    assign_replicas,
    decode_record,
    encode_record,
    validate_topic_name,
)
from .partitions import PartitionManager

log = logging.getLogger(__name__)

METADATA_KEY = (METADATA_TOPIC, 0)
Submit = Callable[[tuple[str, int], Any], Awaitable[Any]]


class _Ask(NamedTuple):
    """What a create asks for, the replication factor resolved; ``internal``: the node
    itself asks (for one of ``INTERNAL_TOPICS``, whose names clients may not create)."""

    partitions: int
    replication_factor: int
    max_message_bytes: int
    internal: bool


#: What a topic change is refused with: an error code and its text.
Problem = tuple[ErrorCode, str]
NOT_LEADER: Problem = (ErrorCode.NOT_LEADER, "not the metadata leader")
NOT_COMMITTED: Problem = (ErrorCode.REQUEST_TIMED_OUT, "metadata record not committed")
#: How often a change waiting for the log to settle looks whether this node still leads.
SETTLE_POLL_S = 0.05

_R = TypeVar("_R", m.CreateTopicResponse, m.DeleteTopicResponse)


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
    ) -> None:
        self.config = config
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

    # ------------------------------------------------------------------ applying
    def start(self) -> None:
        """Open the metadata replica and re-apply its log up to the last offset this node
        knew to be committed, so it knows every topic before the quorum answers."""
        self.partitions.open(METADATA_TOPIC, 0, sorted(self.config.voters))
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
                        state.apply(decode_record(value))
                    except (ValueError, KeyError, TypeError):
                        log.exception("bad metadata record at offset %d", off)
            ends = [h.next_offset for h in iter_batches(data)]
            if not ends:
                break
            state.applied_offset = min(hwm, ends[-1])
        if state.applied_offset > before and upto is None:
            self.datadir.save_metadata_applied(state.applied_offset)
        self.partitions.reconcile(state)
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
        nodes = sorted(self.config.voters)
        replicas = assign_replicas(req.name, req.partitions, ask.replication_factor, nodes)
        record: dict[str, Any] = {"op": "create_topic", "name": req.name, "replicas": replicas}
        if req.max_message_bytes:
            record["max_message_bytes"] = req.max_message_bytes
        problem = await self.commit(record)
        if problem is not None:
            return _answer(m.CreateTopicResponse, problem)
        log.info(
            "created topic %s: %d partition(s), replicas %s", req.name, req.partitions, replicas
        )
        return m.CreateTopicResponse(error=0, error_message="")

    def _ask(self, req: m.CreateTopicRequest, internal: bool = False) -> _Ask:
        rf = req.replication_factor or min(3, len(self.config.voters))
        return _Ask(req.partitions, rf, req.max_message_bytes, internal)

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
        if not 1 <= req.partitions <= 10000:
            return (
                ErrorCode.INVALID_PARTITIONS,
                f"partitions must be 1..10000, got {req.partitions}",
            )
        n = len(self.config.voters)
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
        if req.name in self.state.topics or req.name in self._pending_topics:
            return _exists(req.name)
        return None

    async def delete_topic(self, req: m.DeleteTopicRequest) -> m.DeleteTopicResponse:
        if not self.is_leader():
            return _answer(m.DeleteTopicResponse, NOT_LEADER)
        async with self._changing:
            problem = await self._settle()
            if problem is None:
                problem = self._delete_problem(req.name)
            if problem is None:
                problem = await self.commit({"op": "delete_topic", "name": req.name})
        if problem is not None:
            return _answer(m.DeleteTopicResponse, problem)
        log.info("deleted topic %s", req.name)
        return m.DeleteTopicResponse(error=0, error_message="")

    def _delete_problem(self, name: str) -> Problem | None:
        if name not in self.state.topics:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        if name in INTERNAL_TOPICS:
            return ErrorCode.INVALID_TOPIC, f"topic {name!r} is internal and cannot be deleted"
        return None
