"""The producer's batches while they fill: which partition a record goes to, the open
batch of each partition, the pending records of a topic whose keys are hashed together,
and when a batch is ready for a sender (``Producer`` is an ``Accumulator``; its state,
under ``_lock``, is declared in ``Producer``'s slots)."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .batches import (
    _WATCH_LOCK,
    Headers,
    ManyFuture,
    OnDelivery,
    RecordFuture,
    _Batch,
    _Pending,
    _Spread,
    lists_to_arrow,
    record_sizes,
)
from .client import PIPELINE, Client
from .partitioner import UNKEYED, key_partitions

#: The lane of a routing's records without a key: the topic's sticky partition.
_STICKY = UNKEYED
#: ``_next_batches``' count for a partition that may not go in this call.
_BARRED = 1 << 30

_monotonic = time.monotonic
_new = object.__new__


class Accumulator:
    """Placement and readiness of batches, for ``Producer``; every method runs under
    ``_lock`` but ``_partition_count``."""

    __slots__ = (
        "client",
        "linger_s",
        "max_batch_bytes",
        "max_batch_records",
        "max_in_flight",
        "_partition_in_flight",
        "_call_batches",
        "buffer_bytes",
        "max_block_s",
        "partitioner",
        "_last_row",
        "_lock",
        "_cond",
        "_open",
        "_pending",
        "_closed",
        "_busy",
        "_buffered",
        "_unfinished",
        "_senders",
        "_timed_waiters",
        "_partitions",
        "_sticky",
        "_random",
    )

    client: Client
    linger_s: float
    max_batch_bytes: int
    max_batch_records: int
    max_in_flight: int
    _partition_in_flight: int
    _call_batches: int
    buffer_bytes: int
    max_block_s: float
    partitioner: str
    _last_row: int
    _lock: threading.Lock
    _cond: threading.Condition
    _open: dict[str, dict[int, _Batch]]
    _pending: dict[str, _Pending]
    _closed: deque[_Batch]
    _busy: dict[tuple[str, int], tuple[int, int]]
    _buffered: int
    _unfinished: int
    _senders: list[threading.Thread]
    _timed_waiters: int
    _partitions: dict[str, int]
    _sticky: dict[str, int]
    _random: random.Random

    def _start_senders(self) -> None:
        raise NotImplementedError

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

    def _move_sticky(self, topic: str, n: int) -> int:
        """A new sticky partition for the topic's records without a key (KIP-480): at
        random, another than the last when there is another."""
        last = self._sticky.get(topic)
        choice = self._random.randrange(n)
        if last is not None and n > 1 and choice == last:
            choice = (choice + 1 + self._random.randrange(n - 1)) % n
        self._sticky[topic] = choice
        return choice

    def _new_batch(self, topic: str, partition: int, opened: float) -> _Batch:
        batch = _Batch(topic, partition, opened)
        self._open.setdefault(topic, {})[partition] = batch
        if len(self._senders) < self.max_in_flight:
            self._start_senders()
        if not self._timed_waiters:
            self._cond.notify()  # a sender keeps time for its linger
        return batch

    def _close(self, batch: _Batch, wake: bool = True) -> None:
        del self._open[batch.topic][batch.partition]
        if self._sticky.get(batch.topic) == batch.partition:
            self._move_sticky(batch.topic, self._partitions.get(batch.topic, 1))
        self._closed.append(batch)
        self._unfinished += 1
        if wake:
            self._cond.notify()

    def _to_pending(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        stamp: int,
        headers: Headers | None,
        on_delivery: OnDelivery | None,
        size: int,
        target: int,
    ) -> RecordFuture:
        """Append to the topic's pending records (under the lock). ``target``: the
        partition the caller named, or _STICKY (by key, or sticky without one)."""
        pending = self._pending.get(topic)
        if pending is None:
            pending = self._pending[topic] = _Pending(topic, _monotonic())
            if len(self._senders) < self.max_in_flight:
                self._start_senders()
            if not self._timed_waiters:
                self._cond.notify()
        index = len(pending.values)
        if target != _STICKY or pending.forced is not None:
            if pending.forced is None:
                pending.forced = [_STICKY] * index
            pending.forced.append(target)
        if headers is not None or pending.headers is not None:
            if pending.headers is None:
                pending.headers = [None] * index
            pending.headers.append(headers)
        pending.keys.append(key)
        pending.stamps.append(stamp)
        pending.values.append(value)
        if on_delivery is not None:
            pending.callbacks.append((index, on_delivery))
        pending.size += size
        if index >= self._last_row or pending.size >= self.max_batch_bytes:
            self._route(topic)
        future: RecordFuture = _new(RecordFuture)
        future._target = pending
        future._index = index
        return future

    def _lanes(self, chunk: pa.RecordBatch, n: int, key_list: Sequence[bytes | None]) -> Any:
        """Each row's partition by its key, or _STICKY for a row the partitioner does not
        hash (numpy int64)."""
        return key_partitions(self.partitioner, chunk.column("key"), n, key_list)

    def _route(self, topic: str) -> None:
        """The topic's pending records join their partitions' batches (under the lock)."""
        pending = self._pending.pop(topic)
        chunk = lists_to_arrow(pending.values, pending.keys, pending.stamps, pending.headers)
        lanes = self._lanes(chunk, self._partitions.get(topic, 1), pending.keys)
        if pending.forced is not None:
            forced = np.asarray(pending.forced, np.int64)
            lanes = np.where(forced != _STICKY, forced, lanes)
        rows = chunk.num_rows
        spread = _Spread(np.empty(rows, np.int64), np.empty(rows, np.int64))
        self._place(topic, chunk, record_sizes(chunk), lanes, pending.opened, spread)
        for index, callback in pending.callbacks:
            batch, at = spread.locate(index)
            batch.callbacks.append((at, callback))
        pending.spread = spread
        pending.values, pending.keys, pending.stamps, pending.headers = [], [], [], None
        pending.routed.set()
        with _WATCH_LOCK:
            watchers, pending.watchers = pending.watchers, None
        for future, fn in watchers or ():
            batch, _ = spread.locate(future._index)
            batch.watch(future, fn)  # not answered yet: it was just filled

    def _send_rows(
        self,
        topic: str,
        chunk: pa.RecordBatch,
        lanes: Any,
        partition: int | None,
        keyed: bool,
    ) -> ManyFuture:
        """``send_many``'s rows, a batch's worth at a time (each waits for buffer room)."""
        sizes = record_sizes(chunk)
        rows = chunk.num_rows
        by_key = lanes is not None and keyed
        spread = (
            _Spread(np.empty(rows, np.int64), np.empty(rows, np.int64)) if by_key else _Spread()
        )
        step = max(1, self.max_batch_records)
        start = 0
        while start < rows:
            end = min(rows, start + step)
            # A slice no larger than a batch, nor the buffer, in bytes (at least one row).
            cum = np.cumsum(sizes[start:end])
            most = min(self.max_batch_bytes, self.buffer_bytes)
            end = start + max(1, int(np.searchsorted(cum, most, side="right")))
            part = chunk.slice(start, end - start)
            nbytes = int(sizes[start:end].sum())
            with self._lock:
                if self._buffered + nbytes > self.buffer_bytes and self._buffered:
                    self._wait_for_room(nbytes)
                if topic in self._pending:
                    self._route(topic)
                self._buffered += nbytes
                now = _monotonic()
                if by_key:
                    self._place(topic, part, sizes[start:end], lanes[start:end], now, spread, start)
                else:
                    target = partition if partition is not None else _STICKY
                    pieces = self._fill(topic, target, part, sizes[start:end], now)
                    spread.pieces.setdefault(0, []).extend(pieces)
            start = end
        if not spread.pieces:
            spread.pieces[0] = []
        return ManyFuture(topic, spread, rows)

    def _place(
        self,
        topic: str,
        chunk: pa.RecordBatch,
        sizes: Any,
        lanes: Any,
        opened: float,
        spread: _Spread,
        first_row: int = 0,
    ) -> None:
        """Rows of ``chunk`` (rows ``first_row``... of ``spread``) into the batches of their
        partitions, ``lanes`` (_STICKY: the topic's sticky partition now), in order within
        each partition (under the lock)."""
        rows = chunk.num_rows
        if (lanes == _STICKY).any():
            sticky = self._sticky.get(topic)
            if sticky is None:
                sticky = self._move_sticky(topic, self._partitions.get(topic, 1))
            lanes = np.where(lanes == _STICKY, sticky, lanes)
        order = np.argsort(lanes, kind="stable")
        ordered = lanes[order]
        firsts = np.flatnonzero(np.diff(ordered, prepend=ordered[0] - 1))
        counts = np.diff(firsts, append=rows)
        lane_list: list[int] = ordered[firsts].tolist()
        # Each lane's rows placed by earlier calls for the same spread (send_many's slices).
        before = np.array(
            [sum(c for _, _, c in spread.pieces.get(lane, ())) for lane in lane_list], np.int64
        )
        # A row's rank in its lane, for every row at once (not one numpy call per lane).
        spread.lane[first_row : first_row + rows] = lanes
        spread.rank[first_row + order] = np.arange(rows) - np.repeat(firsts - before, counts)
        sorted_chunk = chunk.take(order)
        sorted_sizes = sizes[order]
        lane_bytes: list[int] = np.add.reduceat(sorted_sizes, firsts).tolist()
        for lane, first, count, nbytes in zip(
            lane_list, firsts.tolist(), counts.tolist(), lane_bytes, strict=True
        ):
            pieces = spread.pieces.setdefault(lane, [])
            piece = sorted_chunk.slice(first, count)
            pieces.extend(
                self._fill(topic, lane, piece, sorted_sizes[first : first + count], opened, nbytes)
            )

    def _fill(
        self,
        topic: str,
        target: int,
        chunk: pa.RecordBatch,
        sizes: Any,
        opened: float,
        nbytes: int | None = None,
    ) -> list[tuple[_Batch, int, int]]:
        """Arrow rows into the open batches of partition ``target`` (or the sticky one,
        which moves on as its batches fill), closing each batch that fills; the pieces
        (batch, first index, rows) in order (under the lock). ``nbytes``: the rows' total
        size, if the caller has it."""
        if target != _STICKY and nbytes is not None:
            # The common case of a routing: a few rows that fit the partition's open batch.
            batch = self._open.get(topic, {}).get(target)
            rows = chunk.num_rows
            if batch is None:
                batch = self._new_batch(topic, target, opened)
            if (
                batch.size + nbytes <= self.max_batch_bytes
                and batch.rows + rows <= self.max_batch_records
            ):
                if opened < batch.opened:
                    batch.opened = opened
                first = batch.add_chunk(chunk, nbytes)
                if batch.size >= self.max_batch_bytes or batch.rows >= self.max_batch_records:
                    self._close(batch)
                return [(batch, first, rows)]
        pieces: list[tuple[_Batch, int, int]] = []
        cum = np.cumsum(sizes)
        total = chunk.num_rows
        start = 0
        while start < total:
            partition = target
            if target == _STICKY:
                sticky = self._sticky.get(topic)
                if sticky is None:
                    sticky = self._move_sticky(topic, self._partitions.get(topic, 1))
                partition = sticky
            batch = self._open.get(topic, {}).get(partition)
            if batch is None:
                batch = self._new_batch(topic, partition, opened)
            elif opened < batch.opened:
                batch.opened = opened  # linger counts from the earliest record's send
            before = int(cum[start - 1]) if start else 0
            fit = int(np.searchsorted(cum, before + self.max_batch_bytes - batch.size, "right"))
            count = min(self.max_batch_records - batch.rows, fit - start, total - start)
            if count <= 0:
                if batch.rows:
                    self._close(batch)
                    continue
                count = 1  # alone over the limit: sent, and refused alone
            nbytes = int(cum[start + count - 1]) - before
            first = batch.add_chunk(chunk.slice(start, count), nbytes)
            pieces.append((batch, first, count))
            start += count
            if batch.size >= self.max_batch_bytes or batch.rows >= self.max_batch_records:
                self._close(batch)
        return pieces

    def _next_batches(
        self, client: Client, sender: int, leader: int | None
    ) -> tuple[list[_Batch], bool]:
        """Closed batches for sender ``sender`` to send next, in the order they closed
        (up to PIPELINE, under the lock): of partitions with nothing in flight or with
        only this sender's in flight, up to ``_partition_in_flight`` in flight each and
        ``_call_batches`` in this call; all of one node's, that ``client`` knows as their
        leader (``leader``, if the sender has calls in flight to it), as Kafka's sender
        makes one request per broker, so a node that hangs holds up only the sender of
        its own partitions. A partition's batches thus go in order on one connection.
        Also whether more are ready that another call could take now (a backlog: this
        call took as many as one call may). Pending records and open batches past their
        linger are routed and closed here (an open batch whose partition has one in
        flight goes on filling)."""
        now = _monotonic()
        linger = self.linger_s
        for topic in [t for t, p in self._pending.items() if now - p.opened >= linger]:
            self._route(topic)
        for by_partition in self._open.values():
            for batch in [b for b in by_partition.values() if now - b.opened >= linger]:
                if batch.key not in self._busy:
                    self._close(batch, wake=False)
        taken: list[_Batch] = []
        kept: deque[_Batch] = deque()
        more = False
        here: dict[tuple[str, int], int] = {}  # partitions looked at: batches taken here
        most, per_call, busy = self._partition_in_flight, self._call_batches, self._busy
        for batch in self._closed:
            key = batch.key
            count = here.get(key)
            if count is None:  # the partition's first closed batch: may it go?
                owner = busy.get(key, (sender, 0))[0]
                node = client.cached_leader(batch.topic, batch.partition)
                if owner != sender:
                    free = False
                elif taken or leader is not None:
                    free = node is not None and node == leader
                else:
                    free, leader = True, node
                count = here[key] = 0 if free else _BARRED
            flying = busy.get(key, (0, 0))[1]
            if count < per_call and len(taken) < PIPELINE and flying < most:
                here[key] = count + 1
                busy[key] = (sender, flying + 1)
                taken.append(batch)
                continue
            # Kept, and so are the partition's later ones (the conditions only tighten).
            more = more or (count < _BARRED and flying < most)
            kept.append(batch)
        self._closed = kept
        return taken, more

    def _any_open(self) -> bool:
        return any(self._open.values())

    def _linger_wait(self) -> float | None:
        """Seconds until the first linger ends of a batch that may then be sent, or of
        pending records; None if there is none."""
        first = min((p.opened for p in self._pending.values()), default=None)
        for by_partition in self._open.values():
            for batch in by_partition.values():
                if (first is None or batch.opened < first) and batch.key not in self._busy:
                    first = batch.opened
        return None if first is None else max(0.0, first + self.linger_s - _monotonic())
