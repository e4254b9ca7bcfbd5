"""The log cleaner (Kafka's LogCleaner, for ``cleanup.policy=compact``): rewrites the
sealed segments below a log's cleanable end keeping the records ``storage.compaction``
says survive, with their original offsets, and swaps the result in, crash safe.

A clean has two halves, so that a node runs the slow one off its event loop:

* ``prepare_clean`` (any thread): reads the sealed segments below the cleanable end
  (the owner thread's appends never touch them), computes the survivors over all of
  them at once (Arrow), and writes each group of consecutive segments (up to
  ``segment.bytes`` of what they keep) as one new segment ``<base>.log.cleaned`` with its index
  ``<base>.index.cleaned``, both fsync'd: the ``CleanPlan``. The kept records of
  consecutive batches that share a header become one batch at the first one's offset,
  sparse where they leave gaps (``clean_batches``, which also says what is copied byte
  for byte and what is never merged).
* ``swap_clean`` (the log's owner thread): checks the segments are still those the
  plan read (retention or a truncation may have removed them: the plan is dropped),
  raises the durable ``cleaned_end`` (gaps below it are a clean's, not damage), writes
  the swap manifest ``cleaner-swap`` (the commit point: each group's base and the
  bases it replaces), renames every ``.cleaned`` file over its group's first segment
  and deletes the group's others, fsyncs the directory and removes the manifest.

Recovery (``recover_swap``, before the log lists its segments) finishes a swap whose
manifest it finds (renames what is left, deletes the replaced segments; every step
is idempotent) and otherwise deletes ``.cleaned`` files: the log then reads as either
the uncleaned or the cleaned log, never a mix of the two (a mix could bring back a
value a dropped tombstone deleted).

What a clean keeps besides the latest record of each key (``compaction.survivors``):
control batches (voter sets, leader changes, transaction markers) and each
producer's last batch, whole, so the producer state a restart rebuilds from the log is
the one it had. The epoch cache is not touched: it does not depend on which records
remain.
"""

# Methods here run on a Log, which subclasses this role: mypy takes that self type
# but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import compaction, fileio
from .clean_batches import SourceBatch, kept_batch, layout
from .errors import CorruptRecordError, StorageError
from .fileutil import atomic_write, fsync_dir
from .log_append import _MAX_RELATIVE, _writev_all
from .log_fields import LogFields
from .log_files import unlink_quietly
from .records import (
    HEADER_SIZE,
    BatchHeader,
    batches_to_table,
    iter_batches,
    parse_header,
)
from .segment import Segment, index_path, log_path
from .transactions import AbortedTxn

if TYPE_CHECKING:
    from .log import Log

__all__ = ["CLEANED_SUFFIX", "SWAP_FILE", "CleanPlan", "CleanStats", "DirtyState", "recover_swap"]

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_FILE = "cleaner-swap"
_SWAP_VERSION = "0"
_CHUNK = 8 * 1024 * 1024
_NO_KEYS = pa.nulls(0, pa.binary())  # not pa.array: see node.keep_pandas_out


@dataclass
class CleanStats:
    """What a clean did (bytes of segment files read and written)."""

    cleanable_end: int = 0
    segments: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0


@dataclass
class DirtyState:
    """A log's standing for the cleaner (``Log.dirty_state``)."""

    cleanable_end: int
    clean_bytes: int
    dirty_bytes: int
    ratio: float
    due: bool


@dataclass
class _Group:
    sources: list[Segment]
    output: Segment


@dataclass
class CleanPlan:
    """The cleaned segments written, not yet swapped in (``Log.swap_clean``)."""

    cleanable_end: int
    truncations: int  # the log's count when the plan began (a truncation drops it)
    groups: list[_Group] = field(default_factory=list)
    stats: CleanStats = field(default_factory=CleanStats)


class CleanerRole(LogFields):
    def clean_point(
        self: Log, high_watermark: int, last_stable_offset: int | None, now_ms: int
    ) -> int:
        """The cleanable end now (``compaction.cleanable_end``), also never past what is
        durable and trusted (the recovery point): a clean rewrites only what a restart
        would not rescan."""
        with self._lock:
            segments = list(self._segments)
        limit = min(high_watermark, self._recovery_point, self._durable_end_offset)
        return compaction.cleanable_end(
            [seg.base_offset for seg in segments],
            [seg.max_timestamp for seg in segments],
            high_watermark=limit,
            last_stable_offset=last_stable_offset,
            now_ms=now_ms,
            min_compaction_lag_ms=self.config.min_compaction_lag_ms,
        )

    def capped_end(self: Log, end: int, max_dirty_bytes: int) -> int:
        """``compaction.capped_end`` of this log: one round of a large backlog."""
        with self._lock:
            segments = list(self._segments)
        return compaction.capped_end(
            [seg.base_offset for seg in segments],
            [seg.size for seg in segments],
            end,
            self._cleaned_end,
            max_dirty_bytes,
        )

    def dirty_state(
        self: Log, high_watermark: int, last_stable_offset: int | None, now_ms: int
    ) -> DirtyState:
        """Clean and dirty bytes below the cleanable end, and whether a clean is due
        (``compaction.should_clean``). Any thread."""
        end = self.clean_point(high_watermark, last_stable_offset, now_ms)
        with self._lock:
            segments = list(self._segments)
        clean = dirty = 0
        oldest = -1
        for i, seg in enumerate(segments[:-1]):
            if segments[i + 1].base_offset > end:
                break
            if segments[i + 1].base_offset <= self._cleaned_end:
                clean += seg.size
            else:
                dirty += seg.size
                if oldest < 0:
                    oldest = seg.max_timestamp
        config = self.config
        due = compaction.should_clean(
            clean_bytes=clean,
            dirty_bytes=dirty,
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            oldest_dirty_timestamp=oldest,
            now_ms=now_ms,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
        )
        return DirtyState(end, clean, dirty, compaction.dirty_ratio(clean, dirty), due)

    def clean_inputs(self: Log) -> tuple[list[AbortedTxn], set[int]]:
        """Owner thread: what ``prepare_clean`` needs from the producer state (the
        aborted transactions, and the first offsets of the producers' batches it
        remembers, each kept whole)."""
        table = self.producer_state()
        aborted = list(self.transactions().aborted)
        return aborted, table.kept_batch_offsets()

    def clean(
        self: Log,
        high_watermark: int,
        last_stable_offset: int | None = None,
        now_ms: int | None = None,
    ) -> CleanStats | None:
        """Clean the log below its cleanable end, both halves in this (the owner)
        thread. None: nothing to clean (or the log changed meanwhile)."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        end = self.clean_point(high_watermark, last_stable_offset, now)
        aborted, pinned = self.clean_inputs()
        plan = self.prepare_clean(end, now, aborted=aborted, pinned=pinned)
        return None if plan is None else self.swap_clean(plan)

    # -- the rewrite -------------------------------------------------------------------

    def prepare_clean(
        self: Log,
        end: int,
        now_ms: int,
        *,
        aborted: Sequence[AbortedTxn],
        pinned: set[int],
        throttle: Callable[[int], None] | None = None,
    ) -> CleanPlan | None:
        """Write the cleaned segments below ``end`` (a segment boundary from
        ``clean_point``): see the module's docstring. Any thread; ``throttle`` is
        called with each chunk's bytes read or written (it may sleep). None: nothing
        below ``end``, or a segment went away meanwhile (retention, truncation)."""
        with self._lock:
            truncations = self._truncations
            sources = [
                seg
                for i, seg in enumerate(self._segments[:-1])
                if self._segments[i + 1].base_offset <= end
            ]
        if not sources:
            return None
        pace = throttle or (lambda _n: None)
        plan = CleanPlan(end, truncations)
        try:
            batches, columns = self._read_for_clean(sources, aborted, pinned, plan.stats, pace)
            if not batches:
                return None
            keep = compaction.survivors(
                columns["offset"],
                columns["key"],
                columns["value"],
                columns["timestamp"],
                cleanable_end=end,
                now_ms=now_ms,
                delete_retention_ms=self.config.delete_retention_ms,
                aborted=columns["aborted"],
                pinned=columns["pinned"],
            )
            mask = keep.to_numpy(zero_copy_only=False)
            plan.stats.records_kept = int(mask.sum())
            kept = _kept_bytes(len(sources), batches, mask)
            for group in _groups(sources, kept, self.config.segment_bytes):
                plan.groups.append(
                    self._write_group_cleaned(group, sources, batches, mask, plan, pace)
                )
        except (OSError, StorageError, CorruptRecordError) as exc:
            log.warning("%s: clean abandoned: %s", self.directory, exc)
            discard_plan(plan)
            return None
        plan.stats.segments = len(sources)
        plan.stats.cleanable_end = end
        return plan

    def _read_for_clean(
        self: Log,
        sources: list[Segment],
        aborted: Sequence[AbortedTxn],
        pinned: set[int],
        stats: CleanStats,
        pace: Callable[[int], None],
    ) -> tuple[list[SourceBatch], dict[str, pa.Array]]:
        """Every batch of ``sources`` and the columns the rules read (keys and the
        values' nulls copied out of the segment bytes, which are then let go)."""
        batches: list[SourceBatch] = []
        keys: list[pa.Array] = []
        values: list[pa.Array] = []
        stamps: list[pa.Array] = []
        offsets: list[pa.Array] = []
        batch_aborted: list[bool] = []
        batch_pinned: list[bool] = []
        counts: list[int] = []
        by_producer: dict[int, list[AbortedTxn]] = {}
        for txn in aborted:
            by_producer.setdefault(txn.producer_id, []).append(txn)
        rows = 0
        for number, seg in enumerate(sources):
            for position, chunk in _chunks(seg):
                stats.bytes_read += len(chunk)
                pace(len(chunk))
                table = batches_to_table(chunk, include_control=True)
                for header in iter_batches(chunk):
                    batches.append(SourceBatch(header, number, position + header.position, rows))
                    rows += header.record_count
                    counts.append(header.record_count)
                    batch_pinned.append(header.is_control or header.base_offset in pinned)
                    batch_aborted.append(
                        header.is_transactional
                        and not header.is_control
                        and any(
                            txn.first_offset <= header.base_offset < txn.last_offset
                            for txn in by_producer.get(header.producer_id, ())
                        )
                    )
                # Copied, so that the chunk's bytes are let go.
                keys.append(pa.concat_arrays([*table.column("key").chunks, _NO_KEYS]))
                values.append(table.column("value").combine_chunks().is_null())
                stamps.append(table.column("timestamp").combine_chunks().cast(pa.int64()))
                offsets.append(table.column("offset").combine_chunks())
        stats.records_read = rows
        repeats = np.asarray(counts, dtype=np.int64)
        # The rules read the values only for their nulls (tombstones): empty stand-ins.
        nulls = pa.concat_arrays(values) if values else pa.array([], pa.bool_())
        columns = {
            "key": pa.concat_arrays(keys) if keys else _NO_KEYS,
            "value": pc.if_else(nulls, pa.scalar(None, pa.binary()), pa.scalar(b"", pa.binary())),
            "timestamp": pa.concat_arrays(stamps) if stamps else pa.array([], pa.int64()),
            "offset": pa.concat_arrays(offsets) if offsets else pa.array([], pa.int64()),
            "aborted": pa.array(np.repeat(np.asarray(batch_aborted, dtype=bool), repeats)),
            "pinned": pa.array(np.repeat(np.asarray(batch_pinned, dtype=bool), repeats)),
        }
        return batches, columns

    def _write_group_cleaned(
        self: Log,
        group: list[Segment],
        sources: list[Segment],
        batches: list[SourceBatch],
        mask: np.ndarray,
        plan: CleanPlan,
        pace: Callable[[int], None],
    ) -> _Group:
        base = group[0].base_offset
        for path in (log_path(self.directory, base), index_path(self.directory, base)):
            unlink_quietly(path + CLEANED_SUFFIX)  # a plan abandoned before
        out = Segment(self.directory, base, create=True, files=self._files, suffix=CLEANED_SUFFIX)
        result = _Group(group, out)
        numbers = {sources.index(seg) for seg in group}
        interval = self.config.index_interval_bytes
        pending: list[tuple[BatchHeader, bytes]] = []
        pending_bytes = 0
        mine = [batch for batch in batches if batch.source in numbers]
        for run, whole in layout(mine, mask):
            first, last = run[0], run[-1]
            seg = sources[first.source]
            raw = seg.pread(last.position + last.header.size - first.position, first.position)
            if whole:
                pending.append((first.header._replace(position=0), raw))
            else:
                rows = mask[first.first_row : last.first_row + last.header.record_count]
                pending.append(kept_batch(raw, first.header, rows))
            pending_bytes += pending[-1][0].size
            if pending_bytes >= _CHUNK:
                _append(out, pending, interval, plan.stats, pace)
                pending, pending_bytes = [], 0
        _append(out, pending, interval, plan.stats, pace)
        out.sync_now()
        atomic_write(out.index_path, out.index_bytes())
        out.close()
        return result

    # -- the swap ----------------------------------------------------------------------

    def swap_clean(self: Log, plan: CleanPlan) -> CleanStats | None:
        """Swap a plan's segments in (owner thread): see the module's docstring. None
        (the plan dropped) if its segments are no longer the log's."""
        self._check_open()
        with self._flush_lock:
            with self._lock:
                current = list(self._segments)
            ids = [id(seg) for seg in current]
            starts: list[int] = []
            for group in plan.groups:
                if id(group.sources[0]) not in ids:
                    break
                at = ids.index(id(group.sources[0]))
                if [id(s) for s in current[at : at + len(group.sources)]] != [
                    id(s) for s in group.sources
                ] or at + len(group.sources) >= len(current):
                    break
                starts.append(at)
            if len(starts) != len(plan.groups) or plan.truncations != self._truncations:
                log.info("%s: the log changed during a clean; dropping it", self.directory)
                discard_plan(plan)
                return None
            self._set_cleaned_end(max(self._cleaned_end, plan.cleanable_end))
            manifest = os.path.join(self.directory, SWAP_FILE)
            lines = [_SWAP_VERSION] + [
                " ".join(str(seg.base_offset) for seg in group.sources) for group in plan.groups
            ]
            atomic_write(manifest, ("\n".join(lines) + "\n").encode())
            _finish(self.directory, [[s.base_offset for s in g.sources] for g in plan.groups])
            unlink_quietly(manifest)
            fsync_dir(self.directory)
            fresh: list[Segment] = []
            for group in plan.groups:
                for seg in group.sources:
                    seg.close()
                seg = Segment(
                    self.directory, group.sources[0].base_offset, create=False, files=self._files
                )
                if not seg.load_index():
                    raise StorageError(f"{seg.path}: the cleaned segment's index does not match it")
                seg.index_durable = True
                fresh.append(seg)
            with self._lock:
                segments = list(self._segments)
                for group, seg in sorted(
                    zip(plan.groups, fresh, strict=True),
                    key=lambda pair: -segments.index(pair[0].sources[0]),
                ):
                    at = segments.index(group.sources[0])
                    segments[at : at + len(group.sources)] = [seg]
                self._segments = segments
                self._bases = [seg.base_offset for seg in segments]
            self._tail.clear()
            self._scrub_at = (-1, 0, 0)  # its position was in a file replaced now
        log.info(
            "%s: cleaned below offset %d: %d segment(s), %d -> %d bytes, %d of %d records kept",
            self.directory,
            plan.cleanable_end,
            plan.stats.segments,
            plan.stats.bytes_read,
            plan.stats.bytes_written,
            plan.stats.records_kept,
            plan.stats.records_read,
        )
        return plan.stats


def discard_plan(plan: CleanPlan) -> None:
    """Delete a plan's written files (it will not be swapped in)."""
    for group in plan.groups:
        group.output.close()
        unlink_quietly(group.output.path)
        unlink_quietly(group.output.index_path)


def _finish(directory: str, groups: list[list[int]]) -> None:
    """Each group's cleaned files renamed over its first segment, its others deleted
    (idempotent: recovery runs it again on whatever a crash left)."""
    for bases in groups:
        first = bases[0]
        for final in (log_path(directory, first), index_path(directory, first)):
            if os.path.exists(final + CLEANED_SUFFIX):
                fileio.replace(final + CLEANED_SUFFIX, final)
        for other in bases[1:]:
            unlink_quietly(log_path(directory, other))
            unlink_quietly(index_path(directory, other))


def recover_swap(directory: str) -> None:
    """Recovery's part: finish a swap whose manifest is there, else delete cleaned files
    a clean left (it had not reached its commit point)."""
    manifest = os.path.join(directory, SWAP_FILE)
    groups: list[list[int]] | None = None
    try:
        with open(manifest, "rb") as fh:
            lines = fh.read().decode().split("\n")
    except FileNotFoundError:
        lines = []
    if lines:
        try:
            if lines[0] != _SWAP_VERSION:
                raise ValueError(lines[0])
            groups = [[int(b) for b in line.split()] for line in lines[1:] if line.strip()]
        except ValueError:
            groups = None  # atomic_write: a manifest is whole or absent; be safe anyway
    if groups:
        log.warning("%s: finishing a clean's swap a crash interrupted", directory)
        _finish(directory, groups)
        fsync_dir(directory)
    for name in os.listdir(directory):
        if name.endswith(CLEANED_SUFFIX):
            unlink_quietly(os.path.join(directory, name))
    if lines:
        unlink_quietly(manifest)
        fsync_dir(directory)


def _chunks(seg: Segment) -> Iterator[tuple[int, bytes]]:
    """The segment's bytes in chunks of whole batches (about ``_CHUNK`` each), one in
    memory at a time."""
    position = 0
    while position < seg.size:
        data = seg.pread(min(_CHUNK, seg.size - position), position)
        whole = 0
        for header in iter_batches_prefix(data):
            whole = header.end
        if whole == 0:  # one batch larger than a chunk
            header = seg.header_at(position)
            data = seg.pread(header.size, position)
            whole = header.size
        yield position, data[:whole]
        position += whole


def iter_batches_prefix(data: bytes) -> list[BatchHeader]:
    """Headers of the whole batches at the start of ``data`` (the last may be cut)."""
    found: list[BatchHeader] = []
    position = 0
    while len(data) - position >= HEADER_SIZE:
        header = parse_header(data, position)
        if header.end > len(data):
            break
        found.append(header)
        position = header.end
    return found


def _kept_bytes(count: int, batches: list[SourceBatch], mask: np.ndarray) -> list[int]:
    """Of each of ``count`` source segments, at most the bytes its cleaned records take:
    its batches that keep a record, whole, and an offset (8 bytes) per record kept, as a
    sparse batch's records carry."""
    sizes = np.zeros(count, dtype=np.int64)
    n = len(batches)
    starts = np.fromiter((b.first_row for b in batches), np.int64, n)
    ends = starts + np.fromiter((b.header.record_count for b in batches), np.int64, n)
    running = np.concatenate(([0], np.cumsum(mask, dtype=np.int64)))
    kept = running[ends] - running[starts]
    sources = np.fromiter((b.source for b in batches), np.int64, n)
    whole = np.fromiter((b.header.size for b in batches), np.int64, n)
    np.add.at(sizes, sources, np.where(kept > 0, whole + 8 * kept, 0))
    return [int(x) for x in sizes]


def _groups(sources: list[Segment], kept: list[int], segment_bytes: int) -> list[list[Segment]]:
    """Consecutive segments, up to ``segment_bytes`` of what they keep (``kept``, each
    one's) a group, each spanning fewer offsets than a segment's index can hold. Kafka
    groups by the bytes a segment holds, so full segments that clean small stay one
    segment each, which no later clean merges while nothing new makes the log dirty."""
    groups: list[list[Segment]] = []
    size = 0
    for seg, seg_kept in zip(sources, kept, strict=True):
        if groups:
            group = groups[-1]
            span = seg.end_offset - group[0].base_offset
            if size + seg_kept <= segment_bytes and span <= _MAX_RELATIVE:
                group.append(seg)
                size += seg_kept
                continue
        groups.append([seg])
        size = seg_kept
    return groups


def _append(
    out: Segment,
    pending: list[tuple[BatchHeader, bytes]],
    interval: int,
    stats: CleanStats,
    pace: Callable[[int], None],
) -> None:
    if not pending:
        return
    position = out.size
    with out.pin(write=True) as fd:
        _writev_all(fd, [data for _, data in pending])
    for header, _data in pending:
        out.track(
            position,
            header.base_offset,
            header.next_offset,
            header.size,
            header.max_timestamp,
            interval,
        )
        position += header.size
    written = sum(header.size for header, _ in pending)
    stats.bytes_written += written
    pace(written)
