"""Durability of a ``Log``: group-commit flush in two halves (``PendingFlush``) and the
small offset files written durably. A role of ``Log`` (see ``log.py``)."""

# Methods here run on a Log, which subclasses this role: mypy takes that self type
# but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import errno
import logging
import os
from typing import TYPE_CHECKING

from ..constants import UNKNOWN
from . import fileio
from .errors import (
    DiskError,
    StorageError,
)
from .fileutil import atomic_write, fsync_dir
from .log_fields import LogFields
from .log_files import (
    unlink_quietly,
    write_offset_file,
)
from .segment import Segment

if TYPE_CHECKING:
    from .log import Log

log = logging.getLogger(__name__)


class FlushRole(LogFields):
    # -- durability ------------------------------------------------------------------

    def flush(self: Log) -> int:
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

    def begin_flush(self: Log) -> PendingFlush:
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

    def _complete_flush(self: Log, pending: PendingFlush) -> int:
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

    def _abandon_flush(self: Log, pending: PendingFlush) -> None:
        if pending.dir_dirty:
            with self._lock:
                self._dir_dirty = True  # the next flush syncs the directory again
                self._parent_dirty |= pending.parent_dirty
        self._flush_lock.release()

    def _make_directory(self: Log) -> None:
        """The first write of a log opened before it had a directory: make it (its entry
        is made durable by the next flush, with the directory's own)."""
        if self._unmade:
            fileio.makedirs(self.directory)
            with self._lock:
                self._unmade = False
                self._parent_dirty = True

    def _set_log_start(self: Log, offset: int) -> None:
        """Durably, before deleting segments below ``offset`` (see LOG_START_FILE)."""
        if offset != self._log_start:
            write_offset_file(self._log_start_path, offset)
            self._sync_new_directory()
            self._log_start = offset

    def _set_cleaned_end(self: Log, offset: int) -> None:
        """Durably (see CLEANER_OFFSET_FILE): before a clean's segments or a follower's
        gap are written, or before a truncation removes cleaned ones."""
        if offset != self._cleaned_end:
            self._make_directory()
            write_offset_file(self._cleaner_offset_path, offset)
            self._sync_new_directory()
            self._cleaned_end = offset

    def _sync_new_directory(self: Log) -> None:
        """Before a write that is durable on return (not left to the next flush): the
        directory's own entry, if the log made it, so the file cannot vanish with it."""
        if self._parent_dirty:
            fsync_dir(os.path.dirname(os.path.abspath(self.directory)))
            with self._lock:
                self._parent_dirty = False

    def _set_recovery_point(self: Log, offset: int) -> None:
        # No file means 0: a new, empty log writes none.
        if offset != self._recovery_point or (
            offset > 0 and not os.path.exists(self._recovery_point_path)
        ):
            write_offset_file(self._recovery_point_path, offset)
            self._recovery_point = offset

    def _clear_catch_up(self: Log) -> None:
        log.info(
            "%s: caught up past offset %d, the log end before data was lost",
            self.directory,
            self._catch_up_offset,
        )
        self._catch_up_offset = UNKNOWN
        unlink_quietly(self._catch_up_path)


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
