"""Log compaction's rules (Kafka's ``cleanup.policy=compact``): which part of a log may be
cleaned, when a log is worth cleaning, and which records a clean keeps. Pure: plain
values and Arrow arrays in, answers out, no file, clock or randomness, so the storage
cleaner (``storage.cleaner``) and the simulator run the same rules.

* **Cleanable end** (``cleanable_end``): whole segments only, never the active one,
  none holding an offset at or above the high watermark or the last stable offset
  (records of undecided transactions stay as they are), none holding a record younger
  than ``min.compaction.lag.ms`` (by the segment's largest timestamp, as Kafka's).
* **Survivors** (``survivors``), among the records below the cleanable end: the latest
  record of each key; a tombstone (a null value) among them only until it is older than
  ``delete.retention.ms`` and no pinned record of its key is left (its value would be
  the key's latest again); records of aborted transactions never count (dropped, so an
  aborted write never shadows a committed one); records without a key kept (a topic
  may have held some before it was compacted); ``pinned`` records always (control
  batches: voter sets, leader changes, transaction markers; each producer's last batch,
  which its state is rebuilt from). Offsets are never renumbered: what is dropped
  leaves a gap.
* **When** (``should_clean``): the dirty part (not cleaned yet, below the cleanable end)
  is at least ``min.cleanable.dirty.ratio`` of the cleanable log, or its oldest record
  is older than ``max.compaction.lag.ms``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["capped_end", "cleanable_end", "dirty_ratio", "should_clean", "survivors"]


def cleanable_end(
    segment_bases: Sequence[int],
    segment_max_timestamps: Sequence[int],
    *,
    high_watermark: int,
    last_stable_offset: int | None,
    now_ms: int,
    min_compaction_lag_ms: int,
) -> int:
    """The end of the cleanable prefix of a log whose segments start at
    ``segment_bases`` (ascending; the last is the active one): the base of the first
    segment not cleanable, every segment before it wholly below the high watermark and
    the last stable offset (None: no transaction undecided) and older than the lag.
    ``segment_bases[0]`` when nothing is cleanable."""
    if len(segment_bases) != len(segment_max_timestamps):
        raise ValueError("one largest timestamp per segment")
    limit = (
        high_watermark if last_stable_offset is None else min(high_watermark, last_stable_offset)
    )
    end = segment_bases[0] if segment_bases else 0
    for i in range(len(segment_bases) - 1):  # never the active (last) segment
        nxt = segment_bases[i + 1]
        if nxt > limit or segment_max_timestamps[i] > now_ms - min_compaction_lag_ms:
            break
        end = nxt
    return end


def capped_end(
    segment_bases: Sequence[int],
    segment_sizes: Sequence[int],
    end: int,
    cleaned_end: int,
    max_dirty_bytes: int,
) -> int:
    """``end`` lowered to a segment boundary so that one clean takes at most about
    ``max_dirty_bytes`` of segments not cleaned yet (at least one of them): a large
    backlog is cleaned in rounds, each swapped in when done, its keys in memory only
    for its own range (Kafka's cleaner bounds a round by its offset map the same way)."""
    dirty = 0
    for i in range(len(segment_bases) - 1):
        nxt = segment_bases[i + 1]
        if nxt > end:
            break
        if nxt > cleaned_end:
            if dirty and dirty + segment_sizes[i] > max_dirty_bytes:
                return segment_bases[i]
            dirty += segment_sizes[i]
    return end


def dirty_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    """The share of the cleanable log not cleaned yet (0 for an empty one)."""
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total > 0 else 0.0


def should_clean(
    *,
    clean_bytes: int,
    dirty_bytes: int,
    min_cleanable_dirty_ratio: float,
    oldest_dirty_timestamp: int,
    now_ms: int,
    max_compaction_lag_ms: int | None,
) -> bool:
    """Whether a log is due a clean: it has dirty bytes below its cleanable end, and
    their ratio reaches ``min.cleanable.dirty.ratio`` or the oldest of them (its
    timestamp; -1 unknown) passed ``max.compaction.lag.ms`` (None: no bound)."""
    if dirty_bytes <= 0:
        return False
    if dirty_ratio(clean_bytes, dirty_bytes) >= min_cleanable_dirty_ratio:
        return True
    return (
        max_compaction_lag_ms is not None
        and oldest_dirty_timestamp >= 0
        and now_ms - oldest_dirty_timestamp > max_compaction_lag_ms
    )


def _mask(values: pa.Array | None, rows: int) -> pa.Array:
    if values is None:
        return pa.repeat(pa.scalar(False), rows)
    if len(values) != rows:
        raise ValueError(f"a mask of {len(values)} for {rows} records")
    return pc.fill_null(values, False)


def survivors(
    offsets: pa.Array,
    keys: pa.Array,
    values: pa.Array,
    timestamps: pa.Array,
    *,
    cleanable_end: int,
    now_ms: int,
    delete_retention_ms: int,
    aborted: pa.Array | None = None,
    pinned: pa.Array | None = None,
) -> pa.Array:
    """A boolean mask over the records (in log order: ``offsets`` ascending), True for
    each record a clean keeps. ``timestamps`` in ms (int64 or timestamp[ms]);
    ``aborted``: the record belongs to an aborted transaction; ``pinned``: kept
    whatever the rules say (see the module's docstring). Records at or above
    ``cleanable_end`` are kept and shadow nothing. Arrow kernels only: the latest
    record of each key is a hash group-by on the key column (the largest row index)."""
    rows = len(offsets)
    if not len(keys) == len(values) == len(timestamps) == rows:
        raise ValueError("offsets, keys, values and timestamps must be as long")
    if rows == 0:
        return pa.array([], pa.bool_())
    aborted_mask = _mask(aborted, rows)
    pinned_mask = _mask(pinned, rows)
    stamps = timestamps.cast(pa.int64()) if timestamps.type != pa.int64() else timestamps
    eligible = pc.less(offsets, cleanable_end)
    candidate = pc.and_(eligible, pc.invert(aborted_mask))
    keyed = keys.is_valid()
    rows_index = pa.array(np.arange(rows, dtype=np.int64))
    voting = pc.and_(candidate, keyed)
    table = pa.table({"key": keys, "row": rows_index}).filter(voting)
    latest_rows = table.group_by("key", use_threads=False).aggregate([("row", "max")])
    latest = pc.is_in(rows_index, value_set=latest_rows.column("row_max"))
    # A tombstone past delete.retention goes, unless a record of its key is pinned (kept
    # whatever the rules say): without the tombstone, that older value would be the
    # key's latest again, a deleted key brought back.
    pinned_keys = keys.filter(pc.and_(pc.and_(candidate, pinned_mask), keyed))
    holds_pinned = pc.fill_null(pc.is_in(keys, value_set=pinned_keys), False)
    expired_tombstone = pc.and_(
        pc.and_(values.is_null(), pc.invert(holds_pinned)),
        pc.fill_null(pc.less(stamps, now_ms - delete_retention_ms), False),
    )
    live_latest = pc.and_(latest, pc.invert(expired_tombstone))
    kept_candidate = pc.and_(candidate, pc.or_(pc.invert(keyed), live_latest))
    return pc.or_(pc.or_(pc.invert(eligible), pinned_mask), kept_candidate)
