"""The producer's batches and what ``send`` hands back.

A ``_Batch`` is one partition's records while they fill: plain lists that ``send``
appends to (value, key, timestamp, headers), and Arrow pieces that ``send_many`` and the
routing of keyed records add whole; its Arrow record batch is built once, when a sender
takes it. A ``_Pending`` holds a topic's records whose partition is decided for many at
once (the key hashes of a whole column, ``partitioner``) before they join their
partitions' batches. Delivery results are per batch: a ``RecordFuture`` is a batch (or
pending buffer) and an index, made without a lock, and its offset is the batch's base
offset plus the index. ``ManyFuture`` stands for all the records of one ``send_many``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..storage.records import HEADER_FIELD, RECORD_SCHEMA, null_array
from .client import ProduceResult

__all__ = ["ManyFuture", "RecordFuture", "RecordMetadata"]

Headers = list[tuple[str, bytes]]
OnDelivery = Callable[[BaseException | None, "RecordMetadata | None"], None]
#: Bytes a record counts for besides its key and value (batch and buffer limits).
RECORD_OVERHEAD = 24

_TIMESTAMP = pa.timestamp("ms")
_HEADERS = pa.list_(HEADER_FIELD)
#: Guards the done-callbacks of futures (added from any thread, run by a sender).
_WATCH_LOCK = threading.Lock()


class RecordMetadata(NamedTuple):
    """Where an acknowledged record is: its partition, offset and the leader epoch that
    appended it."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int


class _Outcome(NamedTuple):
    """What became of rows ``start`` to ``end`` of a batch: appended (``result``) or not
    (``error``)."""

    start: int
    end: int
    result: ProduceResult | None
    error: BaseException | None


class _Batch:
    """Records of one partition, open (filling) or closed (waiting for a sender, or in
    flight). ``base`` rows are in ``chunks`` (Arrow), the rest in the lists."""

    __slots__ = (
        "topic",
        "partition",
        "values",
        "stamps",
        "keyed",
        "headed",
        "chunks",
        "base",
        "size",
        "opened",
        "callbacks",
        "outcome",
        "_done",
        "watchers",
        "table",
        "table_future",
    )

    def __init__(self, topic: str, partition: int, opened: float) -> None:
        self.topic = topic
        self.partition = partition
        self.values: list[bytes | None] = []
        self.stamps: list[int] = []  # ns since the epoch
        # Keys and headers of the records in the lists that have them, by place (most
        # records of a named partition have neither: nothing to append for them).
        self.keyed: list[tuple[int, bytes]] = []
        self.headed: list[tuple[int, Headers]] = []
        self.chunks: list[pa.RecordBatch] = []
        self.base = 0
        self.size = 0
        self.opened = opened
        self.callbacks: list[tuple[int, OnDelivery]] = []
        self.outcome: list[_Outcome] | None = None
        # Made by the first caller that waits (most batches are never waited on one by one:
        # an Event a batch costs as much as routing a few records into it).
        self._done: threading.Event | None = None
        self.watchers: list[tuple[RecordFuture | ManyFuture, Callable[[Any], object]]] | None = []
        self.table: Any = None  # send_batch: an Arrow table, as is, with one future
        self.table_future: Any = None

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition

    @property
    def rows(self) -> int:
        return self.base + len(self.values) if self.table is None else self.table.num_rows

    def append(
        self,
        value: bytes | None,
        key: bytes | None,
        stamp: int,
        headers: Headers | None,
    ) -> int:
        """One record with a key or headers (``send`` inlines the plain case)."""
        values = self.values
        i = len(values)
        if key is not None:
            self.keyed.append((i, key))
        if headers is not None:
            self.headed.append((i, headers))
        self.stamps.append(stamp)
        values.append(value)
        return self.base + i

    def add_chunk(self, chunk: pa.RecordBatch, size: int) -> int:
        """Arrow rows (RECORD_SCHEMA) after the records so far; returns the first's index."""
        self._seal_lists()
        first = self.base
        self.chunks.append(chunk)
        self.base += chunk.num_rows
        self.size += size
        return first

    def _seal_lists(self) -> None:
        n = len(self.values)
        if n:
            keys: list[bytes | None] | None = None
            headers: list[Headers | None] | None = None
            if self.keyed:
                keys = [None] * n
                for i, key in self.keyed:
                    keys[i] = key
            if self.headed:
                headers = [None] * n
                for i, record_headers in self.headed:
                    headers[i] = record_headers
            self.chunks.append(lists_to_arrow(self.values, keys, self.stamps, headers))
            self.base += n
            self._clear_lists()

    def _clear_lists(self) -> None:
        self.values, self.stamps, self.keyed, self.headed = [], [], [], []

    def build(self) -> pa.RecordBatch:
        """The batch's records as one Arrow record batch (once, when a sender takes it)."""
        self._seal_lists()
        if len(self.chunks) == 1:
            return self.chunks[0]
        combined = pa.Table.from_batches(self.chunks, RECORD_SCHEMA).combine_chunks()
        self.chunks = combined.to_batches() or [combined]
        return self.chunks[0]

    def release(self) -> None:
        """Drop the records once answered (futures keep the batch for its outcome)."""
        self._clear_lists()
        self.chunks = []
        self.table = None

    def settle(self, outcome: list[_Outcome]) -> None:
        self.outcome = outcome
        self.release()
        with _WATCH_LOCK:
            watchers, self.watchers = self.watchers, None
            done = self._done
        if done is not None:
            done.set()
        for future, fn in watchers or ():
            _call(fn, future)

    def wait(self, timeout: float | None) -> bool:
        """Wait until the batch is answered, at most ``timeout`` seconds; whether it is."""
        if self.outcome is not None:
            return True
        with _WATCH_LOCK:
            if self.watchers is None:  # settled meanwhile
                return True
            if self._done is None:
                self._done = threading.Event()
            done = self._done
        return done.wait(timeout)

    def outcome_of(self, index: int) -> _Outcome:
        assert self.outcome is not None
        for part in self.outcome:
            if part.start <= index < part.end:
                return part
        raise IndexError(index)

    def metadata(self, index: int) -> tuple[RecordMetadata | None, BaseException | None]:
        part = self.outcome_of(index)
        if part.result is None:
            return None, part.error
        offset = part.result.base_offset + index - part.start
        return RecordMetadata(self.topic, self.partition, offset, part.result.leader_epoch), None

    def watch(self, future: RecordFuture | ManyFuture, fn: Callable[[Any], object]) -> bool:
        """Call ``fn(future)`` when this batch is answered; False if it already is."""
        with _WATCH_LOCK:
            if self.watchers is None:
                return False
            self.watchers.append((future, fn))
            return True


def lists_to_arrow(
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    stamps: list[int],
    headers: list[Headers | None] | None,
) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            null_array(n, pa.binary()) if keys is None else pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(np.array(stamps, np.int64) // 1_000_000).view(_TIMESTAMP),
            null_array(n, _HEADERS) if headers is None else pa.array(headers, _HEADERS),
        ],
        schema=RECORD_SCHEMA,
    )


def record_sizes(chunk: pa.RecordBatch) -> Any:
    """Each row's size as the limits count it (key + value + RECORD_OVERHEAD), numpy."""
    sizes = np.full(chunk.num_rows, RECORD_OVERHEAD, np.int64)
    for name in ("key", "value"):
        column = chunk.column(name)
        if column.null_count < len(column):
            sizes += _lengths(column)
    return sizes


def _lengths(column: pa.Array) -> Any:
    """Each binary value's length (0 for a null), numpy int64: from the offsets as they
    are (a tenth of ``pc.binary_length``'s cost on a few hundred rows)."""
    if column.type != pa.binary() or not isinstance(column, pa.Array):
        return np.asarray(pc.binary_length(column).fill_null(0), np.int64)
    n = len(column)
    offsets = np.frombuffer(column.buffers()[1], np.int32, n + 1, 4 * column.offset)
    lengths = np.diff(offsets).astype(np.int64)
    if column.null_count:  # a null's slot may span bytes (Arrow does not forbid it)
        lengths[column.is_null().to_numpy(zero_copy_only=False)] = 0
    return lengths


class _Spread:
    """Where the rows of one routing (or one ``send_many``) went: row i is the
    ``rank[i]``-th of its lane ``lane[i]`` (a partition; None: one lane, rank = i), and
    each lane's rows fill its pieces (batch, first index in the batch, count) in order."""

    __slots__ = ("lane", "rank", "pieces")

    def __init__(self, lane: Any = None, rank: Any = None) -> None:
        self.lane = lane
        self.rank = rank
        self.pieces: dict[int, list[tuple[_Batch, int, int]]] = {}

    def locate(self, row: int) -> tuple[_Batch, int]:
        lane = 0 if self.lane is None else int(self.lane[row])
        left = row if self.rank is None else int(self.rank[row])
        for batch, first, count in self.pieces[lane]:
            if left < count:
                return batch, first + left
            left -= count
        raise IndexError(row)

    def batches(self) -> list[_Batch]:
        return [b for pieces in self.pieces.values() for b, _, _ in pieces]

    def rows_in_order(self, rows: int) -> list[tuple[_Batch, int]]:
        """(batch, index) of every row, in row order."""
        out: list[tuple[_Batch, int]] = [None] * rows  # type: ignore[list-item]
        for lane, pieces in self.pieces.items():
            # A lane's rows in row order are in rank order (routing keeps each lane's order).
            where: list[int] = (
                list(range(rows))
                if self.lane is None
                else np.flatnonzero(self.lane == lane).tolist()
            )
            it = iter(where)
            for batch, first, count in pieces:
                for j in range(first, first + count):
                    out[next(it)] = (batch, j)
        return out


class _Pending:
    """A topic's records whose partitions are chosen together (keyed records: one hash
    call for the whole column); ``spread`` once they have joined their batches."""

    __slots__ = (
        "topic",
        "values",
        "keys",
        "stamps",
        "headers",
        "forced",
        "callbacks",
        "size",
        "opened",
        "spread",
        "routed",
        "watchers",
    )

    def __init__(self, topic: str, opened: float) -> None:
        self.topic = topic
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.stamps: list[int] = []
        self.headers: list[Headers | None] | None = None
        self.forced: list[int] | None = None  # a partition the caller named, or -1
        self.callbacks: list[tuple[int, OnDelivery]] = []
        self.size = 0
        self.opened = opened
        self.spread: _Spread | None = None
        self.routed = threading.Event()
        self.watchers: list[tuple[RecordFuture, Callable[[Any], object]]] | None = []

    def locate(self, row: int) -> tuple[_Batch, int]:
        assert self.spread is not None
        return self.spread.locate(row)


def _call(fn: Callable[[Any], object], future: Any) -> None:
    try:
        fn(future)
    except Exception:  # as concurrent.futures: the caller's failure does not stop others
        import logging

        logging.getLogger(__name__).exception("done callback of %r failed", future)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class RecordFuture:
    """One record's delivery: ``result()`` is its ``RecordMetadata`` once acknowledged
    (or raises its error), as a ``concurrent.futures.Future`` would. Made by ``send``
    without a lock: it names the record's batch and place, and the batch's answer
    settles every record of it at once."""

    __slots__ = ("_target", "_index")

    def __init__(self, target: _Batch | _Pending, index: int) -> None:
        self._target = target
        self._index = index

    def _batch(self, timeout: float | None) -> tuple[_Batch, int]:
        target = self._target
        if type(target) is _Batch:
            return target, self._index
        assert isinstance(target, _Pending)
        if not target.routed.wait(timeout):
            raise TimeoutError("the record has not been sent yet")
        return target.locate(self._index)

    def done(self) -> bool:
        target = self._target
        if type(target) is _Pending:
            if target.spread is None:
                return False
            target, _ = target.locate(self._index)
        return target.outcome is not None  # type: ignore[union-attr]

    def running(self) -> bool:
        return not self.done()

    def cancel(self) -> bool:
        """A queued record cannot be taken back (as Kafka's producer)."""
        return False

    def cancelled(self) -> bool:
        return False

    def _wait(self, timeout: float | None) -> tuple[RecordMetadata | None, BaseException | None]:
        deadline = None if timeout is None else time.monotonic() + timeout
        batch, index = self._batch(timeout)
        if not batch.wait(_left(deadline)):
            raise TimeoutError("the record's batch is not answered yet")
        return batch.metadata(index)

    def result(self, timeout: float | None = None) -> RecordMetadata:
        meta, error = self._wait(timeout)
        if error is not None:
            raise error
        assert meta is not None
        return meta

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._wait(timeout)[1]

    def add_done_callback(self, fn: Callable[[RecordFuture], object]) -> None:
        """``fn(self)`` once the record is answered (at once if it is), from the thread
        that settles it."""
        target = self._target
        if type(target) is _Pending:
            with _WATCH_LOCK:
                if target.watchers is not None:
                    target.watchers.append((self, fn))
                    return
            target, _ = target.locate(self._index)
        assert isinstance(target, _Batch)
        if not target.watch(self, fn):
            _call(fn, self)

    def __repr__(self) -> str:
        return f"<RecordFuture {'done' if self.done() else 'pending'}>"


class ManyFuture:
    """The records of one ``send_many``: ``result()`` lists their ``RecordMetadata`` in
    the order given (built when asked), or raises the first error of their batches."""

    __slots__ = ("topic", "_spread", "_rows", "_lock", "_left", "_watchers")

    def __init__(self, topic: str, spread: _Spread, rows: int) -> None:
        self.topic = topic
        self._spread = spread
        self._rows = rows
        self._lock = threading.Lock()
        self._left = -1
        self._watchers: list[Callable[[ManyFuture], object]] = []

    def __len__(self) -> int:
        return self._rows

    def done(self) -> bool:
        return all(b.outcome is not None for b in self._spread.batches())

    def running(self) -> bool:
        return not self.done()

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in self._spread.batches():
            if not batch.wait(_left(deadline)):
                raise TimeoutError("some of the records' batches are not answered yet")

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        for batch in self._spread.batches():
            for part in batch.outcome or ():
                if part.error is not None:
                    return part.error
        return None

    def result(self, timeout: float | None = None) -> list[RecordMetadata]:
        error = self.exception(timeout)
        if error is not None:
            raise error
        out: list[RecordMetadata] = []
        for batch, index in self._spread.rows_in_order(self._rows):
            meta, _ = batch.metadata(index)
            assert meta is not None
            out.append(meta)
        return out

    def add_done_callback(self, fn: Callable[[ManyFuture], object]) -> None:
        """``fn(self)`` once every record is answered (at once if they are)."""
        batches = self._spread.batches()
        with self._lock:
            self._watchers.append(fn)
            if self._left >= 0:
                return  # already watching the batches
            self._left = len(batches)
        for batch in batches:
            if not batch.watch(self, ManyFuture._one_done):
                self._one_done()

    def _one_done(self, _: object = None) -> None:
        with self._lock:
            self._left -= 1
            if self._left:
                return
            watchers, self._watchers = self._watchers, []
            self._left = -1
        for fn in watchers:
            _call(fn, self)

    def __repr__(self) -> str:
        return f"<ManyFuture of {self._rows} records {'done' if self.done() else 'pending'}>"
