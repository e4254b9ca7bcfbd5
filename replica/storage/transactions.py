"""Transactions in a partition's log (KIP-98): which are open, which were aborted, and
what a read_committed reader may see. Pure: the logs feed it batch headers in log order.

* A transactional data batch of a producer with no open transaction opens one at its
  base offset; the producer's next marker (commit or abort) closes it. A marker with no
  open transaction (a coordinator's retry, or a partition the producer never wrote)
  closes nothing.
* The **last stable offset** is the first offset of the earliest transaction not yet
  decided below the high watermark, else the high watermark: read_committed readers read
  below it only. A transaction whose marker is in the log but not yet committed counts
  as open (Kafka's "unreplicated" transactions): a leader deposed before its marker
  commits may lose the marker, and the transaction may then be aborted.
* An abort keeps (producer, first offset, marker offset): the aborted-transaction index
  (Kafka's ``.txnindex``). A read_committed fetch is told those overlapping what it
  reads, and drops the producer's transactional batches from the first offset to the
  marker (``committed_batches``).

Like the producer state, this is a function of the log: rebuilt from headers on open and
after a truncation, so recovery and follower truncation rewind it with the log.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol

__all__ = ["AbortedTxn", "HeaderLike", "TransactionIndex", "committed_batches"]


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


class HeaderLike(Protocol):
    """What a batch header tells the index (``storage.records.BatchHeader`` has it)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def base_offset(self) -> int: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def marker(self) -> bool | None: ...


class TransactionIndex:
    """Open transactions (producer id -> first offset) and the aborted ones."""

    def __init__(self) -> None:
        self._open: dict[int, int] = {}
        # Lazily pruned heap of (first offset, producer id) of open transactions.
        self._firsts: list[tuple[int, int]] = []
        # Aborted transactions in marker order (ascending last_offset), and the highest
        # first offset among them so far (for the overlap search).
        self._aborted: list[AbortedTxn] = []
        self._lasts: list[int] = []
        # Ended transactions whose markers the high watermark may not have passed yet:
        # marker offsets (ascending) and their transactions' first offsets.
        self._ended_markers: list[int] = []
        self._ended_firsts: list[int] = []

    def apply(
        self,
        producer_id: int,
        base_offset: int,
        transactional: bool,
        marker: bool | None,
    ) -> None:
        """One batch, in log order: ``marker`` True/False for a commit/abort marker
        (None: a data batch)."""
        if marker is not None:
            first = self._open.pop(producer_id, None)
            if first is None:
                return
            self._ended_markers.append(base_offset)
            self._ended_firsts.append(first)
            if not marker:
                self._aborted.append(AbortedTxn(producer_id, first, base_offset))
                self._lasts.append(base_offset)
            return
        if transactional and producer_id not in self._open:
            self._open[producer_id] = base_offset
            heapq.heappush(self._firsts, (base_offset, producer_id))

    def apply_header(self, header: HeaderLike) -> None:
        self.apply(header.producer_id, header.base_offset, header.is_transactional, header.marker)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the earliest transaction that is open, or whose marker
        is not below ``high_watermark`` (None: there is none). The high watermark a
        leader passes only grows once its epoch is committed (the only time it asks):
        markers below it are forgotten here."""
        cut = bisect_left(self._ended_markers, high_watermark)
        if cut:
            del self._ended_markers[:cut]
            del self._ended_firsts[:cut]
        while self._firsts:
            first, pid = self._firsts[0]
            if self._open.get(pid) == first:
                break
            heapq.heappop(self._firsts)
        candidates = list(self._ended_firsts)
        if self._firsts:
            candidates.append(self._firsts[0][0])
        return min(candidates) if candidates else None

    @property
    def open_transactions(self) -> Mapping[int, int]:
        return dict(self._open)

    @property
    def aborted(self) -> Sequence[AbortedTxn]:
        return tuple(self._aborted)

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [start, end), by first offset."""
        found = [
            a for a in self._aborted[bisect_left(self._lasts, start) :] if a.first_offset < end
        ]
        return sorted(found, key=lambda a: a.first_offset)

    def drop_before(self, offset: int) -> None:
        """Retention moved the log start to ``offset``: forget aborts wholly below it."""
        cut = bisect_left(self._lasts, offset)
        if cut:
            del self._aborted[:cut]
            del self._lasts[:cut]

    def state(self) -> tuple[dict[int, int], tuple[AbortedTxn, ...]]:
        """Everything it holds, to compare two indexes."""
        return dict(self._open), tuple(self._aborted)

    @classmethod
    def of(cls, headers: Iterable[HeaderLike]) -> TransactionIndex:
        index = cls()
        for header in headers:
            index.apply_header(header)
        return index


def committed_batches(
    headers: Iterable[HeaderLike], aborted: Iterable[tuple[int, int]]
) -> Iterator[HeaderLike]:
    """The batches a read_committed reader sees, given the aborted transactions
    (producer id, first offset) a fetch named: control batches never; a transactional
    batch of a producer whose aborted transaction began at or before it, until that
    producer's abort marker, never (Kafka's consumer does the same, per batch)."""
    pending = sorted(aborted, key=lambda a: a[1])
    at = 0
    dropping: set[int] = set()
    for header in headers:
        while at < len(pending) and pending[at][1] <= header.base_offset:
            dropping.add(pending[at][0])
            at += 1
        if header.is_control:
            if header.marker is False:
                dropping.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in dropping:
            continue
        yield header
