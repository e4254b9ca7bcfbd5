"""Producer: asynchronous and pipelined, idempotent by default (as Kafka's Java client).

``send`` appends one record to its partition's open batch (plain lists) and returns at
once a ``RecordFuture`` of its ``RecordMetadata``; ``on_delivery(error, metadata)`` is
called once it is known. ``send_many`` takes Python lists of values (and keys) whole,
``send_batch`` a pyarrow Table for one partition. ``flush`` waits for everything sent so
far. Per record, ``send`` does only what must be per record: it takes the producer's lock,
appends, counts bytes and rows against the limits, and wakes a sender only when a batch
opens or fills. A batch is ready when full (``max_batch_bytes`` / ``max_batch_records``)
or when ``linger_ms`` have passed since its first record and its partition has nothing in
flight (until then it goes on filling, as Kafka's accumulator). Sender threads
(``max_in_flight``, each with its own connections) build each batch's Arrow record batch
once and append them with acks=quorum by default: a sender takes ready batches of one
node's partitions and sends them in one call (``Client.produce_send``), as Kafka's sender
makes one request per broker, and sends up to SENDER_WINDOW calls to that node before it
reads the oldest one's answers (``Client.produce_wait``), so the node appends the next
while the last waits for its quorum. A partition's batches go in order, on one
connection: an idempotent producer's up to PRODUCER_PARTITION_IN_FLIGHT at once,
numbered one after another (should one fail, the leader refuses those after it for the
gap and they are retried after it, as Kafka's with max.in.flight.requests.per.connection
up to 5); otherwise one at a time. A batch's answer settles all its records at once: a
record's offset is the batch's base offset plus its index. ``send`` blocks while
``buffer_bytes`` of records wait (back-pressure), at most ``max_block_ms``, then raises
TimeoutError.

Partitions: a record without a partition goes where its key hashes to, by ``partitioner``
(``partitioner.py``: ``murmur2_random``, the Java client's and the default, or
``consistent_random``, librdkafka's); keyed records wait in their topic's pending buffer
and are hashed a column at a time. A record without a key goes to the topic's sticky
partition, which moves on when its batch closes (KIP-480).

Idempotence: the producer takes an id and epoch from the cluster (InitProducerId) and
numbers each partition's records; a resent batch carries the same numbers, and the leader
appends it once, answering a resend with the first append's offsets, across leader
changes too. A batch that fails for good leaves its numbers in doubt: the next batch
moves to the next epoch of the id (sequences start again at 0), so later batches are not
refused for the gap. A fenced producer (a newer epoch of its id wrote) fails with
InvalidProducerEpochError. With ``idempotent=False`` a resend may append the same records
twice. (How batches are numbered and sent: ``identity``.)

Transactions: with a ``transactional_id`` the producer's id and epoch are its transaction
coordinator's, and records are sent only between ``begin()`` and ``commit()``/``abort()``
(``transactions``: the coordinator's side, Kafka's semantics); ``send_offsets`` commits a
consumer group's offsets with the transaction.

Sizes: a batch over the topic's max.message.bytes is split in halves and sent again
(nothing of it was appended); a single record alone over the limit fails with
RecordTooLargeError (its future, and ``flush``), the rest of its batch is sent.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from operator import itemgetter
from typing import Any, NamedTuple

import pyarrow as pa

from .. import defaults
from ..protocol.messages import ACKS_LEADER, ACKS_QUORUM
from ..storage.records import RECORD_SCHEMA, null_array
from .accumulator import _STICKY
from .batches import (
    Headers,
    ManyFuture,
    OnDelivery,
    RecordFuture,
    RecordMetadata,
    _Batch,
    _Outcome,
    _Pending,
)
from .client import Client, ProduceResult
from .errors import (
    InvalidProducerEpochError,
    RecordTooLargeError,
    TransactionAbortableError,
    TransactionStateError,
)
from .identity import _NOT_SENT, ProducerIdentity, _encoder, _Started, _stored_codec
from .partitioner import DEFAULT_PARTITIONER, PARTITIONERS
from .transactions import NOT_IN_TRANSACTION, Transactions

__all__ = ["ManyFuture", "Producer", "RecordFuture", "RecordMetadata"]

log = logging.getLogger(__name__)

#: A sender thread with nothing to send for this long ends (a new one starts on demand).
SENDER_IDLE_S = 1.0


#: Calls a sender has in flight (to one node) before it reads the oldest one's answers.
SENDER_WINDOW = 3


class _Flight(NamedTuple):
    """A sender's call in flight: its batches, what was sent, and to which node."""

    batches: list[_Batch]
    started: _Started
    leader: int | None

    @property
    def held(self) -> bool:
        return self.started.held


_time_ns = time.time_ns
_monotonic = time.monotonic
_new = object.__new__


class Producer(ProducerIdentity):
    # Slots: attribute loads of send's hot path without a dict lookup (an instance with
    # over 30 attributes loses CPython's shared-keys fast path).
    __slots__ = (
        "acks",
        "idempotent",
        "_hash_empty",
        "_results",
        "_errors",
        "_stopping",
        "_outside_txn",
    )

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
        partitioner: str = DEFAULT_PARTITIONER,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = defaults.TRANSACTION_TIMEOUT_MS,
    ) -> None:
        """``transactional_id``: a transactional producer (``begin``, ``commit``,
        ``abort``, ``send_offsets``); its records are sent only inside a transaction, and
        a transaction left open longer than ``transaction_timeout_ms`` is aborted by its
        coordinator (which fences this producer)."""
        if transactional_id is not None and not idempotent:
            raise ValueError("a transactional producer is idempotent: idempotent=False refused")
        if acks not in ("quorum", "leader"):
            raise ValueError(f"acks must be 'quorum' or 'leader', got {acks!r}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if partitioner not in PARTITIONERS:
            raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {partitioner!r}")
        if max_batch_records < 1 or max_batch_bytes < 1:
            raise ValueError("max_batch_records and max_batch_bytes must be >= 1")
        self.client = client
        self.acks = ACKS_QUORUM if acks == "quorum" else ACKS_LEADER
        self.linger_s = linger_ms / 1000
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_records = max_batch_records
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight
        self._partition_in_flight = defaults.PRODUCER_PARTITION_IN_FLIGHT if idempotent else 1
        # A call takes at most this many of a partition's batches, so that a window of
        # calls shares its allowance.
        self._call_batches = -(-self._partition_in_flight // SENDER_WINDOW)
        self.buffer_bytes = buffer_bytes
        self.max_block_s = max_block_ms / 1000
        self.partitioner = partitioner
        # consistent_random partitions an empty key as no key (librdkafka); murmur2 hashes it.
        self._hash_empty = partitioner == "murmur2_random"
        self._last_row = max_batch_records - 1
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._open: dict[str, dict[int, _Batch]] = {}  # topic -> partition -> filling
        self._pending: dict[str, _Pending] = {}  # topic -> records waiting for a partition
        self._closed: deque[_Batch] = deque()  # in the order they closed
        # Partitions with batches in flight: (the sender's thread id, how many).
        self._busy: dict[tuple[str, int], tuple[int, int]] = {}
        self._buffered = 0
        self._unfinished = 0  # batches closed and not yet answered
        self._results: list[ProduceResult] = []
        self._errors: list[BaseException] = []
        self._senders: list[threading.Thread] = []
        self._timed_waiters = 0  # senders asleep until a linger ends
        self._stopping = False
        self._partitions: dict[str, int] = {}
        self._sticky: dict[str, int] = {}
        self._random = random.Random()
        # Idempotence: (producer id, epoch), and per partition (identity, next sequence).
        self._identity: tuple[int, int] | None = None
        self._renew = False  # a batch failed: its sequence numbers are in doubt
        self._sequences: dict[tuple[str, int], tuple[tuple[int, int], int]] = {}
        self._identity_lock = threading.Lock()
        # Transactions: the id's state, and whether a send now is refused (no
        # transaction open), read by send on its hot path.
        self._txn = (
            Transactions(client, transactional_id, transaction_timeout_ms)
            if transactional_id is not None
            else None
        )
        self._outside_txn = self._txn is not None

    # ------------------------------------------------------------------ public
    @property
    def producer_id(self) -> int | None:
        identity = self._txn.identity if self._txn is not None else self._identity
        return identity[0] if identity else None

    @property
    def producer_epoch(self) -> int | None:
        identity = self._txn.identity if self._txn is not None else self._identity
        return identity[1] if identity else None

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
    ) -> RecordFuture:
        """Queue one record; the future resolves once it is acknowledged (or failed), and
        ``on_delivery`` is called then, from a sender thread."""
        if self._outside_txn:
            self._refuse_send()
        # Timestamps are kept in ns until the batch is built (one division for them all).
        stamp = _time_ns() if timestamp_ms is None else timestamp_ms * 1_000_000
        # The common cases inline (every line here is paid per record): a value to a named
        # partition, and a keyed record (to the topic's pending ones, hashed later).
        size = 24 if value is None else len(value) + 24  # RECORD_OVERHEAD
        if headers is not None or key is not None or partition is None:
            if (
                headers is not None
                or partition is not None
                or key is None
                or not (key or self._hash_empty)
            ):
                return self._send_other(topic, value, key, partition, stamp, headers, on_delivery)
            size += len(key)
            if topic not in self._partitions:
                self._partition_count(topic)
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost
        try:
            buffered = self._buffered + size
            if buffered > self.buffer_bytes and self._buffered:
                self._wait_for_room(size)
                buffered = self._buffered + size
            if partition is None or (self._pending and topic in self._pending):
                # keyed, or after keyed ones of the topic (they keep their order)
                self._buffered = buffered
                target = _STICKY if partition is None else partition
                return self._to_pending(topic, value, key, stamp, None, on_delivery, size, target)
            by_partition = self._open.get(topic)
            batch = None if by_partition is None else by_partition.get(partition)
            if batch is None:
                batch = self._new_batch(topic, partition, _monotonic())
            values = batch.values
            index = batch.base + len(values)
            batch.stamps.append(stamp)
            values.append(value)
            if on_delivery is not None:
                batch.callbacks.append((index, on_delivery))
            self._buffered = buffered
            batch.size += size
            if batch.size >= self.max_batch_bytes or index >= self._last_row:
                self._close(batch)
        finally:
            lock.release()
        future: RecordFuture = _new(RecordFuture)
        future._target = batch
        future._index = index
        return future

    def _send_other(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        stamp: int,
        headers: Headers | None,
        on_delivery: OnDelivery | None,
    ) -> RecordFuture:
        """``send`` of a record with headers, with a key and a partition, or with neither
        (to the sticky partition), or with a key the partitioner does not hash."""
        size = 24 if value is None else len(value) + 24  # RECORD_OVERHEAD
        if key is not None:
            size += len(key)
        n = 0
        if partition is None:
            n = self._partitions.get(topic) or self._partition_count(topic)
        with self._lock:
            if self._buffered + size > self.buffer_bytes and self._buffered:
                self._wait_for_room(size)
            self._buffered += size
            if partition is None and key is not None and (key or self._hash_empty):
                return self._to_pending(topic, value, key, stamp, headers, on_delivery, size, -1)
            if self._pending and topic in self._pending:  # keep the order of keyed ones
                target = _STICKY if partition is None else partition
                return self._to_pending(
                    topic, value, key, stamp, headers, on_delivery, size, target
                )
            if partition is None:
                partition = self._sticky.get(topic)
                if partition is None:
                    partition = self._move_sticky(topic, n)
            batch = self._open.get(topic, {}).get(partition)
            if batch is None:
                batch = self._new_batch(topic, partition, _monotonic())
            index = batch.append(value, key, stamp, headers)
            if on_delivery is not None:
                batch.callbacks.append((index, on_delivery))
            batch.size += size
            if batch.size >= self.max_batch_bytes or index >= self._last_row:
                self._close(batch)
        future: RecordFuture = _new(RecordFuture)
        future._target = batch
        future._index = index
        return future

    def send_many(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        partition: int | None = None,
    ) -> ManyFuture:
        """Queue many records at once: ``values`` (and ``keys``, as long) as Python lists,
        partitioned as ``send`` would each (to ``partition``, by key, or sticky), batched
        without a Python call per record. The future's ``result()`` lists every record's
        RecordMetadata in order."""
        if self._outside_txn:
            self._refuse_send()
        rows = len(values)
        if keys is not None and len(keys) != rows:
            raise ValueError(f"send_many: {len(keys)} keys for {rows} values")
        stamp = pa.scalar(_time_ns() // 1_000_000, RECORD_SCHEMA.field("timestamp").type)
        chunk = pa.RecordBatch.from_arrays(
            [
                null_array(rows, pa.binary()) if keys is None else pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.repeat(stamp, rows),
                null_array(rows, RECORD_SCHEMA.field("headers").type),
            ],
            schema=RECORD_SCHEMA,
        )
        lanes = None
        if partition is None:
            n = self._partitions.get(topic) or self._partition_count(topic)
            lanes = self._lanes(chunk, n, keys if keys is not None else ())
        return self._send_rows(topic, chunk, lanes, partition, keys is not None)

    def send_batch(self, topic: str, partition: int, batch: Any) -> Future[ProduceResult]:
        """Queue a pyarrow Table/RecordBatch (key, value[, timestamp, headers]) as one
        record batch, as is; the future resolves to its ProduceResult."""
        if self._outside_txn:
            self._refuse_send()
        future: Future[ProduceResult] = Future()
        size = batch.nbytes
        with self._lock:
            self._wait_for_room(size)
            if topic in self._pending:
                self._route(topic)  # what was sent before it goes first
            pending = self._open.get(topic, {}).get(partition)
            if pending is not None:
                self._close(pending)
            self._buffered += size
            closed = _Batch(topic, partition, _monotonic())
            closed.size, closed.table, closed.table_future = size, batch, future
            self._closed.append(closed)
            self._unfinished += 1
            self._start_senders()
            self._cond.notify()
        return future

    def flush(self, timeout_s: float | None = None) -> list[ProduceResult]:
        """Send everything queued and wait for the answers; return (and forget) the
        results since the last flush. Raises the first failure since then."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            for topic in list(self._pending):
                self._route(topic)
            for by_partition in list(self._open.values()):
                for batch in list(by_partition.values()):
                    self._close(batch, wake=False)
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
        """Flush, then stop the sender threads and close their connections. (A
        transaction still open is left to its coordinator's timeout, or to the next
        producer of its id, whose ``init_transactions`` aborts it.)"""
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._stopping = True
                self._cond.notify_all()
            for t in list(self._senders):
                t.join(5)
            if self._txn is not None:
                self._txn.close()

    # ------------------------------------------------------------------ transactions
    def _transactions(self) -> Transactions:
        if self._txn is None:
            raise TransactionStateError("not a transactional producer (no transactional_id)")
        return self._txn

    def _refuse_send(self) -> None:
        raise TransactionStateError(NOT_IN_TRANSACTION)

    def init_transactions(self) -> None:
        """Take the transactional id: a new epoch of its producer id, which fences every
        earlier producer of the id and aborts a transaction one left open. ``begin``
        does it first if it was not done."""
        self._transactions().init()

    def begin(self) -> None:
        """Open a transaction: what is sent until ``commit``/``abort`` is part of it."""
        self._transactions().begin()
        self._outside_txn = False

    def send_offsets(self, offsets: Mapping[tuple[str, int], int], group_id: str) -> None:
        """Commit a consumer group's offsets with the transaction (each the next offset
        to read of its (topic, partition)): they count only if it commits."""
        self._transactions().send_offsets(offsets, group_id)

    def commit(self, timeout_s: float | None = None) -> None:
        """Send what was queued, then commit the transaction: returns once the decision
        is durable on the cluster (read_committed readers see the records as the
        markers reach each partition, moments later). A batch that failed makes the
        transaction abortable only: TransactionAbortableError, then ``abort()``. A
        timeout leaves it open: ``commit()`` again (a commit already decided succeeds)
        or ``abort()``."""
        txn = self._transactions()
        try:
            self.flush(timeout_s)
        except (TransactionStateError, InvalidProducerEpochError):
            raise  # out of order, or fenced for good
        except Exception as exc:
            txn.failed(exc)
            raise TransactionAbortableError(
                f"the transaction cannot commit, a batch of it failed: {exc}; abort() it"
            ) from exc
        txn.end(commit=True)
        self._outside_txn = True

    def abort(self, timeout_s: float | None = None) -> None:
        """Abort the transaction: what it wrote is never seen by read_committed readers.
        Waits for the batches in flight first (their answers, whatever they are)."""
        txn = self._transactions()
        self._outside_txn = True
        try:
            self.flush(timeout_s)
        except TransactionStateError:
            raise
        except Exception as exc:
            txn.failed(exc)  # its outcome unknown: the abort bumps the epoch
        txn.end(commit=False)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """Take ready batches, send them, and read their answers, with up to SENDER_WINDOW
        calls in flight to one node when batches wait beyond what one call may take (a
        second call goes out while the first waits for its quorum, on the same
        connection, so a partition's batches stay in order); otherwise one at a time, so
        that calls carry all that is ready."""
        client = self.client.clone()
        me = threading.current_thread()
        sender = threading.get_ident()
        flights: deque[_Flight] = deque()
        taken: list[_Batch] = []  # taken and not yet handed over
        try:
            while True:
                with self._lock:
                    batches: list[_Batch] = []
                    more = False
                    leader = flights[-1].leader if flights else None
                    if not flights or (
                        len(flights) < SENDER_WINDOW and leader is not None and not flights[-1].held
                    ):
                        batches, more = self._next_batches(client, sender, leader)
                    idle_since = _monotonic()
                    while not batches and not flights:
                        linger = self._linger_wait()
                        idle = linger is None and _monotonic() - idle_since >= SENDER_IDLE_S
                        if self._stopping or idle:
                            self._senders.remove(me)
                            return
                        if linger is None:
                            self._cond.wait(SENDER_IDLE_S)
                        else:
                            self._timed_waiters += 1
                            try:
                                self._cond.wait(linger)
                            finally:
                                self._timed_waiters -= 1
                        batches, more = self._next_batches(client, sender, None)
                    taken += batches
                    if batches:
                        leader = client.cached_leader(batches[0].topic, batches[0].partition)
                    if batches and not self._timed_waiters and (self._pending or self._any_open()):
                        self._cond.notify()  # another sender keeps time while this one sends
                if batches:
                    flights.append(_Flight(batches, self._start(client, batches), leader))
                    if more and len(flights) < SENDER_WINDOW and not flights[-1].held:
                        continue  # a backlog: another call goes before this one's answers
                # The oldest call's answers; all calls', in order, if the newest holds
                # batches back (they go after a batch of theirs that is split).
                land_all = flights[-1].held
                while flights:
                    flight = flights[0]
                    answers: list[ProduceResult | BaseException] = []
                    self._land(client, flight, answers)
                    flights.popleft()
                    self._handed_over(flight.batches, answers)
                    del taken[: len(flight.batches)]
                    if not land_all:
                        break
        except Exception as exc:
            # A fault of this thread's own, not an answer (a bug, or connections left
            # mid-frame): its batches fail with it, and a new sender on new connections
            # takes what waits (Kafka's sender logs such an error and goes on).
            log.exception("producer sender failed; its %d batch(es) fail with it", len(taken))
            self._abandon(taken, exc, me)
        finally:
            client.close()

    def _abandon(self, batches: list[_Batch], exc: Exception, sender: threading.Thread) -> None:
        """Settle ``batches`` (those not answered yet) with ``exc``, hand them over, and
        put a new sender in place of the ``sender`` that ends."""
        answers: list[ProduceResult | BaseException] = []
        for batch in batches:
            if batch.outcome is not None:
                continue  # answered before the fault
            answers.append(exc)
            if batch.table is not None:
                batch.table_future.set_exception(exc)
            self._settle(batch, [_Outcome(0, batch.rows, None, exc)])
        if self.idempotent:
            self._renew = True  # their sequence numbers are in doubt
        self._handed_over(batches, answers)
        with self._lock:
            self._senders.remove(sender)
            if self._unfinished and not self._stopping:
                self._start_senders()

    def _handed_over(
        self, batches: list[_Batch], answers: list[ProduceResult | BaseException]
    ) -> None:
        """``batches`` are answered: their results to ``flush``, their partitions free."""
        with self._lock:
            for answer in answers:
                if isinstance(answer, BaseException):
                    self._errors.append(answer)
                else:
                    self._results.append(answer)
            busy = self._busy
            for batch in batches:
                owner, count = busy[batch.key]
                if count > 1:
                    busy[batch.key] = (owner, count - 1)
                else:
                    del busy[batch.key]
                self._buffered -= batch.size
                self._unfinished -= 1
            self._cond.notify_all()

    def _start(self, client: Client, batches: list[_Batch]) -> _Started:
        """Encode closed batches and send them together (Client.produce_send; a
        partition's in order)."""
        return self._send_entries(
            client,
            [
                (b.topic, b.partition, _encoder(b, compression=_stored_codec(client, b)), b.rows)
                for b in batches
            ],
        )

    def _land(
        self, client: Client, flight: _Flight, answers: list[ProduceResult | BaseException]
    ) -> None:
        """Read the answers of a call (``_start``) and settle its batches' futures; a
        batch too large is split and sent again in halves, before the batches of its
        partition after it. Each append's result or error is added to ``answers`` (for
        ``flush``; the sender hands them over with the batches, under one lock)."""
        results = self._wait_entries(client, flight.started)
        held: list[_Batch] = []
        for batch, result in zip(flight.batches, results, strict=True):
            if result is _NOT_SENT:
                held.append(batch)  # after an earlier batch of its partition, split below
                continue
            if batch.table is not None:
                future = batch.table_future
                answers.append(result)
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
                batch.settle([_Outcome(0, batch.rows, None, None)])
                continue
            outcome: list[_Outcome] = []
            self._rows_done(client, batch, 0, batch.rows, result, outcome)
            self._settle(batch, outcome)
            for o in outcome:
                if o.error is not None:
                    answers.append(o.error)
                elif o.result is not None:
                    answers.append(o.result)
        if held:
            self._land(client, _Flight(held, self._start(client, held), None), answers)

    def _rows_done(
        self,
        client: Client,
        batch: _Batch,
        start: int,
        end: int,
        result: ProduceResult | Exception,
        outcome: list[_Outcome],
    ) -> None:
        """Rows ``start``..``end`` of ``batch`` were sent: note their outcome, or send them
        again in halves if they were too large together."""
        if isinstance(result, RecordTooLargeError) and end - start > 1:
            for lo, hi in ((start, start + (end - start) // 2), (start + (end - start) // 2, end)):
                encode = _encoder(batch, lo, hi, compression=_stored_codec(client, batch))
                again = self._append_many(client, [(batch.topic, batch.partition, encode, hi - lo)])
                self._rows_done(client, batch, lo, hi, again[0], outcome)
        elif isinstance(result, Exception):
            outcome.append(_Outcome(start, end, None, result))
        else:
            outcome.append(_Outcome(start, end, result, None))

    def _settle(self, batch: _Batch, outcome: list[_Outcome]) -> None:
        callbacks = batch.callbacks
        batch.callbacks = []
        batch.settle(outcome)
        if len(callbacks) > 1:
            callbacks.sort(key=itemgetter(0))
        for index, callback in callbacks:
            meta, error = batch.metadata(index)
            try:
                callback(error, meta)
            except Exception:
                # The application's failure: logged, as Kafka's producer does; the
                # sender goes on (had it ended, its partitions would wait for ever).
                log.exception("on_delivery callback for %s/%d failed", *batch.key)
