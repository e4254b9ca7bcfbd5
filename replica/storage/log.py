"""``Log``: one partition replica's directory of segments, its epoch cache, recovery,
retention and group-commit flush.

Thread-safety: every method except ``flush`` and its halves (``begin_flush`` and the
``PendingFlush`` it returns; and the read-only ``durable_end_offset``) must be called
from one owner thread (the node's event loop). ``flush`` may run in any other thread at
the same time as appends and reads; concurrent ``flush`` calls are serialised, and each
one fsyncs everything appended before it started (group commit). ``truncate_to``,
``apply_retention`` and ``close`` wait for a running ``flush`` to finish (they are rare,
and it keeps the segment list and the epoch checkpoint consistent).

Segment files are opened through a node-wide ``FdCache`` (``storage.fdcache``): an idle
log holds no file descriptor.

``Log`` mixes in one class per role, each in its own module and each method running on a
``Log`` (as ``RaftReplica`` does): appends (``log_append``), reads and scrub
(``log_read``), truncation and retention (``log_retention``), flush (``log_flush``),
recovery (``log_recovery``), compaction (``cleaner``); their shared state is declared
in ``log_fields``.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .. import defaults
from ..constants import UNKNOWN
from . import fileio, syncfs
from .cleaner import CleanerRole
from .epoch_cache import LeaderEpochCache
from .errors import StorageError
from .fdcache import FdCache, shared_cache
from .fileutil import atomic_write
from .log_append import AppendRole
from .log_files import (
    CATCH_UP_FILE,
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_FILE,
    LOG_START_FILE,
    RECOVERY_POINT_FILE,
    read_offset_file,
)
from .log_flush import FlushRole, PendingFlush
from .log_read import ReadRole
from .log_recovery import RecoveryRole
from .log_retention import TruncationRole
from .producers import ProducerStateTable
from .segment import Segment
from .tail import Tail, TailBudget, shared_tail_budget
from .transactions import TransactionIndex
from .types import EpochEndOffset
from .voters_cache import VotersCache

__all__ = [
    "CATCH_UP_FILE",
    "CLEAN_SHUTDOWN_FILE",
    "RECOVERY_POINT_FILE",
    "Log",
    "LogConfig",
    "PendingFlush",
]

log = logging.getLogger(__name__)

_FLUSH_ORDER = itertools.count()


@dataclass(frozen=True)
class LogConfig:
    """Storage settings (Kafka's names in the comments).

    segment_bytes (segment.bytes): roll the active segment before it would exceed this.
    segment_ms (segment.ms): roll an active segment older than this (needed for age
      retention to reach recent data; None = never).
    index_interval_bytes (index.interval.bytes): bytes between sparse index entries.
    retention_bytes / retention_ms (retention.*): None = unlimited. Whole segments only,
      never the active one.
    validate_records: the leader decodes each client batch's Arrow metadata to check its
      schema and row count (CRCs are always checked).
    drop_synced_pages (serve --page-cache drop): once a flush has synced a segment's
      bytes, ask the kernel to drop their pages from the page cache. A log catching up
      (``Log.catch_up_offset`` set: a copy a move adds, a replica re-fetching what it
      lost) drops them whatever this says: it writes history no reader asks of it soon,
      as fast as its leader sends it, and would otherwise push the node's recent data
      out of the page cache and, on a virtual machine whose host takes back freed memory,
      pay a first touch for every new page (a move's copies then cost its node several
      times the CPU of the same bytes written into reused memory).
    cleanup_policy (cleanup.policy): "delete", "compact" or "compact,delete"; with
      "compact" the node's cleaner keeps the latest record of each key
      (``storage.compaction``), with "delete" too retention also applies.
    min_cleanable_dirty_ratio (min.cleanable.dirty.ratio): clean once the part of the log
      not yet cleaned is at least this share of it.
    min_compaction_lag_ms / max_compaction_lag_ms (min/max.compaction.lag.ms): a record
      younger than the first is never cleaned away; one older than the second (None:
      no bound) makes the log cleanable whatever its dirty ratio.
    delete_retention_ms (delete.retention.ms): how long a tombstone (a null value)
      stays after its clean before a later clean drops it.
    """

    segment_bytes: int = defaults.SEGMENT_BYTES
    segment_ms: int | None = defaults.SEGMENT_MS
    index_interval_bytes: int = defaults.INDEX_INTERVAL_BYTES
    retention_bytes: int | None = defaults.RETENTION_BYTES
    retention_ms: int | None = defaults.RETENTION_MS
    validate_records: bool = True
    drop_synced_pages: bool = False
    cleanup_policy: str = "delete"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None
    delete_retention_ms: int = 86_400_000

    @property
    def compacted(self) -> bool:
        """Whether the cleaner compacts this log (cleanup.policy names "compact")."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def deletes(self) -> bool:
        """Whether retention deletes this log's old segments (cleanup.policy names "delete")."""
        return "delete" in self.cleanup_policy.split(",")

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= 1 << 31:
            raise ValueError(f"segment_bytes must be in (0, 2 GiB], got {self.segment_bytes}")
        if self.index_interval_bytes <= 0:
            raise ValueError("index_interval_bytes must be positive")


class Log(AppendRole, ReadRole, TruncationRole, FlushRole, RecoveryRole, CleanerRole):
    """One partition replica on disk; satisfies ``replica.raft.log.ReplicaLog``.

    Open with ``Log(directory)``: recovers after an unclean shutdown (see ``_recover``).
    ``repair=True`` truncates at a corrupt batch even when valid batches follow it
    (losing them, and recording ``catch_up_offset``) instead of raising CorruptLogError.
    """

    def __init__(
        self,
        directory: str,
        config: LogConfig | None = None,
        *,
        repair: bool = False,
        files: FdCache | None = None,
        tail: TailBudget | None = None,
        close_deleted: Callable[[int], None] | None = None,
    ) -> None:
        self.directory = directory
        self.config = config or LogConfig()
        # Given the last descriptor of each segment file deleted (opened before its
        # unlink): closing it frees the file's cached pages and blocks, the slow part of a
        # deletion (60-70 ms for 256 MiB cached), which a node does in the background
        # (``Trash.close_later``). None: the unlink frees them, here.
        self._close_deleted = close_deleted
        # Segment descriptors come from the node-wide cache: no descriptor per idle log.
        self._files = files if files is not None else shared_cache()
        # The newest batches appended as leader, served from memory (``storage.tail``).
        self._tail = Tail(tail if tail is not None else shared_tail_budget())
        # Locks of many logs are taken in this order by a group flush.
        self.flush_order = next(_FLUSH_ORDER)
        self._repair = repair
        self._lock = threading.Lock()  # guards state shared with the flush thread
        self._flush_lock = threading.Lock()  # held by flush, truncate, retention, close
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._dir_dirty = False
        self._closed = False
        self._rebuild_cache = False
        self._rebuild_voters = False
        # Built from the log when first needed (an idempotent producer's batch), kept
        # up to date by appends, dropped by truncation.
        self._producers: ProducerStateTable | None = None
        # Open and aborted transactions (``storage.transactions``): built with it.
        self._txns: TransactionIndex | None = None
        # A new log makes its directory with its first write (``_make_directory``):
        # thousands of partitions nobody has produced to cost no directory or file.
        parent = os.path.dirname(os.path.abspath(directory))
        #: The directory was there when the log was opened (a replica this node held).
        self.existed = os.path.isdir(directory)
        self._unmade = not self.existed and os.path.isdir(parent)
        self._parent_dirty = False  # the directory's own entry is not durable yet
        if not self._unmade:
            fileio.makedirs(directory, durable=True)
        home = parent if self._unmade else directory
        self.device = os.stat(home).st_dev
        syncfs.watch(self.device, home)  # before any write (see storage.syncfs)
        self._recovery_point_path = os.path.join(directory, RECOVERY_POINT_FILE)
        self._catch_up_path = os.path.join(directory, CATCH_UP_FILE)
        self._log_start_path = os.path.join(directory, LOG_START_FILE)
        self._cleaner_offset_path = os.path.join(directory, CLEANER_OFFSET_FILE)
        if self._unmade:  # no directory: none of its files to read
            self._recovery_point, self._catch_up_offset = 0, UNKNOWN
            self._log_start = 0
            self._cleaned_end = 0
        else:
            self._recovery_point = read_offset_file(self._recovery_point_path, 0)
            self._catch_up_offset = read_offset_file(self._catch_up_path, UNKNOWN)
            self._log_start = read_offset_file(self._log_start_path, 0)
            self._cleaned_end = read_offset_file(self._cleaner_offset_path, 0)
        # Scrub cursor: (segment base offset, position, expected offset at position).
        self._scrub_at = (-1, 0, 0)
        self._truncations = 0
        self.scrub_passes = 0
        self.scrubbed_bytes = 0
        self._cache = self._open_cache()
        self._voters = self._open_voters()
        self._recover()
        self._end_offset = self._segments[-1].end_offset
        self._durable_end_offset = self._end_offset
        # Everything now in the log was verified (trusted below the old recovery point,
        # CRC-scanned past it) and is durable.
        self._set_recovery_point(self._end_offset)
        if 0 <= self._catch_up_offset <= self._end_offset:
            self._clear_catch_up()

    # -- ReplicaLog properties -------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        return self._end_offset

    @property
    def durable_end_offset(self) -> int:
        return self._durable_end_offset

    @property
    def epoch_cache(self) -> LeaderEpochCache:
        return self._cache

    @property
    def size_bytes(self) -> int:
        return sum(seg.size for seg in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    @property
    def recovery_point(self) -> int:
        """Offsets below this were fsync'd and verified: recovery trusts them."""
        return self._recovery_point

    @property
    def catch_up_offset(self) -> int:
        """The durable end this log had before it lost data to corruption (UNKNOWN: none
        lost). Until the durable end is back at it, the replica may lack records it
        acknowledged: it must not vote, stand, or count towards the HWM."""
        return self._catch_up_offset

    @property
    def cleaned_end(self) -> int:
        """The log was cleaned below this offset (``storage.cleaner``): batches there may
        leave gaps between their offsets; 0 for a log never cleaned."""
        return self._cleaned_end

    def continues(self, expected: int, base_offset: int) -> bool:
        """Whether a batch at ``base_offset`` may follow one that ended at ``expected``:
        right after it, or past a gap a clean left (below ``cleaned_end``)."""
        return base_offset == expected or expected < base_offset <= self._cleaned_end

    def last_epoch(self) -> int:
        return self._cache.latest_epoch

    @property
    def voters(self) -> tuple[int, ...] | None:
        """The voter set of the latest voter-set record in the log, committed or not
        (None: the log holds none)."""
        latest = self._voters.latest
        return None if latest is None else latest[1]

    @property
    def voters_before(self) -> tuple[int, ...] | None:
        """The voter set the latest voter-set record replaced (None: none in the log)."""
        entries = self._voters.entries
        return entries[-2][1] if len(entries) > 1 else None

    @property
    def voters_offset(self) -> int:
        """The offset of that record (UNKNOWN: none)."""
        latest = self._voters.latest
        return UNKNOWN if latest is None else latest[0]

    @property
    def voters_cache(self) -> VotersCache:
        return self._voters

    def end_offset_for(self, epoch: int) -> EpochEndOffset:
        return self._cache.end_offset_for(epoch, self._end_offset)

    def epoch_at(self, offset: int) -> int:
        if not self.start_offset <= offset < self._end_offset:
            return UNKNOWN
        return self._cache.epoch_for_offset(offset)

    def close(self) -> None:
        """Flush, write every index and a clean-shutdown marker, close files."""
        if self._closed:
            return
        self._tail.clear()
        self.flush()
        with self._flush_lock:
            if self._unmade:  # never written: nothing on disk to close
                with self._lock:
                    self._closed = True
                    for seg in self._segments:
                        seg.close()
                return
            active = self._segments[-1]
            atomic_write(active.index_path, active.index_bytes())
            self._set_recovery_point(self._end_offset)
            atomic_write(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE), b"")
            with self._lock:
                self._closed = True
                for seg in self._segments:
                    seg.close()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.directory} is closed")
