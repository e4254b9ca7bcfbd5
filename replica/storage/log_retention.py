"""Truncation (to an offset, at corruption, emptying) and retention of a ``Log``; the
catch-up floor. A role of ``Log`` (see ``log.py``)."""

# Methods here run on a Log, which subclasses this role: mypy takes that self type
# but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import bisect
import logging
import os
import time
from typing import TYPE_CHECKING

from ..constants import UNKNOWN
from .fileutil import fsync_dir
from .log_fields import LogFields
from .log_files import (
    unlink_quietly,
    write_offset_file,
)
from .segment import Segment
from .types import CATCH_UP_UNKNOWN

if TYPE_CHECKING:
    from .log import Log

log = logging.getLogger(__name__)


class TruncationRole(LogFields):
    # -- truncation and retention ----------------------------------------------------

    def truncate_to(self: Log, offset: int) -> None:
        """Remove every record at or above ``offset``. If ``offset`` falls inside a batch
        the whole batch goes (batches are never split), so end_offset may end up below
        ``offset``. Below start_offset the log is emptied and restarts at ``offset``.
        The truncation is fsync'd before returning."""
        self._check_open()
        with self._flush_lock:
            self._truncate_locked(offset)

    def _truncate_locked(self: Log, offset: int) -> None:
        if offset >= self._end_offset:
            return
        self._tail.clear()
        self._producers = self._txns = None  # rebuilt from what is left when next needed
        with self._lock:
            self._truncations += 1  # a clean being prepared read what this changes
        if offset < self.start_offset:
            self._truncate_fully(offset)
            return
        index = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[index]
        if offset >= seg.end_offset:  # in a gap a clean left after the segment's last batch
            position, end = seg.size, offset
        else:
            batch = seg.locate_lenient(offset)
            # Inside a cleaned gap the batch found starts past the offset.
            position, end = batch.position, min(batch.base_offset, offset)
        # First lower the recovery point: a crash part-way through leaves a cut segment
        # before later ones, which recovery then cuts again (_breaks_before), not refuses.
        self._set_recovery_point(min(self._recovery_point, end))
        # And the cleaned end: later segments a crash kept are not a clean's gap then.
        self._set_cleaned_end(min(self._cleaned_end, end))
        for later in self._segments[index + 1 :]:
            self._delete_segment(later)
        unlink_quietly(seg.index_path)
        seg.truncate_file(position)
        with self._lock:
            del self._segments[index + 1 :]
            del self._bases[index + 1 :]
            seg.index_durable = False
            seg.truncate_index(position)
            self._end_offset = end
            self._durable_end_offset = min(self._durable_end_offset, end)
        fsync_dir(self.directory)
        self._cache.truncate_from_end(end)
        self._cache.flush()
        self._voters.truncate_from_end(end)
        log.info("%s: truncated to offset %d", self.directory, end)

    def truncate_corrupt(self: Log, offset: int) -> None:
        """Repair latent corruption found at ``offset``: durably remember the durable
        end as ``catch_up_offset`` (what the replica may have acknowledged), then
        ``truncate_to(offset)``. A crash in between leaves the mark and the damaged
        batch, which is found again."""
        self._check_open()
        with self._flush_lock:
            floor = max(self._catch_up_offset, self._durable_end_offset)
            if offset < floor and floor != self._catch_up_offset:
                self._make_directory()
                write_offset_file(self._catch_up_path, floor)
                self._sync_new_directory()
                self._catch_up_offset = floor
            self._truncate_locked(offset)

    def mark_catch_up(self: Log, floor: int) -> None:
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
            write_offset_file(self._catch_up_path, new)
            self._sync_new_directory()
            self._catch_up_offset = new
            log.info(
                "%s: catching up%s",
                self.directory,
                " (floor unknown)" if new == CATCH_UP_UNKNOWN else f" to offset {new}",
            )

    def _truncate_fully(self: Log, offset: int) -> None:
        self._make_directory()
        self._set_recovery_point(min(self._recovery_point, offset))
        self._set_cleaned_end(min(self._cleaned_end, offset))
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

    def apply_retention(self: Log, now_ms: int | None = None, max_offset: int | None = None) -> int:
        """Delete the oldest whole segments past retention_ms (by their largest record
        timestamp) or beyond retention_bytes, never the active segment and, if
        ``max_offset`` is given (pass the high watermark), never a segment holding an
        offset at or above it. Moves start_offset and trims the epoch cache. Returns
        the number of segments deleted."""
        self._check_open()
        config = self.config
        if not config.deletes or (config.retention_ms is None and config.retention_bytes is None):
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

    def _delete_segment(self: Log, seg: Segment) -> None:
        held = self._hold_for_close(seg.path)
        try:
            seg.close()
            unlink_quietly(seg.path)
            unlink_quietly(seg.index_path)
        finally:
            if held is not None and self._close_deleted is not None:
                self._close_deleted(held)

    def _hold_for_close(self: Log, path: str) -> int | None:
        """A descriptor of ``path`` that outlives its unlink, so the unlink only drops
        the name and ``close_deleted`` frees the pages (None: no hook, or no file)."""
        if self._close_deleted is None:
            return None
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
