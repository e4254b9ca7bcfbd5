"""Kafka consumer groups on the Kafka listener: FindCoordinator, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit and OffsetFetch, with committed offsets kept in the
replicated internal topic ``__consumer_offsets`` (as Kafka's).

**Coordinator.** Group G belongs to partition ``abs(javaHashCode(G)) % P`` of
``__consumer_offsets`` (Kafka's own ``partitionFor``, so tools that compute it agree);
that partition's quorum leader is G's coordinator. FindCoordinator answers that leader's
Kafka address (COORDINATOR_NOT_AVAILABLE while it has none); a node that is not the
leader answers group requests NOT_COORDINATOR, so clients find the new one after a
failover. Membership (``replica.kafka.groups``, a pure state machine ticked from here)
lives in the coordinator's memory only: after a coordinator move, members rejoin.

**The topic.** Created through the metadata controller on first use, with
``offsets.topic.num.partitions`` partitions (``--offsets-topic-partitions``) and
replication factor min(3, nodes). Only the metadata leader can create it; a
FindCoordinator reaching another node while it is missing names the metadata leader
(whose group requests create it, then answer NOT_COORDINATOR so the client looks again).
Clients may read it (Metadata lists it with ``is_internal``) but not produce to it or
delete it.

**Records.** One OffsetCommit is one record batch (atomic over its partitions), appended
through the node's own produce path with acks=quorum: the commit is answered once a
majority holds it durably. Each record:

* key: msgpack ``[1, group, topic, partition]`` (1: the offset-commit key version);
* value: msgpack ``{"offset": int, "leader_epoch": int, "metadata": str,
  "commit_timestamp": int (ms since the epoch)}``; a null value deletes the entry.

A TxnOffsetCommit (an offset committed inside a Kafka transaction, KIP-447) is a record
of key ``[2, group, topic, partition, producer id, producer epoch]``: it waits in the
cache (``OffsetsCache.pending``) until the transaction's marker reaches this partition,
and counts only if it commits in that epoch (the loader replays the same from the log).
Once the commit marker is written, the coordinator writes those offsets again as plain
commits: the next transaction of that producer epoch writes records of the same keys,
which would shadow them on the compacted topic (and lose them if it aborts).

The last record of a key wins, and the topic is compacted (``internal_topics``): the
cleaner keeps the latest record of each key, so a coordinator's load reads about one
record per committed partition (and per transactional commit's producer epoch).
DeleteGroups and OffsetDelete write tombstones, which the cleaner drops after
``delete.retention.ms``.

**Cache.** OffsetFetch is answered from memory on the coordinator. The cache of a
partition is built when this node first needs it as leader: once the leader has
committed an entry of its own epoch (so everything before is committed too), it reads the
partition up to the high watermark, fenced by that epoch (group requests wait for it, at
most ``internal_topics.LOAD_WAIT_S``, then get COORDINATOR_LOAD_IN_PROGRESS). Its own commits then update
it as they are acknowledged; a commit whose outcome is unknown (a timeout) makes it read
again. A new leader epoch, or losing leadership, drops the cache and the groups of that
partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgpack
import pyarrow as pa

from ..kafka import messages as km
from ..kafka.coordinators import GROUP_KEY_TYPE, OFFSETS_TOPIC, TXN_KEY_TYPE, partition_for
from ..kafka.errors import KafkaError
from ..kafka.groups import GroupConfig, GroupCoordinator, JoinResult, SyncResult
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from ..kafka.txn import group_of
from ..node.api import Api
from ..node.metadata import TopicAssignment
from ..protocol import ErrorCode
from ..protocol import messages as m
from ..storage.records import BatchHeader, encode_batch
from .internal_topics import InternalTopic, loaded_state, read_partition
from .offsets import (
    Committed,
    OffsetsCache,
    decode_offset_record,
    decode_txn_offset_record,
    encode_offset_key,
    encode_offset_value,
    encode_txn_offset_key,
)

log = logging.getLogger(__name__)

# What a parked JoinGroup or SyncGroup is answered with.
R = TypeVar("R", JoinResult, SyncResult)

#: (api, lowest version, highest version) served; librdkafka 2.x negotiates
#: FindCoordinator 2, JoinGroup 5, SyncGroup 3, Heartbeat 3, LeaveGroup 1, OffsetCommit 9
#: and OffsetFetch 9 (batched groups), the Java client the newest.
SERVED: tuple[tuple[KafkaApi, int, int], ...] = tuple(
    (api, api.min_version, api.max_version)
    for api in (
        km.OFFSET_COMMIT,
        km.OFFSET_FETCH,
        km.FIND_COORDINATOR,
        km.JOIN_GROUP,
        km.HEARTBEAT,
        km.LEAVE_GROUP,
        km.SYNC_GROUP,
        km.TXN_OFFSET_COMMIT,
    )
)

#: How often the membership timers (sessions, rebalance deadlines) and the leadership of
#: loaded partitions are checked while this node has groups; with offsets loaded but no
#: groups, only leadership is (to free caches of partitions led elsewhere now); with
#: neither, nothing wakes up.
TICK_S = 0.1
IDLE_TICK_S = 1.0
#: How long a group request waits for a partition's cache to load before it is answered
#: COORDINATOR_LOAD_IN_PROGRESS (the client retries).

Handler = Callable[[KafkaApi, int, Message], Awaitable[Message | None]]

#: The client id and host of the Kafka request being handled (the listener sets it per
#: request): a member's JoinGroup records them, DescribeGroups shows them.
REQUEST_CLIENT: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "kafka_request_client", default=("", "")
)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class KafkaGroups:
    """The group handlers of one node's Kafka listener (``handlers``: api key -> handler)."""

    def __init__(
        self,
        api: Api,
        advertised: dict[int, tuple[str, int]],
        config: GroupConfig | None = None,
    ) -> None:
        self.api = api
        self.advertised = advertised
        if config is None:
            delay = api.config.group_initial_rebalance_delay_ms
            config = GroupConfig(initial_rebalance_delay_ms=delay)
        self.machine = GroupCoordinator(config)
        self.caches: dict[int, OffsetsCache] = {}
        self._waiting: dict[int, asyncio.Future[JoinResult | SyncResult]] = {}
        self._tokens = itertools.count(1)
        self._ticker: asyncio.Task[None] | None = None
        self._busy = asyncio.Event()
        # Writes of transactions' committed offsets as plain commits (``marker_written``).
        self._rewrites: set[asyncio.Task[None]] = set()
        self.offsets = InternalTopic(
            api, OFFSETS_TOPIC, lambda: api.config.offsets_topic_partitions
        )
        # Where FindCoordinator for a transactional id goes (``txn_coordinator``).
        self.transactions: InternalTopic | None = None
        self.handlers: dict[int, Handler] = {
            km.FIND_COORDINATOR.key: self.find_coordinator,
            km.JOIN_GROUP.key: self.join_group,
            km.SYNC_GROUP.key: self.sync_group,
            km.HEARTBEAT.key: self.heartbeat,
            km.LEAVE_GROUP.key: self.leave_group,
            km.OFFSET_COMMIT.key: self.offset_commit,
            km.OFFSET_FETCH.key: self.offset_fetch,
            km.TXN_OFFSET_COMMIT.key: self.txn_offset_commit,
        }

    def marker_written(
        self, partition: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """A transaction marker this node wrote to offsets partition ``partition``: the
        producer's pending offset commits there count (commit) or are dropped. Those that
        count are written again as plain offset commits, so their value stops resting on
        the transactional record: on the compacted topic, the record of a later
        transaction of the same producer epoch (the same key) shadows it, and if that
        one aborts, a load after the next clean would have lost the committed offset."""
        cache = self.caches.get(partition)
        if cache is None:
            return
        committed = cache.end_pending(producer_id, producer_epoch, commit)
        if committed:
            task = asyncio.create_task(self._write_committed(cache, committed))
            self._rewrites.add(task)
            task.add_done_callback(self._rewrites.discard)

    async def _write_committed(
        self, cache: OffsetsCache, committed: dict[tuple[str, str, int], Committed]
    ) -> None:
        """``committed`` (a transaction's offsets, just counted) as plain commits, each
        only while the cache still holds it (a later commit of that partition wins)."""
        by_group: dict[str, dict[tuple[str, int], Committed | None]] = {}
        for (group, topic, part), c in committed.items():
            if cache.groups.get(group, {}).get((topic, part)) is c:
                by_group.setdefault(group, {})[(topic, part)] = c
        for group, rows in by_group.items():
            code = await self._write(group, cache, rows)
            if code != KafkaError.NONE:  # the transactional record and marker still hold it
                log.info(
                    "%s/%d: rewriting %s's committed offsets: %s",
                    OFFSETS_TOPIC,
                    cache.partition,
                    group,
                    code.name,
                )

    async def close(self) -> None:
        tasks: list[asyncio.Task[Any]] = [t for t in (self._ticker, *self._rewrites) if t]
        tasks += [c.task for c in self.caches.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.offsets.close()

    # ------------------------------------------------------------------ coordination
    def _offsets_topic(self) -> TopicAssignment | None:
        return self.api.controller.state.topics.get(OFFSETS_TOPIC)

    async def _coordinate(self, group_id: str) -> tuple[OffsetsCache | None, KafkaError]:
        """The loaded offsets of ``group_id``'s partition if this node coordinates it,
        else the error to answer."""
        self._start_ticker()
        topic = self._offsets_topic()
        if topic is None:
            if self.api.controller.is_leader():
                await self.offsets.create()
            return None, KafkaError.COORDINATOR_NOT_AVAILABLE
        return await self._loaded(partition_for(group_id, len(topic.replicas)))

    async def _loaded(self, p: int) -> tuple[OffsetsCache | None, KafkaError]:
        return await loaded_state(
            self.api,
            (OFFSETS_TOPIC, p),
            self.caches,
            OffsetsCache,
            lambda cache, start, upto: self._load(p, cache, start, upto),
            # A stale cache of this epoch is read again; its groups' membership stays.
            lambda moved: self._unload(p, groups=moved),
        )

    async def _load(self, p: int, cache: OffsetsCache, start: int, upto: int) -> bool:
        """Read partition ``p`` from ``start`` to ``upto`` (its high watermark) into
        ``cache``; False if the leadership moved meanwhile. Transactional offset commits
        wait in ``cache.pending`` for their transaction's marker."""
        records = 0

        def on_batch(header: BatchHeader, rows: pa.Table | None) -> None:
            nonlocal records
            if rows is None:
                if header.marker is not None:
                    cache.end_pending(header.producer_id, header.producer_epoch, header.marker)
                return
            keys = rows.column("key").to_pylist()
            values = rows.column("value").to_pylist()
            for key, value in zip(keys, values, strict=True):
                try:
                    decoded = decode_offset_record(key, value)
                    pending = decode_txn_offset_record(key, value) if decoded is None else None
                except (ValueError, TypeError, KeyError, msgpack.UnpackException):
                    log.warning("%s/%d: bad record near %d", OFFSETS_TOPIC, p, header.base_offset)
                    continue
                if decoded is not None:
                    cache.apply(*decoded)
                    records += 1
                elif pending is not None:
                    cache.add_pending(*pending)

        try:
            if not await read_partition(
                self.api, (OFFSETS_TOPIC, p), cache.epoch, start, upto, on_batch
            ):
                return False
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s/%d: loading failed", OFFSETS_TOPIC, p)
            return False
        log.info(
            "%s/%d: coordinating in epoch %d: %d offset record(s) of %d group(s) loaded",
            OFFSETS_TOPIC,
            p,
            cache.epoch,
            records,
            len(cache.groups),
        )
        return True

    def _unload(self, p: int, *, groups: bool = True) -> None:
        """Forget partition ``p``'s offsets and (``groups``) its groups' membership."""
        cache = self.caches.pop(p, None)
        if cache is not None and cache.task is not None and not cache.task.done():
            cache.task.cancel()
        if not groups:
            return
        topic = self._offsets_topic()
        n = len(topic.replicas) if topic is not None else 0
        gone = [g for g in self.machine.groups if n == 0 or partition_for(g, n) == p]
        if gone:
            log.info("%s/%d: no longer coordinating %d group(s)", OFFSETS_TOPIC, p, len(gone))
            self.machine.unload(gone)
            self._deliver()

    # ------------------------------------------------------------------ timers
    def _start_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._tick_loop())
        self._busy.set()

    async def _tick_loop(self) -> None:
        while True:
            try:
                self.machine.tick(now_ms())
                for p, cache in list(self.caches.items()):
                    part = self.api.driver.get((OFFSETS_TOPIC, p))
                    if part is None or not part.core.is_leader or part.core.epoch != cache.epoch:
                        self._unload(p)
                self._deliver()
            except Exception:
                log.exception("group coordinator tick failed")
            if self.machine.groups:
                await asyncio.sleep(TICK_S)
            elif self.caches:
                # A request wakes it at once (its groups need the finer timers).
                self._busy.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._busy.wait(), IDLE_TICK_S)
            else:
                self._busy.clear()
                await self._busy.wait()

    def _deliver(self) -> None:
        for token, result in self.machine.take_answers():
            fut = self._waiting.get(token)
            if fut is not None and not fut.done():
                fut.set_result(result)

    async def _parked(
        self, group_id: str, step: Callable[[int], None], answer: type[R], **fields: Any
    ) -> R:
        """If this node coordinates ``group_id``, run ``step(token)`` on the state machine
        and wait for the ``answer`` it gives that token, now or later (every parked request
        is answered by its phase deadline; the longest rebalance timeout is a safety net
        past it). Otherwise the answer is ``answer(error, **fields)``: the coordinator
        lookup's error, or REBALANCE_IN_PROGRESS past the safety net."""
        _, code = await self._coordinate(group_id)
        if code != KafkaError.NONE:
            return answer(code, **fields)
        safety_net_s = self.machine.config.max_rebalance_timeout_ms / 1000 + 5
        token = next(self._tokens)
        fut: asyncio.Future[JoinResult | SyncResult] = asyncio.get_running_loop().create_future()
        self._waiting[token] = fut
        try:
            step(token)
            self._deliver()
            try:
                result = await asyncio.wait_for(fut, safety_net_s)
            except TimeoutError:
                return answer(KafkaError.REBALANCE_IN_PROGRESS, **fields)
            assert isinstance(result, answer)
            return result
        finally:
            self._waiting.pop(token, None)

    # ------------------------------------------------------------------ FindCoordinator
    async def find_coordinator(self, api: KafkaApi, version: int, body: Message) -> Message:
        keys = body["coordinator_keys"] if version >= 4 else [body["key"]]
        found = [await self._find(key, body["key_type"]) for key in keys]
        out = api.default_response(version)
        if version >= 4:
            out["coordinators"] = [
                {
                    "key": key,
                    "node_id": node,
                    "host": host,
                    "port": port,
                    "error_code": int(code),
                    "error_message": text,
                }
                for key, (code, text, node, host, port) in zip(keys, found, strict=True)
            ]
        else:
            code, text, node, host, port = found[0]
            out.update(error_code=int(code), error_message=text, node_id=node, host=host, port=port)
        return out

    async def _find(self, key: str, key_type: int) -> tuple[KafkaError, str | None, int, str, int]:
        def node(nid: int) -> tuple[KafkaError, str | None, int, str, int]:
            host, port = self.advertised[nid]
            return KafkaError.NONE, None, nid, host, port

        def error(code: KafkaError, text: str) -> tuple[KafkaError, str | None, int, str, int]:
            return code, text, -1, "", -1

        if key_type == GROUP_KEY_TYPE:
            internal = self.offsets
        elif key_type == TXN_KEY_TYPE and self.transactions is not None:
            internal = self.transactions
        else:
            return error(
                KafkaError.INVALID_REQUEST, f"coordinator key type {key_type} is not served"
            )
        count = internal.count()
        if count is None:
            controller = self.api.controller
            if controller.is_leader():
                await internal.create()
            elif controller.leader_id() in self.advertised:
                # Only the metadata leader creates it: the client's request goes there,
                # creates it and is told NOT_COORDINATOR, so it looks again.
                return node(controller.leader_id())
            return error(KafkaError.COORDINATOR_NOT_AVAILABLE, f"{internal.name} is being created")
        topic = self.api.controller.state.topics[internal.name]
        # A transaction group's members are coordinated with the group (``kafka.txn``).
        p = partition_for(group_of(key) if key_type == TXN_KEY_TYPE else key, count)
        leader = self.api.partition_info(internal.name, p, topic.replicas[p]).leader_id
        if self.api.driver.get((internal.name, p)) is None and topic.replicas[p]:
            # Not a replica here, so the leader is unknown here: name the preferred replica,
            # usually the leader (if not, the client is told NOT_COORDINATOR and asks again).
            leader = topic.replicas[p][0]
        if leader not in self.advertised:
            return error(KafkaError.COORDINATOR_NOT_AVAILABLE, f"{internal.name}/{p} has no leader")
        return node(leader)

    # ------------------------------------------------------------------ membership
    async def join_group(self, api: KafkaApi, version: int, body: Message) -> Message:
        group_id, member_id = body["group_id"], body["member_id"]
        protocols = [(p["name"], p["metadata"]) for p in body["protocols"]]

        client_id, client_host = REQUEST_CLIENT.get()

        def step(token: int) -> None:
            self.machine.join(
                token,
                group_id,
                member_id,
                body["protocol_type"],
                protocols,
                body["session_timeout_ms"],
                body["rebalance_timeout_ms"],
                now_ms(),
                require_known_member_id=version >= 4,
                client_id=client_id,
                client_host=client_host,
                group_instance_id=body["group_instance_id"],
            )

        result = await self._parked(group_id, step, JoinResult, member_id=member_id)
        out = api.default_response(version)
        out.update(
            error_code=int(result.error),
            generation_id=result.generation_id,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name if version >= 7 else result.protocol_name or "",
            leader=result.leader,
            member_id=result.member_id,
            members=[
                {
                    "member_id": mid,
                    "group_instance_id": self._instance(group_id, mid),
                    "metadata": md,
                }
                for mid, md in result.members
            ],
        )
        return out

    async def sync_group(self, api: KafkaApi, version: int, body: Message) -> Message:
        group_id = body["group_id"]
        assignments = [(a["member_id"], a["assignment"]) for a in body["assignments"]]

        def step(token: int) -> None:
            self.machine.sync(
                token,
                group_id,
                body["generation_id"],
                body["member_id"],
                assignments,
                now_ms(),
                protocol_type=body["protocol_type"],
                protocol_name=body["protocol_name"],
                group_instance_id=body["group_instance_id"],
            )

        result = await self._parked(group_id, step, SyncResult)
        out = api.default_response(version)
        out.update(
            error_code=int(result.error),
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )
        return out

    async def heartbeat(self, api: KafkaApi, version: int, body: Message) -> Message:
        _, code = await self._coordinate(body["group_id"])
        if code == KafkaError.NONE:
            code = self.machine.heartbeat(
                body["group_id"],
                body["generation_id"],
                body["member_id"],
                now_ms(),
                body["group_instance_id"],
            )
            self._deliver()
        out = api.default_response(version)
        out["error_code"] = int(code)
        return out

    async def leave_group(self, api: KafkaApi, version: int, body: Message) -> Message:
        group_id = body["group_id"]
        _, code = await self._coordinate(group_id)
        out = api.default_response(version)
        if code != KafkaError.NONE:
            out["error_code"] = int(code)
            return out
        now = now_ms()
        if version < 3:
            out["error_code"] = int(self.machine.leave(group_id, body["member_id"], now))
        else:
            out["members"] = [
                {
                    "member_id": mb["member_id"],
                    "group_instance_id": mb["group_instance_id"],
                    "error_code": int(
                        self.machine.leave(group_id, mb["member_id"], now, mb["group_instance_id"])
                    ),
                }
                for mb in body["members"]
            ]
        self._deliver()
        return out

    def _instance(self, group_id: str, member_id: str) -> str | None:
        """A member's group instance id (None: a dynamic member, or gone)."""
        group = self.machine.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        return member.group_instance_id if member is not None else None

    # ------------------------------------------------------------------ offsets
    async def offset_commit(self, api: KafkaApi, version: int, body: Message) -> Message:
        return await self._commit(api, version, body, body["generation_id_or_member_epoch"])

    async def txn_offset_commit(self, api: KafkaApi, version: int, body: Message) -> Message:
        """Offsets committed inside a transaction (KIP-98, KIP-447): written now, counted
        once the transaction's commit marker reaches this partition (dropped by an abort
        marker, or by any marker of a later producer epoch). From v3 the member's
        generation is checked as an OffsetCommit's is (KIP-447)."""
        txn = (body["producer_id"], body["producer_epoch"])
        generation = body["generation_id"] if version >= 3 else -1
        return await self._commit(api, version, body, generation, txn)

    async def _commit(
        self,
        api: KafkaApi,
        version: int,
        body: Message,
        generation: int,
        txn: tuple[int, int] | None = None,
    ) -> Message:
        group_id = body["group_id"]
        cache, code = await self._coordinate(group_id)
        if cache is not None and (txn is None or generation >= 0):
            code = self.machine.commit_error(
                group_id,
                generation,
                body["member_id"],
                now_ms(),
                body["group_instance_id"],
            )
            self._deliver()
            limit = self.machine.config.max_groups
            if (
                code == KafkaError.NONE
                and group_id not in cache.groups
                and len(cache.groups) >= limit
            ):
                code = KafkaError.GROUP_MAX_SIZE_REACHED
        codes: dict[tuple[str, int], int] = {}
        rows: dict[tuple[str, int], Committed | None] = {}
        max_metadata = self.machine.config.offset_metadata_max_bytes
        commit_ts = int(time.time() * 1000)
        for t in body["topics"]:
            assignment = self.api.controller.state.topics.get(t["name"])
            for p in t["partitions"]:
                where = (t["name"], p["partition_index"])
                metadata = p["committed_metadata"] or ""
                if code != KafkaError.NONE:
                    codes[where] = int(code)
                elif assignment is None or not 0 <= where[1] < len(assignment.replicas):
                    codes[where] = int(KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
                elif len(metadata.encode()) > max_metadata:
                    codes[where] = int(KafkaError.OFFSET_METADATA_TOO_LARGE)
                else:
                    rows[where] = Committed(
                        p["committed_offset"], p["committed_leader_epoch"], metadata, commit_ts
                    )
        if rows and cache is not None:
            written = await self._write(group_id, cache, rows, txn)
            codes.update(dict.fromkeys(rows, int(written)))
        out = api.default_response(version)
        out["topics"] = [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": codes[(t["name"], p["partition_index"])],
                    }
                    for p in t["partitions"]
                ],
            }
            for t in body["topics"]
        ]
        return out

    async def _write(
        self,
        group_id: str,
        cache: OffsetsCache,
        rows: dict[tuple[str, int], Committed | None],
        txn: tuple[int, int] | None = None,
    ) -> KafkaError:
        """Append ``rows`` as one batch, durable on a quorum, then into the cache (None:
        a tombstone, which deletes that partition's committed offset). ``txn``: the
        (producer id, epoch) of a transaction they are committed in: they wait in the
        cache for its marker."""
        p = cache.partition
        if txn is None:
            keys = [encode_offset_key(group_id, topic, part) for topic, part in rows]
        else:
            keys = [encode_txn_offset_key(group_id, topic, part, *txn) for topic, part in rows]
        records = encode_batch(
            [None if c is None else encode_offset_value(c) for c in rows.values()], keys=keys
        )
        req = m.ProduceRequest(
            topic=OFFSETS_TOPIC,
            partition=p,
            acks=m.ACKS_QUORUM,
            timeout_ms=self.machine.config.offsets_commit_timeout_ms,
            records=records,
        )
        resp = await self.api.submit((OFFSETS_TOPIC, p), req)
        if resp.error:
            code = ErrorCode(resp.error)
            if code in _MOVED:
                self._unload(p)
                return KafkaError.NOT_COORDINATOR
            # The outcome is unknown (it may still commit): read the log again next time.
            cache.stale = True
            if code == ErrorCode.MESSAGE_TOO_LARGE:
                return KafkaError.INVALID_COMMIT_OFFSET_SIZE
            if code in (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS):
                return KafkaError.COORDINATOR_NOT_AVAILABLE
            log.warning("%s/%d: commit failed: %s", OFFSETS_TOPIC, p, resp.error_message)
            return KafkaError.UNKNOWN_SERVER_ERROR
        current = self.caches.get(p)
        if current is cache and resp.leader_epoch == cache.epoch:
            for (topic, part), c in rows.items():
                if txn is None:
                    cache.apply((group_id, topic, part), c)
                elif c is not None:
                    cache.add_pending(*txn, (group_id, topic, part), c)
        elif current is not None:
            # The cache was replaced (or read in another epoch) while this was written:
            # it may have been read before this commit was; read it again.
            current.stale = True
        return KafkaError.NONE

    async def offset_fetch(self, api: KafkaApi, version: int, body: Message) -> Message:
        """v0-7: one group (``topics`` null from v2: all its partitions); v8+: ``groups``."""
        asked = (
            [(g["group_id"], g["topics"]) for g in body["groups"]]
            if version >= 8
            else [(body["group_id"], body["topics"])]
        )
        answers = []
        for group_id, topics in asked:
            cache, code = await self._coordinate(group_id)
            committed = cache.groups.get(group_id, {}) if cache is not None else {}
            if topics is None:
                names = sorted({topic for topic, _ in committed})
                wanted = [(n, sorted(p for topic, p in committed if topic == n)) for n in names]
            else:
                wanted = [(t["name"], t["partition_indexes"]) for t in topics]
            none = Committed(-1, -1, "", -1)
            answers.append(
                {
                    "group_id": group_id,
                    "error_code": int(code),
                    "topics": [
                        {
                            "name": name,
                            "partitions": [
                                {
                                    "partition_index": p,
                                    "committed_offset": c.offset,
                                    "committed_leader_epoch": c.leader_epoch,
                                    "metadata": c.metadata,
                                    # v0-1 have no top-level error: each partition has it.
                                    "error_code": int(code) if version < 2 else 0,
                                }
                                for p in parts
                                for c in [committed.get((name, p), none)]
                            ],
                        }
                        for name, parts in wanted
                    ]
                    if code == KafkaError.NONE or version < 2
                    else [],
                }
            )
        out = api.default_response(version)
        if version >= 8:
            out["groups"] = answers
        else:
            out["topics"] = answers[0]["topics"]
            out["error_code"] = answers[0]["error_code"]
        return out


_MOVED = frozenset(
    {
        ErrorCode.NOT_LEADER,
        ErrorCode.NOT_FOLLOWER,
        ErrorCode.NOT_QUORUM_LEADER,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
)
