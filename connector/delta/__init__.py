"""The Delta sink with truncation-safe checkpoints.

``df.writeStream.foreachBatch(DeltaSink(path)).option("checkpointLocation", ...).start()``
writes every micro-batch to a Delta table with ``deltalake`` (delta-rs). A small batch
(``SMALL_BATCH_ROWS``, ``SMALL_BATCH_BYTES``) is written and committed on the driver: read
from the log there when it is the quorumlog source's rows unchanged
(``connector/driver_read.py``, no Spark job), else collected. A larger one is written by
Spark's own Parquet writer on the executors (into ``STAGING_DIR`` under the table; no
row crosses into Python), tasks describe the files from their footers and offset columns
(``files.FileDescriber``), and the driver moves them into the table and commits them in
one transaction, so the driver's memory does not grow with the batch (object-store
paths: the batch is written from the driver).

Exactly once
    Each micro-batch is one Delta commit carrying an app transaction
    ``(app_id, batch_id)``. Before writing, the sink reads the table's
    ``transaction_version(app_id)`` and skips a batch id at or below it: delta-rs 1.6
    itself accepts a second commit with the same app id and version (and doubles the
    rows), so the check must be ours. ``app_id`` defaults to the streaming query's id
    (``StreamingQuery.id``), which Spark stores in the checkpoint: stable across
    restarts from the same checkpoint, and new when the checkpoint is deleted, which is
    exactly when batch ids restart at 0. An id derived from the checkpoint *path* would
    skip every batch of a fresh checkpoint at the old path (silent data loss).

Truncation-safe
    Every commit's ``commitInfo`` carries, under the key ``"quorumlog"``, the table's
    complete end positions after the commit (``offset`` = max offset + 1, ``epoch`` = that
    record's leader epoch, per topic-partition; partitions absent from the batch carried
    forward from the previous commit), the app id, the batch id and any truncations.
    Reading them costs the latest commit file only (``history(limit=1)``), not a scan.
    A batch whose lowest offset for a topic-partition is below the last committed end
    offset re-delivers offsets the table holds (the source resumed after a log
    truncation): the batch is then written as one ``overwrite`` commit whose predicate
    deletes that partition's rows at or above the lowest re-delivered offset. delta-rs
    rejects an overwrite whose new rows fall outside the predicate, so the predicate
    also covers every other partition of the batch from its lowest offset up, a range
    the table holds no rows in; the whole micro-batch stays one atomic commit. The lowest
    re-delivered offset can lie above the true divergence offset (the new leader's
    leader-change control record sits there and is not a row); ``resolve_divergence``
    lets the caller supply the divergence offset (OffsetsForLeaderEpoch) so old rows in
    that gap are replaced too.

Upsert
    ``DeltaSink(path, bootstrap=..., mode="upsert")`` keeps one row per ``(topic,
    partition, key)``, its latest record; a tombstone deletes it. Each micro-batch is one
    MERGE commit with the same app transaction and positions; a re-delivery rebuilds the
    partition from the log in that commit (``upsert.py`` says how and why).

Layout
    New tables are partitioned by ``(topic, partition)``: the replace predicate then
    touches only the truncated partition's directory, and file statistics on ``offset``
    (rows are sorted by offset within a batch) prune its files below the divergence.

Modules
    ``sink`` (``DeltaSink``: per batch, the replay check, the path by size, the commit),
    ``commits`` (the plan and the metadata each commit carries), ``upsert``
    (``mode="upsert"``: the latest record per key merged), ``executors`` (the
    distributed write and repair, driver side), ``files`` (their tasks), ``repair`` (where
    the log diverged, exactly), ``staging`` (staging directories and their sweep),
    ``spark_engine`` (the same commit through delta-spark).
"""

from __future__ import annotations

from ..offsets import Position
from .commits import (
    DEFAULT_METADATA_LOOKBACK,
    DEFAULT_PARTITION_BY,
    METADATA_FORMAT_VERSION,
    METADATA_KEY,
    REQUIRED_COLUMNS,
    CommitPlan,
    CommitResult,
    DeltaSinkError,
    PartitionRange,
    Positions,
    Truncation,
    batch_ranges,
    plan_commit,
    positions_to_json,
    positions_to_offsets,
    read_committed_offsets_json,
    read_committed_positions,
)
from .executors import DRIVER_DESCRIBE_ROWS, FileBatch, WrittenFile
from .repair import DivergenceResolver, LogDivergenceResolver
from .sink import SMALL_BATCH_BYTES, SMALL_BATCH_ROWS, DeltaSink, Engine
from .spark_engine import delta_spark_available
from .staging import STAGING_DIR

__all__ = [
    "DEFAULT_METADATA_LOOKBACK",
    "DEFAULT_PARTITION_BY",
    "DRIVER_DESCRIBE_ROWS",
    "METADATA_FORMAT_VERSION",
    "METADATA_KEY",
    "REQUIRED_COLUMNS",
    "SMALL_BATCH_BYTES",
    "SMALL_BATCH_ROWS",
    "STAGING_DIR",
    "CommitPlan",
    "CommitResult",
    "DeltaSink",
    "DeltaSinkError",
    "DivergenceResolver",
    "Engine",
    "FileBatch",
    "LogDivergenceResolver",
    "PartitionRange",
    "Position",
    "Positions",
    "Truncation",
    "WrittenFile",
    "batch_ranges",
    "delta_spark_available",
    "plan_commit",
    "positions_to_json",
    "positions_to_offsets",
    "read_committed_offsets_json",
    "read_committed_positions",
]
