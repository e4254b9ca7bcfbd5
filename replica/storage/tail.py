"""The newest batches of a log, kept in memory as they were written.

A leader's followers fetch what it appended a moment ago, and so do consumers reading
at the tail. Read from the file, each such fetch costs a header lookup (a pread per
header), a pread of the batches and a CRC check of every byte read (the disk is not
trusted). The bytes were checked when they were appended: a ``Tail`` keeps them, and
``Log.read`` serves an offset it covers from memory.

A tail always ends at its log's end: it covers [first base offset, end offset) without
a gap. An append that is not kept (a follower's, or a batch larger than one tail may
hold) and every truncation clear it, so no byte is ever served that the log does not
hold at that offset.

Memory is bounded twice: one tail holds at most ``TAIL_LOG_BATCHES`` batches and
``TAIL_LOG_BYTES`` (its oldest batches go first: followers fetch within milliseconds of
an append, so a few batches are enough), and the tails of a process share a ``TailBudget`` (``TAIL_CACHE_BYTES``):
past it, the least recently appended tails are dropped whole (thousands of idle
partitions keep nothing for long). The budget's lock guards every change to a tail;
reads run on the log's owner thread, as its appends do.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from operator import itemgetter

from .. import defaults

__all__ = ["Tail", "TailBudget", "shared_tail_budget"]

_BASE = itemgetter(0)


class TailBudget:
    """The bytes all tails of a process may hold together (0: keep none)."""

    def __init__(self, limit: int = defaults.TAIL_CACHE_BYTES) -> None:
        if limit < 0:
            raise ValueError(f"tail budget must be >= 0, got {limit}")
        self.limit = limit
        self.used = 0
        self.lock = threading.Lock()
        # Tails holding bytes, least recently appended first.
        self._holders: OrderedDict[int, Tail] = OrderedDict()

    def _charge(self, tail: Tail, nbytes: int) -> None:
        """Under ``lock``: ``tail`` grew by ``nbytes``; drop the least recently appended
        other tails while over the limit."""
        self.used += nbytes
        self._holders[id(tail)] = tail
        self._holders.move_to_end(id(tail))
        while self.used > self.limit and len(self._holders) > 1:
            _, oldest = next(iter(self._holders.items()))
            oldest._drop_locked()

    def _release(self, tail: Tail, nbytes: int) -> None:
        self.used -= nbytes
        if not tail._entries:
            self._holders.pop(id(tail), None)


class Tail:
    """One log's newest batches: (base offset, the batch's bytes) in offset order,
    ending at the log's end offset."""

    __slots__ = ("_budget", "_bytes", "_entries", "_limit")

    def __init__(self, budget: TailBudget, limit: int = defaults.TAIL_LOG_BYTES) -> None:
        self._budget = budget
        self._limit = min(limit, budget.limit)
        self._entries: list[tuple[int, bytes]] = []
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def start(self) -> int | None:
        """Base offset of the oldest batch held (None: empty)."""
        entries = self._entries
        return entries[0][0] if entries else None

    def extend(self, batches: list[tuple[int, bytes]]) -> None:
        """Keep batches just appended at the log's end (they continue what is held). An
        append holding a batch over this tail's limit is not kept, nor what was held."""
        budget = self._budget
        sizes = [len(data) for _, data in batches]
        with budget.lock:
            if max(sizes) > self._limit:
                self._drop_locked()
                return
            entries = self._entries
            entries.extend(batches)
            added = sum(sizes)
            self._bytes += added
            budget._charge(self, added)
            if len(entries) > defaults.TAIL_LOG_BATCHES or self._bytes > self._limit:
                self._trim_locked()
            # Still over with no other tail to drop: this one gives up its oldest.
            if budget.used > budget.limit:
                self._trim_locked(self._bytes - (budget.used - budget.limit))

    def clear(self) -> None:
        """The log changed in a way the tail does not follow (a truncation, an append
        not kept): hold nothing."""
        if self._entries:
            with self._budget.lock:
                self._drop_locked()

    def read(self, offset: int, max_bytes: int, max_offset: int | None) -> bytes | None:
        """What ``Log.read`` returns for ``offset`` (below the log's end), from memory:
        whole batches starting with the one holding ``offset``, up to ``max_bytes`` but
        at least one, none starting at or past ``max_offset``. None when ``offset`` is
        below what the tail holds."""
        entries = self._entries
        if not entries or offset < entries[0][0]:
            return None
        index = bisect.bisect_right(entries, offset, key=_BASE) - 1
        base, data = entries[index]
        if max_offset is not None and base >= max_offset:
            return b""
        size = len(data)
        last = index + 1
        while last < len(entries):
            base, later = entries[last]
            if size + len(later) > max_bytes or (max_offset is not None and base >= max_offset):
                break
            size += len(later)
            last += 1
        if last == index + 1:
            return data
        return b"".join(data for _, data in entries[index:last])

    def _trim_locked(self, keep: int | None = None) -> None:
        """Drop the oldest batches until at most ``keep`` bytes (this tail's limit) and
        ``TAIL_LOG_BATCHES`` batches are held."""
        keep = self._limit if keep is None else keep
        entries = self._entries
        held = self._bytes
        count = 0
        while count < len(entries) and (
            len(entries) - count > defaults.TAIL_LOG_BATCHES or held > keep
        ):
            held -= len(entries[count][1])
            count += 1
        if count:
            del entries[:count]
            dropped = self._bytes - held
            self._bytes = held
            self._budget._release(self, dropped)

    def _drop_locked(self) -> None:
        dropped = self._bytes
        self._entries = []
        self._bytes = 0
        self._budget._release(self, dropped)


_shared: TailBudget | None = None
_shared_lock = threading.Lock()


def shared_tail_budget() -> TailBudget:
    """The process-wide budget (``TAIL_CACHE_BYTES``) every ``Log`` uses unless it is
    given its own."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TailBudget()
        return _shared
