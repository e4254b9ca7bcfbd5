"""Opening a ``Log``: its checkpoints, and recovery after an unclean shutdown (the tail
scanned, a torn tail cut, damage repaired or refused). A role of ``Log`` (see ``log.py``)."""

# Methods here run on a Log, which subclasses this role: mypy takes that self type
# but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from .cleaner import recover_swap
from .epoch_cache import CHECKPOINT_FILE, LeaderEpochCache
from .errors import (
    CorruptCheckpointError,
    CorruptLogError,
    CorruptRecordError,
    UnsupportedFormatError,
)
from .fileutil import fsync_dir
from .log_fields import LogFields
from .log_files import (
    CLEAN_SHUTDOWN_FILE,
    unlink_quietly,
    write_offset_file,
)
from .records import (
    HEADER_SIZE,
    MAGIC,
    MAGIC_V1,
    VOTERS_KEY,
    BatchHeader,
    decode_control,
    parse_header,
    validate_payload,
)
from .segment import Segment, index_path, log_path
from .voters_cache import VOTERS_FILE, VotersCache

if TYPE_CHECKING:
    from .log import Log

log = logging.getLogger(__name__)


class RecoveryRole(LogFields):
    # -- recovery --------------------------------------------------------------------

    def _open_cache(self: Log) -> LeaderEpochCache:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        try:
            return LeaderEpochCache(path, auto_flush=False)
        except CorruptCheckpointError as exc:
            log.warning("%s; rebuilding the epoch cache from batch headers", exc)
            unlink_quietly(path)
            cache = LeaderEpochCache(path, auto_flush=False)
            self._rebuild_cache = True
            return cache

    def _open_voters(self: Log) -> VotersCache:
        path = os.path.join(self.directory, VOTERS_FILE)
        try:
            return VotersCache(path)
        except CorruptCheckpointError as exc:
            log.warning("%s; rebuilding the voter sets from the log's control batches", exc)
            unlink_quietly(path)
            self._rebuild_voters = True
            return VotersCache(path)

    def _recover(self: Log) -> None:
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
                unlink_quietly(os.path.join(directory, name))
        recover_swap(directory)  # a clean's swap a crash interrupted: finished or undone
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
            unlink_quietly(marker)
            return
        while len(bases) > 1 and bases[1] <= self._log_start:
            # Retention (or emptying) had begun deleting it when the process stopped.
            log.warning(
                "%s: deleting segment %d below the log start %d",
                directory,
                bases[0],
                self._log_start,
            )
            unlink_quietly(log_path(directory, bases[0]))
            unlink_quietly(index_path(directory, bases[0]))
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
            unlink_quietly(seg.index_path)
            if self._scan(seg, segments[i + 1 :]) or (
                not is_last and self._breaks_before(seg, segments[i + 1])
            ):
                cut_at = i
                break
        if cut_at is not None:
            for seg in segments[cut_at + 1 :]:
                log.warning("%s: deleting %s after the truncated tail", directory, seg.path)
                seg.close()
                unlink_quietly(seg.path)
                unlink_quietly(seg.index_path)
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
        unlink_quietly(marker)
        fsync_dir(directory)

    def _breaks_before(self: Log, seg: Segment, nxt: Segment) -> bool:
        """Whether the log ends with ``seg`` because ``nxt`` does not continue it. Past
        the recovery point that is a state a crash leaves (segments written since the
        last flush reach the disk in any order, so a later one may hold data an earlier
        one lost): the log is cut there. Below it, data that was fsync'd is missing:
        CorruptLogError (the directory's own entries were fsync'd with that data)."""
        if self.continues(seg.end_offset, nxt.base_offset):
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

    def _walk_epochs(self: Log, seg: Segment) -> None:
        position = 0
        while position < seg.size:
            header = seg.header_at(position)
            if header.leader_epoch > self._cache.latest_epoch:
                self._cache.assign(header.leader_epoch, header.base_offset)
            position = header.end

    def _walk_voters(self: Log, seg: Segment) -> None:
        position = 0
        while position < seg.size:
            header = seg.header_at(position)
            if header.is_quorum_control:
                self._recover_voters(seg.pread(header.size, position), header)
            position = header.end

    def _recover_voters(self: Log, batch: bytes | memoryview, header: BatchHeader) -> None:
        """A voter-set record found by recovery: in the checkpoint again (a crash may have
        undone the truncation that removed it, with its data)."""
        record = decode_control(batch)
        if record.key == VOTERS_KEY:
            self._voters.assign(header.base_offset, tuple(record.voters))

    def _scan(self: Log, seg: Segment, later: list[Segment]) -> bool:
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
                if not self.continues(expected, header.base_offset):
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
                    if not self.continues(expected, nxt.base_offset):
                        break
                except CorruptRecordError:
                    break
                header = nxt
            position += local
        return False

    def _handle_corruption(
        self: Log,
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
                write_offset_file(self._catch_up_path, lost_end)
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
