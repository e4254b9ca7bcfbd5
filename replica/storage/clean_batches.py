"""How the cleaner lays out the records a clean keeps as batches (``cleaner``'s rewrite).

Kafka's cleaner keeps one output batch per source batch, with gaps inside (explicit
offset deltas). Ours goes one better: the survivors of *consecutive* source batches
that can share a header (same leader epoch, same flags, no producer) become one sparse
batch (``records.SPARSE_OFFSETS_FLAG``), up to ``MERGED_BYTES`` of payload, so scattered
survivors cost a record's bytes each rather than a batch's header and schema each.

What is never merged, as Kafka keeps it: a control batch (kept whole), a batch a
producer wrote (a producer's batches, of any epoch, stay apart: a record's sequence is
its batch's base sequence plus its offset delta). A batch whose records all survive and
that is large already (half the bound) or has a producer is copied byte for byte; a
producer's batch partly kept becomes a sparse batch of its own, its base sequence that
of its first kept record.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .records import (
    RECORD_SCHEMA,
    SPARSE_OFFSETS_FLAG,
    BatchHeader,
    Producer,
    batches_to_table,
    encode_arrow,
    parse_header,
)

__all__ = ["MERGED_BYTES", "SourceBatch", "batch_from", "kept_batch", "layout"]

#: The payload bytes (estimated from the source batches' share kept) past which a
#: merged batch is not grown: a fetch returns a first batch whole, whatever its size.
MERGED_BYTES = 1 << 20
_SEQUENCE_WRAP = 1 << 31


@dataclass
class SourceBatch:
    """A batch of the segments a clean reads."""

    header: BatchHeader
    source: int  # index of its segment in the plan's sources
    position: int  # in its segment
    first_row: int  # of its records, in the clean's columns


def layout(
    batches: Sequence[SourceBatch], mask: np.ndarray, bound: int = MERGED_BYTES
) -> Iterator[tuple[list[SourceBatch], bool]]:
    """The output batches, in order: (a batch, True) to copy byte for byte, or
    (consecutive batches back to back in one segment, False) whose kept records
    (``mask``, by row) become one batch (``kept_batch``). A run may hold batches none of
    whose records survive (between two that keep some): their rows are skipped."""
    run: list[SourceBatch] = []
    run_kept = 0  # the run's length up to its last batch with records kept
    run_bytes = 0.0
    for batch in batches:
        header = batch.header
        count = header.record_count
        kept = int(np.count_nonzero(mask[batch.first_row : batch.first_row + count]))
        if kept == 0:
            if run and batch.source == run[0].source:
                run.append(batch)
            continue
        mergeable = header.producer is None and not header.is_control
        share = header.payload_length * kept / count
        if run and mergeable and _shares_header(run[0], batch) and run_bytes + share <= bound:
            run.append(batch)
            run_kept = len(run)
            run_bytes += share
            continue
        if run:
            yield run[:run_kept], False
            run, run_kept, run_bytes = [], 0, 0.0
        if kept == count and (not mergeable or header.size >= bound // 2):
            yield [batch], True
        elif mergeable:
            run, run_kept, run_bytes = [batch], 1, share
        else:
            yield [batch], False  # a producer's batch partly kept: a batch of its own
    if run:
        yield run[:run_kept], False


def _shares_header(first: SourceBatch, batch: SourceBatch) -> bool:
    a, b = first.header, batch.header
    return (
        first.source == batch.source
        and a.leader_epoch == b.leader_epoch
        and a.flags & ~SPARSE_OFFSETS_FLAG == b.flags & ~SPARSE_OFFSETS_FLAG
    )


def kept_batch(raw: bytes, first: BatchHeader, kept: np.ndarray) -> tuple[BatchHeader, bytes]:
    """The records ``kept`` (by row) of the whole batches in ``raw`` (back to back, the
    first with header ``first``, all sharing its epoch, flags and producer) as one batch
    at the first kept record's offset: sparse if they leave gaps."""
    table = batches_to_table(raw, include_control=True, verify_crc=False)
    return _encode_kept(table, first, kept)


def batch_from(raw: bytes, header: BatchHeader, first: int) -> tuple[BatchHeader, bytes]:
    """The records of a batch from offset ``first`` on, as a batch of their own (the
    cleaner's way of keeping records of a batch): for a follower whose log ends inside a
    batch its leader holds whole, its own clean having laid that batch out otherwise."""
    table = batches_to_table(raw, include_control=True, verify_crc=False)
    kept = table.column("offset").to_numpy() >= first
    return _encode_kept(table, header, kept)


def _encode_kept(
    table: pa.Table, first: BatchHeader, kept: np.ndarray
) -> tuple[BatchHeader, bytes]:
    if not kept.all():
        table = table.filter(pa.array(kept, pa.bool_()))
    offsets = table.column("offset").to_numpy()
    base = int(offsets[0])
    deltas = offsets - base
    dense = int(deltas[-1]) == len(deltas) - 1
    stamps = pc.max(table.column("timestamp").cast(pa.int64())).as_py()
    producer = first.producer
    if producer is not None:
        # A record's sequence is the base sequence plus its offset delta (Kafka's rule).
        skip = base - first.base_offset
        producer = Producer(
            producer.producer_id,
            producer.producer_epoch,
            (producer.base_sequence + skip) % _SEQUENCE_WRAP,
        )
    data = encode_arrow(
        table.select(RECORD_SCHEMA.names),
        base_offset=base,
        leader_epoch=first.leader_epoch,
        flags=first.flags,
        producer=producer,
        max_timestamp=-1 if stamps is None else int(stamps),
        offset_deltas=None if dense else deltas,
    )
    return parse_header(data, 0), data
