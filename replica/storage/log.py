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
"""

from __future__ import annotations

import bisect
import errno
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import defaults
from ..constants import UNKNOWN
from . import fileio, syncfs
from .epoch_cache import CHECKPOINT_FILE, LeaderEpochCache
from .errors import (
    CorruptCheckpointError,
    CorruptDataError,
    CorruptLogError,
    CorruptRecordError,
    DiskError,
    OffsetOutOfRangeError,
    StorageError,
    UnsupportedFormatError,
)
from .fdcache import FdCache, shared_cache
from .fileutil import atomic_write, fsync_dir
from .producers import ProducerBatch, ProducerStateTable, last_sequence
from .records import (
    HEADER_SIZE,
    MAGIC,
    MAGIC_V1,
    VOTERS_KEY,
    BatchHeader,
    TxnMarker,
    batches_to_table,
    decode_control,
    encode_control_batch,
    encode_txn_marker,
    encode_voters_batch,
    iter_batches,
    parse_header,
    restamp_header,
    validate_arrow,
    validate_payload,
)
from .segment import Segment, index_path, log_path
from .tail import Tail, TailBudget, shared_tail_budget
from .transactions import TransactionIndex
from .types import CATCH_UP_UNKNOWN, AppendInfo, EpochEndOffset
from .voters_cache import VOTERS_FILE, VotersCache

__all__ = [
    "CATCH_UP_FILE",
    "CLEAN_SHUTDOWN_FILE",
    "RECOVERY_POINT_FILE",
    "Log",
    "LogConfig",
    "PendingFlush",
]

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
# Kafka's recovery-point-offset-checkpoint, per partition directory: "0\n<offset>\n"
# (format version, offset). Everything below the offset was fsync'd and verified, so
# recovery after an unclean shutdown re-checks (CRC) only the segments past it.
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
# "0\n<offset>\n": the log lost data it may have acknowledged (corruption repaired by
# truncation) and held, durably, everything below <offset> before. Written before the
# truncation; removed once the durable end reaches the offset again.
CATCH_UP_FILE = "catch-up-offset"
# Kafka's log-start-offset-checkpoint, per partition directory: "0\n<offset>\n". Written
# before retention (or an emptying truncation) deletes segments, so that segments left
# below it by a crash part-way through are known to be deleted ones, not a gap.
LOG_START_FILE = "log-start-offset"
_OFFSET_FILE_VERSION = 0
_IOV_MAX = 512
_MAX_RELATIVE = (1 << 31) - 1
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
    cleanup_policy (cleanup.policy): "delete", "compact" or "compact,delete": whether the
      cleaner keeps only the latest record of each key, and whether retention deletes.
    min_cleanable_dirty_ratio, min_compaction_lag_ms, max_compaction_lag_ms (None: no
      bound), delete_retention_ms: when the cleaner runs and how long tombstones stay
      (Kafka's topic configs of those names).
    """

    segment_bytes: int = defaults.SEGMENT_BYTES
    segment_ms: int | None = defaults.SEGMENT_MS
    index_interval_bytes: int = defaults.INDEX_INTERVAL_BYTES
    retention_bytes: int | None = defaults.RETENTION_BYTES
    retention_ms: int | None = defaults.RETENTION_MS
    validate_records: bool = True
    drop_synced_pages: bool = False
    cleanup_policy: str = defaults.CLEANUP_POLICY
    min_cleanable_dirty_ratio: float = defaults.MIN_CLEANABLE_DIRTY_RATIO
    min_compaction_lag_ms: int = defaults.MIN_COMPACTION_LAG_MS
    max_compaction_lag_ms: int | None = defaults.MAX_COMPACTION_LAG_MS
    delete_retention_ms: int = defaults.DELETE_RETENTION_MS

    def __post_init__(self) -> None:
        if not 0 < self.segment_bytes <= 1 << 31:
            raise ValueError(f"segment_bytes must be in (0, 2 GiB], got {self.segment_bytes}")
        if self.index_interval_bytes <= 0:
            raise ValueError("index_interval_bytes must be positive")


@dataclass
class _Planned:
    header: BatchHeader
    base_offset: int
    epoch: int
    buffers: list[bytes | memoryview]


class PendingFlush:
    """One log's flush between its two halves (``Log.begin_flush``): make the captured
    data durable, either with ``sync_files`` (fdatasync per written segment, fsync of
    the directory) or with one syncfs(2) of the log's filesystem that started after
    ``begin_flush`` followed by ``synced_by_filesystem``; then ``complete`` (writes the
    epoch checkpoint and sealed indexes, marks the durable end, returns it). ``abandon``
    instead if the sync failed. The log's flush lock is held until one of them."""

    def __init__(
        self,
        log: Log,
        target: int,
        work: list[tuple[Segment, int, int]],
        dir_dirty: bool,
        sealed: list[Segment],
        parent_dirty: bool = False,
    ) -> None:
        self.log = log
        self.target = target
        self.work = work  # (segment, size to make durable, its write generation)
        self.dir_dirty = dir_dirty
        self.parent_dirty = parent_dirty  # the directory itself is new
        self.sealed = sealed
        self._finished = False

    @property
    def needs_sync(self) -> bool:
        """Whether any file of the log has writes or new entries to make durable."""
        return bool(self.work) or self.dir_dirty

    @property
    def device(self) -> int:
        """The filesystem holding the log (st_dev), for grouping logs under one syncfs."""
        return self.log.device

    def sync_files(self) -> None:
        """Make the captured data durable file by file. Raises StorageError."""
        try:
            for seg, _size, _gen in self.work:
                seg.sync()
            if self.dir_dirty:
                fsync_dir(self.log.directory)
            if self.parent_dirty:
                fsync_dir(os.path.dirname(os.path.abspath(self.log.directory)))
        except OSError as exc:
            raise StorageError(f"{self.log.directory}: flush failed: {exc}") from exc

    def synced_by_filesystem(self) -> None:
        """A syncfs(2) of ``device`` that started after ``begin_flush`` succeeded.
        Raises StorageError if the cache failed to sync one of the files when it
        closed it (that failure is not reported to a later syncfs)."""
        for seg, _size, gen in self.work:
            seg.finish_sync(gen)

    def stage_checkpoint(self) -> str | None:
        """Before a syncfs: the changed epoch checkpoint written to a temporary file (see
        ``LeaderEpochCache.stage``), or None."""
        try:
            return self.log._cache.stage()
        except OSError as exc:
            raise StorageError(f"{self.log.directory}: checkpoint failed: {exc}") from exc

    def commit_checkpoint(self, tmp: str) -> None:
        try:
            self.log._cache.commit_staged(tmp)
        except OSError as exc:
            raise StorageError(f"{self.log.directory}: checkpoint failed: {exc}") from exc

    def unstage_checkpoint(self) -> None:
        self.log._cache.unstage()

    def complete(self) -> int:
        if self._finished:
            raise RuntimeError("this flush is already finished")
        self._finished = True
        return self.log._complete_flush(self)

    def abandon(self) -> None:
        """Give up (the sync failed): nothing is marked durable. No-op once finished."""
        if not self._finished:
            self._finished = True
            self.log._abandon_flush(self)


class Log:
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
        if self._unmade:  # no directory: none of its files to read
            self._recovery_point, self._catch_up_offset = 0, UNKNOWN
            self._log_start = 0
        else:
            self._recovery_point = _read_offset_file(self._recovery_point_path, 0)
            self._catch_up_offset = _read_offset_file(self._catch_up_path, UNKNOWN)
            self._log_start = _read_offset_file(self._log_start_path, 0)
        # Scrub cursor: (segment base offset, position, expected offset at position).
        self._scrub_at = (-1, 0, 0)
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

    # -- appends ---------------------------------------------------------------------

    def append_as_leader(self, records: bytes, epoch: int) -> AppendInfo:
        """Append client batches: offsets assigned from end_offset and ``epoch`` stamped
        by writing new headers in front of the untouched payloads (CRCs are checked, and
        with ``validate_records`` the Arrow schema and row counts). Control batches are
        rejected; use append_control."""
        return self._append_leader(records, epoch, allow_control=False)

    def append_control(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        batch = encode_control_batch(leader_id, voters, timestamp_ms, leader_epoch=epoch)
        return self._append_leader(batch, epoch, allow_control=True)

    def append_voters(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        """Append a voter-set change (KIP-853's VotersRecord): ``voters`` is in force
        from its offset on (see ``voters_cache``)."""
        batch = encode_voters_batch(leader_id, voters, timestamp_ms, leader_epoch=epoch)
        return self._append_leader(batch, epoch, allow_control=True)

    def _append_leader(
        self, records: bytes, epoch: int, *, allow_control: bool, markers: bool = False
    ) -> AppendInfo:
        self._check_open()
        if epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, got {epoch}")
        latest = self._cache.latest_epoch
        if epoch < latest:
            raise ValueError(f"append with epoch {epoch} below the latest epoch {latest}")
        view = memoryview(records)
        planned: list[_Planned] = []
        kept: list[tuple[int, bytes]] = []  # (base offset, the batch as written)
        next_offset = self._end_offset
        for header in iter_batches(view, verify_crc=True):
            if header.is_control and not allow_control:
                raise CorruptRecordError(
                    f"client batch at position {header.position} has the control flag set"
                )
            if self.config.validate_records:
                validate_arrow(view, header)
            # One copy of the batch, restamped: written, then kept in the tail.
            data = (
                restamp_header(header, next_offset, epoch)
                + view[header.position + HEADER_SIZE : header.end]
            )
            planned.append(_Planned(header, next_offset, epoch, [data]))
            kept.append((next_offset, data))
            next_offset += header.record_count
        if not planned:
            raise ValueError("append_as_leader needs at least one batch")
        end = self._end_offset
        try:
            if markers:
                info = self._write(planned)
                table = self.producer_state()
                for item in planned:
                    self._apply_producer(table, item.header, item.base_offset)
                    self._note_transaction(item.header, item.base_offset)
            elif any(item.header.producer is not None for item in planned):
                info = self._append_idempotent(planned)
            else:
                info = self._write(planned)
        except BaseException:
            if self._end_offset != end:  # written in part: the tail no longer ends there
                self._tail.clear()
            raise
        self._tail.extend(kept)
        return info

    def append_markers(
        self, markers: Sequence[TxnMarker], epoch: int, timestamp_ms: int
    ) -> AppendInfo:
        """Append transaction markers (a coordinator's, through the partition's leader),
        a batch each, of epochs their producers have not left (``InvalidProducerEpoch``,
        nothing written); each ends its producer's open transaction here
        (``transactions``)."""
        table = self.producer_state()
        for marker in markers:
            table.check_marker(marker.producer_id, marker.producer_epoch)
        self.transactions()  # built before the markers land, so they update it
        records = b"".join(encode_txn_marker(marker, timestamp_ms) for marker in markers)
        return self._append_leader(records, epoch, allow_control=True, markers=True)

    def _append_idempotent(self, planned: list[_Planned]) -> AppendInfo:
        """An idempotent producer's batch: checked against the producer state first (a
        retry raises ``DuplicateSequence`` naming where the batch already is)."""
        item = planned[0]
        if len(planned) > 1 or item.header.producer is None:
            raise CorruptRecordError("an idempotent producer's batch must travel alone")
        table = self.producer_state()
        batch = _producer_batch(item.header, item.base_offset)
        pid = item.header.producer.producer_id
        table.check(pid, batch.producer_epoch, batch.first_sequence, batch.last_sequence)
        info = self._write(planned)
        table.apply(pid, batch)
        self._note_transaction(item.header, item.base_offset)
        return info

    def _note_transaction(self, header: BatchHeader, base_offset: int) -> None:
        if self._txns is not None:
            self._txns.apply(
                header.producer_id, base_offset, header.is_transactional, header.marker
            )

    def append_as_follower(self, batches: bytes) -> AppendInfo | None:
        """Append whole batches fetched from the leader, byte for byte. Base offsets must
        continue at end_offset and epochs must not go below the latest epoch (else
        ValueError, nothing written); CRCs are checked."""
        self._check_open()
        view = memoryview(batches)
        if not view:
            return None
        self._tail.clear()  # a follower serves no fetches: it keeps no tail
        planned: list[_Planned] = []
        expected = self._end_offset
        latest = self._cache.latest_epoch
        for header in iter_batches(view, verify_crc=True):
            if header.base_offset != expected:
                raise ValueError(
                    f"batch at position {header.position} has base offset "
                    f"{header.base_offset}, expected {expected}"
                )
            if header.leader_epoch < 0 or header.leader_epoch < latest:
                raise ValueError(
                    f"batch at offset {header.base_offset} has epoch {header.leader_epoch}, "
                    f"below the latest epoch {latest}"
                )
            latest = header.leader_epoch
            planned.append(
                _Planned(
                    header, expected, header.leader_epoch, [view[header.position : header.end]]
                )
            )
            expected = header.next_offset
        info = self._write(planned)
        if self._producers is not None:
            for item in planned:
                if item.header.producer is not None:
                    self._apply_producer(self._producers, item.header, item.base_offset)
                    self._note_transaction(item.header, item.base_offset)
        return info

    # -- idempotent producers ----------------------------------------------------------

    def producer_state(self) -> ProducerStateTable:
        """The producers' state as this log holds it (``storage.producers``), built by
        walking every batch header the first time it is needed. A damaged header on the
        way raises ``CorruptDataError`` (the state past it is unknown), as a read does."""
        if self._producers is None:
            table = ProducerStateTable(complete=self.start_offset == 0)
            txns = TransactionIndex()
            for seg in self._segments:
                position, expected = 0, seg.base_offset
                while position < seg.size:
                    try:
                        header = seg.header_at(position)
                    except CorruptRecordError as exc:
                        raise self._detected(
                            self._find_corruption(seg, expected, str(exc))
                        ) from exc
                    if header.producer is not None:
                        self._apply_producer(table, header, header.base_offset)
                        txns.apply_header(header)
                    position, expected = header.end, header.next_offset
            self._producers, self._txns = table, txns
        return self._producers

    def transactions(self) -> TransactionIndex:
        """The open and aborted transactions as this log holds them, built with the
        producer state (``producer_state``) and kept up to date alike."""
        if self._txns is None or self._producers is None:
            self._producers = None
            self.producer_state()
        assert self._txns is not None
        return self._txns

    @staticmethod
    def _apply_producer(table: ProducerStateTable, header: BatchHeader, base: int) -> None:
        assert header.producer is not None
        if header.marker is not None:  # a marker moves the epoch, it holds no sequence
            table.apply_marker(header.producer_id, header.producer_epoch)
        else:
            table.apply(header.producer.producer_id, _producer_batch(header, base))

    def _write(self, planned: Sequence[_Planned]) -> AppendInfo:
        """Write planned batches, rolling segments as needed. A failed write truncates
        the segment back so the log never holds a partial batch."""
        first = planned[0].base_offset
        group: list[_Planned] = []
        for item in planned:
            if group:
                active_size = self._segments[-1].size + sum(p.header.size for p in group)
            else:
                active_size = self._segments[-1].size
            if self._should_roll(active_size, item):
                self._write_group(group)
                group = []
                self._roll(item.base_offset)
            group.append(item)
        self._write_group(group)
        last = planned[-1]
        return AppendInfo(
            first,
            last.base_offset + last.header.record_count - 1,
            last.base_offset + last.header.record_count - first,
        )

    def _should_roll(self, active_size: int, item: _Planned) -> bool:
        if active_size == 0:
            return False
        active = self._segments[-1]
        if active_size + item.header.size > self.config.segment_bytes:
            return True
        if item.base_offset + item.header.record_count - active.base_offset > _MAX_RELATIVE:
            return True
        segment_ms = self.config.segment_ms
        return segment_ms is not None and (
            (time.monotonic() - active.created_monotonic) * 1000 >= segment_ms
        )

    def _write_group(self, group: list[_Planned]) -> None:
        if not group:
            return
        self._make_directory()
        seg = self._segments[-1]
        buffers = [buf for item in group for buf in item.buffers]
        start = seg.size
        # A voter-set record is in the checkpoint before it is in the segment (so the
        # checkpoint names every one the log can hold; see voters_cache).
        voters_from = self._note_voters(group)
        with seg.pin(write=True) as fd:
            try:
                _writev_all(fd, buffers)
            except BaseException as exc:
                fileio.ftruncate(fd, start)
                if voters_from is not None:
                    self._voters.truncate_from_end(voters_from)
                if isinstance(exc, OSError):
                    raise DiskError(seg.path, exc) from exc
                raise
        interval = self.config.index_interval_bytes
        position = start
        for item in group:
            if item.epoch > self._cache.latest_epoch:
                self._cache.assign(item.epoch, item.base_offset)
            next_offset = item.base_offset + item.header.record_count
            with self._lock:
                seg.track(
                    position,
                    item.base_offset,
                    next_offset,
                    item.header.size,
                    item.header.max_timestamp,
                    interval,
                )
                self._end_offset = next_offset
            position += item.header.size

    def _note_voters(self, group: list[_Planned]) -> int | None:
        """Record the voter-set records of ``group`` in the voters checkpoint; the offset
        of the first one (None: there is none)."""
        first = None
        for item in group:
            if item.header.is_quorum_control:
                record = decode_control(b"".join(bytes(b) for b in item.buffers))
                if record.key == VOTERS_KEY:
                    self._voters.assign(item.base_offset, tuple(record.voters))
                    first = item.base_offset if first is None else first
        return first

    def _roll(self, base_offset: int) -> None:
        self._make_directory()
        seg = Segment(self.directory, base_offset, create=True, files=self._files)
        with self._lock:
            self._segments.append(seg)
            self._bases.append(base_offset)
            self._dir_dirty = True
        log.debug("%s: rolled new segment at offset %d", self.directory, base_offset)

    # -- reads -----------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches starting with the one holding ``offset``: up to ``max_bytes``
        but at least one batch, and no batch starting at or past ``max_offset``. From
        the tail in memory when it holds ``offset`` (batches this log appended as
        leader, checked then); else from one segment, with one pread (one kernel-to-user
        copy) for the result, every batch read CRC-checked. Raises
        OffsetOutOfRangeError outside [start_offset, end_offset]."""
        self._check_open()
        if not self.start_offset <= offset <= self._end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{self.start_offset}, {self._end_offset}]"
            )
        if offset == self._end_offset or (max_offset is not None and offset >= max_offset):
            return b""
        kept = self._tail.read(offset, max_bytes, max_offset)
        if kept is not None:
            return kept
        seg = self._segments[bisect.bisect_right(self._bases, offset) - 1]
        try:
            return self._read_segment(seg, offset, max_bytes, max_offset)
        except OSError as exc:
            # A disk that fails a read is treated as damage there: the replica repairs
            # from a healthy copy (a leader resigns first), as for a bad CRC.
            reason = f"the disk failed the read ({exc})"
            raise self._detected(CorruptDataError(seg.path, offset, -1, reason)) from exc

    def _read_segment(
        self, seg: Segment, offset: int, max_bytes: int, max_offset: int | None
    ) -> bytes:
        try:
            first = seg.locate(offset)
        except CorruptRecordError as exc:
            raise self._detected(self._find_corruption(seg, offset, str(exc))) from exc
        if max_offset is not None and first.base_offset >= max_offset:
            return b""
        limit = seg.size
        if max_offset is not None and max_offset < seg.end_offset:
            try:
                limit = seg.locate(max_offset - 1).end
            except CorruptRecordError:
                limit = first.end  # the damage lies past the first batch: checked below
        target = min(limit, first.position + max(max_bytes, 0))
        end = first.end if target <= first.end else seg.boundary_before(first.position, target)
        data = seg.pread(end - first.position, first.position)
        # Never serve damaged bytes: CRC-check every batch (header and payload). A
        # damaged batch ends the result; if it is the first, raise CorruptDataError.
        valid, reason = _valid_prefix(data)
        if valid == len(data):
            return data
        if valid:
            return data[:valid]
        raise self._detected(CorruptDataError(seg.path, first.base_offset, first.position, reason))

    # -- truncation and retention ----------------------------------------------------

    def offset_for_timestamp(self, timestamp_ms: int, max_offset: int) -> tuple[int, int]:
        """ListOffsets by time: (the first offset below ``max_offset`` whose record
        timestamp is >= ``timestamp_ms``, that timestamp), or (max_offset, -1) if none.
        Scans batch headers; decodes only the batch that holds the answer."""
        import pyarrow.compute as pc

        offset = self.start_offset
        while offset < max_offset:
            data = self.read(offset, 4 << 20, max_offset=max_offset)
            if not data:
                break
            for h in iter_batches(data):
                if not h.is_control and h.max_timestamp >= timestamp_ms:
                    table = batches_to_table(data[h.position : h.end])
                    stamps = table.column("timestamp").cast("int64")
                    idx = pc.index(pc.greater_equal(stamps, timestamp_ms), True).as_py()
                    if idx >= 0:
                        return int(table.column("offset")[idx].as_py()), int(stamps[idx].as_py())
                offset = h.next_offset
        return max_offset, -1

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or above ``offset``. If ``offset`` falls inside a batch
        the whole batch goes (batches are never split), so end_offset may end up below
        ``offset``. Below start_offset the log is emptied and restarts at ``offset``.
        The truncation is fsync'd before returning."""
        self._check_open()
        with self._flush_lock:
            self._truncate_locked(offset)

    def _truncate_locked(self, offset: int) -> None:
        if offset >= self._end_offset:
            return
        self._tail.clear()
        self._producers = self._txns = None  # rebuilt from what is left when next needed
        if offset < self.start_offset:
            self._truncate_fully(offset)
            return
        index = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[index]
        batch = seg.locate_lenient(offset)
        # First lower the recovery point: a crash part-way through leaves a cut segment
        # before later ones, which recovery then cuts again (_breaks_before), not refuses.
        self._set_recovery_point(min(self._recovery_point, batch.base_offset))
        for later in self._segments[index + 1 :]:
            self._delete_segment(later)
        _unlink(seg.index_path)
        seg.truncate_file(batch.position)
        with self._lock:
            del self._segments[index + 1 :]
            del self._bases[index + 1 :]
            seg.index_durable = False
            seg.truncate_index(batch.position)
            self._end_offset = batch.base_offset
            self._durable_end_offset = min(self._durable_end_offset, batch.base_offset)
        fsync_dir(self.directory)
        self._cache.truncate_from_end(batch.base_offset)
        self._cache.flush()
        self._voters.truncate_from_end(batch.base_offset)
        log.info("%s: truncated to offset %d", self.directory, batch.base_offset)

    def truncate_corrupt(self, offset: int) -> None:
        """Repair latent corruption found at ``offset``: durably remember the durable
        end as ``catch_up_offset`` (what the replica may have acknowledged), then
        ``truncate_to(offset)``. A crash in between leaves the mark and the damaged
        batch, which is found again."""
        self._check_open()
        with self._flush_lock:
            floor = max(self._catch_up_offset, self._durable_end_offset)
            if offset < floor and floor != self._catch_up_offset:
                self._make_directory()
                _write_offset_file(self._catch_up_path, floor)
                self._sync_new_directory()
                self._catch_up_offset = floor
            self._truncate_locked(offset)

    def mark_catch_up(self, floor: int) -> None:
        """Durably record that this replica may lack acknowledged records below
        ``floor`` (``CATCH_UP_UNKNOWN``: below a point not yet known, as after a lost
        disk). A known floor replaces an unknown one; a known one only rises. It clears
        once the durable end reaches it."""
        self._check_open()
        with self._flush_lock:
            cur = self._catch_up_offset
            if floor == CATCH_UP_UNKNOWN or cur in (UNKNOWN, CATCH_UP_UNKNOWN):
                new = floor
            else:
                new = max(cur, floor)
            if new == cur:
                return
            if 0 <= new <= self._durable_end_offset:
                self._catch_up_offset = new
                self._clear_catch_up()
                return
            self._make_directory()
            _write_offset_file(self._catch_up_path, new)
            self._sync_new_directory()
            self._catch_up_offset = new
            log.info(
                "%s: catching up%s",
                self.directory,
                " (floor unknown)" if new == CATCH_UP_UNKNOWN else f" to offset {new}",
            )

    def _truncate_fully(self, offset: int) -> None:
        self._make_directory()
        self._set_recovery_point(min(self._recovery_point, offset))
        self._set_log_start(offset)
        for seg in self._segments:
            self._delete_segment(seg)
        seg = Segment(self.directory, offset, create=True, files=self._files)
        with self._lock:
            self._segments = [seg]
            self._bases = [offset]
            self._end_offset = offset
            self._durable_end_offset = offset
        fsync_dir(self.directory)
        self._sync_new_directory()
        self._voters.clear()
        self._cache.clear()
        self._cache.flush()
        self._set_recovery_point(offset)
        log.info("%s: emptied, restarting at offset %d", self.directory, offset)

    def apply_retention(self, now_ms: int | None = None, max_offset: int | None = None) -> int:
        """Delete the oldest whole segments past retention_ms (by their largest record
        timestamp) or beyond retention_bytes, never the active segment and, if
        ``max_offset`` is given (pass the high watermark), never a segment holding an
        offset at or above it. Moves start_offset and trims the epoch cache. Returns
        the number of segments deleted."""
        self._check_open()
        config = self.config
        if config.retention_ms is None and config.retention_bytes is None:
            return 0
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        with self._flush_lock:
            doomed = 0
            total = self.size_bytes
            for seg in self._segments[:-1]:
                if max_offset is not None and seg.end_offset > max_offset:
                    break
                expired = (
                    config.retention_ms is not None
                    and seg.max_timestamp < now - config.retention_ms
                )
                oversize = (
                    config.retention_bytes is not None
                    and total - seg.size >= config.retention_bytes
                )
                if not (expired or oversize):
                    break
                doomed += 1
                total -= seg.size
            if not doomed:
                return 0
            victims = self._segments[:doomed]
            self._set_log_start(victims[-1].end_offset)
            start = victims[-1].end_offset
            if self._txns is not None:
                if any(first < start for first in self._txns.open_transactions.values()):
                    # A transaction open since a deleted segment: what the log holds now
                    # says where it starts (rare: rebuilt from the headers when next
                    # needed, as a reopen would).
                    self._producers = self._txns = None
                else:
                    self._txns.drop_before(start)
            with self._lock:
                del self._segments[:doomed]
                del self._bases[:doomed]
            for seg in victims:
                self._delete_segment(seg)
            fsync_dir(self.directory)
            self._cache.truncate_from_start(self.start_offset)
            self._cache.flush()
            self._voters.truncate_from_start(self.start_offset)
            log.info(
                "%s: retention deleted %d segment(s); log starts at %d",
                self.directory,
                doomed,
                self.start_offset,
            )
            return doomed

    def _delete_segment(self, seg: Segment) -> None:
        held = self._hold_for_close(seg.path)
        try:
            seg.close()
            _unlink(seg.path)
            _unlink(seg.index_path)
        finally:
            if held is not None and self._close_deleted is not None:
                self._close_deleted(held)

    def _hold_for_close(self, path: str) -> int | None:
        """A descriptor of ``path`` that outlives its unlink, so the unlink only drops
        the name and ``close_deleted`` frees the pages (None: no hook, or no file)."""
        if self._close_deleted is None:
            return None
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    # -- durability ------------------------------------------------------------------

    def flush(self) -> int:
        """Group commit: fsync everything appended before this call (segment data, new
        directory entries, the epoch checkpoint, indexes of sealed segments) and return
        the new durable end offset. Safe to call from a worker thread while the owner
        thread appends. Raises StorageError if the data could not be made durable.

        Built on two halves, which a node-wide flush job uses to cover many logs with
        one sync of their filesystem (``storage.groupflush``): ``begin_flush`` captures
        what is to be made durable, the sync runs, ``PendingFlush.complete`` marks it."""
        pending = self.begin_flush()
        try:
            pending.sync_files()
        except BaseException:
            pending.abandon()
            raise
        return pending.complete()

    def begin_flush(self) -> PendingFlush:
        """First half of ``flush``: capture the end offset to make durable and the files
        to sync for it. Holds this log's flush lock (truncation, retention and close
        wait) until ``complete`` or ``abandon`` of the result, which the same thread
        must call. Raises StorageError if the log is closed."""
        self._flush_lock.acquire()
        try:
            with self._lock:
                self._check_open()
                target = self._end_offset
                work = [
                    (seg, seg.size, seg.sync_generation())
                    for seg in self._segments
                    if seg.synced_size < seg.size
                ]
                # An unmade directory has nothing to sync yet (its first write makes it).
                dir_dirty = self._dir_dirty and not self._unmade
                parent_dirty = self._parent_dirty and dir_dirty
                if dir_dirty:
                    self._dir_dirty = self._parent_dirty = False
                sealed = [seg for seg in self._segments[:-1] if not seg.index_durable]
        except BaseException:
            self._flush_lock.release()
            raise
        return PendingFlush(self, target, work, dir_dirty, sealed, parent_dirty)

    def _complete_flush(self, pending: PendingFlush) -> int:
        try:
            if self._cache.dirty:
                self._cache.flush()
            for seg in pending.sealed:
                atomic_write(seg.index_path, seg.index_bytes())
            if pending.sealed and pending.target > self._recovery_point:
                # A roll: everything below target is durable and was checked when it
                # was appended (the active segment's tail is rescanned after a crash).
                self._set_recovery_point(pending.target)
            if self.config.drop_synced_pages or self._catch_up_offset != UNKNOWN:
                for seg, size, _gen in pending.work:
                    seg.drop_cached(size)
            with self._lock:
                for seg, size, _gen in pending.work:
                    seg.synced_size = max(seg.synced_size, size)
                for seg in pending.sealed:
                    seg.index_durable = True
                self._durable_end_offset = max(self._durable_end_offset, pending.target)
                durable = self._durable_end_offset
            if 0 <= self._catch_up_offset <= durable:
                self._clear_catch_up()
            return durable
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                # A checkpoint or index could not be written: its old file stands, and
                # nothing was claimed durable. The flush can be tried again later.
                raise DiskError(self.directory, exc) from exc
            raise StorageError(f"{self.directory}: flush failed: {exc}") from exc
        finally:
            self._flush_lock.release()

    def _abandon_flush(self, pending: PendingFlush) -> None:
        if pending.dir_dirty:
            with self._lock:
                self._dir_dirty = True  # the next flush syncs the directory again
                self._parent_dirty |= pending.parent_dirty
        self._flush_lock.release()

    def _make_directory(self) -> None:
        """The first write of a log opened before it had a directory: make it (its entry
        is made durable by the next flush, with the directory's own)."""
        if self._unmade:
            fileio.makedirs(self.directory)
            with self._lock:
                self._unmade = False
                self._parent_dirty = True

    def _set_log_start(self, offset: int) -> None:
        """Durably, before deleting segments below ``offset`` (see LOG_START_FILE)."""
        if offset != self._log_start:
            _write_offset_file(self._log_start_path, offset)
            self._sync_new_directory()
            self._log_start = offset

    def _sync_new_directory(self) -> None:
        """Before a write that is durable on return (not left to the next flush): the
        directory's own entry, if the log made it, so the file cannot vanish with it."""
        if self._parent_dirty:
            fsync_dir(os.path.dirname(os.path.abspath(self.directory)))
            with self._lock:
                self._parent_dirty = False

    def _set_recovery_point(self, offset: int) -> None:
        # No file means 0: a new, empty log writes none.
        if offset != self._recovery_point or (
            offset > 0 and not os.path.exists(self._recovery_point_path)
        ):
            _write_offset_file(self._recovery_point_path, offset)
            self._recovery_point = offset

    def _clear_catch_up(self) -> None:
        log.info(
            "%s: caught up past offset %d, the log end before data was lost",
            self.directory,
            self._catch_up_offset,
        )
        self._catch_up_offset = UNKNOWN
        _unlink(self._catch_up_path)

    # -- verification ----------------------------------------------------------------

    def scrub(self, max_bytes: int) -> CorruptDataError | None:
        """Verify (header and payload CRC, offsets continuous) about ``max_bytes`` of
        sealed segments from where the last call stopped, wrapping around to the first
        sealed segment after the last (``scrub_passes`` counts finished passes). Returns
        the first damage found (the cursor stays there) or None. The caller bounds the
        rate by the budget it passes per call."""
        self._check_open()
        sealed = len(self._segments) - 1
        if sealed <= 0:
            self._scrub_at = (-1, 0, 0)
            return None
        base, position, expected = self._scrub_at
        index = bisect.bisect_left(self._bases, base)
        if index >= sealed:
            index, position = 0, 0
        seg = self._segments[index]
        if seg.base_offset != base:
            position, expected = 0, seg.base_offset
        budget = max(max_bytes, 1)
        while budget > 0:
            if position >= seg.size:
                index += 1
                if index >= sealed:
                    self.scrub_passes += 1
                    self._scrub_at = (-1, 0, 0)
                    return None
                seg = self._segments[index]
                position, expected = 0, seg.base_offset
                continue
            data = seg.pread(min(max(budget, HEADER_SIZE), seg.size - position), position)
            budget -= len(data)
            self.scrubbed_bytes += len(data)
            valid, reason = _valid_prefix(data, expected)
            if not valid and len(data) >= HEADER_SIZE and not reason:
                # The first batch is larger than the budget: read it whole.
                try:
                    header = parse_header(data, 0)
                    data = seg.pread(min(header.size, seg.size - position), position)
                    valid, reason = _valid_prefix(data, expected)
                except CorruptRecordError as exc:
                    reason = str(exc)
            if not valid:
                self._scrub_at = (seg.base_offset, position, expected)
                return CorruptDataError(seg.path, expected, position, reason or "torn batch")
            expected = _next_offset_after(data, valid)
            position += valid
        self._scrub_at = (seg.base_offset, position, expected)
        return None

    @staticmethod
    def _detected(exc: CorruptDataError) -> CorruptDataError:
        log.error(
            "%s: damaged batch at offset %d (position %d) found by a read, not served: %s",
            exc.path,
            exc.offset,
            exc.position,
            exc.reason,
        )
        return exc

    def _find_corruption(self, seg: Segment, offset: int, reason: str) -> CorruptDataError:
        """Walk ``seg`` from its nearest index entry at or below ``offset`` and name the
        first damaged batch (an index entry is trusted: it was written with a CRC)."""
        position, expected = seg.index_floor(offset)
        while position < seg.size:
            data = seg.pread(min(8 * 1024 * 1024, seg.size - position), position)
            valid, why = _valid_prefix(data, expected)
            if not valid:
                try:
                    header = parse_header(data, 0)
                    data = seg.pread(header.size, position)
                    valid, why = _valid_prefix(data, expected)
                except CorruptRecordError as exc:
                    why = str(exc)
                if not valid:
                    return CorruptDataError(seg.path, expected, position, why or reason)
            expected = _next_offset_after(data, valid)
            position += valid
        return CorruptDataError(seg.path, expected, position, reason)

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

    # -- recovery --------------------------------------------------------------------

    def _open_cache(self) -> LeaderEpochCache:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        try:
            return LeaderEpochCache(path, auto_flush=False)
        except CorruptCheckpointError as exc:
            log.warning("%s; rebuilding the epoch cache from batch headers", exc)
            _unlink(path)
            cache = LeaderEpochCache(path, auto_flush=False)
            self._rebuild_cache = True
            return cache

    def _open_voters(self) -> VotersCache:
        path = os.path.join(self.directory, VOTERS_FILE)
        try:
            return VotersCache(path)
        except CorruptCheckpointError as exc:
            log.warning("%s; rebuilding the voter sets from the log's control batches", exc)
            _unlink(path)
            self._rebuild_voters = True
            return VotersCache(path)

    def _recover(self) -> None:
        """Open every segment. A segment is trusted without a scan when its index file is
        intact and matches it exactly (written after the segment was fsync'd) and either
        the last shutdown was clean or the segment ends at or below the recovery point
        (after an unclean shutdown every segment past it is CRC-checked, not only the
        last). Other segments, and all after the first one scanned, are scanned batch by
        batch (header + CRC); the epoch cache is rebuilt from their headers. A torn or
        corrupt tail is truncated at the last valid batch; a corrupt batch with valid
        batches after it raises CorruptLogError, or with ``repair`` is cut there after
        recording how far the damaged log reached as ``catch_up_offset``. Finally epoch
        entries past the log end are dropped (KIP-101). Latent damage in trusted
        segments is found by reads (every batch served is CRC-checked) and ``scrub``."""
        directory = self.directory
        if self._unmade:
            self._segments = [Segment(directory, 0, create=True, later=True, files=self._files)]
            self._bases = [0]
            self._dir_dirty = True
            return
        marker = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
        clean = os.path.exists(marker)
        for name in os.listdir(directory):
            if name.endswith(".tmp"):
                _unlink(os.path.join(directory, name))
        bases = sorted(
            int(name[:-4])
            for name in os.listdir(directory)
            if name.endswith(".log") and len(name) == 24 and name[:20].isdigit()
        )
        if not bases:
            self._segments = [Segment(directory, 0, create=True, files=self._files)]
            self._bases = [0]
            # The new segment's directory entry is made durable by the first flush, before
            # anything in it counts (opening 10,000 new replicas costs no fsync each).
            self._dir_dirty = True
            if self._cache.entries:
                self._cache.clear()
                self._cache.flush()
            # The voter record a checkpoint names may have been in a segment whose
            # creation a crash undid (the checkpoint is written before the record).
            self._voters.clear()
            _unlink(marker)
            return
        while len(bases) > 1 and bases[1] <= self._log_start:
            # Retention (or emptying) had begun deleting it when the process stopped.
            log.warning(
                "%s: deleting segment %d below the log start %d",
                directory,
                bases[0],
                self._log_start,
            )
            _unlink(log_path(directory, bases[0]))
            _unlink(index_path(directory, bases[0]))
            del bases[0]
        if self._cache.entries == [] and bases:
            self._rebuild_cache = True
        if not clean:
            log.warning("%s: unclean shutdown, recovering the log tail", directory)
        segments = [Segment(directory, base, create=False, files=self._files) for base in bases]
        _refuse_old_format(segments)
        scanning = False
        cut_at: int | None = None
        for i, seg in enumerate(segments):
            is_last = i == len(segments) - 1
            if (
                not scanning
                and (clean or not is_last)
                and seg.load_index()
                and (clean or seg.end_offset <= self._recovery_point)
            ):
                seg.index_durable = True
                if self._rebuild_cache:
                    self._walk_epochs(seg)
                if self._rebuild_voters:
                    self._walk_voters(seg)
                if not is_last and self._breaks_before(seg, segments[i + 1]):
                    cut_at = i
                    break
                continue
            if not scanning:
                scanning = True
                self._cache.truncate_from_end(seg.base_offset)
            _unlink(seg.index_path)
            if self._scan(seg, segments[i + 1 :]) or (
                not is_last and self._breaks_before(seg, segments[i + 1])
            ):
                cut_at = i
                break
        if cut_at is not None:
            for seg in segments[cut_at + 1 :]:
                log.warning("%s: deleting %s after the truncated tail", directory, seg.path)
                seg.close()
                _unlink(seg.path)
                _unlink(seg.index_path)
            segments = segments[: cut_at + 1]
        self._segments = segments
        self._bases = [seg.base_offset for seg in segments]
        self._cache.truncate_from_end(segments[-1].end_offset)
        self._cache.truncate_from_start(segments[0].base_offset)
        if self._cache.dirty or self._rebuild_cache:
            self._cache.flush()
        self._voters.truncate_from_end(segments[-1].end_offset)
        for seg in segments:
            if scanning and not seg.index_durable:
                # Past the recovery point what survived a process crash may still be in
                # the page cache only: make it durable before it counts as such.
                seg.sync_now()
            seg.synced_size = seg.size
        _unlink(marker)
        fsync_dir(directory)

    def _breaks_before(self, seg: Segment, nxt: Segment) -> bool:
        """Whether the log ends with ``seg`` because ``nxt`` does not continue it. Past
        the recovery point that is a state a crash leaves (segments written since the
        last flush reach the disk in any order, so a later one may hold data an earlier
        one lost): the log is cut there. Below it, data that was fsync'd is missing:
        CorruptLogError (the directory's own entries were fsync'd with that data)."""
        if seg.end_offset == nxt.base_offset:
            return False
        if seg.end_offset >= self._recovery_point:
            log.warning(
                "%s: segment ends at offset %d but %s starts at %d, past the recovery "
                "point %d: an unflushed tail, cut there",
                self.directory,
                seg.end_offset,
                nxt.path,
                nxt.base_offset,
                self._recovery_point,
            )
            return True
        raise CorruptLogError(
            seg.path,
            seg.end_offset,
            seg.size,
            f"segment ends at offset {seg.end_offset} but {nxt.path} starts at "
            f"{nxt.base_offset}, below the recovery point {self._recovery_point} (that "
            "data was fsync'd)",
        )

    def _walk_epochs(self, seg: Segment) -> None:
        position = 0
        while position < seg.size:
            header = seg.header_at(position)
            if header.leader_epoch > self._cache.latest_epoch:
                self._cache.assign(header.leader_epoch, header.base_offset)
            position = header.end

    def _walk_voters(self, seg: Segment) -> None:
        position = 0
        while position < seg.size:
            header = seg.header_at(position)
            if header.is_quorum_control:
                self._recover_voters(seg.pread(header.size, position), header)
            position = header.end

    def _recover_voters(self, batch: bytes | memoryview, header: BatchHeader) -> None:
        """A voter-set record found by recovery: in the checkpoint again (a crash may have
        undone the truncation that removed it, with its data)."""
        record = decode_control(batch)
        if record.key == VOTERS_KEY:
            self._voters.assign(header.base_offset, tuple(record.voters))

    def _scan(self, seg: Segment, later: list[Segment]) -> bool:
        """Validate ``seg`` batch by batch, rebuild its index and the epoch cache tail.
        Returns True if the segment was cut short (its tail was torn)."""
        seg.reset_index()
        file_size = seg.file_size()
        interval = self.config.index_interval_bytes
        position = 0
        expected = seg.base_offset
        chunk = 8 * 1024 * 1024
        while position < file_size:
            reason = ""
            raw = seg.pread(min(chunk, file_size - position), position)
            try:
                header = parse_header(raw, 0)
                if header.size > len(raw):
                    raw = seg.pread(header.size, position)
                validate_payload(raw, header)
                if header.base_offset != expected:
                    reason = f"base offset {header.base_offset} does not continue the log"
            except CorruptRecordError as exc:
                reason = f"{exc} (position relative to the batch start)"
            if reason:
                self._handle_corruption(seg, position, expected, reason, file_size, later)
                seg.size = position
                return True
            # Every batch in this chunk is checked the same way without re-reading.
            view = memoryview(raw)
            local = 0
            while True:
                if header.leader_epoch > self._cache.latest_epoch:
                    self._cache.assign(header.leader_epoch, header.base_offset)
                if header.is_quorum_control:
                    self._recover_voters(view[local : local + header.size], header)
                seg.track(
                    position + local,
                    header.base_offset,
                    header.next_offset,
                    header.size,
                    header.max_timestamp,
                    interval,
                )
                expected = header.next_offset
                local += header.size
                if len(view) - local < HEADER_SIZE:
                    break
                try:
                    nxt = parse_header(view, local)
                    if nxt.end > len(view):
                        break
                    validate_payload(view, nxt)
                    if nxt.base_offset != expected:
                        break
                except CorruptRecordError:
                    break
                header = nxt
            position += local
        return False

    def _handle_corruption(
        self,
        seg: Segment,
        position: int,
        expected: int,
        reason: str,
        file_size: int,
        later: list[Segment],
    ) -> None:
        follower = _find_valid_batch(seg, position + 8, file_size)
        # Later segments' data counts only below the recovery point: past it, they may
        # hold writes that reached the disk before this segment's (see _breaks_before).
        if follower is None and expected < self._recovery_point:
            for other in later:
                other_size = other.file_size()
                if other_size and _find_valid_batch(other, 0, other_size) is not None:
                    follower = 0
                    break
        if follower is not None and not self._repair:
            raise CorruptLogError(seg.path, expected, position, reason)
        if follower is not None:
            # Valid data follows: this is damage, not a torn tail. Remember how far the
            # log reached, durably, before cutting it (see catch_up_offset).
            lost_end = max(
                [_max_valid_end(seg, position + 8, file_size)]
                + [_max_valid_end(other, 0, other.file_size()) for other in later]
            )
            if lost_end > max(self._catch_up_offset, expected):
                _write_offset_file(self._catch_up_path, lost_end)
                self._catch_up_offset = lost_end
            log.error(
                "%s: corrupt batch at offset %d (position %d): %s; truncating the log "
                "there, it must catch up past offset %d from the leader",
                seg.path,
                expected,
                position,
                reason,
                lost_end,
            )
        log.warning(
            "%s: truncating at position %d (offset %d): %s", seg.path, position, expected, reason
        )
        seg.truncate_file(position)


def _valid_prefix(data: bytes, expected: int | None = None) -> tuple[int, str]:
    """Length of the longest prefix of whole, intact batches (header and payload CRC;
    base offsets continuing from ``expected`` when given) and why it stops ("" when it
    stops at a batch cut off by the end of ``data``, or at the end)."""
    position = 0
    total = len(data)
    while position < total:
        try:
            header = parse_header(data, position)
        except CorruptRecordError as exc:
            if total - position < HEADER_SIZE:
                return position, ""
            return position, str(exc)
        if header.end > total:
            return position, ""
        try:
            validate_payload(data, header)
        except CorruptRecordError as exc:
            return position, str(exc)
        if expected is not None:
            if header.base_offset != expected:
                return position, f"base offset {header.base_offset}, expected {expected}"
            expected = header.next_offset
        position = header.end
    return position, ""


def _next_offset_after(data: bytes, length: int) -> int:
    """Next offset after the whole batches in ``data[:length]`` (length > 0)."""
    last = 0
    position = 0
    while position < length:
        last = position
        position = parse_header(data, position).end
    return parse_header(data, last).next_offset


def _max_valid_end(seg: Segment, start: int, file_size: int) -> int:
    """Largest next offset of any intact batch at an 8-aligned position in
    [start, file_size) (-1 if none): how far a damaged segment's data reached."""
    start += (-start) % 8
    if start >= file_size:
        return -1
    data = seg.pread(file_size - start, start)
    best = -1
    found = data.find(MAGIC)
    while found >= 0:
        nxt = found + 1
        if found % 8 == 0:
            try:
                header = parse_header(data, found)
                validate_payload(data, header)
                best = max(best, header.next_offset)
                nxt = header.end
            except CorruptRecordError:
                pass
        found = data.find(MAGIC, nxt)
    return best


def _read_offset_file(path: str, default: int) -> int:
    try:
        with open(path, "rb") as fh:
            lines = fh.read().split()
    except FileNotFoundError:
        return default
    try:
        if len(lines) != 2 or int(lines[0]) != _OFFSET_FILE_VERSION or int(lines[1]) < 0:
            raise ValueError(lines)
        return int(lines[1])
    except ValueError:
        log.warning("%s is malformed; ignoring it", path)
        return default


def _write_offset_file(path: str, offset: int) -> None:
    atomic_write(path, f"{_OFFSET_FILE_VERSION}\n{offset}\n".encode())


def _find_valid_batch(seg: Segment, start: int, file_size: int) -> int | None:
    """Position of a valid batch (header and payload CRC) at an 8-aligned position in
    [start, file_size), searching for the magic; None if there is none."""
    start += (-start) % 8
    if start >= file_size:
        return None
    data = seg.pread(file_size - start, start)
    found = data.find(MAGIC)
    while found >= 0:
        if found % 8 == 0:
            try:
                header = parse_header(data, found)
                validate_payload(data, header)
                return start + found
            except CorruptRecordError:
                pass
        found = data.find(MAGIC, found + 1)
    return None


def _refuse_old_format(segments: list[Segment]) -> None:
    """A log written in batch format 1 is not damage: refuse it whole, truncate nothing."""
    for seg in segments:
        if seg.size and seg.pread(len(MAGIC_V1), 0) == MAGIC_V1:
            for other in segments:
                other.close()
            raise UnsupportedFormatError(
                f"{seg.path}: written in quorumlog's batch format 1, which this version "
                "does not read; nothing was changed (run the version that wrote it)"
            )


def _producer_batch(header: BatchHeader, base_offset: int) -> ProducerBatch:
    """The producer-state entry of a batch with producer fields appended at ``base_offset``."""
    assert header.producer is not None
    _, epoch, first = header.producer
    last = base_offset + header.record_count - 1
    return ProducerBatch(epoch, first, last_sequence(first, header.record_count), base_offset, last)


def _writev_all(fd: int, buffers: list[bytes | memoryview]) -> None:
    pending = [memoryview(b) for b in buffers]
    first = 0
    while first < len(pending):
        written = fileio.writev(fd, pending[first : first + _IOV_MAX])
        while written:
            head = pending[first]
            if written >= len(head):
                written -= len(head)
                first += 1
            else:
                pending[first] = head[written:]
                written = 0


def _unlink(path: str) -> None:
    try:
        fileio.unlink(path)
    except FileNotFoundError:
        pass
