"""A node's Prometheus metrics (``serve --metrics-listen``), through ``prometheus-client``.

Cheap to keep, as DESIGN.md's observability section asks: what happens is counted where
it happens (a request answered, an election state persisted, a flush job done), with a
dict increment or a histogram observation and nothing per idle partition; every gauge
(partitions hosted, led, under-replicated, quiesced, follower lag, high watermarks,
consumer-group lag) is computed at scrape time from the node's own objects, by one pass
over its replicas in slices of ``SCAN_SLICE`` (the event loop runs between them). The
raft cores and the driver are only read, never told anything.

Per-partition series (``--metrics-per-partition``) are off by default: 10,000 partitions
must not make 100,000 series. Per-topic and per-node aggregates are always served.
docs/monitoring.md lists every metric."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from ..driver import PartitionKey
from ..driver.partition import PartitionDriver
from ..kafka.errors import KafkaError
from ..protocol import ApiKey, ErrorCode, Frame
from ..protocol import messages as m
from ..raft import ElectionState
from ..storage.errors import CorruptRecordError
from ..storage.records import iter_batches

if TYPE_CHECKING:
    from .node import Node
    from .partitions import PartitionManager

#: Request latency (seconds): a long-poll fetch is answered at its max wait (500 ms by
#: default), a produce within milliseconds.
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#: Flush and quorum-state write latency (seconds): an fsync on an SSD takes 0.1-5 ms.
FSYNC_BUCKETS = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
    *(0.5, 1, 2.5),
)
#: Replicas read per turn of the event loop while a scrape computes its gauges: ~7 ms
#: of CPU at a time (10,000 replicas took 50-80 ms of CPU per scrape on the loaded
#: 2-core machine), so heartbeats and fetches never wait long behind a scrape.
SCAN_SLICE = 1000
#: Nested Kafka answers are searched this deep for error codes (topics > partitions).
KAFKA_ERROR_DEPTH = 4

NATIVE, KAFKA = "native", "kafka"


@dataclass(slots=True)
class TopicRow:
    """One topic's aggregates over the replicas this node hosts."""

    hosted: int = 0
    led: int = 0
    under_replicated: int = 0
    without_leader: int = 0
    quiesced: int = 0
    high_watermark: int = 0  # sums over the hosted replicas
    log_end_offset: int = 0
    follower_lag_records: int = 0  # over the partitions this node leads


@dataclass
class Snapshot:
    """What one pass over the node's replicas found."""

    topics: dict[str, TopicRow] = field(default_factory=dict)
    # The leader's view, per follower node: records behind (summed over the partitions
    # this node leads) and seconds since a follower that is behind last fetched (max).
    lag_records: dict[int, int] = field(default_factory=dict)
    lag_seconds: dict[int, float] = field(default_factory=dict)
    peers_up: dict[int, bool] = field(default_factory=dict)
    # --metrics-per-partition: (topic, partition, high watermark, log end offset), and
    # (topic, partition, follower, records behind).
    partitions: list[tuple[str, int, int, int]] = field(default_factory=list)
    partition_lag: list[tuple[str, int, int, int]] = field(default_factory=list)
    scan_seconds: float = 0.0


@dataclass(slots=True)
class Traffic:
    """One topic's client records and bytes, produced (in) and fetched (out)."""

    records_in: int = 0
    bytes_in: int = 0
    records_out: int = 0
    bytes_out: int = 0


class NodeMetrics:
    """The registry a node serves, its event hooks and its scrape-time collector."""

    def __init__(self, node: Node, *, per_partition: bool = False) -> None:
        self.node = node
        self.per_partition = per_partition
        # No ``_created`` series beside every counter and histogram: Prometheus needs
        # none, and they would double the series a node serves.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.request_seconds = Histogram(
            "quorumlog_request_duration_seconds",
            "Time from a request's arrival to its answer, by listener and API.",
            ["listener", "api"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.flush_seconds = Histogram(
            "quorumlog_log_flush_duration_seconds",
            "One log flush job: the fsyncs (or one syncfs) making every log written "
            "meanwhile durable.",
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self.persist_seconds = Histogram(
            "quorumlog_quorum_state_write_duration_seconds",
            "One durable write (with its fsync) of the quorum-state journal: the election "
            "states of one step, before anything of it is sent.",
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self.requests: dict[tuple[str, str], int] = {}
        self.errors: dict[tuple[str, str, str], int] = {}
        self.traffic: dict[str, Traffic] = {}
        self.elections_started = 0
        self.elections_won = 0
        self.epoch_changes = 0
        self.snapshot = Snapshot()
        self._timers: dict[tuple[str, str], Any] = {}
        self._scrape = asyncio.Lock()
        self.registry.register(self)

    # ------------------------------------------------------------------ hooks
    def native_handler(
        self, handle: Callable[[Frame], Awaitable[tuple[int, Any] | None]]
    ) -> Callable[[Frame], Awaitable[tuple[int, Any] | None]]:
        """``handle`` (the native listener's request handler), timed and counted."""

        async def timed(frame: Frame) -> tuple[int, Any] | None:
            began = time.perf_counter()
            code = "EXCEPTION"
            try:
                out = await handle(frame)
                error = getattr(out[1], "error", 0) if out is not None else 0
                code = _name(ErrorCode, error) if error else ""
                return out
            finally:
                # An unknown key is one label, whatever a client sends (bounded series).
                api = _name(ApiKey, frame.api_key, "UNKNOWN")
                self.answered_request(NATIVE, api, began, [code] if code else [])

        return timed

    def kafka_answered(self, api: str, began: float, answer: Any) -> None:
        """The Kafka listener answered (``answer`` None: a produce with acks=0)."""
        codes = [_name(KafkaError, c) for c in _kafka_errors(answer, KAFKA_ERROR_DEPTH)]
        self.answered_request(KAFKA, api, began, codes)

    def answered_request(self, listener: str, api: str, began: float, errors: list[str]) -> None:
        key = (listener, api)
        timer = self._timers.get(key)
        if timer is None:
            timer = self._timers[key] = self.request_seconds.labels(listener, api)
        timer.observe(time.perf_counter() - began)
        self.requests[key] = self.requests.get(key, 0) + 1
        for code in errors:
            ekey = (listener, api, code)
            self.errors[ekey] = self.errors.get(ekey, 0) + 1

    def answered(self, key: PartitionKey, req: Any, resp: Any) -> None:
        """A partition request the driver answered: client records in and out."""
        if getattr(resp, "error", 1) != 0:
            return
        if isinstance(req, m.ProduceRequest):
            t = self._traffic(key[0])
            t.records_in += resp.last_offset - resp.base_offset + 1
            t.bytes_in += len(req.records)
        elif isinstance(req, m.FetchRequest) and resp.records:
            t = self._traffic(key[0])
            t.records_out += _records_from(resp.records, req.fetch_offset)
            t.bytes_out += len(resp.records)

    def _traffic(self, topic: str) -> Traffic:
        t = self.traffic.get(topic)
        if t is None:
            t = self.traffic[topic] = Traffic()
        return t

    def persist(
        self, partitions: PartitionManager, items: Sequence[tuple[PartitionKey, ElectionState]]
    ) -> None:
        """Persist one step's election states (``PartitionManager.persist_all``), timed;
        count the epoch changes, candidacies and leaderships among them."""
        me = self.node.node_id
        journal = partitions.journal
        seen: dict[PartitionKey, tuple[int, int | None, int | None]] = {}
        for key, state in items:
            before = seen.get(key)
            if before is None:
                old = journal.get(key)
                before = (
                    (-1, None, None)
                    if old is None
                    else (old.leader_epoch, _known(old.leader_id), _known(old.voted_id))
                )
            epoch, leader, voted = before
            if state.epoch > epoch:
                self.epoch_changes += 1
            new_term = state.epoch > epoch
            if state.voted_id == me and state.leader_id is None and (new_term or voted != me):
                self.elections_started += 1
            if state.leader_id == me and (new_term or leader != me):
                self.elections_won += 1
            seen[key] = (state.epoch, state.leader_id, state.voted_id)
        began = time.perf_counter()
        partitions.persist_all(items)
        self.persist_seconds.observe(time.perf_counter() - began)

    def timed_flush(self, flush: Callable[..., Any]) -> Callable[..., Any]:
        """The flusher's job body (run in a worker thread), timed."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return flush(*args, **kwargs)
            finally:
                self.flush_seconds.observe(time.perf_counter() - began)

        return timed

    # ------------------------------------------------------------------ scraping
    async def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """Every metric, gauges read now, in the format the ``Accept`` header asks for
        (Prometheus text or OpenMetrics, as prometheus-client chooses): (body, content
        type). One scrape at a time: concurrent scrapes wait and read their own."""
        encode, content_type = choose_encoder(accept)
        async with self._scrape:
            await self.refresh()
            return encode(self.registry), content_type

    async def refresh(self) -> None:
        """Read every hosted replica, SCAN_SLICE per turn of the event loop."""
        node = self.node
        driver = node.driver
        now = node.clock.now()
        timeout = driver.quorum.fetch_timeout_ms
        live = driver.liveness
        snap = Snapshot()
        snap.peers_up = {
            peer: peer not in live.stale and now - seen < timeout
            for peer, seen in live.seen.items()
        }
        replicas = list(driver.partitions.values())
        for start in range(0, len(replicas), SCAN_SLICE):
            if start:
                await asyncio.sleep(0)
                now = node.clock.now()
            began = time.perf_counter()
            self._scan(replicas[start : start + SCAN_SLICE], now, timeout, snap)
            snap.scan_seconds += time.perf_counter() - began
        self.snapshot = snap

    def _scan(
        self, replicas: list[PartitionDriver], now: int, timeout: int, snap: Snapshot
    ) -> None:
        """Add ``replicas`` to ``snap``. The hot loop of a scrape (10,000 replicas):
        replicas come grouped by topic, so a topic's row is looked up once per run of it,
        and a quiesced partition costs a few attribute reads."""
        peers_up = snap.peers_up
        per_partition = self.per_partition
        topic = ""
        row = TopicRow()
        for p in replicas:
            if p.closed:
                continue
            core = p.core
            if p.key[0] != topic:
                topic = p.key[0]
                row = snap.topics.get(topic) or snap.topics.setdefault(topic, TopicRow())
            row.hosted += 1
            if core.leader_id is None:
                row.without_leader += 1
            hwm, end = max(core.high_watermark, 0), core.log_end_offset
            row.high_watermark += hwm
            row.log_end_offset += end
            if per_partition:
                snap.partitions.append((topic, p.key[1], hwm, end))
            if not core.is_leader:
                row.quiesced += core.quiesced
                continue
            row.led += 1
            if not core.quiesced:
                self._leader(p, now, timeout, row, snap)
                continue
            # Every voter is caught up (it quiesced only then) and fetches nothing: in
            # sync while its node is heard. Most of an idle node's partitions.
            row.quiesced += 1
            me = core.node_id
            if not all(peers_up.get(v, False) for v in core.voters if v != me):
                row.under_replicated += 1
            if per_partition:
                snap.partition_lag.extend((topic, p.key[1], v, 0) for v in core.voters if v != me)

    def _leader(
        self, p: PartitionDriver, now: int, timeout: int, row: TopicRow, snap: Snapshot
    ) -> None:
        """A partition this node leads that is not quiesced: its voters' progress."""
        core = p.core
        behind = False
        for v in core.describe(now).voters:
            peer = v.replica_id
            if peer == core.node_id:
                continue
            if v.lag < 0:  # not heard in this epoch yet
                behind = True
                continue
            fetched = v.last_fetch_ms >= 0 and now - v.last_fetch_ms <= timeout
            # In sync: its node is heard, and it is caught up or fetching.
            behind |= not (snap.peers_up.get(peer, False) and (v.lag == 0 or fetched))
            row.follower_lag_records += v.lag
            snap.lag_records[peer] = snap.lag_records.get(peer, 0) + v.lag
            if v.lag > 0 and v.last_fetch_ms >= 0:
                seconds = (now - v.last_fetch_ms) / 1000
                snap.lag_seconds[peer] = max(snap.lag_seconds.get(peer, 0.0), seconds)
            if self.per_partition:
                snap.partition_lag.append((p.key[0], p.key[1], peer, v.lag))
        if behind:
            row.under_replicated += 1

    def collect(self) -> Iterator[Metric]:
        """prometheus-client's collector protocol: the counters kept, the gauges of the
        last ``refresh``."""
        yield from self._node_metrics()
        yield from self._partition_metrics()
        yield from self._request_metrics()
        yield from self._group_metrics()

    def _node_metrics(self) -> Iterator[Metric]:
        node = self.node
        info = GaugeMetricFamily(
            "quorumlog_node_info",
            "This node: its id, cluster and rack (serve --rack; empty: none).",
            labels=["node", "cluster", "rack"],
        )
        info.add_metric([str(node.node_id), node.config.cluster_id, node.config.rack or ""], 1)
        yield info
        up = GaugeMetricFamily(
            "quorumlog_peer_up",
            "1 while a peer node is heard within the fetch timeout, as this node sees it.",
            labels=["peer"],
        )
        for peer, alive in sorted(self.snapshot.peers_up.items()):
            up.add_metric([str(peer)], 1 if alive else 0)
        yield up
        conns = GaugeMetricFamily(
            "quorumlog_open_connections", "Open client and peer connections.", labels=["listener"]
        )
        conns.add_metric([NATIVE], node.server.open_connections)
        if node.kafka is not None:
            conns.add_metric([KAFKA], node.kafka.open_connections)
        yield conns
        for name, doc, value in (
            ("elections", "Elections this node stood in (candidacies).", self.elections_started),
            ("elections_won", "Leaderships this node took.", self.elections_won),
            (
                "epoch_changes",
                "Leader epochs this node's replicas moved to.",
                self.epoch_changes,
            ),
        ):
            yield CounterMetricFamily(f"quorumlog_{name}", doc, value=value)
        yield GaugeMetricFamily(
            "quorumlog_metrics_scan_seconds",
            "How long the last scrape's pass over the replicas took (its slices, not the "
            "event loop's other work between them).",
            value=self.snapshot.scan_seconds,
        )

    def _partition_metrics(self) -> Iterator[Metric]:
        snap = self.snapshot
        fields = (
            ("hosted", "Partition replicas this node hosts."),
            ("led", "Partitions this node leads."),
            (
                "under_replicated",
                "Partitions this node leads with a voter out of sync (its node not heard, "
                "or behind and not fetching, within the fetch timeout).",
            ),
            ("without_leader", "Hosted partitions without a leader, as this node sees them."),
            ("quiesced", "Hosted partitions quiesced (idle: no timers, no fetches)."),
        )
        for attr, doc in fields:
            total = GaugeMetricFamily(f"quorumlog_partitions_{attr}", doc)
            total.add_metric([], sum(getattr(r, attr) for r in snap.topics.values()))
            yield total
            per_topic = GaugeMetricFamily(
                f"quorumlog_topic_partitions_{attr}", doc + " By topic.", labels=["topic"]
            )
            for topic, row in sorted(snap.topics.items()):
                per_topic.add_metric([topic], getattr(row, attr))
            yield per_topic
        for attr, doc in (
            ("high_watermark", "Sum of the high watermarks of the topic's hosted replicas."),
            ("log_end_offset", "Sum of the log end offsets of the topic's hosted replicas."),
            (
                "follower_lag_records",
                "Records the followers of the partitions this node leads are behind, summed.",
            ),
        ):
            g = GaugeMetricFamily(f"quorumlog_topic_{attr}", doc, labels=["topic"])
            for topic, row in sorted(snap.topics.items()):
                g.add_metric([topic], getattr(row, attr))
            yield g
        lag = GaugeMetricFamily(
            "quorumlog_follower_lag_records",
            "Records a follower node is behind this leader, summed over the partitions it leads.",
            labels=["follower"],
        )
        for peer, n in sorted(snap.lag_records.items()):
            lag.add_metric([str(peer)], n)
        yield lag
        secs = GaugeMetricFamily(
            "quorumlog_follower_lag_seconds",
            "Seconds since a follower node that is behind this leader last fetched (the "
            "most of the partitions it leads; 0 when caught up).",
            labels=["follower"],
        )
        for peer in sorted(snap.lag_records):
            secs.add_metric([str(peer)], snap.lag_seconds.get(peer, 0.0))
        yield secs
        yield from self._traffic_metrics()
        if self.per_partition:
            yield from self._per_partition()

    def _traffic_metrics(self) -> Iterator[Metric]:
        for attr, doc in (
            ("records_in", "Client records appended (produced) to the topic, as its leader."),
            ("bytes_in", "Client record-batch bytes appended to the topic, as its leader."),
            ("records_out", "Records fetched by consumers from the topic."),
            ("bytes_out", "Record-batch bytes fetched by consumers from the topic."),
        ):
            c = CounterMetricFamily(f"quorumlog_topic_{attr}", doc, labels=["topic"])
            for topic, t in sorted(self.traffic.items()):
                c.add_metric([topic], getattr(t, attr))
            yield c

    def _per_partition(self) -> Iterator[Metric]:
        snap = self.snapshot
        hwm = GaugeMetricFamily(
            "quorumlog_partition_high_watermark",
            "A hosted replica's high watermark.",
            labels=["topic", "partition"],
        )
        end = GaugeMetricFamily(
            "quorumlog_partition_log_end_offset",
            "A hosted replica's log end offset.",
            labels=["topic", "partition"],
        )
        for topic, partition, h, e in snap.partitions:
            hwm.add_metric([topic, str(partition)], h)
            end.add_metric([topic, str(partition)], e)
        lag = GaugeMetricFamily(
            "quorumlog_partition_follower_lag_records",
            "Records a follower is behind this leader, per partition it leads.",
            labels=["topic", "partition", "follower"],
        )
        for topic, partition, peer, n in snap.partition_lag:
            lag.add_metric([topic, str(partition), str(peer)], n)
        yield from (hwm, end, lag)

    def _request_metrics(self) -> Iterator[Metric]:
        reqs = CounterMetricFamily(
            "quorumlog_requests",
            "Requests answered, by listener and API.",
            labels=["listener", "api"],
        )
        for (listener, api), n in sorted(self.requests.items()):
            reqs.add_metric([listener, api], n)
        yield reqs
        errs = CounterMetricFamily(
            "quorumlog_request_errors",
            "Error codes answered (a Kafka answer counts each partition's), by listener, "
            "API and code.",
            labels=["listener", "api", "code"],
        )
        for (listener, api, code), n in sorted(self.errors.items()):
            errs.add_metric([listener, api, code], n)
        yield errs
        stats = self.node.server.stats
        native = CounterMetricFamily(
            "quorumlog_native_rejected_requests",
            "Frames the native listener refused, by reason.",
            labels=["reason"],
        )
        for reason, n in (
            ("bad_frame", stats.bad_frames),
            ("refused_raft", stats.refused_raft),
            ("denied", stats.denied_requests),
            ("failed", stats.failed_requests),
        ):
            native.add_metric([reason], n)
        yield native
        kafka = CounterMetricFamily(
            "quorumlog_kafka_rejected_requests",
            "Requests the Kafka listener refused without serving them, by reason.",
            labels=["reason"],
        )
        if self.node.kafka is not None:
            for reason, n in sorted(self.node.kafka.rejected.items()):
                kafka.add_metric([reason], n)
        yield kafka

    def _group_metrics(self) -> Iterator[Metric]:
        """Committed offsets and lag of the consumer groups this node coordinates (the
        leader of their ``__consumer_offsets`` partition), against the high watermarks
        of the replicas it hosts."""
        committed = GaugeMetricFamily(
            "quorumlog_consumer_group_committed_offset",
            "Sum of a group's committed offsets over a topic's partitions (served by the "
            "group's coordinator).",
            labels=["group", "topic"],
        )
        lag = GaugeMetricFamily(
            "quorumlog_consumer_group_lag_records",
            "Records between a group's committed offsets and the high watermarks, summed "
            "over a topic's partitions hosted by the group's coordinator.",
            labels=["group", "topic"],
        )
        per = GaugeMetricFamily(
            "quorumlog_partition_consumer_group_lag_records",
            "Records between a group's committed offset and a partition's high watermark.",
            labels=["group", "topic", "partition"],
        )
        for (group, topic), (offsets, behind, rows) in sorted(self._groups().items()):
            committed.add_metric([group, topic], offsets)
            lag.add_metric([group, topic], behind)
            for partition, n in rows:
                per.add_metric([group, topic, str(partition)], n)
        yield committed
        yield lag
        if self.per_partition:
            yield per

    def _groups(self) -> dict[tuple[str, str], tuple[int, int, list[tuple[int, int]]]]:
        out: dict[tuple[str, str], tuple[int, int, list[tuple[int, int]]]] = {}
        driver = self.node.driver
        for cache in list(self.node.kafka_dispatch.handlers.groups.caches.values()):
            if not cache.ready:
                continue
            for group, offsets in cache.groups.items():
                for (topic, partition), c in offsets.items():
                    total, behind, rows = out.get((group, topic), (0, 0, []))
                    p = driver.get((topic, partition))
                    n = max(0, p.core.high_watermark - c.offset) if p is not None else 0
                    if self.per_partition and p is not None:
                        rows.append((partition, n))
                    out[(group, topic)] = (total + c.offset, behind + n, rows)
        return out


def _name(enum: Any, code: int, unknown: str | None = None) -> str:
    """``code``'s name in ``enum``; else ``unknown``, or the number itself."""
    try:
        return str(enum(code).name)
    except ValueError:
        return str(code) if unknown is None else unknown


def _known(node_id: int) -> int | None:
    return None if node_id < 0 else node_id


def _kafka_errors(answer: Any, depth: int) -> list[int]:
    """Every non-zero ``error_code`` in a Kafka answer, down to ``depth`` levels (one
    list filled by one walk: it runs for every answer, thousands a second)."""
    found: list[int] = []
    _walk_errors(answer, depth, found)
    return found


def _walk_errors(answer: Any, depth: int, found: list[int]) -> None:
    if isinstance(answer, dict):
        for k, v in answer.items():
            if k == "error_code":
                if v:
                    found.append(v)
            elif depth and isinstance(v, list | dict):
                _walk_errors(v, depth - 1, found)
    elif isinstance(answer, list) and depth:
        for item in answer:
            if isinstance(item, dict):
                _walk_errors(item, depth - 1, found)


def _records_from(records: bytes, offset: int) -> int:
    """User records at or after ``offset`` in a fetched chunk of whole batches (the
    first batch may begin before the fetch offset)."""
    n = 0
    try:
        for h in iter_batches(records):
            if not h.is_control:
                # A sparse batch's gaps are not known from its header: at most its rows.
                n += max(0, min(h.record_count, h.next_offset - max(h.base_offset, offset)))
    except CorruptRecordError:
        pass  # the consumer finds out; a metric does not
    return n
