"""Kafka's transaction coordinator on the Kafka listener (KIP-98): InitProducerId with a
transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions and
ListTransactions; FindCoordinator with key type 1 comes here through ``groups``.

**Coordinator.** Transactional id T belongs to partition ``abs(javaHashCode(T)) % P`` of
the internal topic ``__transaction_state`` (Kafka's ``partitionFor``); that partition's
quorum leader coordinates T, and the leader epoch is the coordinator epoch its markers
carry. The topic is created on first use, as ``__consumer_offsets`` is.

**Every step is written before it is acted on.** Each state change of an id (the pure
rules are ``kafka.txn``) is one record appended to its partition with acks=quorum, and
only once that is acknowledged does the coordinator answer or send markers. (The one
record not waited for is Complete, written after the markers: it decides nothing.) The
decision to commit or abort is the PrepareCommit / PrepareAbort record: a crash after
it leaves a coordinator-to-be that reads the partition (on a leader change), finds the
decision, writes the markers again (a marker written twice is harmless: the second
finds no open transaction) and then the Complete record. A crash before it leaves the
transaction open, to be aborted by its timeout or by the producer's next
InitProducerId.

**Fencing.** InitProducerId bumps the id's producer epoch; an ongoing transaction is
aborted first with the bumped epoch, whose markers fence the old producer on every
partition it wrote. A transaction open past its ``transaction.timeout.ms`` is aborted
the same way by the coordinator's timer (``TICK_S``).

Operations on one id run one at a time (a lock per id), so two requests never write
conflicting states. EndTxn is answered once its decision is durable; a request for an
id whose decision's markers are still being written waits for them (a few seconds at
most; then CONCURRENT_TRANSACTIONS, which clients retry).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..kafka import messages as km
from ..kafka.coordinators import OFFSETS_TOPIC, TXN_STATE_TOPIC, partition_for
from ..kafka.errors import KafkaError
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from ..kafka.txn import (
    Decision,
    TxnMetadata,
    TxnState,
    add_partitions,
    begin_abort_on_timeout,
    complete,
    decode_fence_record,
    decode_txn_record,
    encode_fence_key,
    encode_fence_value,
    encode_txn_key,
    encode_txn_value,
    end_txn,
    expired,
    group_of,
    init_producer_id,
    names_another_producer,
)
from ..node.api import Api
from ..protocol import ErrorCode
from ..storage.records import BatchHeader, encode_batch
from .internal_topics import MOVED, InternalTopic, append, loaded, loaded_state, read_partition
from .txn_markers import MarkerWriter

log = logging.getLogger(__name__)

Handler = Callable[[KafkaApi, int, Message], Awaitable[Message | None]]

#: (api, lowest version, highest version) served.
SERVED: tuple[tuple[KafkaApi, int, int], ...] = tuple(
    (api, api.min_version, api.max_version)
    for api in (
        km.ADD_PARTITIONS_TO_TXN,
        km.ADD_OFFSETS_TO_TXN,
        km.END_TXN,
        km.DESCRIBE_TRANSACTIONS,
        km.LIST_TRANSACTIONS,
    )
)

#: How often ongoing transactions are checked against their timeout.
TICK_S = 0.5
#: How long a request of an id waits for the markers of its last decision to be
#: written (past this: CONCURRENT_TRANSACTIONS, and the client retries).
FINISH_WAIT_S = 5.0
#: How long a state record waits for quorum durability.
WRITE_TIMEOUT_MS = 5000


@dataclass
class TxnPartition:
    """The transactional ids of ``__transaction_state`` partition ``partition`` as of its
    log in leader epoch ``epoch`` (this node leads it)."""

    partition: int
    epoch: int
    txns: dict[str, TxnMetadata] = field(default_factory=dict)
    # Transaction groups' fences: the last batch each committed (``kafka.txn``).
    fences: dict[str, int] = field(default_factory=dict)
    task: asyncio.Task[bool] | None = None
    stale: bool = False
    # The decisions being carried out (their markers), by transactional id, and the
    # Complete records being written after them.
    finishing: dict[str, asyncio.Task[KafkaError]] = field(default_factory=dict)
    completing: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def ready(self) -> bool:
        return loaded(self.task)


class TransactionCoordinator:
    """The transaction handlers of one node's Kafka listener (``handlers``: api key ->
    handler; InitProducerId with a transactional id through ``init_producer_id``)."""

    def __init__(self, api: Api, markers: MarkerWriter) -> None:
        self.api = api
        self.markers = markers
        self.topic = InternalTopic(
            api, TXN_STATE_TOPIC, lambda: api.config.transaction_state_partitions
        )
        self.partitions: dict[int, TxnPartition] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._ticker: asyncio.Task[None] | None = None
        self.handlers: dict[int, Handler] = {
            km.ADD_PARTITIONS_TO_TXN.key: self.add_partitions_to_txn,
            km.ADD_OFFSETS_TO_TXN.key: self.add_offsets_to_txn,
            km.END_TXN.key: self.end_txn,
        }

    async def close(self) -> None:
        tasks: list[asyncio.Task[object]] = [t for t in (self._ticker,) if t is not None]
        for part in self.partitions.values():
            if part.task is not None:
                tasks.append(part.task)
            tasks += part.finishing.values()
            tasks += part.completing
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.topic.close()
        await self.markers.changes.close()  # the connections markers went out on

    # ------------------------------------------------------------------ coordination
    def partition_of(self, transactional_id: str) -> int | None:
        count = self.topic.count()
        return None if count is None else partition_for(group_of(transactional_id), count)

    async def _coordinate(self, tid: str) -> tuple[TxnPartition | None, KafkaError]:
        """The loaded state of ``tid``'s partition if this node coordinates it, else the
        error to answer."""
        self._start_ticker()
        p = self.partition_of(tid)
        if p is None:
            if self.api.controller.is_leader():
                await self.topic.create()
            return None, KafkaError.COORDINATOR_NOT_AVAILABLE
        return await self._loaded(p)

    def _still(self, part: TxnPartition) -> bool:
        """This node still leads ``part`` in the epoch its state was read in."""
        driver = self.api.driver.get((TXN_STATE_TOPIC, part.partition))
        return (
            driver is not None
            and driver.core.is_leader
            and driver.core.epoch == part.epoch
            and self.partitions.get(part.partition) is part
        )

    async def _loaded(self, p: int) -> tuple[TxnPartition | None, KafkaError]:
        return await loaded_state(
            self.api,
            (TXN_STATE_TOPIC, p),
            self.partitions,
            TxnPartition,
            self._load,
            lambda moved: self._unload(p),
        )

    async def _load(self, part: TxnPartition, start: int, upto: int) -> bool:
        """Read the partition into ``part``, then finish every decision found there
        (a previous coordinator's PrepareCommit / PrepareAbort)."""

        def on_batch(header: BatchHeader, rows: object) -> None:
            if rows is None:
                return
            keys = rows.column("key").to_pylist()  # type: ignore[attr-defined]
            values = rows.column("value").to_pylist()  # type: ignore[attr-defined]
            for key, value in zip(keys, values, strict=True):
                try:
                    decoded = decode_txn_record(key, value)
                except (ValueError, TypeError, KeyError):
                    log.warning(
                        "%s/%d: a bad record near %d",
                        TXN_STATE_TOPIC,
                        part.partition,
                        header.base_offset,
                    )
                    continue
                if decoded is None:
                    fence = decode_fence_record(key, value)
                    if fence is not None:
                        part.fences[fence[0]] = fence[1]
                    continue
                tid, meta = decoded
                if meta is None:
                    part.txns.pop(tid, None)
                else:
                    part.txns[tid] = meta

        key = (TXN_STATE_TOPIC, part.partition)
        try:
            if not await read_partition(self.api, key, part.epoch, start, upto, on_batch):
                return False
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s/%d: loading failed", TXN_STATE_TOPIC, part.partition)
            return False
        decided = [meta for meta in part.txns.values() if meta.state.preparing]
        log.info(
            "%s/%d: coordinating in epoch %d: %d transactional id(s), %d decision(s) to finish",
            TXN_STATE_TOPIC,
            part.partition,
            part.epoch,
            len(part.txns),
            len(decided),
        )
        for meta in decided:
            self._finish_later(part, meta)
        return True

    def _unload(self, p: int) -> None:
        part = self.partitions.pop(p, None)
        if part is None:
            return
        if part.task is not None and not part.task.done():
            part.task.cancel()
        for task in [*part.finishing.values(), *part.completing]:
            task.cancel()

    def _lock(self, tid: str) -> asyncio.Lock:
        lock = self._locks.get(tid)
        if lock is None:
            lock = self._locks[tid] = asyncio.Lock()
        return lock

    async def _write(
        self,
        part: TxnPartition,
        meta: TxnMetadata | None,
        *more: TxnMetadata,
        fence: tuple[str, int] | None = None,
    ) -> KafkaError:
        """Append ``meta`` (and ``more``) as the ids' new states, and a group's ``fence``,
        in one batch (all or none), durable on a quorum, then into the cache; an error if
        it could not be (this node no longer coordinates, or the outcome is unknown: the
        partition is read again before its next use)."""
        metas = [m for m in (meta, *more) if m is not None]
        keys = [encode_txn_key(m.transactional_id) for m in metas]
        values = [encode_txn_value(m) for m in metas]
        if fence is not None:
            keys.append(encode_fence_key(fence[0]))
            values.append(encode_fence_value(fence[1]))
        records = encode_batch(values, keys=keys)
        resp = await append(self.api, (TXN_STATE_TOPIC, part.partition), records, WRITE_TIMEOUT_MS)
        if resp.error:
            code = ErrorCode(resp.error)
            if code in MOVED:
                self._unload(part.partition)
                return KafkaError.NOT_COORDINATOR
            part.stale = True
            log.warning(
                "%s/%d: state write failed: %s", TXN_STATE_TOPIC, part.partition, resp.error_message
            )
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if resp.leader_epoch != part.epoch or not self._still(part):
            part.stale = True
            return KafkaError.NOT_COORDINATOR
        for m in metas:
            part.txns[m.transactional_id] = m
        if fence is not None:
            part.fences[fence[0]] = fence[1]
        return KafkaError.NONE

    # ------------------------------------------------------------------ finishing
    def _finish_later(self, part: TxnPartition, meta: TxnMetadata) -> asyncio.Task[KafkaError]:
        """Carry out a written decision (markers, then Complete) in a task of its own,
        one per id at a time."""
        tid = meta.transactional_id
        running = part.finishing.get(tid)
        if running is not None and not running.done():
            return running
        task = asyncio.create_task(self._finish(part, meta))
        part.finishing[tid] = task
        task.add_done_callback(
            lambda t: part.finishing.pop(tid, None) if part.finishing.get(tid) is t else None
        )
        return task

    async def _finish(self, part: TxnPartition, meta: TxnMetadata) -> KafkaError:
        if not await self._write_markers(part, meta):
            return KafkaError.NOT_COORDINATOR
        tid = meta.transactional_id
        if part.txns.get(tid) != meta:
            return KafkaError.NONE  # finished by another path meanwhile
        # The markers are durable: the transaction is over. Its Complete record is for
        # the record only (a coordinator finding the decision again resends markers that
        # end nothing now), so the producer's next request does not wait for it, and a
        # next state written first makes it moot.
        done = part.txns[tid] = complete(meta, wall_ms())
        task = asyncio.create_task(self._write_complete(part, done))
        part.completing.add(task)
        task.add_done_callback(part.completing.discard)
        return KafkaError.NONE

    async def _write_complete(self, part: TxnPartition, done: TxnMetadata) -> None:
        async with self._lock(done.transactional_id):
            if part.txns.get(done.transactional_id) is done:
                await self._write(part, done)

    async def _abort_ongoing(self, part: TxnPartition, meta: TxnMetadata) -> KafkaError:
        """Abort ``meta``'s ongoing transaction with the epoch bumped (fencing its
        producer), markers included; called with the id's lock held."""
        decision = begin_abort_on_timeout(meta, wall_ms())
        code = await self._write(part, decision)
        if code != KafkaError.NONE:
            return code
        if not await self._write_markers(part, decision):
            return KafkaError.NOT_COORDINATOR
        return await self._write(part, complete(decision, wall_ms()))

    async def _write_markers(self, part: TxnPartition, meta: TxnMetadata) -> bool:
        """The markers of ``meta``'s decision (a Prepare* state) on every partition it
        wrote; False if this node stopped coordinating first."""
        assert meta.state.preparing
        return await self.markers.write(
            sorted(meta.partitions),
            meta.producer_id,
            meta.producer_epoch,
            meta.state == TxnState.PREPARE_COMMIT,
            part.epoch,
            lambda: self._still(part),
        )

    # ------------------------------------------------------------------ timers
    def _start_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick_loop())

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self._expire()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction coordinator tick failed")

    def start(self) -> None:
        """Begin watching this node's ``__transaction_state`` leaders (``TICK_S``)."""
        self._start_ticker()

    async def _expire(self) -> None:
        """Load every partition this node newly leads (a new coordinator finishes the
        decisions it finds there at once, not at its first request), abort every ongoing
        transaction past its timeout, forget partitions led elsewhere now."""
        for p in range(self.topic.count() or 0):
            driver = self.api.driver.get((TXN_STATE_TOPIC, p))
            if driver is not None and driver.core.is_leader and driver.core.leader_committed:
                part = self.partitions.get(p)
                if part is None or part.epoch != driver.core.epoch:
                    await self._loaded(p)
        now = wall_ms()
        for p, part in list(self.partitions.items()):
            if not self._still(part):
                self._unload(p)
                continue
            if not part.ready:
                continue
            for meta in [t for t in part.txns.values() if expired(t, now)]:
                async with self._lock(meta.transactional_id):
                    current = part.txns.get(meta.transactional_id)
                    if current is None or not expired(current, wall_ms()):
                        continue
                    log.info(
                        "transactional id %r: transaction of producer %d epoch %d open past "
                        "its timeout (%d ms): aborting",
                        meta.transactional_id,
                        meta.producer_id,
                        meta.producer_epoch,
                        meta.timeout_ms,
                    )
                    await self._abort_ongoing(part, current)

    # ------------------------------------------------------------------ requests
    async def init_producer_id(
        self, tid: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> tuple[KafkaError, int, int]:
        """(error, producer id, producer epoch) for a transactional producer."""
        if not 0 < timeout_ms <= self.api.config.transaction_max_timeout_ms:
            return KafkaError.INVALID_TRANSACTION_TIMEOUT, -1, -1
        part, code = await self._coordinate(tid)
        if part is None:
            return code, -1, -1
        await self._settled(part, tid)
        async with self._lock(tid):
            meta = part.txns.get(tid)
            if names_another_producer(meta, (producer_id, producer_epoch)):
                return KafkaError.PRODUCER_FENCED, -1, -1  # a zombie: the live one's stays
            if meta is not None and meta.state == TxnState.ONGOING:
                code = await self._abort_ongoing(part, meta)
                if code != KafkaError.NONE:
                    return code, -1, -1
                meta = part.txns.get(tid)
                if producer_id >= 0 and meta is not None:
                    # The client named the epoch it had; the abort bumped it once.
                    producer_epoch = meta.producer_epoch
            decision = init_producer_id(
                meta,
                tid,
                timeout_ms,
                (producer_id, producer_epoch),
                secrets.randbits(62),
                wall_ms(),
            )
            code = await self._apply(part, decision)
            if code != KafkaError.NONE or decision.write is None:
                return code, -1, -1
            return KafkaError.NONE, decision.write.producer_id, decision.write.producer_epoch

    async def _apply(self, part: TxnPartition, decision: Decision) -> KafkaError:
        if decision.error != KafkaError.NONE:
            return decision.error
        if decision.write is None:
            return KafkaError.NONE
        return await self._write(part, decision.write)

    async def _add(
        self,
        tid: str,
        producer_id: int,
        producer_epoch: int,
        partitions: frozenset[tuple[str, int]],
    ) -> KafkaError:
        part, code = await self._coordinate(tid)
        if part is None:
            return code
        await self._settled(part, tid)
        async with self._lock(tid):
            meta = part.txns.get(tid)
            if meta is not None and meta.state.preparing:
                return KafkaError.CONCURRENT_TRANSACTIONS
            decision = add_partitions(meta, producer_id, producer_epoch, partitions, wall_ms())
            return await self._apply(part, decision)

    async def add_partitions_to_txn(self, api: KafkaApi, version: int, body: Message) -> Message:
        tid = body["v3_and_below_transactional_id"]
        pid, epoch = body["v3_and_below_producer_id"], body["v3_and_below_producer_epoch"]
        wanted: list[tuple[str, int]] = [
            (t["name"], p) for t in body["v3_and_below_topics"] for p in t["partitions"]
        ]
        unknown = {tp for tp in wanted if not self._exists(tp)}
        if unknown:
            codes = {
                tp: KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown
                else KafkaError.OPERATION_NOT_ATTEMPTED
                for tp in wanted
            }
        else:
            code = await self._add(tid, pid, epoch, frozenset(wanted))
            codes = dict.fromkeys(wanted, code)
        out = api.default_response(version)
        by_topic: dict[str, list[Message]] = {}
        for (name, p), code in codes.items():
            by_topic.setdefault(name, []).append(
                {"partition_index": p, "partition_error_code": int(code)}
            )
        out["results_by_topic_v3_and_below"] = [
            {"name": name, "results_by_partition": rows} for name, rows in by_topic.items()
        ]
        return out

    def _exists(self, tp: tuple[str, int]) -> bool:
        topic = self.api.controller.state.topics.get(tp[0])
        return topic is not None and 0 <= tp[1] < len(topic.replicas)

    async def add_offsets_to_txn(self, api: KafkaApi, version: int, body: Message) -> Message:
        """The group's offsets partition joins the transaction: its TxnOffsetCommit is
        completed there by the transaction's marker."""
        out = api.default_response(version)
        offsets = self.api.controller.state.topics.get(OFFSETS_TOPIC)
        if offsets is None:
            out["error_code"] = int(KafkaError.COORDINATOR_NOT_AVAILABLE)
            return out
        p = partition_for(body["group_id"], len(offsets.replicas))
        code = await self._add(
            body["transactional_id"],
            body["producer_id"],
            body["producer_epoch"],
            frozenset({(OFFSETS_TOPIC, p)}),
        )
        out["error_code"] = int(code)
        return out

    async def end_txn(self, api: KafkaApi, version: int, body: Message) -> Message:
        out = api.default_response(version)
        out["error_code"] = int(
            await self._end(
                body["transactional_id"],
                body["producer_id"],
                body["producer_epoch"],
                body["committed"],
            )
        )
        return out

    async def _end(self, tid: str, pid: int, epoch: int, commit: bool) -> KafkaError:
        part, code = await self._coordinate(tid)
        if part is None:
            return code
        await self._settled(part, tid)
        async with self._lock(tid):
            meta = part.txns.get(tid)
            decision = end_txn(meta, pid, epoch, commit, wall_ms())
            code = await self._apply(part, decision)
            if code != KafkaError.NONE or decision.write is None:
                return code
            self._finish_later(part, decision.write)
        # Answered once the decision is durable, as Kafka's coordinator does: the
        # markers follow, and the producer's next request waits for them (``_settled``)
        # while its records for the next transaction queue up.
        return KafkaError.NONE

    async def _settled(self, part: TxnPartition, tid: str) -> None:
        """Wait (at most FINISH_WAIT_S) for the markers of ``tid``'s decision, if any
        are being written: a request that finds them so is answered
        CONCURRENT_TRANSACTIONS, which the client retries after a back-off."""
        task = part.finishing.get(tid)
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), FINISH_WAIT_S)


def wall_ms() -> int:
    """Wall-clock ms: transaction start times are shown to users and compared across
    coordinators (a new one reads them from the topic)."""
    return int(time.time() * 1000)
