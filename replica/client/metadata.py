"""The metadata cache: nodes, the metadata controller and each partition's leader, learnt
from the nodes' Metadata answers and merged (a partition's leader speaks for it)."""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from .. import defaults
from ..protocol import ApiKey, ErrorCode
from ..protocol import messages as m
from .base import ClientBase
from .connection import ConnectionLost
from .errors import (
    BootstrapUnreachableError,
    QuorumLogError,
    RequestTimeoutError,
    SecurityError,
    UnknownTopicError,
)

log = logging.getLogger(__name__)

METADATA_GRACE_S = 0.2
METADATA_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    leader_id: int
    leader_epoch: int
    replicas: list[int]
    high_watermark: int
    log_start_offset: int
    # The topic's max.message.bytes as the answering node enforces it; 0 if not told.
    max_message_bytes: int = 0
    # The Arrow IPC codec the topic's batches are stored with ("lz4", "zstd"; None:
    # uncompressed), from its compression.type: what a Producer encodes with.
    compression: str | None = None


#: compression.type values whose batches a producer compresses (with that Arrow codec).
_STORED_CODECS = frozenset({"lz4", "zstd"})


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    partitions: dict[int, PartitionMetadata] = field(default_factory=dict)
    # The configs the topic sets (Kafka's names: retention.ms, ...); the nodes' values
    # apply to the rest.
    configs: dict[str, str] = field(default_factory=dict)


def _leaders_known(answers: list[m.MetadataResponse]) -> bool:
    """Whether the answers so far name a leader for every partition they mention."""
    led: dict[tuple[str, int], bool] = {}
    for resp in answers:
        for t in resp.topics:
            for p in t.partitions:
                key = (t.name, p.partition)
                led[key] = led.get(key, False) or p.leader_id >= 0
    return all(led.values())


class MetadataCache(ClientBase):
    """What the client knows of the cluster, and the Metadata requests that refresh it."""

    # (topic, partition) -> its metadata as last learnt (shared by clones; an entry is
    # replaced whole, never changed in place).
    _leaders: dict[tuple[str, int], PartitionMetadata]
    _controller_id: int
    cluster_id: str
    _retired: set[int]
    # node -> its rack (``serve --rack``), for the nodes that registered one.
    _racks: dict[int, str]

    def _metadata_timeout_s(self, timeout_s: float | None) -> float:
        """How long a metadata call waits for the nodes: ``timeout_s`` (retry loops pass
        their attempt's time), by default the request timeout, at most 5 s."""
        if timeout_s is None:
            return min(self.request_timeout_ms / 1000, METADATA_TIMEOUT_S)
        return timeout_s

    def _metadata_from(
        self, addr: tuple[str, int], req: m.MetadataRequest, timeout_s: float
    ) -> m.MetadataResponse:
        resp = self._request(addr, ApiKey.METADATA, req, m.MetadataResponse, timeout_s)
        self.cluster_id = resp.cluster_id
        for n in resp.nodes:
            self._nodes[n.node_id] = (n.host, n.port)
        self._retired = {n.node_id for n in resp.nodes if n.retired}
        self._racks = {n.node_id: n.rack for n in resp.nodes if n.rack is not None}
        if resp.controller_id >= 0:
            self._controller_id = resp.controller_id
        return resp

    def metadata(
        self,
        topics: list[str] | None = None,
        *,
        partitions: list[int] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, TopicMetadata]:
        """Fresh metadata from every reachable node, merged: a partition's leader speaks for
        it (epoch, high watermark); otherwise the highest epoch any replica reports.
        ``partitions``: only these partitions of the topics named (the others are left
        out of the answer, and of the cache's refresh). ``timeout_s``: how long to wait
        for the nodes (default the request timeout, at most 5 s); retry loops pass their
        attempt's time."""
        timeout_s = self._metadata_timeout_s(timeout_s)
        answers: list[m.MetadataResponse] = []
        errors: list[str] = []
        security_error: SecurityError | None = None
        # Every node is asked at once. A node that does not answer (e.g. SIGSTOPped) is
        # given up on once every partition's leader is known and a short grace has passed,
        # so one hung node does not cost each planning step the whole timeout.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="quorumlog-metadata")
        req = m.MetadataRequest(topics=topics, partitions=partitions)
        futures = {
            self._pool.submit(self._metadata_from, addr, req, timeout_s): addr
            for addr in self._addresses()
        }
        pending = set(futures)
        deadline = time.monotonic() + timeout_s
        first_answer_at: float | None = None
        while pending:
            done, pending = wait(pending, timeout=0.02, return_when=FIRST_COMPLETED)
            for fut in done:
                addr = futures[fut]
                try:
                    answers.append(fut.result())
                except SecurityError as exc:
                    security_error = exc
                except (ConnectionLost, QuorumLogError, OSError) as exc:
                    errors.append(f"{addr[0]}:{addr[1]}: {exc}")
            now = time.monotonic()
            if answers and first_answer_at is None:
                first_answer_at = now
            if now >= deadline:
                break
            # Suspected nodes (an attempt to them just timed out) get no grace: the others
            # say who leads now. They are still asked, to learn when they answer again.
            if (
                first_answer_at is not None
                and _leaders_known(answers)
                and (
                    now - first_answer_at >= METADATA_GRACE_S
                    or all(self._suspected(futures[f]) for f in pending)
                )
            ):
                break
        for fut in pending:
            addr = futures[fut]
            conn = self._conns.pop(addr, None)
            if conn is not None:
                conn.abort()
            errors.append(f"{addr[0]}:{addr[1]}: no answer in time")
        if security_error is not None and not answers:
            # The same settings fail on every node: say so. (One node's refusal while
            # others answer, e.g. a connection it closed mid-handshake, is not fatal:
            # requests to that node meet it again and say so then.)
            raise security_error
        if not answers:
            raise BootstrapUnreachableError(
                "no quorumlog node reachable at bootstrap "
                + ",".join(f"{h}:{p}" for h, p in self._bootstrap)
                + " ("
                + "; ".join(errors)
                + ")"
            )
        return self._merge(answers, topics)

    def _merge(
        self, answers: list[m.MetadataResponse], topics: list[str] | None
    ) -> dict[str, TopicMetadata]:
        """Nodes' Metadata answers merged into the cache (see ``metadata``)."""
        best: dict[tuple[str, int], tuple[tuple[int, int, int], m.PartitionInfo, int]] = {}
        names: set[str] = set()
        # A topic's configs as the metadata leader knows them, else as any node does.
        configs: dict[str, tuple[bool, dict[str, str]]] = {}
        for resp in answers:
            for t in resp.topics:
                if t.error != ErrorCode.NONE:
                    continue
                names.add(t.name)
                from_leader = resp.node_id == resp.controller_id
                if t.name not in configs or (from_leader and not configs[t.name][0]):
                    told = {c.name: c.value for c in t.configs if c.value is not None}
                    configs[t.name] = (from_leader, told)
                for p in t.partitions:
                    rank = (
                        1 if p.is_local_leader else 0,
                        p.leader_epoch,
                        1 if p.leader_id >= 0 else 0,
                    )
                    key = (t.name, p.partition)
                    if key not in best or rank > best[key][0]:
                        best[key] = (rank, p, t.max_message_bytes)
        out: dict[str, TopicMetadata] = {
            n: TopicMetadata(n, configs=configs[n][1]) for n in sorted(names)
        }
        for (topic, part), (_, p, limit) in best.items():
            codec = configs[topic][1].get("compression.type")
            pm = PartitionMetadata(
                topic,
                part,
                p.leader_id,
                p.leader_epoch,
                list(p.replicas),
                p.high_watermark,
                p.log_start_offset,
                limit,
                codec if codec in _STORED_CODECS else None,
            )
            out[topic].partitions[part] = pm
            self._leaders[(topic, part)] = pm
        if topics:
            missing = [t for t in topics if t not in out]
            if missing:
                raise UnknownTopicError(f"unknown topic(s): {', '.join(missing)}")
        return out

    @property
    def node_ids(self) -> list[int]:
        """The ids of the cluster's nodes, as the Metadata answers so far named them."""
        return sorted(self._nodes)

    @property
    def retired_node_ids(self) -> list[int]:
        """Those of ``node_ids`` decommissioned (``retire_node``): they take no new
        replicas."""
        return sorted(self._retired)

    @property
    def node_racks(self) -> dict[int, str]:
        """The racks of ``node_ids`` that registered one (``serve --rack``)."""
        return dict(self._racks)

    def refresh_nodes(self, *, timeout_s: float | None = None) -> None:
        """Learn the nodes and the metadata controller from every reachable node, with a
        Metadata request for no partition: one that names none describes every partition
        of every topic, a fifth of a second of each node's loop per 10,000 partitions."""
        self.metadata(partitions=[], timeout_s=timeout_s)

    def wait_for_leaders(
        self, topic: str, timeout_ms: int = defaults.REQUEST_TIMEOUT_MS
    ) -> TopicMetadata:
        """Block until every partition of ``topic`` has a leader; a clear timeout otherwise."""
        deadline = self._deadline(timeout_ms)
        attempt = 0
        while True:
            try:
                meta = self.metadata([topic], timeout_s=self._attempt_s(deadline))[topic]
                if meta.partitions and all(p.leader_id >= 0 for p in meta.partitions.values()):
                    return meta
                missing = [p.partition for p in meta.partitions.values() if p.leader_id < 0]
                why = f"partitions without a leader: {missing}"
            except UnknownTopicError as exc:
                why = str(exc)
            if time.monotonic() >= deadline:
                raise RequestTimeoutError(
                    f"topic {topic!r} has no leader for every partition after {timeout_ms} ms ({why})"
                )
            self._backoff(deadline, attempt, waiting_for_leader=True)
            attempt += 1

    def stored_compression(self, topic: str, partition: int) -> str | None:
        """The Arrow codec ``topic`` stores batches with (its compression.type: "lz4",
        "zstd"; None: uncompressed), from the metadata cache, filled first if cold (a
        producer about to send learns the leader so anyway). None if it cannot be
        learnt: the produce that follows reports why."""
        pm = self._leaders.get((topic, partition))
        if pm is None:
            try:
                pm = self.partition_metadata(topic, partition)
            except QuorumLogError:
                return None
        return pm.compression

    def partition_metadata(
        self, topic: str, partition: int, *, refresh: bool = False, timeout_s: float | None = None
    ) -> PartitionMetadata:
        key = (topic, partition)
        cached = self._leaders.get(key)
        if cached is None and not refresh:
            cached = self._topic_from_one_node(topic, partition, timeout_s)
        if cached is None or refresh or cached.leader_id < 0:
            # A cold cache learns the whole topic (a producer goes on to its other
            # partitions), from one node if it can; a refresh asks every node for this
            # partition alone, so a leader change under a topic of thousands of partitions
            # costs the nodes asked one partition's answer, not the topic's, at the moment
            # they are busiest.
            only = None if cached is None else [partition]
            meta = self.metadata([topic], partitions=only, timeout_s=timeout_s)
            if partition not in meta[topic].partitions:
                raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
        return self._leaders[key]

    def _topic_from_one_node(
        self, topic: str, partition: int, timeout_s: float | None
    ) -> PartitionMetadata | None:
        """A cold cache filled with a topic's metadata from one node, picked at random
        among those not suspected (as Kafka's clients ask one broker): a topic of
        thousands of partitions costs each node asked a fifth of a second, and every
        client starting at once (the senders of producers) would ask every node. The
        partition's entry, or None when that node failed or did not know it (the caller
        then asks every node)."""
        addrs = self._addresses()
        healthy = [a for a in addrs if not self._suspected(a)] or addrs
        req = m.MetadataRequest(topics=[topic])
        try:
            answer = self._metadata_from(
                random.choice(healthy), req, self._metadata_timeout_s(timeout_s)
            )
        except (ConnectionLost, QuorumLogError, OSError) as exc:
            log.debug("metadata of %s from one node failed: %s", topic, exc)
            return None
        if any(t.name == topic and t.error == ErrorCode.NONE for t in answer.topics):
            self._merge([answer], [topic])
        return self._leaders.get((topic, partition))

    def cached_leader(self, topic: str, partition: int) -> int | None:
        """The partition's leader as this client last learnt it, asking no node (None if
        it knows none)."""
        pm = self._leaders.get((topic, partition))
        return pm.leader_id if pm is not None and pm.leader_id >= 0 else None
