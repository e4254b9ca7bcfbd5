"""A node: one asyncio process hosting many partition replicas. It executes what the pure
driver (``replica.driver``) hands out with real sockets, disks and time: quorum-state
writes before sends, log flushes in a worker thread, raft messages to peers, answers to
clients. The rooms: ``transport``/``peers`` (connections), ``api`` (a handler per API),
``partitions`` (files of hosted replicas), ``controller`` (the metadata log),
``maintenance`` (retention, scrub), ``datadir`` (lock, identity, replacement)."""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import functools
import gc
import importlib.abc
import itertools
import logging
import os
import random
import signal
import sys
import time
import typing
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from .. import defaults
from ..driver import Driver, Limits, NodeHeartbeat, PartitionKey, Ready
from ..kafka_listener.dispatch import KafkaDispatch
from ..kafka_listener.handlers import KafkaHandlers
from ..kafka_listener.server import KafkaServer
from ..kafka_listener.txn_groups import TxnGroups
from ..protocol import (
    ApiKey,
    DecodeError,
    ErrorCode,
    Frame,
    decode_body,
    encode,
    max_batch_bytes,
)
from ..protocol import messages as m
from ..raft import Message, QuorumConfig
from ..storage import LogConfig, StorageError, fileio, flush_logs
from .api import Api
from .cleaner import LogCleaner
from .config import NodeConfig
from .controller import METADATA_KEY, MetadataController
from .datadir import DataDir
from .directories import DirectoryIds
from .diskspace import DiskSpace
from .flusher import Flusher
from .maintenance import Maintenance
from .metadata import NodeRegistration
from .metrics import NodeMetrics
from .metrics_http import MetricsServer
from .nodes import NodeBook
from .partitions import PartitionManager
from .peers import PeerLink
from .security import (
    AuthConfig,
    check_own_principal,
    check_raft_sender,
    cluster_auth_config,
    peer_client_context,
    server_context,
)
from .topic_changes import TopicChanges
from .topic_configs import cleanup_policy
from .transport import Server

log = logging.getLogger(__name__)

#: How often a node that could not register itself yet tries again.
REGISTER_RETRY_S = 1.0

# The exit status of a node stopped by a failing disk (sysexits' EX_IOERR).
EXIT_DISK_FAILED = 74

# Raft frames name their message class; only these may be decoded from a peer.
RAFT_CLASSES: dict[str, type] = {
    cls.__name__: cls for cls in (*typing.get_args(Message), NodeHeartbeat)
}

# A node ticks its driver at the driver's next deadline, but at least TICK_S after its
# last tick (a node reads its sockets between two ticks: see PeerLiveness) and at most
# MAX_TICK_S after it (its own upkeep: maintenance, the controller's catch-up).
TICK_S = 0.01
MAX_TICK_S = 0.1
# Raft batches: records above this travel in a frame of their own (never copied into a
# batch); a batch frame holds at most this many bytes of records, counting each item's
# head as BATCH_ITEM_OVERHEAD (well inside any frame limit).
BATCH_ALONE_BYTES = 1 << 20
BATCH_FRAME_BYTES = 8 << 20
BATCH_ITEM_OVERHEAD = 512
# ... and at most this many messages: its receiver applies a frame in one go (~10 ms for
# this many), its heartbeats and other peers' frames waiting meanwhile. Without a cap a
# step that speaks for thousands of partitions at once (a node heard again, an
# election wave) sent them in one frame that held the receiver for most of a second.
BATCH_MESSAGES = 256


# The collector's thresholds in a node process. Python's (700, 10, 10) collect the young
# every 700 allocations and everything whenever the heap grew by a quarter: with
# thousands of replicas (millions of long-lived objects) each full collection took
# 300-470 ms, stalling the loop, and collections were half the CPU of creating 10,000
# partitions (`quorumlog perf partitions`). The young generations stay small (a second
# generation of 20 first ones held up to a million survivors: a pause of 140-200 ms when
# it was collected, 400-700 ms on a loaded machine, while a topic of 10,000 opened); a
# full collection comes as rarely as before (every 100 million allocations).
GC_THRESHOLDS = (25_000, 2, 2_000)

# glibc's malloc in a node process (``tune_malloc``). A node allocates and frees buffers
# of 100 kB to a few MB all the time (asyncio's 256 kB socket reads, frames, fetched
# batches). Past glibc's threshold (128 kB, raised as such blocks are freed) each is a
# fresh mmap, and memory trimmed off the heap's top comes back as fresh pages: the
# first touch of every page is a fault and a zeroing. With 64 partitions under load
# that was 13,000-22,000 page faults a second over three nodes, and with these 150-500.
MALLOC_MMAP_THRESHOLD = 16 << 20  # above the largest frame (BATCH_FRAME_BYTES)
MALLOC_TRIM_THRESHOLD = 128 << 20  # the heap keeps up to this much free at its top
# mallopt(3)'s parameter numbers, and the variables with which glibc lets a user set
# the same (then left as they are).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

# Lag of the event loop the driver's clock still counts (see DriverClock).
LOOP_LAG_ALLOWANCE_MS = 100
# A stall this long (not counted by the driver's clock) is logged.
STALL_WARNING_MS = 1000
# A graceful stop takes well under a second. One still running after this long (a flush
# stuck in the kernel, a task that ignores its cancellation) is cut short: every thread's
# stack goes to stderr and the process exits with status 1, which loses nothing a kill -9
# would not (nothing is acknowledged before it is durable).
STOP_DEADLINE_S = 10.0


# The requests ``Node._request`` hands the driver a turn of the loop at a time.
_APPENDS = (m.ProduceRequest, m.WriteTxnMarkerRequest)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class GatheredSteps:
    """Driver steps carried out together: those handed to ``soon`` in one turn of the
    event loop (client requests, raft frames and completed flushes that came in
    together) are merged and carried out once, at the loop's next turn, so they cost one
    journal write, one set of flushes and one frame per peer, every persist still
    before every send. ``now`` carries out what was gathered with its own step, so
    steps are always carried out in the order the driver took them. Under load, this is
    what batches a node's work: a frame and a socket write per step cost ~10% of a
    loaded node's CPU with 64 busy partitions. Work handed in for the driver to take
    at the next turn (``wake``: a turn's appends) is taken then by ``pending``, its step
    carried out with the gathered ones, after them."""

    def __init__(
        self, carry_out: Callable[[Ready], None], pending: Callable[[], Ready | None] | None = None
    ) -> None:
        self._carry_out = carry_out
        self._pending = pending
        self._gathered: Ready | None = None
        self._due = False  # a turn is scheduled

    def now(self, ready: Ready) -> None:
        if self._gathered is not None:
            gathered, self._gathered = self._gathered, None
            gathered.merge(ready)
            ready = gathered
        self._carry_out(ready)

    def soon(self, ready: Ready) -> None:
        if self._gathered is None:
            self._gathered = Ready()
        self._gathered.merge(ready)
        self.wake()

    def wake(self) -> None:
        """Have a turn at the loop's next turn (``pending`` is asked for its step then)."""
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self._due = False
        ready, self._gathered = self._gathered, None
        step = self._pending() if self._pending is not None else None
        if step is not None:
            if ready is None:
                ready = step
            else:
                ready.merge(step)
        if ready is not None:
            self._carry_out(ready)


class TickTimer:
    """When a node's next tick is due: at the driver's next deadline, within [TICK_S,
    MAX_TICK_S] after the last tick. A step that brings a deadline of the driver forward
    while the loop waits brings the tick forward (``advance``, after every step carried
    out). An idle node (thousands of quiesced partitions) wakes for its heartbeats and its
    upkeep, ten times a second, not a hundred (each wake cost an idle node ~0.3 ms of CPU
    with 10,000 partitions). The wait planned is the period ``DriverClock.turn`` takes:
    a stall is what the loop ran late past it."""

    def __init__(self, next_deadline: Callable[[], int | None], now: Callable[[], int]) -> None:
        self._next_deadline = next_deadline  # the driver's, on the clock ``now`` reads
        self._now = now
        self._last = 0.0  # event-loop time the last wait began (the last tick's end)
        self._at = 0.0  # event-loop time the next tick is due
        self._wake: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def wait(self) -> int:
        """Until the next tick is due; the wait planned, in ms (as last armed)."""
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        self._wake = loop.create_future()
        self._arm(self._due())
        try:
            await self._wake
        finally:
            self._wake = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        return round((self._at - self._last) * 1000)

    def advance(self) -> None:
        """The driver's deadlines may have changed: while waiting, tick sooner if due."""
        if self._wake is None or self._at <= self._last + TICK_S:
            return  # not waiting (a tick is running), or due as soon as may be
        at = self._due()
        if at < self._at:
            self._arm(at)

    def _due(self) -> float:
        due = self._next_deadline()
        if due is None:
            return self._last + MAX_TICK_S
        at = asyncio.get_running_loop().time() + (due - self._now()) / 1000
        return min(max(at, self._last + TICK_S), self._last + MAX_TICK_S)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._fire)

    def _fire(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)


class DriverClock:
    """The time the node hands its driver: monotonic milliseconds, less the time the
    event loop was stalled beyond ``LOOP_LAG_ALLOWANCE_MS`` (as a raft ticker drops the
    ticks a busy node cannot take). An overloaded node (thousands of partitions electing
    at once) must not count against its peers, or its own quorum timers, the time it
    spent not reading their messages: heartbeats and fetches waiting in its sockets would
    look like silence, and every peer stale, every fetch timed out, would start
    elections that load it more. Timers stretch with the overload instead. Never goes
    back."""

    def __init__(self, allowance_ms: int = LOOP_LAG_ALLOWANCE_MS) -> None:
        self.allowance_ms = allowance_ms
        self.stalled_ms = 0  # not counted so far
        self._last = 0
        self._turn_at: int | None = None

    def now(self) -> int:
        t = max(self._last, now_ms() - self.stalled_ms)
        self._last = t
        return t

    def turn(self, period_ms: int) -> None:
        """One turn of the node's periodic loop, due ``period_ms`` after the last one:
        its lateness beyond the allowance is not counted."""
        real = now_ms()
        if self._turn_at is not None:
            excess = real - self._turn_at - period_ms - self.allowance_ms
            if excess > 0:
                self.stalled_ms += excess
                if excess >= STALL_WARNING_MS:
                    log.warning("event loop stalled %d ms: quorum timers did not count it", excess)
        self._turn_at = real


def default_quorum_config(config: NodeConfig) -> QuorumConfig:
    """The shipped timing (replica.defaults says why): a follower gives up on a silent
    leader after the fetch timeout, so kill -9 of a leader is followed by a new leader about
    0.8-1.0 s later, while idle long-polls answer well within that window, so a live leader
    under load is never deposed."""
    return QuorumConfig(
        election_timeout_ms=config.election_timeout_ms,
        fetch_timeout_ms=config.fetch_timeout_ms,
        election_backoff_max_ms=defaults.QUORUM_ELECTION_BACKOFF_MAX_MS,
        retry_backoff_ms=defaults.QUORUM_RETRY_BACKOFF_MS,
        retry_backoff_max_ms=defaults.QUORUM_RETRY_BACKOFF_MAX_MS,
        request_timeout_ms=defaults.quorum_request_timeout_ms(
            config.fetch_timeout_ms, config.replica_fetch_max_wait_ms
        ),
        fetch_max_wait_ms=config.replica_fetch_max_wait_ms,
        fetch_max_bytes=defaults.REPLICA_FETCH_MAX_BYTES,
        quiesce=config.quiesce,
        rebalance_interval_ms=config.leader_imbalance_check_interval_ms or None,
    )


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.quorum = default_quorum_config(config)
        log_config = LogConfig(
            segment_bytes=config.segment_bytes,
            retention_bytes=config.retention_bytes,
            retention_ms=config.retention_ms,
            drop_synced_pages=config.drop_synced_pages,
            segment_ms=config.segment_ms,
            cleanup_policy=cleanup_policy(config.cleanup_policy) or config.cleanup_policy,
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            min_compaction_lag_ms=config.min_compaction_lag_ms,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
            delete_retention_ms=config.delete_retention_ms,
        )
        self.rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        self.driver = Driver(
            config.node_id,
            config.cluster_id,
            self.quorum,
            Limits(
                max_fetch_bytes=max_batch_bytes(config.max_frame_bytes),
                produce_timeout_ms=config.produce_timeout_ms,
                catch_up_bytes_per_s=config.catch_up_bytes_per_second,
            ),
            self.rng,
        )
        if config.incarnation is not None:  # registered with it (serve --join)
            self.driver.incarnation = config.incarnation
        self.clock = DriverClock()
        self.ticks = TickTimer(self.driver.next_deadline_ms, self.clock.now)
        self.steps = GatheredSteps(self._carry_out, self._take_appends)
        self.space = DiskSpace(config.data_dir, config.node_id)
        # Off unless --metrics-listen: then requests, flushes and persists are counted.
        self.metrics: NodeMetrics | None = None
        if config.metrics_listen is not None:
            self.metrics = NodeMetrics(self, per_partition=config.metrics_per_partition)
        flush = flush_logs if self.metrics is None else self.metrics.timed_flush(flush_logs)
        self.flusher = Flusher(
            self.driver,
            self.execute_soon,
            self.clock.now,
            flush=flush,
            on_disk_full=self.space.saw,
            on_failure=self._flush_failed,
        )
        self.datadir = DataDir(config.data_dir, config.cluster_id, config.node_id)
        kafka = dict(config.kafka_voters)
        if config.kafka_listen is not None and not kafka:
            kafka = {self.node_id: config.kafka_listen}
        self.book = NodeBook(config.node_id, config.voters, kafka, config.rack)
        self.partitions = PartitionManager(
            config.node_id,
            self.datadir,
            log_config,
            self.driver,
            self.execute,
            self.clock.now,
            space=self.space,
            settle_gc=settle_gc,
        )
        self.controller = MetadataController(
            config,
            self.datadir,
            self.driver,
            self.partitions,
            self.submit,
            self.execute,
            self.clock.now,
            self.book,
        )
        self.changes = TopicChanges(
            self.controller,
            config,
            self._forwarding_credentials(),
            self.book,
            node_credentials=config.peer_credentials(),
        )
        self.maintenance = Maintenance(
            log_config,
            config.scrub_bytes_per_second,
            self.driver,
            self.partitions,
            self.execute,
            self.clock.now,
        )
        self.cleaner = LogCleaner(self.driver, self.partitions, config.cleaner_bytes_per_second)
        self.api = Api(
            config, self.driver, self.controller, self.changes, self.submit, self.submit_each
        )
        self.peers: dict[int, PeerLink] = {}
        self._batch_room = min(BATCH_FRAME_BYTES, max_batch_bytes(config.max_frame_bytes) // 2)
        self._batch_alone = min(BATCH_ALONE_BYTES, self._batch_room)
        auth = self._load_auth()
        self.server = Server(
            config.host,
            config.port,
            self.api.handle
            if self.metrics is None
            else self.metrics.native_handler(self.api.handle),
            self._handle_raft,
            max_frame_bytes=config.max_frame_bytes,
            ssl_context=server_context(config.tls) if config.tls else None,
            auth=auth,
            # Plaintext: clients stay anonymous; only peers holding the cluster secret
            # authenticate, and only they may send raft traffic.
            node_auth=(
                cluster_auth_config(config.cluster_secret, sorted(config.voters))
                if config.cluster_secret and not config.auth_config
                else None
            ),
        )
        # Kafka's coordinators (groups, transactions) answer the Kafka listener's clients
        # and, carried in envelopes, the native listener's.
        self.kafka_dispatch = KafkaDispatch(KafkaHandlers(self.api, self.book.kafka, self.changes))
        self.api.handlers[ApiKey.KAFKA_ENVELOPE] = self.kafka_dispatch.envelope
        self.api.handlers[ApiKey.TXN_GROUP_COMMIT] = TxnGroups(
            self.kafka_dispatch.handlers.transactions
        ).group_commit
        if self.metrics is not None:
            self.kafka_dispatch.observe = self.metrics.kafka_answered
        self.kafka: KafkaServer | None = None
        if config.kafka_listen is not None:
            host, port = config.kafka_listen
            # The same certificate and principals as the native listener.
            self.kafka = KafkaServer(
                self.kafka_dispatch,
                host,
                port,
                config.max_frame_bytes,
                ssl_context=server_context(config.tls) if config.tls else None,
                auth=auth,
            )
        self.metrics_server: MetricsServer | None = None
        if self.metrics is not None and config.metrics_listen is not None:
            self.metrics_server = MetricsServer(
                self.metrics,
                *config.metrics_listen,
                ssl_context=server_context(config.tls) if config.tls else None,
            )
        self.directories: DirectoryIds | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._registering: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._answers: dict[int, asyncio.Future[Any]] = {}
        self._tokens = itertools.count(1)
        # The appends handed in this turn of the loop, for the driver at the next.
        self._appends: list[tuple[int, PartitionKey, Any]] = []

    # ------------------------------------------------------------------ executing
    def execute(self, ready: Ready) -> None:
        """Carry out one driver step now (after the steps gathered before it)."""
        self.steps.now(ready)

    def execute_soon(self, ready: Ready) -> None:
        """Carry out one driver step with the others of this turn of the event loop."""
        self.steps.soon(ready)

    def _carry_out(self, ready: Ready) -> None:
        """In the order ``Ready`` prescribes."""
        if ready.persist:
            # One fsync for every state of this step, durable before any send below.
            try:
                if self.metrics is None:
                    self.partitions.persist_all(ready.persist)
                else:
                    self.metrics.persist(self.partitions, ready.persist)
            except (OSError, StorageError) as exc:
                # Nothing of this step may be sent, and the cores have moved on.
                self.fail_stop(f"election state could not be made durable ({exc})")
        for key in ready.flush:
            self._start_flush(key)
        if ready.send:
            self._send(ready.send)
        for token, resp in ready.answers:
            fut = self._answers.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(resp)
        if METADATA_KEY in ready.committed:
            self.controller.apply()
        self.ticks.advance()

    async def submit(self, key: PartitionKey, req: Any) -> Any:
        """Hand a client request to the driver and wait for its answer (the driver
        answers every request: at once, at the HWM, or at its deadline)."""
        token, fut = self._request(key, req)
        try:
            return await fut
        finally:
            self._submitted(token, key, req, fut)

    def submit_each(self, requests: list[tuple[PartitionKey, Any]]) -> list[asyncio.Future[Any]]:
        """``submit`` each, all in this turn of the loop, without a task each: a future
        each, in the same order, done with its answer."""
        futures = []
        for key, req in requests:
            token, fut = self._request(key, req)
            fut.add_done_callback(functools.partial(self._submitted, token, key, req))
            futures.append(fut)
        return futures

    def _submitted(self, token: int, key: PartitionKey, req: Any, fut: asyncio.Future[Any]) -> None:
        """A request handed to the driver is over: its token goes, and its answer, if it
        has one, is counted in the metrics."""
        self._answers.pop(token, None)
        if self.metrics is None or not fut.done() or fut.cancelled() or fut.exception():
            return
        self.metrics.answered(key, req, fut.result())

    def _request(self, key: PartitionKey, req: Any) -> tuple[int, asyncio.Future[Any]]:
        token = next(self._tokens)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[token] = fut
        if type(req) in _APPENDS:
            self._appends.append((token, key, req))
            self.steps.wake()
            return token, fut
        try:
            self.execute_soon(self.driver.request(token, key, req, self.clock.now()))
        except BaseException:
            del self._answers[token]
            raise
        return token, fut

    def _take_appends(self) -> Ready | None:
        """The appends handed in the last turn of the loop (produce requests, from every
        connection, and transaction markers), to the driver together and in order, their
        step carried out with the turn's others: a partition's plain batches of several
        requests are one append there (one write, one flush, one replication round;
        ``Driver.request_many``). A node under load takes many requests a turn, a few
        for each of its partitions."""
        if not self._appends:
            return None
        items, self._appends = self._appends, []
        try:
            return self.driver.request_many(items, self.clock.now())
        except Exception as exc:  # a bug: each request fails with it, as handed alone
            log.exception("appending %d produce requests failed", len(items))
            for token, _key, _req in items:
                fut = self._answers.pop(token, None)
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
            return None

    def _start_flush(self, key: PartitionKey) -> None:
        """Join the node's next flush job (one job, one worker thread and, with several
        dirty logs, one syncfs for every partition written meanwhile)."""
        p = self.driver.get(key)
        f = self.partitions.files.get(key)
        if p is None or f is None:
            return
        self.flusher.request(key, p, f.log)

    def _send(self, sends: list[tuple[PartitionKey, Any]]) -> None:
        """One frame per peer for what one step sends it (a RaftBatch of many partitions'
        messages); a message with large records goes in a frame of its own (no copy)."""
        by_peer: dict[int, list[tuple[PartitionKey, Any]]] = {}
        for key, msg in sends:
            by_peer.setdefault(msg.dst, []).append((key, msg))
        for dst, items in by_peer.items():
            link = self.peers.get(dst)
            if link is None or not link.connected:
                continue
            batch: list[tuple[PartitionKey, str, Any, bytes | memoryview]] = []
            size = 0
            for key, msg in items:
                body, payload = encode(msg)
                kind = type(msg).__name__
                if len(payload) > self._batch_alone or len(items) == 1:
                    env, _ = encode(
                        m.RaftEnvelope(topic=key[0], partition=key[1], kind=kind, body=body)
                    )
                    link.send(env, payload)
                    continue
                if size + len(payload) > self._batch_room or len(batch) == BATCH_MESSAGES:
                    self._send_batch(link, batch)
                    batch, size = [], 0
                batch.append((key, kind, body, payload))
                size += len(payload) + BATCH_ITEM_OVERHEAD
            if batch:
                self._send_batch(link, batch)

    @staticmethod
    def _send_batch(
        link: PeerLink, batch: list[tuple[PartitionKey, str, Any, bytes | memoryview]]
    ) -> None:
        env, _ = encode(
            m.RaftBatch(
                topics=[k[0] for k, *_ in batch],
                partitions=[k[1] for k, *_ in batch],
                kinds=[kind for _, kind, _, _ in batch],
                bodies=[body for *_, body, _ in batch],
                sizes=[len(p) for *_, p in batch],
            )
        )
        link.send(env, b"".join(p for *_, p in batch), ApiKey.RAFT_BATCH)

    def _handle_raft(self, frame: Frame, sender: int) -> None:
        """A raft frame (one message, or a batch) from a connection authenticated as node
        ``sender``. Every message is decoded and checked before any is applied: raises
        DecodeError for a malformed frame and ForgedSender for a message claiming another
        sender; the transport counts and logs both (once per connection)."""
        if frame.api_key == ApiKey.RAFT_BATCH:
            batch = decode_body(m.RaftBatch, frame.body, frame.payload)
            parts = batch.items()
        else:
            env = decode_body(m.RaftEnvelope, frame.body, frame.payload)
            parts = [(env.topic, env.partition, env.kind, env.body, env.records)]
        items: list[tuple[PartitionKey, Any]] = []
        for topic, partition, kind, body, records in parts:
            cls = RAFT_CLASSES.get(kind)
            if cls is None:
                raise DecodeError(f"unknown raft message kind {kind!r}")
            msg: Any = decode_body(cls, body, records)
            check_raft_sender(msg, sender)
            items.append(((topic, partition), msg))
        self.execute_soon(self.driver.raft_many(items, self.clock.now()))

    async def _tick_loop(self) -> None:
        period_ms = int(TICK_S * 1000)
        while True:
            try:
                self.clock.turn(period_ms)
                self.execute(self.driver.tick(self.clock.now()))
                self.space.poll()
                self.cleaner.run()
                if self.maintenance.run() and self.datadir.catch_up_pending:
                    # Also when no metadata arrives any more.
                    self.controller.maybe_end_catch_up_pending()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("tick failed")
            period_ms = await self.ticks.wait()

    # ------------------------------------------------------------------ lifecycle
    def _flush_failed(self, key: PartitionKey, exc: BaseException) -> None:
        self.fail_stop(f"the flush of {key[0]}/{key[1]} failed ({exc})")

    def fail_stop(self, reason: str) -> None:
        """A failed fsync (or election-state write): what was written since the last
        good one may be lost whatever a retry says, so nothing more is acknowledged or
        voted from this process. It exits at once; restarted, the node recovers its logs
        from what is on disk (as after a power loss) and catches up from the others."""
        log.critical(
            "node %d: %s; stopping now (fail-stop): data written since the last successful "
            "fsync is not trusted. Check the disk, then restart the node: it recovers from "
            "disk and catches up from its peers.",
            self.node_id,
            reason,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_DISK_FAILED)

    async def start(self) -> None:
        fileio.install_from_environment()
        self.datadir.lock()
        self.space.prepare()
        self.directories = DirectoryIds(
            self.config.data_dir, self.datadir.check(), self._on_directory_replaced
        )
        self.server.directories = self.directories
        self.server.on_node = self._peer_connected
        await self.server.start()
        self.kafka_dispatch.start()
        if self.kafka is not None:
            await self.kafka.start()
            log.info("node %d serving Kafka clients on %s:%d", self.node_id, *self.kafka.address)
        if self.metrics_server is not None:
            await self.metrics_server.start()
            log.info(
                "node %d serving metrics at %s://%s:%d/metrics",
                self.node_id,
                self.metrics_server.scheme,
                self.metrics_server.host,
                self.metrics_server.port,
            )
        for nid in self.book.ids():
            self._link(nid)
        self.book.on_moved = self._link
        self.controller.start()
        self.partitions.reopen_local()
        self._ticker = asyncio.create_task(self._tick_loop())
        self._registering = asyncio.create_task(self._register())
        log.info(
            "node %d serving on %s:%d (cluster %s, %d nodes known)",
            self.node_id,
            self.config.host,
            self.server.port,
            self.config.cluster_id,
            len(self.book.native),
        )

    def _link(self, nid: int) -> None:
        """Open the raft link to node ``nid`` at its address in the book (replacing one
        to an address it left)."""
        address = self.book.address(nid)
        if nid == self.node_id or address is None:
            return
        host, port = self.config.peer_addresses.get(nid, address)
        old = self.peers.get(nid)
        if old is not None:
            if (old.host, old.port) == (host, port):
                return
            closing = asyncio.get_running_loop().create_task(old.close())
            self._tasks.add(closing)
            closing.add_done_callback(self._tasks.discard)
        link = PeerLink(
            nid,
            host,
            port,
            f"node-{self.node_id}",
            self.rng,
            ssl_context=peer_client_context(self.config.tls) if self.config.tls else None,
            server_hostname=address[0],
            credentials=self.config.peer_credentials(),
            directories=self.directories,
            on_refused=self._peer_refused,
        )
        link.start()
        self.peers[nid] = link

    async def _register(self) -> None:
        """Register this node (its directory and listeners) with the metadata leader,
        again every REGISTER_RETRY_S until it is: a node that started with ``--voters``
        enters the address book and the Kafka listeners' Metadata this way."""
        # Where the others reach it: its own entries in the book it started with (the
        # --voters / --kafka-voters addresses, which may differ from where it listens).
        assert self.directories is not None  # set by start, before this task
        reg = NodeRegistration(
            self.node_id,
            self.directories.own,
            self.book.native[self.node_id],
            self.book.kafka.get(self.node_id),
            self.config.rack,
        )
        req = reg.request(self.driver.incarnation)
        said = ""
        while True:
            resp = await self.changes.register_node(req)
            if not resp.error:
                return
            if resp.error_message != said and not ErrorCode(resp.error).retriable:
                log.error("node %d could not register: %s", self.node_id, resp.error_message)
                said = resp.error_message
            await asyncio.sleep(REGISTER_RETRY_S)

    def _peer_connected(self, peer: int) -> None:
        """A peer's node connected to this one: it may have just restarted, and our link
        to it may be waiting out a back-off (``PeerLink.heard_from``)."""
        link = self.peers.get(peer)
        if link is not None:
            link.heard_from()

    def _peer_refused(self, peer: int) -> None:
        self.execute(self.driver.peer_unreachable(peer, self.clock.now()))

    def _on_directory_replaced(self, peer: int, remembered: str) -> None:
        self.datadir.replaced(
            peer, remembered, lambda: self.execute(self.driver.begin_catch_up(self.clock.now()))
        )

    def _load_auth(self) -> AuthConfig | None:
        c = self.config
        if c.auth_config is None:
            return None
        auth = AuthConfig.load(c.auth_config)
        if c.auth_principal:
            check_own_principal(auth, c.auth_principal, self.node_id, str(c.auth_config))
        return auth

    def _forwarding_credentials(self) -> tuple[str, str] | None:
        """Who this node forwards topic changes to the metadata leader as: its node
        principal where the listeners authenticate clients (``--auth-config``); else no
        one, as any plaintext client, since a connection that authenticates as a node
        renews the leader's raft link to this node (``PeerLink.heard_from``)."""
        return self.config.peer_credentials() if self.config.auth_config is not None else None

    async def stop(self, graceful: bool = True) -> None:
        if graceful:
            ready = self.driver.begin_shutdown(self.clock.now())
            self.execute(ready)
            if ready.send:
                # Give the EndQuorumEpoch messages a moment to leave the socket buffers.
                await asyncio.sleep(0.05)
        for task in (self._ticker, self._registering):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.server.close()
        if self.kafka is not None:
            await self.kafka.close()
        await self.kafka_dispatch.close()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        for link in self.peers.values():
            await link.close()
        await self.cleaner.stop()  # no swap after this; a rewrite running gives up
        await self.flusher.wait_idle()  # no log is closed under its running fsync
        self.partitions.close_all()
        self.datadir.unlock()
        log.info("node %d stopped", self.node_id)


def tune_gc() -> None:
    """The collector of a node process: what start-up made (modules, configuration) is
    never scanned again, and collections run at GC_THRESHOLDS."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def settle_gc() -> None:
    """Thousands of replicas were just opened: their objects, which live as long as the
    replicas, join start-up's out of the collector's reach (``gc.freeze``), the young
    generations collected first. A full collection scanned them all: with 100,000
    replicas a node's took seconds of its event loop (1.1 s for 10,000 on a loaded
    2-core machine), and the heap's growth made them come with every few topics
    created. Closed replicas leave no cycles: deleting a topic frees its objects."""
    gc.collect(1)
    gc.freeze()


def tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds to MALLOC_MMAP_THRESHOLD and
    MALLOC_TRIM_THRESHOLD, unless the environment sets malloc's tunables itself; False
    when it does or when the C library has no mallopt (not glibc) or refuses."""
    if any(name in os.environ for name in _MALLOC_ENV):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
        and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
    )


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses to import pandas (see ``keep_pandas_out``)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"a node does not use {name}", name=name)


def keep_pandas_out() -> bool:
    """A node never uses pandas, but pyarrow imports it, when installed, on the first
    array a process builds from Python objects (a topic's first metadata record, its
    first applied batch): 0.6-0.8 s of CPU in every node at its first topic create, when
    it is busiest, and ~37 MB more each. Refuse that import (pyarrow then works as it does
    without pandas), unless something imported it already. True when refused."""
    if "pandas" in sys.modules:
        return False
    sys.meta_path.insert(0, _NoPandas())
    return True


def run_node(config: NodeConfig) -> int:
    tune_gc()
    if not keep_pandas_out():
        log.debug("pandas was imported before the node started")
    if not tune_malloc():
        log.debug("malloc left as it is (not glibc, or set by the environment)")

    if config.join:
        from .join import join

        config = join(config)

    async def main() -> None:
        node = Node(config)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await node.start()
        await stop.wait()
        log.info("node %d shutting down gracefully", config.node_id)
        # Armed until the process ends: it covers asyncio.run's own clean-up (cancelling
        # what is left, joining the executor's threads) too.
        faulthandler.dump_traceback_later(STOP_DEADLINE_S, exit=True)
        await node.stop(graceful=True)

    asyncio.run(main())
    return 0
