"""Producer: asynchronous and pipelined, idempotent by default (as Kafka's Java client).

``send`` adds a record to its partition's batch and returns at once with a
``concurrent.futures.Future`` of its ``RecordMetadata`` (and calls ``on_delivery(error,
metadata)`` once it is known); ``flush`` waits for everything sent so far. Batches close
at ``max_batch_bytes`` / ``max_batch_records`` or after ``linger_ms``, and sender threads
(``max_in_flight``, each with its own connections) append them with acks=quorum by
default: a sender takes every ready batch of one node's partitions and sends them in one
round trip (``Client.produce_many``), as Kafka's sender makes one request per broker, so
batches of many partitions are in flight together; a partition's go one after another,
in order. ``send`` blocks while ``buffer_bytes`` of records wait
(back-pressure), at most ``max_block_ms``.

Idempotence: the producer takes an id and epoch from the cluster (InitProducerId) and
numbers each partition's records; a resent batch carries the same numbers, and the leader
appends it once, answering a resend with the first append's offsets, across leader
changes too. A batch that fails for good leaves its numbers in doubt: the next batch
moves to the next epoch of the id (sequences start again at 0), so later batches are not
refused for the gap. A fenced producer (a newer epoch of its id wrote) fails with
InvalidProducerEpochError. With ``idempotent=False`` a resend may append the same records
twice.

Sizes: a batch over the topic's max.message.bytes is split in halves and sent again
(nothing of it was appended); a single record alone over the limit fails with
RecordTooLargeError (its future, and ``flush``), the rest of its batch is sent.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import defaults
from ..protocol.messages import ACKS_LEADER, ACKS_QUORUM
from ..storage.producers import last_sequence
from ..storage.records import Producer as ProducerFields
from ..storage.records import encode_arrow, encode_batch
from .client import PIPELINE, Client, ProduceResult
from .errors import InvalidProducerEpochError, RecordTooLargeError, UnknownProducerIdError

__all__ = ["Producer", "RecordMetadata"]

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
Row = tuple[bytes | None, bytes | None, int, Headers]
OnDelivery = Callable[[BaseException | None, "RecordMetadata | None"], None]
Encoder = Callable[[ProducerFields | None], bytes]
_SEQUENCES = 1 << 31
#: A sender thread with nothing to send for this long ends (a new one starts on demand).
SENDER_IDLE_S = 1.0


class RecordMetadata(NamedTuple):
    """Where an acknowledged record is: its partition, offset and the leader epoch that
    appended it."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int


@dataclass
class _Batch:
    """Records of one partition, open (filling) or closed (waiting for a sender)."""

    topic: str
    partition: int
    rows: list[Row] = field(default_factory=list)
    futures: list[Future[RecordMetadata]] = field(default_factory=list)
    callbacks: list[OnDelivery | None] = field(default_factory=list)
    size: int = 0
    opened: float = 0.0
    table: Any = None  # send_batch: an Arrow table, as is, with one future
    table_future: Future[ProduceResult] | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition


class Producer:
    def __init__(
        self,
        client: Client,
        *,
        acks: str = "quorum",
        linger_ms: int = defaults.LINGER_MS,
        max_batch_bytes: int = defaults.BATCH_MAX_BYTES,
        max_batch_records: int = defaults.BATCH_MAX_RECORDS,
        idempotent: bool = True,
        max_in_flight: int = defaults.PRODUCER_MAX_IN_FLIGHT,
        buffer_bytes: int = defaults.PRODUCER_BUFFER_BYTES,
        max_block_ms: int = defaults.PRODUCER_MAX_BLOCK_MS,
    ) -> None:
        if acks not in ("quorum", "leader"):
            raise ValueError(f"acks must be 'quorum' or 'leader', got {acks!r}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.client = client
        self.acks = ACKS_QUORUM if acks == "quorum" else ACKS_LEADER
        self.linger_s = linger_ms / 1000
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_records = max_batch_records
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight
        self.buffer_bytes = buffer_bytes
        self.max_block_s = max_block_ms / 1000
        self._cond = threading.Condition()
        self._open: dict[tuple[str, int], _Batch] = {}
        self._closed: deque[_Batch] = deque()  # in the order they closed
        self._busy: set[tuple[str, int]] = set()  # partitions with a batch in flight
        self._buffered = 0
        self._unfinished = 0  # batches closed and not yet answered
        self._results: list[ProduceResult] = []
        self._errors: list[BaseException] = []
        self._senders: list[threading.Thread] = []
        self._stopping = False
        self._partitions: dict[str, int] = {}
        self._sticky: dict[str, int] = {}
        # Idempotence: (producer id, epoch), and per partition (identity, next sequence).
        self._identity: tuple[int, int] | None = None
        self._renew = False  # a batch failed: its sequence numbers are in doubt
        self._sequences: dict[tuple[str, int], tuple[tuple[int, int], int]] = {}
        self._identity_lock = threading.Lock()

    # ------------------------------------------------------------------ public
    @property
    def producer_id(self) -> int | None:
        return self._identity[0] if self._identity else None

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
        on_delivery: OnDelivery | None = None,
    ) -> Future[RecordMetadata]:
        """Queue one record; the future resolves once it is acknowledged (or failed), and
        ``on_delivery`` is called then, from a sender thread."""
        n = self._partition_count(topic) if partition is None else 0
        ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        size = (len(value) if value else 0) + (len(key) if key else 0) + 24
        future: Future[RecordMetadata] = Future()
        with self._cond:
            if partition is None:
                # By key, or without one the topic's current partition (sticky, as Kafka's).
                partition = (
                    zlib.crc32(key) % n if key is not None else self._sticky.get(topic, 0) % n
                )
            self._wait_for_room(size)
            batch = self._open.get((topic, partition))
            if batch is None:
                batch = self._open[(topic, partition)] = _Batch(
                    topic, partition, opened=time.monotonic()
                )
            batch.rows.append((value, key, ts, headers or []))
            batch.futures.append(future)
            batch.callbacks.append(on_delivery)
            batch.size += size
            self._buffered += size
            if batch.size >= self.max_batch_bytes or len(batch.rows) >= self.max_batch_records:
                self._close(batch)
            self._start_senders()
            self._cond.notify_all()
        return future

    def send_batch(self, topic: str, partition: int, batch: Any) -> Future[ProduceResult]:
        """Queue a pyarrow Table/RecordBatch (key, value[, timestamp, headers]) as one
        record batch, as is; the future resolves to its ProduceResult."""
        future: Future[ProduceResult] = Future()
        size = batch.nbytes
        with self._cond:
            self._wait_for_room(size)
            pending = self._open.get((topic, partition))
            if pending is not None:
                self._close(pending)  # what was sent before it goes first
            self._buffered += size
            closed = _Batch(topic, partition, size=size, table=batch, table_future=future)
            self._closed.append(closed)
            self._unfinished += 1
            self._start_senders()
            self._cond.notify_all()
        return future

    def flush(self, timeout_s: float | None = None) -> list[ProduceResult]:
        """Send everything queued and wait for the answers; return (and forget) the
        results since the last flush. Raises the first failure since then."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            for batch in list(self._open.values()):
                self._close(batch)
            self._cond.notify_all()
            while self._unfinished:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self._unfinished} batch(es) still unanswered")
                self._cond.wait(left)
            out, self._results = self._results, []
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]
        return out

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop the sender threads and close their connections."""
        try:
            self.flush(timeout_s)
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            for t in list(self._senders):
                t.join(5)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ batching
    def _partition_count(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:  # the caller's thread and client (senders have clients of their own)
            n = len(self.client.metadata([topic])[topic].partitions)
            self._partitions[topic] = n
        return n

    def _wait_for_room(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_s
        while self._buffered and self._buffered + size > self.buffer_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"producer buffer full ({self._buffered} of {self.buffer_bytes} bytes) "
                    f"for {self.max_block_s:.1f} s: the cluster is not keeping up"
                )
            self._cond.wait(left)

    def _close(self, batch: _Batch) -> None:
        del self._open[batch.key]
        n = self._partitions.get(batch.topic)
        if n and self._sticky.get(batch.topic, 0) % n == batch.partition:
            self._sticky[batch.topic] = self._sticky.get(batch.topic, 0) + 1  # the next one
        self._closed.append(batch)
        self._unfinished += 1

    def _next_batches(self, client: Client) -> list[_Batch]:
        """The closed batches whose partitions have nothing in flight, the first of each
        partition, that ``client`` knows one leader for (up to PIPELINE, under the lock):
        one node's, as Kafka's sender makes one request per broker, so a node that hangs
        holds up only the sender of its own partitions. Open batches past their linger
        close here."""
        now = time.monotonic()
        for batch in list(self._open.values()):
            if now - batch.opened >= self.linger_s:
                self._close(batch)
        taken: list[_Batch] = []
        kept: deque[_Batch] = deque()
        leader: int | None = None
        for batch in self._closed:
            if batch.key in self._busy or len(taken) >= PIPELINE:
                kept.append(batch)
                continue
            node = client.cached_leader(batch.topic, batch.partition)
            if taken and (node is None or node != leader):
                kept.append(batch)
                continue
            leader = node
            self._busy.add(batch.key)
            taken.append(batch)
        self._closed = kept
        return taken

    def _linger_wait(self) -> float | None:
        if not self._open:
            return None
        first = min(b.opened for b in self._open.values())
        return max(0.0, first + self.linger_s - time.monotonic())

    # ------------------------------------------------------------------ senders
    def _start_senders(self) -> None:
        """Up to ``max_in_flight`` sender threads (they end when idle, so a producer that
        is never closed leaves no thread or connection behind for long)."""
        while len(self._senders) < self.max_in_flight:
            t = threading.Thread(
                target=self._sender,
                name=f"quorumlog-producer-{len(self._senders)}",
                daemon=True,
            )
            self._senders.append(t)
            t.start()

    def _sender(self) -> None:
        client = self.client.clone()
        me = threading.current_thread()
        try:
            while True:
                with self._cond:
                    batches = self._next_batches(client)
                    idle_since = time.monotonic()
                    while not batches:
                        linger = self._linger_wait()
                        idle = linger is None and time.monotonic() - idle_since >= SENDER_IDLE_S
                        if self._stopping or idle:
                            self._senders.remove(me)
                            return
                        self._cond.wait(SENDER_IDLE_S if linger is None else linger)
                        batches = self._next_batches(client)
                self._deliver(client, batches)
                with self._cond:
                    for batch in batches:
                        self._busy.discard(batch.key)
                        self._buffered -= batch.size
                        self._unfinished -= 1
                    self._cond.notify_all()
        finally:
            client.close()

    def _deliver(self, client: Client, batches: list[_Batch]) -> None:
        """Append closed batches of distinct partitions together (Client.produce_many) and
        settle their futures; a batch too large is split and sent again in halves."""
        results = self._append_many(
            client,
            [
                (b.topic, b.partition, self._encoder(b), len(b.rows) or b.table.num_rows)
                for b in batches
            ],
        )
        for batch, result in zip(batches, results, strict=True):
            if batch.table is not None:
                assert batch.table_future is not None
                if isinstance(result, Exception):
                    self._failed(result)
                    batch.table_future.set_exception(result)
                else:
                    self._succeeded(result)
                    batch.table_future.set_result(result)
            else:
                self._rows_done(client, batch, 0, len(batch.rows), result)

    @staticmethod
    def _encoder(batch: _Batch, start: int = 0, end: int | None = None) -> Encoder:
        """``encode(producer fields or None)`` -> the record batch of ``batch`` (its rows
        from ``start`` to ``end``, or its Arrow table as is)."""
        table = batch.table
        if table is not None:
            return lambda fields: encode_arrow(table, producer=fields)
        rows = batch.rows[start:end]
        values, keys, timestamps, headers = (list(c) for c in zip(*rows, strict=True))

        def encode(fields: ProducerFields | None) -> bytes:
            return encode_batch(
                values, keys=keys, timestamps=timestamps, headers=headers, producer=fields
            )

        return encode

    def _deliver_rows(self, client: Client, batch: _Batch, start: int, end: int) -> None:
        encode = self._encoder(batch, start, end)
        result = self._append_many(client, [(batch.topic, batch.partition, encode, end - start)])[0]
        self._rows_done(client, batch, start, end, result)

    def _rows_done(
        self,
        client: Client,
        batch: _Batch,
        start: int,
        end: int,
        result: ProduceResult | Exception,
    ) -> None:
        """Rows ``start``..``end`` of ``batch`` were sent: settle their futures, or send
        them again in halves if they were too large together."""
        if isinstance(result, RecordTooLargeError) and end - start > 1:
            half = start + (end - start) // 2
            self._deliver_rows(client, batch, start, half)
            self._deliver_rows(client, batch, half, end)
        elif isinstance(result, Exception):
            self._settle(batch, start, end, result, None)
        else:
            self._settle(batch, start, end, None, result)

    def _settle(
        self,
        batch: _Batch,
        start: int,
        end: int,
        error: BaseException | None,
        result: ProduceResult | None,
    ) -> None:
        if error is not None:
            self._failed(error)
        else:
            assert result is not None
            self._succeeded(result)
        for i in range(start, end):
            meta = None
            if result is not None:
                offset = result.base_offset + i - start
                meta = RecordMetadata(batch.topic, batch.partition, offset, result.leader_epoch)
                batch.futures[i].set_result(meta)
            else:
                assert error is not None
                batch.futures[i].set_exception(error)
            callback = batch.callbacks[i]
            if callback is not None:
                try:
                    callback(error, meta)
                except Exception:
                    # The application's failure: logged, as Kafka's producer does; the
                    # sender goes on (had it ended, its partitions would wait for ever).
                    log.exception("on_delivery callback for %s/%d failed", *batch.key)

    def _succeeded(self, result: ProduceResult) -> None:
        with self._cond:
            self._results.append(result)

    def _failed(self, error: BaseException) -> None:
        with self._cond:
            self._errors.append(error)

    # ------------------------------------------------------------------ idempotence
    def _append_many(
        self, client: Client, entries: list[tuple[str, int, Encoder, int]], renewed: bool = False
    ) -> list[ProduceResult | Exception]:
        """Entries of (topic, partition, ``encode``, record count), one per partition
        (each with nothing else in flight), appended together under this producer's
        identity and each partition's next sequence numbers; each one's ProduceResult
        or error, in order (a batch that cannot be encoded, or a producer that gets no
        identity, fails without being sent). A batch refused as UNKNOWN_PRODUCER_ID (its
        partition no longer holds this producer's batches) was not appended: it is sent
        once more under the next epoch, from sequence 0."""
        results: list[ProduceResult | Exception | None] = [None] * len(entries)
        identity: tuple[int, int] | None = None
        if self.idempotent:
            try:
                identity = self._current_identity(client)
            except Exception as exc:
                return [exc] * len(entries)
        firsts: list[int] = []
        items: list[tuple[str, int, bytes]] = []
        sent: list[int] = []
        for i, (topic, partition, encode, _) in enumerate(entries):
            first = 0
            if identity is not None:
                known, first = self._sequences.get((topic, partition), (identity, 0))
                first = 0 if known != identity else first  # a new epoch starts at 0
            firsts.append(first)
            try:
                fields = None if identity is None else ProducerFields(*identity, first)
                items.append((topic, partition, encode(fields)))
            except Exception as exc:
                results[i] = exc
                continue
            sent.append(i)
        unknown: list[int] = []
        for i, result in zip(sent, client.produce_many(items, acks=self.acks), strict=True):
            results[i] = result
            if isinstance(result, UnknownProducerIdError) and not renewed:
                self._renew = True
                unknown.append(i)
                continue
            if identity is None or isinstance(
                result, (RecordTooLargeError, InvalidProducerEpochError)
            ):
                continue  # nothing appended / fenced: no sequence is in doubt
            if isinstance(result, Exception):
                self._renew = True  # appended or not, unknown: the next batch moves epoch
                continue
            topic, partition, _, count = entries[i]
            next_seq = (last_sequence(firsts[i], count) + 1) % _SEQUENCES
            self._sequences[(topic, partition)] = (identity, next_seq)
        if unknown:
            again = self._append_many(client, [entries[i] for i in unknown], renewed=True)
            for i, result in zip(unknown, again, strict=True):
                results[i] = result
        out = [r for r in results if r is not None]
        assert len(out) == len(entries)
        return out

    def _current_identity(self, client: Client) -> tuple[int, int]:
        with self._identity_lock:
            if self._identity is None or self._renew:
                self._identity = client.init_producer_id(*(self._identity or (-1, -1)))
                self._renew = False
            return self._identity
