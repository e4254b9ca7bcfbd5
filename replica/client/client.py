"""The synchronous client: metadata, produce, fenced fetch, list offsets, offsets-for-epoch.

Timeouts as Kafka's clients: a call (produce, fetch, ...) may take ``request_timeout_ms`` in
all (Kafka's ``delivery.timeout.ms`` / ``default.api.timeout.ms``), made of attempts that
each take at most ``attempt_timeout_ms`` (Kafka's ``request.timeout.ms``), connecting
included. What a node waits for inside an attempt (a long poll's max wait, an acks=quorum
produce's wait for the quorum) is cut to fit in the attempt, so an attempt that outlives
its timeout means a node that stopped answering (SIGSTOP, a stalled VM, a long GC): its
connection is closed, the node is suspected until it answers again (for one attempt
timeout at most), metadata is refreshed from the nodes that answer, and the retry goes to
the partition's current leader. Retries back off with one formula (``backoff_s``).

Leader routing uses a metadata cache refreshed on NOT_LEADER / FENCED / UNKNOWN epoch,
on connection loss and on a timed-out attempt: a cold cache learns a topic from one node,
a refresh asks every node for the one partition it routes. When a caller passes its own
``current_leader_epoch``, fencing errors are raised to it instead of retried: the caller
(a KIP-320 consumer) must re-validate its position before reading on.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from .. import defaults
from ..protocol import DEFAULT_MAX_FRAME_BYTES, ApiKey, ErrorCode, max_batch_bytes
from ..protocol import messages as m
from ..storage.types import EpochEndOffset, OffsetAndEpoch
from .connection import AttemptTimedOut, Connection, ConnectionLost
from .errors import (
    BootstrapUnreachableError,
    FencedLeaderEpochError,
    LeaderNotAvailableError,
    NotLeaderError,
    OffsetNotAvailableError,
    OutOfOrderSequenceError,
    QuorumLogError,
    RecordTooLargeError,
    RequestTimeoutError,
    SecurityError,
    TopicExistsError,
    UnknownLeaderEpochError,
    UnknownTopicError,
    error_for,
)
from .security import ClientSecurity

log = logging.getLogger(__name__)

T = TypeVar("T")
# Requests a produce_many has in flight on one connection: what a node reads ahead of its
# answers.
PIPELINE = defaults.CONNECTION_MAX_IN_FLIGHT
# Bytes of records one ProduceMany frame of produce_many carries at most (more make another
# frame): what one Produce may carry, so a node that takes the largest batch takes these.
PRODUCE_MANY_BYTES = defaults.MAX_MESSAGE_BYTES

_REFRESH_ERRORS = (
    NotLeaderError,
    LeaderNotAvailableError,
    FencedLeaderEpochError,
    UnknownLeaderEpochError,
    ConnectionLost,
)

# The client's names for its shipped defaults (replica.defaults says why).
DEFAULT_REQUEST_TIMEOUT_MS = defaults.REQUEST_TIMEOUT_MS
DEFAULT_ATTEMPT_TIMEOUT_MS = defaults.ATTEMPT_TIMEOUT_MS
# A node's own wait inside an attempt (long poll, quorum wait) ends at this share of the
# attempt, so its answer arrives before the attempt gives up on it.
_SERVER_WAIT_SHARE = 0.8


def _server_wait_ms(attempt_s: float) -> int:
    """How long a node may wait inside an attempt of ``attempt_s`` seconds."""
    return int(attempt_s * 1000 * _SERVER_WAIT_SHARE)


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


class ProduceResult(NamedTuple):
    topic: str
    partition: int
    base_offset: int
    last_offset: int
    leader_epoch: int


class ProduceCall:
    """A ``produce_many`` sent in part (``Client.produce_send``), for
    ``Client.produce_wait``: its items, each one's result so far, each leader's frames
    (lists of item indexes), and the turn in flight (its frames, connections and the
    errors of those that could not be sent)."""

    __slots__ = ("items", "acks", "deadline", "results", "per_node", "part", "sent", "unsent")

    def __init__(self, items: Sequence[tuple[str, int, bytes]], acks: int, deadline: float):
        self.items = items
        self.acks = acks
        self.deadline = deadline
        self.results: list[ProduceResult | Exception | None] = [None] * len(items)
        self.per_node: dict[tuple[str, int], list[list[int]]] = {}
        self.part: dict[tuple[str, int], list[list[int]]] = {}
        self.sent: dict[tuple[str, int], tuple[Connection, list[int]]] = {}
        self.unsent: dict[tuple[str, int], list[Any]] = {}


@dataclass(frozen=True, slots=True)
class FetchResult:
    topic: str
    partition: int
    leader_epoch: int
    high_watermark: int
    log_start_offset: int
    records: bytes
    # read_committed: the aborted transactions (producer id, first offset) the leader
    # named for these records; None for a read_uncommitted fetch.
    aborted: list[tuple[int, int]] | None = None
    last_stable_offset: int = -1

    def to_arrow(self, start_offset: int | None = None, end_offset: int | None = None) -> Any:
        """The user records as a pyarrow Table (key, value, timestamp, headers, offset,
        leaderEpoch): control batches removed, and for a read_committed fetch the
        records of aborted transactions (their offsets are gaps), rows outside
        [start, end) sliced off."""
        import pyarrow.compute as pc

        from ..storage.records import batches_to_table

        table = batches_to_table(self.records, aborted=self.aborted)
        if start_offset is None and end_offset is None:
            return table
        offsets = table.column("offset")
        mask = None
        if start_offset is not None:
            mask = pc.greater_equal(offsets, start_offset)
        if end_offset is not None:
            upper = pc.less(offsets, end_offset)
            mask = upper if mask is None else pc.and_(mask, upper)
        return table.filter(mask)

    def last_offset_and_epoch(self) -> OffsetAndEpoch | None:
        """Offset and epoch of the last record held (control records included)."""
        from ..storage.records import iter_batches

        last: OffsetAndEpoch | None = None
        for b in iter_batches(self.records):
            last = OffsetAndEpoch(b.last_offset, b.leader_epoch)
        return last


#: A consumer's isolation level, by Kafka's names.
ISOLATION_LEVELS = {"read_uncommitted": m.READ_UNCOMMITTED, "read_committed": m.READ_COMMITTED}


def isolation_level(name: str) -> int:
    try:
        return ISOLATION_LEVELS[name]
    except KeyError:
        raise ValueError(
            f"isolation must be one of {sorted(ISOLATION_LEVELS)}, got {name!r}"
        ) from None


def check_batch_size(topic: str, partition: int, records: bytes, limit: int) -> None:
    """Raise RecordTooLargeError if ``records`` holds a batch over ``limit`` (the topic's
    max.message.bytes; 0: unknown) or cannot fit one frame at all. Only headers are read,
    and only when the whole is over the limit."""
    ceiling = max_batch_bytes(DEFAULT_MAX_FRAME_BYTES)
    if len(records) > ceiling:
        raise RecordTooLargeError(
            f"MESSAGE_TOO_LARGE: {len(records)} bytes of records to {topic}/{partition} exceed "
            f"the {ceiling} bytes one produce request can carry"
        )
    if limit <= 0 or len(records) <= limit:
        return
    from ..storage.errors import CorruptRecordError
    from ..storage.records import iter_batches

    try:
        for h in iter_batches(records):
            if h.size > limit:
                raise RecordTooLargeError(
                    f"MESSAGE_TOO_LARGE: record batch of {h.size} bytes to {topic}/{partition} "
                    f"exceeds the topic's max.message.bytes {limit}"
                )
    except CorruptRecordError:
        return  # malformed input: the node answers for it


def parse_bootstrap(bootstrap: str | list[str]) -> list[tuple[str, int]]:
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out: list[tuple[str, int]] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap address {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("bootstrap is empty: give host:port[,host:port...]")
    return out


METADATA_GRACE_S = 0.2
METADATA_TIMEOUT_S = 5.0


def _leaders_known(answers: list[m.MetadataResponse]) -> bool:
    """Whether the answers so far name a leader for every partition they mention."""
    led: dict[tuple[str, int], bool] = {}
    for resp in answers:
        for t in resp.topics:
            for p in t.partitions:
                key = (t.name, p.partition)
                led[key] = led.get(key, False) or p.leader_id >= 0
    return all(led.values())


class Client:
    def __init__(
        self,
        bootstrap: str | list[str],
        *,
        client_id: str = "quorumlog",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS,
        retry_backoff_ms: int = defaults.RETRY_BACKOFF_MS,
        retry_backoff_max_ms: int = defaults.RETRY_BACKOFF_MAX_MS,
        security: ClientSecurity | None = None,
    ) -> None:
        """``request_timeout_ms``: what one call may take, retries included;
        ``attempt_timeout_ms``: what one attempt may take (connecting included) before
        its node is given up on for this attempt; ``retry_backoff_ms`` /
        ``retry_backoff_max_ms``: the back-off between attempts (see ``backoff_s``)."""
        self._bootstrap = parse_bootstrap(bootstrap)
        for name, value in (
            ("request_timeout_ms", request_timeout_ms),
            ("attempt_timeout_ms", attempt_timeout_ms),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.security = security
        self._ssl_context = security.ssl_context() if security is not None else None
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.attempt_timeout_ms = attempt_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = max(retry_backoff_ms, retry_backoff_max_ms)
        self._nodes: dict[int, tuple[str, int]] = {}
        self._conns: dict[tuple[str, int], Connection] = {}
        # node address -> until when it is suspected of hanging (an attempt to it timed
        # out): leader-routed attempts wait for another leader or for it to answer again.
        self._suspects: dict[tuple[str, int], float] = {}
        self._leaders: dict[tuple[str, int], PartitionMetadata] = {}
        self._controller_id = m.UNKNOWN
        self.cluster_id = ""
        self._retired: set[int] = set()
        self._pool: ThreadPoolExecutor | None = None

    # ---- plumbing -------------------------------------------------------------------
    def clone(self) -> Client:
        """A client with this one's settings and connections of its own (a Client is used
        by one thread at a time) that shares what this one knows of the cluster: its
        nodes and partition leaders, one mapping each (an entry is replaced whole, never
        changed in place). What one learns, the others route by: a Producer's sender that
        has not sent yet knows the leaders the others learnt, where it asked one node at
        random, which could be a hung one (an attempt timeout lost for a partition whose
        leader runs)."""
        twin = Client(
            [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self._bootstrap],
            client_id=self.client_id,
            request_timeout_ms=self.request_timeout_ms,
            attempt_timeout_ms=self.attempt_timeout_ms,
            retry_backoff_ms=self.retry_backoff_ms,
            retry_backoff_max_ms=self.retry_backoff_max_ms,
            security=self.security,
        )
        twin._nodes = self._nodes
        twin._leaders = self._leaders
        return twin

    def close(self) -> None:
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, addr: tuple[str, int], api: ApiKey, req: Any, resp_cls: type[T], timeout_s: float
    ) -> T:
        """One attempt on ``addr``'s connection (opened first if needed), all of it within
        ``timeout_s``. A failed connection is dropped; a silent node becomes a suspect."""
        conn = self._connection(addr, timeout_s)
        try:
            resp = conn.request(api, req, resp_cls)
        except Exception as exc:
            self._settle(addr, conn, [exc])
            raise
        self._settle(addr, conn, [resp])
        return resp

    def _pipelined(
        self,
        batches: dict[tuple[str, int], list[Any]],
        api: ApiKey,
        resp_cls: type[T],
        timeout_s: float,
    ) -> dict[tuple[str, int], list[T | Exception]]:
        """Requests to several nodes, all sent before any answer is read: each node's on
        its connection, then read in order (a node answers a connection's requests in the
        order they came), within ``timeout_s`` of that connection's last send. An error
        answer stands for its request alone; a lost or silent connection is closed, and
        every request of it not answered by then gets that error (it may have been
        applied)."""
        out, sent = self._pipeline_send(batches, api, timeout_s)
        return self._pipeline_receive(sent, resp_cls, out)

    def _pipeline_send(
        self, batches: dict[tuple[str, int], list[Any]], api: ApiKey, timeout_s: float
    ) -> tuple[
        dict[tuple[str, int], list[Any]], dict[tuple[str, int], tuple[Connection, list[int]]]
    ]:
        """``_pipelined``'s sends: the errors of nodes whose requests could not be sent,
        and each other node's connection and the correlation ids to read."""
        out: dict[tuple[str, int], list[Any]] = {}
        sent: dict[tuple[str, int], tuple[Connection, list[int]]] = {}
        for addr, reqs in batches.items():
            ids: list[int] = []
            try:
                conn = self._connection(addr, timeout_s)
            except Exception as exc:
                out[addr] = [exc] * len(reqs)
                continue
            try:
                for req in reqs:
                    ids.append(conn.send(api, req))
            except Exception as exc:
                conn.close()  # the answers of those sent must not be read as later ones
                out[addr] = [exc] * len(reqs)
                self._settle(addr, conn, out[addr])
                continue
            except BaseException:
                conn.close()
                raise
            sent[addr] = (conn, ids)
        return out, sent

    def _pipeline_receive(
        self,
        sent: dict[tuple[str, int], tuple[Connection, list[int]]],
        resp_cls: type[T],
        out: dict[tuple[str, int], list[T | Exception]],
    ) -> dict[tuple[str, int], list[T | Exception]]:
        """``_pipelined``'s reads: each node's answers, in order, added to ``out``."""
        for addr, (conn, ids) in sent.items():
            answers: list[T | Exception] = []
            try:
                for cid in ids:
                    try:
                        answers.append(conn.receive(cid, resp_cls))
                    except QuorumLogError as exc:
                        if isinstance(exc, ConnectionLost) or conn.closed:
                            raise
                        answers.append(exc)  # an error answer: the stream is in step
            except Exception as exc:
                conn.close()
                answers.extend([exc] * (len(ids) - len(answers)))
            except BaseException:
                conn.close()
                raise
            self._settle(addr, conn, answers)
            out[addr] = answers
        return out

    def _connection(self, addr: tuple[str, int], timeout_s: float) -> Connection:
        """``addr``'s connection, opened first if needed (within ``timeout_s``), with
        ``timeout_s`` per request."""
        conn = self._conns.get(addr)
        if conn is None or conn.closed:
            conn = Connection(
                addr[0],
                addr[1],
                client_id=self.client_id,
                timeout_s=timeout_s,
                ssl_context=self._ssl_context,
                credentials=(self.security.credentials() if self.security is not None else None),
                defer=True,
            )
            # Published before connecting, so metadata() can abort a hung establishment.
            self._conns[addr] = conn
            try:
                conn.establish(timeout_s)
            except Exception as exc:
                self._settle(addr, conn, [exc])
                raise
        conn.set_timeout(timeout_s)
        return conn

    def _settle(self, addr: tuple[str, int], conn: Connection, answers: list[Any]) -> None:
        """After an exchange on ``addr``'s connection: a failed connection is dropped, a
        node that did not answer in time is suspected until it does, and one that
        answered is no longer suspected."""
        if conn.closed and self._conns.get(addr) is conn:
            self._conns.pop(addr, None)
        if any(isinstance(a, AttemptTimedOut) for a in answers):
            self._suspects[addr] = time.monotonic() + self.attempt_timeout_ms / 1000
            log.info("%s:%d did not answer in time; suspected until it does", *addr)
        elif any(not isinstance(a, BaseException) for a in answers):
            self._suspects.pop(addr, None)

    def _suspected(self, addr: tuple[str, int]) -> bool:
        until = self._suspects.get(addr)
        return until is not None and until > time.monotonic()

    def _addresses(self) -> list[tuple[str, int]]:
        """Known nodes then the bootstrap, suspected ones last."""
        seen: list[tuple[str, int]] = []
        for addr in [*self._nodes.values(), *self._bootstrap]:
            if addr not in seen:
                seen.append(addr)
        return sorted(seen, key=self._suspected)

    def _deadline(self, timeout_ms: int | None = None) -> float:
        return (
            time.monotonic()
            + (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        )

    def _attempt_s(self, deadline: float) -> float:
        """One attempt's time: the attempt timeout, or what is left of the call if less."""
        return max(0.05, min(self.attempt_timeout_ms / 1000, deadline - time.monotonic()))

    def backoff_s(self, attempt: int, *, waiting_for_leader: bool = False) -> float:
        """The back-off before retry number ``attempt`` (0 first), for every retry of this
        client and of the connector's readers: exponential from ``retry_backoff_ms`` up to
        32 times that and at most ``retry_backoff_max_ms`` (a short back-off stays short
        while a leader is elected), with +-20 % jitter so that clients that failed together
        do not retry together (Kafka's KIP-580). ``waiting_for_leader`` (no leader yet, or
        the one known did not answer in time): the back-off stays at its second step, so a
        call that already spent attempts (a timed-out one costs 1.5 s) notices the new
        leader within ~0.2 s of its election, not up to a second later; each retry is a
        metadata request about one partition."""
        if waiting_for_leader:
            attempt = min(attempt, 1)
        term = min(self.retry_backoff_ms * float(2 ** min(attempt, 5)), self.retry_backoff_max_ms)
        return max(self.retry_backoff_ms, term * random.uniform(0.8, 1.2)) / 1000

    def _backoff(self, deadline: float, attempt: int, *, waiting_for_leader: bool = False) -> None:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            pause = self.backoff_s(attempt, waiting_for_leader=waiting_for_leader)
            time.sleep(min(pause, remaining))

    def _retrying(
        self,
        what: str,
        timeout_ms: int,
        attempt: Callable[[float], T],
        retriable: tuple[type[Exception], ...],
    ) -> T:
        """The one retry loop: ``attempt(call deadline)`` until it returns, raises a
        non-retriable error, or the call's ``timeout_ms`` is spent (RequestTimeoutError
        naming the last failure)."""
        deadline = time.monotonic() + timeout_ms / 1000
        attempts = 0
        while True:
            attempts += 1
            try:
                return attempt(deadline)
            except retriable as exc:
                last: Exception = exc
                log.debug("%s: attempt %d failed: %s", what, attempts, exc)
            if time.monotonic() >= deadline:
                raise RequestTimeoutError(
                    f"{what} did not succeed within {timeout_ms} ms ({attempts} attempts; "
                    f"last: {last})"
                )
            self._backoff(
                deadline, attempts - 1, waiting_for_leader=isinstance(last, LeaderNotAvailableError)
            )

    @staticmethod
    def _check(resp: Any) -> None:
        if resp.error != ErrorCode.NONE:
            raise error_for(resp.error, resp.error_message)

    # ---- metadata -------------------------------------------------------------------
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

    def refresh_nodes(self, *, timeout_s: float | None = None) -> None:
        """Learn the nodes and the metadata controller from every reachable node, with a
        Metadata request for no partition: one that names none describes every partition
        of every topic, a fifth of a second of each node's loop per 10,000 partitions."""
        self.metadata(partitions=[], timeout_s=timeout_s)

    def list_topics(self) -> list[str]:
        return self._admin(ApiKey.LIST_TOPICS, m.ListTopicsRequest(), m.ListTopicsResponse).topics

    def _admin(
        self,
        api: ApiKey,
        req: Any,
        resp_cls: type[T],
        *,
        controller: bool = False,
        attempts: list[float] | None = None,
    ) -> T:
        """A request any node answers (or, ``controller``, the metadata leader): each
        attempt tries the known nodes in turn, each within the attempt timeout. Each
        attempt's start is appended to ``attempts``, so a caller can tell a retry."""

        def attempt(deadline: float) -> T:
            if attempts is not None:
                attempts.append(time.monotonic())
            if controller and self._controller_id < 0:
                try:
                    self.refresh_nodes(timeout_s=self._attempt_s(deadline))
                except BootstrapUnreachableError:
                    pass  # the nodes below are tried anyway; a clear error if none answers
            targets = self._addresses()
            if controller and self._controller_id in self._nodes:
                targets = [self._nodes[self._controller_id]]
            last: Exception = LeaderNotAvailableError("no node to ask")
            for addr in targets:
                try:
                    resp = self._request(addr, api, req, resp_cls, self._attempt_s(deadline))
                    self._check(resp)
                    return resp
                except _REFRESH_ERRORS as exc:
                    last = exc
                    self._controller_id = m.UNKNOWN
            if not self._nodes and isinstance(last, ConnectionLost):
                # Never reached any node: the bootstrap is wrong or down; say so now.
                raise BootstrapUnreachableError(
                    "no quorumlog node reachable at bootstrap "
                    + ",".join(f"{h}:{p}" for h, p in self._bootstrap)
                    + f" ({last})"
                )
            raise last

        return self._retrying(api.name, self.request_timeout_ms, attempt, _REFRESH_ERRORS)

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int | None = None,
        *,
        max_message_bytes: int | None = None,
        configs: Mapping[str, str] | None = None,
    ) -> None:
        """``max_message_bytes``: the topic's limit on one record batch (Kafka's
        max.message.bytes); None: each node's ``serve --max-message-bytes`` applies.
        ``configs``: what else the topic sets, in Kafka's names (retention.ms,
        retention.bytes, segment.bytes, max.message.bytes)."""
        if max_message_bytes is not None and max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be > 0, got {max_message_bytes}")
        attempts: list[float] = []
        try:
            self._admin(
                ApiKey.CREATE_TOPIC,
                m.CreateTopicRequest(
                    name=name,
                    partitions=partitions,
                    replication_factor=replication_factor or 0,
                    max_message_bytes=max_message_bytes or 0,
                    configs=[m.TopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
                ),
                m.CreateTopicResponse,
                controller=True,
                attempts=attempts,
            )
        except TopicExistsError:
            # An attempt that timed out may have created it: a retry then finds the topic.
            # That is this call's success if the topic is the one asked for.
            if len(attempts) < 2 or len(self.metadata([name])[name].partitions) != partitions:
                raise

    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        configs: Mapping[str, str | None] | None = None,
    ) -> None:
        """Grow ``name`` to ``partitions`` (never fewer) and set its ``configs`` (Kafka's
        names; a None value deletes one, so the nodes' value applies again)."""
        self._admin(
            ApiKey.ALTER_TOPIC,
            m.AlterTopicRequest(
                name=name,
                partitions=partitions or 0,
                configs=[m.TopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
            ),
            m.AlterTopicResponse,
            controller=True,
        )

    def reassign(
        self, topic: str, moves: Mapping[int, Sequence[int]], *, cancel: bool = False
    ) -> None:
        """Move each partition ``p`` of ``topic`` in ``moves`` to the replicas
        ``moves[p]`` (the first becomes its preferred leader), online: new replicas catch
        up, join the voters one at a time, and the leaving ones go (see
        ``reassignment``). ``cancel``: move those partitions back to the replicas they
        had before their latest move instead (the values are ignored)."""
        self._admin(
            ApiKey.REASSIGN,
            m.ReassignRequest(
                topic=topic,
                moves=[
                    m.PartitionMove(partition=p, replicas=list(r)) for p, r in sorted(moves.items())
                ],
                cancel=cancel,
            ),
            m.ReassignResponse,
            controller=True,
        )

    def set_catch_up_throttle(self, bytes_per_s: int | None) -> None:
        """Set the bytes per second every node's leaders send the replicas moves add (0:
        unthrottled), at once for the moves under way too, kept in the cluster's metadata;
        None: each node's own --catch-up-bytes-per-second again."""
        self._admin(
            ApiKey.CATCH_UP_THROTTLE,
            m.CatchUpThrottleRequest(bytes_per_s=m.UNKNOWN if bytes_per_s is None else bytes_per_s),
            m.CatchUpThrottleResponse,
            controller=True,
        )

    def change_voter(self, node_id: int, *, add: bool) -> list[int]:
        """Add ``node_id`` to the metadata quorum's voters (``add``) or remove it; returns
        the voter set the quorum moves to (one voter at a time, online)."""
        resp = self._admin(
            ApiKey.CHANGE_VOTER,
            m.ChangeVoterRequest(node_id=node_id, add=add),
            m.ChangeVoterResponse,
            controller=True,
        )
        return list(resp.voters)

    def register_node(self, req: m.RegisterNodeRequest) -> m.RegisterNodeResponse:
        """Register a node (``serve --join`` does, as that node's principal): the cluster
        it joins. DuplicateNodeError while a live node holds its id with another data
        directory."""
        return self._admin(ApiKey.REGISTER_NODE, req, m.RegisterNodeResponse, controller=True)

    def retire_node(self, node_id: int, *, retired: bool = True) -> None:
        """Decommission ``node_id``: it is given no new replicas (its replicas stay until
        moved, as ``quorumlog cluster decommission`` does); ``retired=False`` takes it
        back (``cluster recommission``)."""
        self._admin(
            ApiKey.RETIRE_NODE,
            m.RetireNodeRequest(node_id=node_id, retired=retired),
            m.RetireNodeResponse,
            controller=True,
        )

    def delete_topic(self, name: str) -> None:
        attempts: list[float] = []
        try:
            self._admin(
                ApiKey.DELETE_TOPIC,
                m.DeleteTopicRequest(name=name),
                m.DeleteTopicResponse,
                controller=True,
                attempts=attempts,
            )
        except UnknownTopicError:
            if len(attempts) < 2:  # else an attempt that timed out deleted it
                raise

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

    # ---- leader-routed requests -----------------------------------------------------
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

    def check_size(self, topic: str, partition: int, records: bytes) -> None:
        """Raise RecordTooLargeError if ``records`` would be refused for its size by the
        partition's max.message.bytes as this client last learnt it (asking no node)."""
        pm = self._leaders.get((topic, partition))
        check_batch_size(topic, partition, records, pm.max_message_bytes if pm else 0)

    def cached_leader(self, topic: str, partition: int) -> int | None:
        """The partition's leader as this client last learnt it, asking no node (None if
        it knows none)."""
        pm = self._leaders.get((topic, partition))
        return pm.leader_id if pm is not None and pm.leader_id >= 0 else None

    def _leader_call(
        self,
        topic: str,
        partition: int,
        api: ApiKey,
        make_request: Callable[[PartitionMetadata, float], Any],
        resp_cls: type[T],
        *,
        fenced_to_caller: bool,
        timeout_ms: int | None = None,
        also_retriable: tuple[type[Exception], ...] = (),
    ) -> T:
        """``make_request(partition metadata, attempt seconds)`` sent to the partition's
        leader, retried (metadata refreshed first) on the errors a leader change or a hung
        or restarted node gives, and ``also_retriable``, within the call's timeout."""
        refresh = False

        def attempt(deadline: float) -> T:
            nonlocal refresh
            pm = self.partition_metadata(
                topic, partition, refresh=refresh, timeout_s=self._attempt_s(deadline)
            )
            refresh = True  # whatever fails next, the retry asks who leads now
            if pm.leader_id < 0 or pm.leader_id not in self._nodes:
                raise LeaderNotAvailableError(f"{topic}/{partition} has no leader yet")
            addr = self._nodes[pm.leader_id]
            if self._suspected(addr):
                raise LeaderNotAvailableError(
                    f"leader {pm.leader_id} of {topic}/{partition} (epoch {pm.leader_epoch}) "
                    "did not answer in time; waiting for a new leader or for it to answer"
                )
            attempt_s = self._attempt_s(deadline)
            resp = self._request(addr, api, make_request(pm, attempt_s), resp_cls, attempt_s)
            if resp.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                # A node that just restarted may not host the partition yet; a topic
                # that does not exist at all fails at the metadata refresh instead.
                raise LeaderNotAvailableError(
                    f"node {pm.leader_id} does not host {topic}/{partition} yet"
                )
            if resp.error == ErrorCode.NOT_LEADER and self._moved(pm, resp):
                refresh = False  # the retry goes where the answer says, without metadata
            self._check(resp)
            return resp

        retriable: tuple[type[Exception], ...] = (
            NotLeaderError,
            LeaderNotAvailableError,
            OffsetNotAvailableError,  # a new leader that does not know its HWM yet
            ConnectionLost,
            BootstrapUnreachableError,
            RequestTimeoutError,  # the node's own wait (quorum) ran out: Kafka retries it
        )
        if not fenced_to_caller:
            retriable += (FencedLeaderEpochError, UnknownLeaderEpochError)
        retriable += also_retriable
        return self._retrying(
            f"{api.name} on {topic}/{partition}",
            timeout_ms if timeout_ms is not None else self.request_timeout_ms,
            attempt,
            retriable,
        )

    def _moved(self, pm: PartitionMetadata, resp: Any) -> bool:
        """A NOT_LEADER answer that names the partition's leader in a later epoch than
        ``pm`` (as Kafka's KIP-951): that leader goes in the cache, and True. A client
        retrying on it needs no metadata, which a topic of thousands of partitions makes
        costly for every node asked, at the very moment leadership moves."""
        leader = getattr(resp, "leader_id", m.UNKNOWN)
        epoch = getattr(resp, "leader_epoch", m.UNKNOWN)
        if leader < 0 or epoch <= pm.leader_epoch or leader not in self._nodes:
            return False
        self._leaders[(pm.topic, pm.partition)] = replace(pm, leader_id=leader, leader_epoch=epoch)
        return True

    def _fenced_call(
        self,
        topic: str,
        partition: int,
        api: ApiKey,
        make_request: Callable[[int, float], Any],
        resp_cls: type[T],
        current_leader_epoch: int | None,
        timeout_ms: int | None = None,
    ) -> T:
        """A ``_leader_call`` whose request names the leader epoch the caller knows (KIP-320):
        ``make_request(epoch, attempt seconds)`` is given ``current_leader_epoch``, or
        UNKNOWN if the caller names none. A named epoch the leader fences or does not know
        is the caller's to handle, so those errors are raised, not retried."""
        epoch = m.UNKNOWN if current_leader_epoch is None else current_leader_epoch
        return self._leader_call(
            topic,
            partition,
            api,
            lambda pm, attempt_s: make_request(epoch, attempt_s),
            resp_cls,
            fenced_to_caller=current_leader_epoch is not None,
            timeout_ms=timeout_ms,
        )

    def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        *,
        acks: int = m.ACKS_QUORUM,
        timeout_ms: int | None = None,
    ) -> ProduceResult:
        """Append encoded batches (see ``quorumlog.replica.storage.records``). An attempt
        that timed out or lost its connection may have appended them; the retry sends the
        same bytes, so a batch with producer fields (``Producer``, idempotent) is appended
        once: the leader answers a retry with the first append's offsets. Without them a
        retry may append the records twice. With acks=quorum the leader waits for the
        quorum within the attempt (its REQUEST_TIMED_OUT is retried). OUT_OF_ORDER_SEQUENCE
        is retried too: a deposed leader that missed the previous batch answers it, and
        the current leader then finds the retry in order, or a duplicate."""
        t = timeout_ms if timeout_ms is not None else self.request_timeout_ms
        sent = 0

        def request(pm: PartitionMetadata, attempt_s: float) -> m.ProduceRequest:
            nonlocal sent
            # Checked per attempt against the limit of the metadata it routes by; raised
            # out of _leader_call at once, as no retry can make the batch fit.
            check_batch_size(topic, partition, records, pm.max_message_bytes)
            sent += 1
            return m.ProduceRequest(
                topic=topic,
                partition=partition,
                acks=acks,
                timeout_ms=max(1, _server_wait_ms(attempt_s)),
                records=records,
            )

        try:
            resp = self._leader_call(
                topic,
                partition,
                ApiKey.PRODUCE,
                request,
                m.ProduceResponse,
                fenced_to_caller=False,
                timeout_ms=t,
                also_retriable=(OutOfOrderSequenceError,),
            )
        except RequestTimeoutError as exc:
            if not sent:
                raise
            raise RequestTimeoutError(
                f"{exc}. The records may have been appended anyway (an attempt that timed "
                "out or lost its connection can still commit)"
            ) from None
        return ProduceResult(
            topic, partition, resp.base_offset, resp.last_offset, resp.leader_epoch
        )

    def produce_many(
        self,
        items: Sequence[tuple[str, int, bytes]],
        *,
        acks: int = m.ACKS_QUORUM,
        timeout_ms: int | None = None,
    ) -> list[ProduceResult | Exception]:
        """Append encoded batches to several partitions at once, ``items`` of (topic,
        partition, records): one ProduceMany request per leader and topic (as Kafka's
        ProduceRequest; more past PRODUCE_MANY_BYTES), every leader's sent on its
        connection (up to PIPELINE each) before any answer is read, so batches for many
        partitions wait one round trip and cost the node one frame, not one each. An item
        whose first attempt fails (an error answer, of the item or of its whole frame, a
        leader change, a lost connection) is then sent alone by ``produce``, with its
        retries and errors. Returns, in the order of ``items``, each one's ProduceResult or
        the error ``produce`` raised for it.
        A partition's items are appended in the order given when their first attempts
        succeed (the requests of a pipeline are appended in order), but an item that is
        retried alone goes after the others: give a partition several items only if a
        later one is refused while an earlier one is missing (an idempotent producer's
        numbered batches: OUT_OF_ORDER_SEQUENCE, retried in turn). The call returns
        when every item has: a node that does not answer holds it up for an attempt
        timeout (``Producer`` sends one node's batches per call, so that a hung node holds
        up only its own partitions)."""
        return self.produce_wait(self.produce_send(items, acks=acks, timeout_ms=timeout_ms))

    def produce_send(
        self,
        items: Sequence[tuple[str, int, bytes]],
        *,
        acks: int = m.ACKS_QUORUM,
        timeout_ms: int | None = None,
    ) -> ProduceCall:
        """The first half of ``produce_many``: its requests sent (the first PIPELINE
        frames of each leader), no answer read. ``produce_wait`` reads them and does the
        rest. Calls sent one after another on this client and waited for in the same
        order keep a pipeline on each leader's connection: the node appends the second
        while the first waits for its quorum."""
        t = timeout_ms if timeout_ms is not None else self.request_timeout_ms
        call = ProduceCall(items, acks, time.monotonic() + t / 1000)
        filling: dict[tuple[tuple[str, int], str], tuple[list[int], int]] = {}  # and bytes
        for i, (topic, partition, records) in enumerate(items):
            try:
                pm = self.partition_metadata(
                    topic, partition, timeout_s=self._attempt_s(call.deadline)
                )
                check_batch_size(topic, partition, records, pm.max_message_bytes)
            except RecordTooLargeError as exc:
                call.results[i] = exc  # no retry makes it fit
                continue
            except Exception:
                continue  # left to produce()
            addr = self._nodes.get(pm.leader_id) if pm.leader_id >= 0 else None
            if addr is not None and not self._suspected(addr):
                chunk, size = filling.get((addr, topic), ([], PRODUCE_MANY_BYTES))
                if size + len(records) > PRODUCE_MANY_BYTES:  # one topic a frame
                    chunk, size = [], 0
                    call.per_node.setdefault(addr, []).append(chunk)
                chunk.append(i)
                filling[(addr, topic)] = (chunk, size + len(records))
        self._produce_turn(call, 0)
        return call

    def produce_wait(self, call: ProduceCall) -> list[ProduceResult | Exception]:
        """The second half of ``produce_many``: the answers of ``call`` read (and its
        further turns sent and read), then each item whose first attempt failed sent
        alone by ``produce``; each item's ProduceResult or error, in order."""
        items = call.items
        turns = max(map(len, call.per_node.values()), default=0)
        for turn in range(0, turns, PIPELINE):
            if turn:
                self._produce_turn(call, turn)
            answers = self._pipeline_receive(call.sent, m.ProduceManyResponse, call.unsent)
            for addr, chunks in call.part.items():
                for chunk, many in zip(chunks, answers[addr], strict=True):
                    if not isinstance(many, m.ProduceManyResponse) or len(many.answers) != len(
                        chunk
                    ):
                        continue  # an error of the whole frame: each item goes again alone
                    for i, resp in zip(chunk, many.answers, strict=True):
                        if resp.error == ErrorCode.NONE:
                            call.results[i] = ProduceResult(
                                items[i][0],
                                items[i][1],
                                resp.base_offset,
                                resp.last_offset,
                                resp.leader_epoch,
                            )
                        elif resp.error == ErrorCode.NOT_LEADER:
                            cached = self._leaders.get((items[i][0], items[i][1]))
                            if cached is not None:
                                self._moved(cached, resp)  # its retry goes to the leader named
        results = call.results
        for i, (topic, partition, records) in enumerate(items):
            if results[i] is None:
                left_ms = max(1, int((call.deadline - time.monotonic()) * 1000))
                try:
                    results[i] = self.produce(
                        topic, partition, records, acks=call.acks, timeout_ms=left_ms
                    )
                except Exception as exc:
                    results[i] = exc
        out = [r for r in results if r is not None]
        assert len(out) == len(items)
        return out

    def _produce_turn(self, call: ProduceCall, turn: int) -> None:
        """Send the frames of ``call``'s turn (up to PIPELINE a leader, from ``turn``)."""
        items = call.items
        part = {addr: chunks[turn : turn + PIPELINE] for addr, chunks in call.per_node.items()}
        call.part = {addr: chunks for addr, chunks in part.items() if chunks}
        attempt_s = self._attempt_s(call.deadline)
        server_ms = max(1, _server_wait_ms(attempt_s))
        batches = {
            addr: [
                m.ProduceManyRequest(
                    topic=items[chunk[0]][0],
                    partitions=[items[i][1] for i in chunk],
                    sizes=[len(items[i][2]) for i in chunk],
                    acks=call.acks,
                    timeout_ms=server_ms,
                    records=b"".join(items[i][2] for i in chunk),
                )
                for chunk in chunks
            ]
            for addr, chunks in call.part.items()
        }
        call.unsent, call.sent = self._pipeline_send(batches, ApiKey.PRODUCE_MANY, attempt_s)

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        current_leader_epoch: int | None = None,
        max_bytes: int = defaults.FETCH_MAX_BYTES,
        max_wait_ms: int = 0,
        isolation: str = "read_uncommitted",
    ) -> FetchResult:
        """Records from ``offset``. A long poll (``max_wait_ms``) is sent as polls that each
        fit in an attempt, until records come or ``max_wait_ms`` has passed, so a hung
        leader is noticed within an attempt timeout however long the poll.
        ``isolation``: ``read_committed`` reads below the last stable offset only (no
        open transaction's records) and drops aborted transactions' records."""
        level = isolation_level(isolation)
        now = time.monotonic()
        wait_until = now + max(0, max_wait_ms) / 1000
        call_deadline = now + max(self.request_timeout_ms, max_wait_ms + 5000) / 1000

        def request(epoch: int, attempt_s: float) -> m.FetchRequest:
            left_ms = int((wait_until - time.monotonic()) * 1000)
            poll_ms = max(0, min(left_ms, _server_wait_ms(attempt_s)))
            return m.FetchRequest(
                topic=topic,
                partition=partition,
                current_leader_epoch=epoch,
                fetch_offset=offset,
                max_wait_ms=poll_ms,
                min_bytes=1,
                max_bytes=max_bytes,
                isolation_level=level,
            )

        while True:
            resp = self._fenced_call(
                topic,
                partition,
                ApiKey.FETCH,
                request,
                m.FetchResponse,
                current_leader_epoch,
                timeout_ms=max(1, int((call_deadline - time.monotonic()) * 1000)),
            )
            now = time.monotonic()
            if resp.records or now >= wait_until or now >= call_deadline:
                break
        return FetchResult(
            topic,
            partition,
            resp.leader_epoch,
            resp.high_watermark,
            resp.log_start_offset,
            resp.records,
            [(a.producer_id, a.first_offset) for a in resp.aborted_transactions]
            if level == m.READ_COMMITTED
            else None,
            resp.last_stable_offset,
        )

    def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: str | int,
        current_leader_epoch: int | None = None,
        *,
        isolation: str = "read_uncommitted",
    ) -> OffsetAndEpoch:
        """``latest`` is the high watermark, or with ``isolation="read_committed"`` the
        last stable offset (below any open transaction)."""
        level = isolation_level(isolation)
        if spec == "latest":
            ts = m.LATEST_TIMESTAMP
        elif spec == "earliest":
            ts = m.EARLIEST_TIMESTAMP
        elif isinstance(spec, int) and spec >= 0:
            ts = spec
        else:
            raise ValueError(
                f"list_offsets spec must be 'earliest', 'latest' or a timestamp in ms, got {spec!r}"
            )
        resp = self._fenced_call(
            topic,
            partition,
            ApiKey.LIST_OFFSETS,
            lambda epoch, _: m.ListOffsetsRequest(
                topic=topic,
                partition=partition,
                current_leader_epoch=epoch,
                timestamp=ts,
                isolation_level=level,
            ),
            m.ListOffsetsResponse,
            current_leader_epoch,
        )
        return OffsetAndEpoch(resp.offset, resp.leader_epoch)

    def offsets_for_leader_epoch(
        self, topic: str, partition: int, leader_epoch: int, current_leader_epoch: int | None = None
    ) -> EpochEndOffset:
        resp = self._fenced_call(
            topic,
            partition,
            ApiKey.OFFSETS_FOR_LEADER_EPOCH,
            lambda epoch, _: m.OffsetsForLeaderEpochRequest(
                topic=topic,
                partition=partition,
                current_leader_epoch=epoch,
                leader_epoch=leader_epoch,
            ),
            m.OffsetsForLeaderEpochResponse,
            current_leader_epoch,
        )
        return EpochEndOffset(resp.leader_epoch, resp.end_offset)

    def describe_quorum(self, topic: str, partition: int) -> m.DescribeQuorumResponse:
        return self._leader_call(
            topic,
            partition,
            ApiKey.DESCRIBE_QUORUM,
            lambda pm, _: m.DescribeQuorumRequest(topic=topic, partition=partition),
            m.DescribeQuorumResponse,
            fenced_to_caller=False,
        )

    def force_leader(self, topic: str, partition: int, node_id: int, *, confirm: bool) -> int:
        """Unclean leader election: ``node_id`` leads ``topic/partition`` in a new epoch even
        without a majority. Records it lacks are lost. Returns the new leader epoch."""
        if not confirm:
            raise ValueError("force_leader may lose committed records: pass confirm=True")
        if not self._nodes:
            self.refresh_nodes()
        if node_id not in self._nodes:
            raise ValueError(f"unknown node id {node_id}; known: {sorted(self._nodes)}")
        resp = self._request(
            self._nodes[node_id],
            ApiKey.FORCE_LEADER,
            m.ForceLeaderRequest(topic=topic, partition=partition, confirm=True),
            m.ForceLeaderResponse,
            self.request_timeout_ms / 1000,
        )
        self._check(resp)
        self._leaders.pop((topic, partition), None)
        return resp.leader_epoch

    def init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        """A new idempotent producer identity (id, epoch 0), or, naming the current one,
        the next epoch of that id (which fences the older epoch)."""
        resp = self._admin(
            ApiKey.INIT_PRODUCER_ID,
            m.InitProducerIdRequest(producer_id=producer_id, producer_epoch=producer_epoch),
            m.InitProducerIdResponse,
        )
        return resp.producer_id, resp.producer_epoch

    def api_versions(self, node_id: int | None = None) -> m.ApiVersionsResponse:
        addr = self._nodes[node_id] if node_id is not None else self._addresses()[0]
        return self._request(
            addr,
            ApiKey.API_VERSIONS,
            m.ApiVersionsRequest(),
            m.ApiVersionsResponse,
            self.request_timeout_ms / 1000,
        )
