"""The Delta sink with truncation-safe checkpoints.

``df.writeStream.foreachBatch(DeltaSink(path)).option("checkpointLocation", ...).start()``
writes every micro-batch to a Delta table with ``deltalake`` (delta-rs): Spark's own
Parquet writer writes the batch's files on the executors (into ``STAGING_DIR`` under the
table; no row crosses into Python), tasks describe them from their footers and offset
columns (``delta_files.FileDescriber``), and the driver moves them into the table and
commits them in one transaction, so the driver's memory does not grow with the batch
(object-store paths: the batch is written from the driver).

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

Layout
    New tables are partitioned by ``(topic, partition)``: the replace predicate then
    touches only the truncated partition's directory, and file statistics on ``offset``
    (rows are sorted by offset within a batch) prune its files below the divergence.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from ..replica.client import Client
from ..replica.client.security import ClientSecurity
from .delta_files import (
    FILES_SCHEMA,
    RANGE_FIELDS,
    STAGED_PARTITION,
    STAGED_TOPIC,
    FileDescriber,
    FileRewriter,
    now_ms,
    partition_value,
)
from .offsets import Position, TopicPartition
from .validation import validate

logger = logging.getLogger(__name__)

#: Key of the sink's entry in each commit's ``commitInfo``.
METADATA_KEY = "quorumlog"
METADATA_FORMAT_VERSION = 1
#: Columns the sink needs; every other column of the source's schema is optional.
REQUIRED_COLUMNS: tuple[str, ...] = ("topic", "partition", "offset", "leaderEpoch")
DEFAULT_PARTITION_BY: tuple[str, ...] = ("topic", "partition")
#: How many commits to look back for the sink's metadata when the latest commit was made
#: by another writer (e.g. OPTIMIZE); the sink's own commits always carry it.
DEFAULT_METADATA_LOOKBACK = 100
_DELTA_SPARK_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
#: Where Spark's writer puts a batch's files (``<table>/STAGING_DIR/<uuid>``) before the
#: driver moves them into the table; ``_``-prefixed, so Delta readers never look there.
STAGING_DIR = "_quorumlog_staging"
#: Most tasks describing a batch's staged files (each reads two columns of a few files).
_DESCRIBE_TASKS = 64
#: A batch of at most this many rows is described on the driver: reading its offset and
#: epoch columns takes milliseconds, a Spark job a second. A larger one is described by
#: tasks, so the driver's work stays bounded whatever the batch size.
DRIVER_DESCRIBE_ROWS = 256 * 1024
_QUERY_ID_PROPERTY = "sql.streaming.queryId"

Engine = Literal["delta-rs", "delta-spark", "auto"]


Positions = dict[str, dict[int, Position]]


class DeltaSinkError(RuntimeError):
    """A sink failure the user can act on; the message names the table and the fix."""


@dataclass(frozen=True)
class Truncation:
    """Offsets of one topic-partition re-delivered after a log truncation."""

    topic: str
    partition: int
    divergence_offset: int  # rows at or above it are replaced
    first_redelivered_offset: int  # the batch's lowest offset of this partition
    old_offset: int
    old_epoch: int
    new_epoch: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "divergenceOffset": self.divergence_offset,
            "firstRedeliveredOffset": self.first_redelivered_offset,
            "oldOffset": self.old_offset,
            "oldEpoch": self.old_epoch,
            "newEpoch": self.new_epoch,
        }


@dataclass(frozen=True)
class PartitionRange:
    """What one micro-batch (or one file of it) holds for one topic-partition; a task
    describes a file it wrote with these fields (``delta_files.RANGE_FIELDS``)."""

    topic: str
    partition: int
    min_offset: int
    max_offset: int
    first_epoch: int
    last_epoch: int
    rows: int


@dataclass(frozen=True)
class CommitPlan:
    """One micro-batch's commit: append, or replace from the divergence offsets up."""

    app_id: str
    batch_id: int
    ranges: tuple[PartitionRange, ...]
    positions: Positions
    truncations: tuple[Truncation, ...] = ()

    @property
    def replaces(self) -> bool:
        return bool(self.truncations)

    def predicate(self) -> str:
        """Rows the commit replaces: each truncated partition from its divergence offset
        up, every other partition of the batch from its lowest offset up (delta-rs
        requires all new rows to match an overwrite predicate)."""
        cut = {(t.topic, t.partition): t.divergence_offset for t in self.truncations}
        terms = []
        for r in self.ranges:
            start = cut.get((r.topic, r.partition), r.min_offset)
            terms.append(
                f"(topic = {_sql_string(r.topic)} AND partition = {r.partition}"
                f" AND offset >= {start})"
            )
        return " OR ".join(terms)

    def batch_positions(self) -> Positions:
        """End positions of the partitions in this batch only."""
        out: Positions = {}
        for r in self.ranges:
            out.setdefault(r.topic, {})[r.partition] = Position(r.max_offset + 1, r.last_epoch)
        return out

    def metadata(self) -> dict[str, Any]:
        return {
            METADATA_KEY: {
                "formatVersion": METADATA_FORMAT_VERSION,
                "appId": self.app_id,
                "batchId": self.batch_id,
                "positions": positions_to_offsets(self.positions),
                "batch": positions_to_offsets(self.batch_positions()),
                "truncations": [t.to_json() for t in self.truncations],
            }
        }


@dataclass(frozen=True)
class CommitResult:
    """Handed to ``DeltaSink(on_commit=...)`` right after a Delta commit."""

    path: str
    app_id: str
    batch_id: int
    version: int
    rows: int
    truncations: tuple[Truncation, ...] = field(default=())


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def positions_to_offsets(
    positions: Mapping[str, Mapping[int, tuple[int, int]]],
) -> dict[str, dict[str, dict[str, int]]]:
    """Positions as the source's offsets dict ``{"topic": {"0": {"offset": N, "epoch":
    E}}}``, topics and partitions sorted (the same positions give the same JSON)."""
    return {
        topic: {
            str(p): {"offset": int(pos[0]), "epoch": int(pos[1])}
            for p, pos in sorted(positions[topic].items())
        }
        for topic in sorted(positions)
    }


def positions_to_json(positions: Mapping[str, Mapping[int, tuple[int, int]]]) -> str:
    """Positions as the source's offsets JSON (``startingOffsets`` accepts it)."""
    return json.dumps(positions_to_offsets(positions), separators=(",", ":"))


def _positions_from_offsets(raw: Mapping[str, Any]) -> Positions:
    out: Positions = {}
    for topic, parts in raw.items():
        for p, pos in parts.items():
            out.setdefault(topic, {})[int(p)] = Position(int(pos["offset"]), int(pos["epoch"]))
    return out


def _sink_metadata(commit: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The sink's entry in one commitInfo; delta-spark writes it as ``userMetadata``."""
    entry = commit.get(METADATA_KEY)
    if entry is None and isinstance(commit.get("userMetadata"), str):
        try:
            entry = json.loads(commit["userMetadata"]).get(METADATA_KEY)
        except (json.JSONDecodeError, AttributeError):
            entry = None
    return entry if isinstance(entry, Mapping) else None


def _latest_sink_metadata(
    table: DeltaTable, lookback: int = DEFAULT_METADATA_LOOKBACK
) -> Mapping[str, Any] | None:
    """The sink's metadata of the newest commit that has it. Reads the latest commit file
    only, unless another writer committed since (then pages back, up to ``lookback``)."""
    limit = 1
    while True:
        commits = table.history(limit=limit)
        for commit in commits:
            entry = _sink_metadata(commit)
            if entry is not None:
                return entry
        if len(commits) < limit:
            return None  # the whole history was read
        if limit >= lookback:
            raise DeltaSinkError(
                f"Delta table {table.table_uri}: none of the last {limit} commits carries "
                f"the quorumlog sink's positions (commitInfo key {METADATA_KEY!r}); other "
                "writers committed since. Re-delivered offsets cannot be detected; let the "
                "sink write once more before other writers, or raise metadata_lookback."
            )
        limit = min(limit * 10, lookback)


def read_committed_positions(
    path: str | os.PathLike[str], *, storage_options: dict[str, str] | None = None
) -> Positions:
    """The source positions the table last committed: ``{topic: {partition: (offset,
    epoch)}}``; empty if the sink never wrote to it. Restart a stream from them with
    ``startingOffsets=read_committed_offsets_json(path)``."""
    table = _open_table(str(path), storage_options)
    if table is None:
        raise DeltaSinkError(f"{path} is not a Delta table; no positions to read.")
    entry = _latest_sink_metadata(table)
    return _positions_from_offsets(entry["positions"]) if entry else {}


def read_committed_offsets_json(
    path: str | os.PathLike[str], *, storage_options: dict[str, str] | None = None
) -> str:
    """``read_committed_positions`` as the source's offsets JSON."""
    return positions_to_json(read_committed_positions(path, storage_options=storage_options))


def _open_table(path: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    local = None if "://" in path else Path(path)
    if local is not None and local.exists() and not local.is_dir():
        raise DeltaSinkError(f"Delta sink path {path} is a file; give a directory.")
    if DeltaTable.is_deltatable(path, storage_options):
        return DeltaTable(path, storage_options=storage_options)
    if local is not None and local.exists() and any(local.iterdir()):
        raise DeltaSinkError(
            f"Delta sink path {path} is a non-empty directory but not a Delta table "
            "(no _delta_log); give an empty or new directory or an existing Delta table."
        )
    return None


def batch_ranges(data: pa.Table) -> tuple[pa.Table, tuple[PartitionRange, ...]]:
    """Sort a micro-batch by (topic, partition, offset) and summarize each topic-partition.
    Raises if a required column is null or an offset appears twice."""
    for name in REQUIRED_COLUMNS:
        if data.column(name).null_count:
            raise DeltaSinkError(f"Column {name!r} has null values; the sink needs it set.")
    data = data.sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    if data.num_rows > 1:
        topic, partition, offset = (data.column(c) for c in ("topic", "partition", "offset"))
        same = pc.and_(
            pc.and_(
                pc.equal(topic.slice(1), topic.slice(0, data.num_rows - 1)),
                pc.equal(partition.slice(1), partition.slice(0, data.num_rows - 1)),
            ),
            pc.equal(offset.slice(1), offset.slice(0, data.num_rows - 1)),
        )
        if pc.any(same).as_py():
            i = pc.index(same, True).as_py() + 1
            raise DeltaSinkError(
                f"The micro-batch holds offset {offset[i].as_py()} of "
                f"{topic[i].as_py()}/{partition[i].as_py()} twice; a batch must hold each "
                "(topic, partition, offset) once."
            )
    grouped = data.group_by(["topic", "partition"], use_threads=False).aggregate(
        [
            ("offset", "min"),
            ("offset", "max"),
            ("leaderEpoch", "first"),
            ("leaderEpoch", "last"),
            ("offset", "count"),
        ]
    )
    ranges = tuple(
        PartitionRange(
            topic=row["topic"],
            partition=int(row["partition"]),
            min_offset=int(row["offset_min"]),
            max_offset=int(row["offset_max"]),
            first_epoch=int(row["leaderEpoch_first"]),
            last_epoch=int(row["leaderEpoch_last"]),
            rows=int(row["offset_count"]),
        )
        for row in grouped.to_pylist()  # one dict per topic-partition, not per row
    )
    return data, ranges


#: ``(topic, partition, last committed end position) -> divergence offset`` (or None).
DivergenceResolver = Callable[[str, int, Position], int | None]


class LogDivergenceResolver:
    """KIP-320's answer for a re-delivered partition: OffsetsForLeaderEpoch for the epoch
    of the table's last committed position gives where the log diverged from what the
    table holds. Picklable (it keeps only how to reach the cluster); asks the cluster only
    when a truncation is being reconciled."""

    def __init__(
        self,
        bootstrap: str,
        *,
        security: ClientSecurity | None = None,
        request_timeout_ms: int = 30000,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.request_timeout_ms = request_timeout_ms

    def __call__(self, topic: str, partition: int, position: Position) -> int | None:
        if position.epoch < 0:
            return None  # no epoch known: the log cannot say where it diverged
        with Client(
            self.bootstrap, request_timeout_ms=self.request_timeout_ms, security=self.security
        ) as client:
            divergence = validate(
                client,
                TopicPartition(topic, partition),
                position,
                leader_epoch=None,
                log_start_offset=0,
            )
        if divergence is None:
            return position.offset  # the log holds everything the table does
        # Only an offset the log names is a divergence point; the inexact "log start"
        # answers would make the table drop rows retention already removed from the log.
        return divergence.offset if divergence.epoch >= 0 else None


def plan_commit(
    app_id: str,
    batch_id: int,
    ranges: Sequence[PartitionRange],
    previous: Positions,
    resolve_divergence: DivergenceResolver | None = None,
) -> CommitPlan:
    """Compare the batch with the last committed end positions: a lowest offset below
    the committed end offset is a re-delivery; the new positions carry the rest forward.

    Rows are replaced from the lowest re-delivered offset, or from the divergence offset
    ``resolve_divergence`` gives if lower: the offsets in between are control records in
    the new log (never rows), so old rows there are truncated data the batch cannot show."""
    positions: Positions = {t: dict(by_p) for t, by_p in previous.items()}
    truncations = []
    for r in ranges:
        last = previous.get(r.topic, {}).get(r.partition)
        if last is not None and r.min_offset < last.offset:
            divergence = r.min_offset
            if resolve_divergence is not None:
                resolved = resolve_divergence(r.topic, r.partition, last)
                if resolved is not None and 0 <= resolved < divergence:
                    divergence = resolved
            truncations.append(
                Truncation(
                    topic=r.topic,
                    partition=r.partition,
                    divergence_offset=divergence,
                    first_redelivered_offset=r.min_offset,
                    old_offset=last.offset,
                    old_epoch=last.epoch,
                    new_epoch=r.first_epoch,
                )
            )
        positions.setdefault(r.topic, {})[r.partition] = Position(r.max_offset + 1, r.last_epoch)
    return CommitPlan(app_id, batch_id, tuple(ranges), positions, tuple(truncations))


def _local_root(path: str) -> str | None:
    """The table's directory when executors can write it as files (a local or mounted
    path, or ``file://``); None for object stores."""
    if path.startswith("file://"):
        return os.path.abspath(path[len("file://") :])
    if "://" in path:
        return None
    return os.path.abspath(path)


def _remove_empty_dirs(root: str, start: str, remove_root: bool) -> None:
    here = os.path.abspath(start)
    while here.startswith(root) and (here != root or remove_root):
        try:
            os.rmdir(here)  # only if empty
        except OSError:
            return
        if here == root:
            return
        here = os.path.dirname(here)


def _remove_new_root(root: str, existed: bool) -> None:
    """After a failed first write: remove the directories the tasks made (empty ones only),
    so the path is again what it was (a new path stays absent)."""
    if existed or not os.path.isdir(root):
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda w: -len(w[0])):
        _remove_empty_dirs(root, dirpath, remove_root=True)


def _column(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _stage(data: Any, batch: FileBatch) -> list[WrittenFile]:
    """Write the batch with Spark's Parquet writer into ``batch.staging``, then describe
    the files (by tasks; a small batch on the driver). The write is partitioned by the table's partition columns
    and the topic-partition (copies of ``topic``/``partition`` when the table is not
    partitioned by them, so the files keep those columns) and sorted by offset within
    each: every file holds one topic-partition in offset order, which is what a Delta
    file's statistics and the commit plan need. Timestamps as INT64 microseconds: Spark's
    default INT96 is deprecated and carries no statistics."""
    assert batch.staging is not None
    keys = list(batch.partition_by)
    topic_key = "topic" if "topic" in keys else STAGED_TOPIC
    partition_key = "partition" if "partition" in keys else STAGED_PARTITION
    for key, column in ((topic_key, "topic"), (partition_key, "partition")):
        if key != column:
            data = data.withColumn(key, _column(column))
            keys.append(key)
    (
        data.sortWithinPartitions(*(_column(k) for k in keys), "offset")
        .write.mode("errorifexists")
        .option("compression", "snappy")
        .option("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .partitionBy(*keys)
        .parquet(batch.staging)
    )
    staged = sorted(
        os.path.relpath(os.path.join(directory, name), batch.staging)
        for directory, _dirs, names in os.walk(batch.staging)
        for name in names
        if name.endswith(".parquet") and not name.startswith((".", "_"))
    )
    if not staged:
        return []
    describer = FileDescriber(batch.staging, tuple(batch.partition_by), topic_key, partition_key)
    rows = sum(pq.read_metadata(os.path.join(batch.staging, s)).num_rows for s in staged)
    if rows <= DRIVER_DESCRIBE_ROWS:
        # a small batch: a Spark job would cost more than reading its offsets here
        out = describer(iter([pa.record_batch({"staged": staged})]))
        return [WrittenFile.from_row(r) for b in out for r in b.to_pylist()]
    from pyspark.sql import functions as F

    # the names spread over tasks by index: no shuffle stage, unlike a repartition
    names = F.array(*(F.lit(s) for s in staged))
    described = (
        batch.session.range(0, len(staged), 1, min(len(staged), _DESCRIBE_TASKS))
        .select(F.element_at(names, F.col("id").cast("int") + 1).alias("staged"))
        .mapInArrow(describer, FILES_SCHEMA)
        .collect()
    )
    return [WrittenFile.from_row(r.asDict()) for r in described]


@dataclass(frozen=True)
class WrittenFile(PartitionRange):
    """A Parquet file a task wrote, as it described it (``delta_files.FILES_SCHEMA``): the
    offsets of the one topic-partition it holds (an error row holds none) and its action."""

    action: str
    path: str | None
    staged: str | None  # where Spark's writer left it, relative to the batch's staging
    size: int
    modification_time: int
    partition_values: dict[str, str | None]
    stats: str
    duplicate_offset: int | None
    replaces: str | None
    error: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> WrittenFile:
        def number(name: str, missing: int = -1) -> int:
            return missing if row[name] is None else int(row[name])

        values = row.get("partition_values")
        return cls(
            topic=row["topic"] or "",
            **{name: number(name) for name in RANGE_FIELDS if name not in ("topic", "rows")},
            rows=number("rows", 0),
            action=row["action"],
            path=row["path"],
            staged=row.get("staged"),
            size=number("size", 0),
            modification_time=number("modification_time", 0),
            partition_values=json.loads(values) if values else {},
            stats=row["stats"] or "{}",
            duplicate_offset=row["duplicate_offset"],
            replaces=row["replaces"],
            error=row["error"],
        )

    def add_action(self) -> AddAction:
        assert self.path is not None
        return AddAction(
            self.path, self.size, self.partition_values, self.modification_time, True, self.stats
        )


@dataclass
class FileBatch:
    """One micro-batch written by the executors, not yet committed (driver side)."""

    session: Any
    root: str
    partition_by: list[str]
    files: list[WrittenFile]
    schema: pa.Schema | None  # the table's schema when the commit creates the table
    staging: str | None = None  # Spark's output directory for the batch, removed after it

    def place(self) -> None:
        """Move the staged files to their paths in the table: renames within the table's
        file system, so no data is copied."""
        assert self.staging is not None
        for f in self.files:
            if f.staged is None or f.path is None:
                continue
            target = os.path.join(self.root, f.path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(self.staging, f.staged), target)
        self.remove_staging()

    def remove_staging(self) -> None:
        """Remove what is left of Spark's output (``_SUCCESS``, checksums, files not
        committed) and the staging parent once no other batch uses it."""
        if self.staging is None:
            return
        shutil.rmtree(self.staging, ignore_errors=True)
        _remove_empty_dirs(self.root, os.path.dirname(self.staging), remove_root=False)

    def discard(self, root_existed: bool) -> None:
        """Remove the files of a batch that will not be committed (best effort)."""
        self.remove_staging()
        for f in self.files:
            if f.path is None:
                continue
            full = os.path.join(self.root, f.path)
            try:
                os.remove(full)
            except FileNotFoundError:
                pass
            except OSError:
                logger.warning("cannot remove uncommitted file %s", full, exc_info=True)
            _remove_empty_dirs(self.root, os.path.dirname(full), remove_root=False)
        _remove_new_root(self.root, root_existed)


def _ranges_of_files(batch: FileBatch) -> tuple[PartitionRange, ...]:
    """The batch's summary per topic-partition from the files' descriptions (each file
    holds one topic-partition). Offsets held twice are found per file by its task; across
    files of one topic-partition only when their ranges overlap (a repartitioned
    DataFrame), then by a Spark query over those files' offsets."""
    by_tp: dict[tuple[str, int], list[WrittenFile]] = {}
    for f in batch.files:
        by_tp.setdefault((f.topic, f.partition), []).append(f)
    ranges = []
    for (topic, partition), files in sorted(by_tp.items()):
        files.sort(key=lambda f: f.min_offset)
        dup = min(
            (f.duplicate_offset for f in files if f.duplicate_offset is not None), default=None
        )
        if dup is None and any(
            b.min_offset <= max(a.max_offset for a in files[:i]) for i, b in enumerate(files) if i
        ):
            dup = _duplicate_across(batch, files)
        if dup is not None:
            raise DeltaSinkError(
                f"The micro-batch holds offset {dup} of {topic}/{partition} twice; a batch "
                "must hold each (topic, partition, offset) once."
            )
        last = max(files, key=lambda f: f.max_offset)
        ranges.append(
            PartitionRange(
                topic=topic,
                partition=partition,
                min_offset=files[0].min_offset,
                max_offset=last.max_offset,
                first_epoch=files[0].first_epoch,
                last_epoch=last.last_epoch,
                rows=sum(f.rows for f in files),
            )
        )
    return tuple(ranges)


def _duplicate_across(batch: FileBatch, files: Sequence[WrittenFile]) -> int | None:
    from pyspark.sql import functions as F

    paths = [os.path.join(batch.root, f.path) for f in files if f.path]
    found = (
        batch.session.read.schema("offset long")
        .parquet(*paths)
        .groupBy("offset")
        .count()
        .where(F.col("count") > 1)
        .agg(F.min("offset").alias("offset"))
        .collect()
    )
    return None if not found or found[0]["offset"] is None else int(found[0]["offset"])


def _repair(batch: FileBatch, plan: CommitPlan, table: DeltaTable) -> list[RemoveAction]:
    """Truncation repair: the table's files that may hold rows of a truncated partition
    at or above its divergence offset (partition values and offset statistics say which,
    from the snapshot; no data file is read for that) are removed; the executors rewrite
    the rows below the divergence of those that also hold some (``FileRewriter``), and
    the rewritten files join ``batch.files``."""
    cuts = [(t.topic, t.partition, t.divergence_offset) for t in plan.truncations]
    actions = pa.table(table.get_add_actions(flatten=True))
    names = set(actions.column_names)
    whole: list[dict[str, Any]] = []
    rewrite: list[dict[str, Any]] = []
    for row in actions.to_pylist():
        values = {c: partition_value(row.get(f"partition.{c}")) for c in batch.partition_by}
        low, high = row.get("min.offset"), row.get("max.offset")
        hit = []
        for topic, partition, offset in cuts:
            if "topic" in values and values["topic"] != topic:
                continue
            if "partition" in values and values["partition"] != str(partition):
                continue
            if high is not None and "max.offset" in names and high < offset:
                continue
            hit.append((topic, partition, offset))
        if not hit:
            continue
        item = {
            "path": row["path"],
            "size": row.get("size_bytes"),
            "partition_values": json.dumps(values),
            "cuts": json.dumps(hit),
        }
        single_tp = {"topic", "partition"} <= values.keys()
        if single_tp and low is not None and low >= hit[0][2]:
            whole.append(item)  # every row of the file is replaced
        else:
            rewrite.append(item)
    outcomes: list[WrittenFile] = []
    if rewrite:
        described = (
            batch.session.createDataFrame(
                [(i["path"], i["partition_values"], i["cuts"]) for i in rewrite],
                "path string, partition_values string, cuts string",
            )
            .repartition(min(len(rewrite), 64))
            .mapInArrow(FileRewriter(batch.root), FILES_SCHEMA)
            .collect()
        )
        outcomes = [WrittenFile.from_row(r.asDict()) for r in described]
    batch.files.extend(f for f in outcomes if f.action == "add")
    dropped = {f.replaces for f in outcomes if f.action in ("add", "remove")}
    deleted = now_ms()
    return [
        RemoveAction(i["path"], True, deleted, i["size"], json.loads(i["partition_values"]))
        for i in [*whole, *(r for r in rewrite if r["path"] in dropped)]
    ]


def delta_spark_available(spark: Any) -> bool:
    """True if the session is configured for delta-spark and its classes load."""
    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
        if _DELTA_SPARK_EXTENSION not in extensions:
            return False
        jvm = spark.sparkContext._jvm
        jvm.java.lang.Class.forName(_DELTA_SPARK_EXTENSION)
        return True
    except Exception:  # Spark Connect (no JVM), class not found, ...
        logger.debug("delta-spark is not usable in this session", exc_info=True)
        return False


class DeltaSink:
    """``foreachBatch`` function writing micro-batches of the quorumlog source to Delta.

    Args:
        path: the Delta table (created on the first non-empty batch).
        app_id: the app transaction id; default the streaming query's id (required
            under Spark Connect and outside a streaming query). An explicit id must change
            whenever the checkpoint is deleted: batch ids restart at 0 and every id at or
            below the table's transaction version would be skipped.
        partition_by: partition columns of a new table (an existing table keeps its own).
        storage_options: passed to delta-rs.
        engine: ``"delta-rs"`` (default, verified), ``"delta-spark"`` (requires the
            session to be configured for it), ``"auto"`` (delta-spark when detected).
        on_commit: called on the driver right after each Delta commit.
        resolve_divergence: for a re-delivered partition, ``(topic, partition, last
            committed end position) -> divergence offset``, e.g. the log's
            OffsetsForLeaderEpoch answer for that position's epoch. Without it, rows are
            replaced from the lowest re-delivered offset, so an old row at an offset the
            new log holds a control record at (the new leader's leader-change record sits
            at the divergence offset) would survive.
        bootstrap: the quorumlog cluster the stream reads; when given (and no
            ``resolve_divergence``), the sink asks it where the log diverged
            (``LogDivergenceResolver``), so the table stays exact across truncation.
        security: TLS/auth settings for that cluster (``ClientSecurity``).
        metadata_lookback: commits to search for the sink's positions when other
            writers committed after it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        app_id: str | None = None,
        partition_by: Sequence[str] | None = DEFAULT_PARTITION_BY,
        storage_options: dict[str, str] | None = None,
        engine: Engine = "delta-rs",
        on_commit: Callable[[CommitResult], None] | None = None,
        resolve_divergence: DivergenceResolver | None = None,
        bootstrap: str | None = None,
        security: ClientSecurity | None = None,
        metadata_lookback: int = DEFAULT_METADATA_LOOKBACK,
    ) -> None:
        if engine not in ("delta-rs", "delta-spark", "auto"):
            raise ValueError(f"engine must be 'delta-rs', 'delta-spark' or 'auto', not {engine!r}")
        if app_id is not None and not app_id:
            raise ValueError("app_id must be a non-empty string or None (the query's id)")
        self.path = str(path)
        self.app_id = app_id
        self.partition_by = list(partition_by) if partition_by else None
        self.storage_options = storage_options
        self.engine = engine
        self.on_commit = on_commit
        if resolve_divergence is None and bootstrap is not None:
            resolve_divergence = LogDivergenceResolver(bootstrap, security=security)
        self.resolve_divergence = resolve_divergence
        self.metadata_lookback = metadata_lookback
        self._table: DeltaTable | None = None
        _open_table(self.path, storage_options)  # fail before the stream starts

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_table"] = None  # a native handle; reopened on first use
        return state

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write_batch(df, batch_id)

    def write_batch(self, df: Any, batch_id: int) -> CommitResult | None:
        """Write one micro-batch; ``None`` if it was skipped (replayed or empty)."""
        missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
        if missing:
            raise DeltaSinkError(
                f"Delta sink {self.path}: the DataFrame lacks columns {missing} "
                f"(has {df.columns}); keep the quorumlog source's columns {list(REQUIRED_COLUMNS)}."
            )
        app_id = self._resolve_app_id(df)
        table = self._refresh_table()
        if table is not None:
            committed = table.transaction_version(app_id)
            if committed is not None and batch_id <= committed:
                logger.info(
                    "Delta sink %s: batch %d of app %s already committed (txn version %d); "
                    "skipping the replay",
                    self.path,
                    batch_id,
                    app_id,
                    committed,
                )
                return None
        engine = self._engine(df)
        if engine == "delta-spark":
            return self._write_delta_spark(df, batch_id, app_id, table)
        if _local_root(self.path) is None:
            return self._write_on_driver(df, batch_id, app_id, table)
        return self._write_distributed(df, batch_id, app_id, table)

    def _write_on_driver(
        self, df: Any, batch_id: int, app_id: str, table: DeltaTable | None
    ) -> CommitResult | None:
        """Object stores (a URI with a scheme): the batch as one Arrow table on the driver,
        written by delta-rs. Executors cannot be handed the store's credentials here."""
        data = df.toArrow()
        if data.num_rows == 0:
            # No rows, no new positions; the next batch's txn version supersedes this one.
            logger.debug("Delta sink %s: batch %d is empty; nothing to commit", self.path, batch_id)
            return None
        data, ranges = batch_ranges(data)
        previous = self._previous_positions(table)
        plan = plan_commit(app_id, batch_id, ranges, previous, self.resolve_divergence)
        if plan.replaces:
            self._replace(data, plan, table)
        else:
            self._append(data, plan, table)
        return self._committed(plan, data.num_rows)

    def _write_distributed(
        self, df: Any, batch_id: int, app_id: str, table: DeltaTable | None
    ) -> CommitResult | None:
        """Spark's own Parquet writer writes the batch into a staging directory under the
        table (``_stage``), tasks describe the staged files from their footers and offset
        columns (``FileDescriber``), the driver moves them into the table, plans from the
        descriptions and commits them."""
        root = _local_root(self.path)
        assert root is not None
        partition_by = (
            list(table.metadata().partition_columns) if table is not None else self.partition_by
        ) or []
        missing = [c for c in partition_by if c not in df.columns]
        if missing:
            raise DeltaSinkError(
                f"Delta sink {self.path}: partition columns {missing} are not in the "
                f"DataFrame (has {df.columns})."
            )
        data = df.select(*(_column(c) for c in self._table_columns(df, table)))
        existed = os.path.isdir(root)
        batch = FileBatch(
            session=df.sparkSession,
            root=root,
            partition_by=partition_by,
            files=[],
            schema=None if table is not None else data.limit(0).toArrow().schema,
            staging=os.path.join(root, STAGING_DIR, uuid.uuid4().hex),
        )
        committing = False
        try:
            try:
                files = _stage(data, batch)
            except Exception as exc:
                raise DeltaSinkError(
                    f"Delta sink {self.path}: writing the files of batch {batch_id} of app "
                    f"{app_id} failed: {exc}"
                ) from exc
            errors = [f.error for f in files if f.error]
            if errors:
                raise DeltaSinkError(f"Delta sink {self.path}: batch {batch_id}: {errors[0]}")
            batch.files = [f for f in files if f.action == "add"]
            if not batch.files:
                logger.debug(
                    "Delta sink %s: batch %d is empty; nothing to commit", self.path, batch_id
                )
                batch.discard(existed)
                return None
            batch.place()
            ranges = _ranges_of_files(batch)
            rows = sum(r.rows for r in ranges)
            plan = plan_commit(
                app_id, batch_id, ranges, self._previous_positions(table), self.resolve_divergence
            )
            committing = True
            if plan.replaces:
                self._replace(batch, plan, table)
            else:
                self._append(batch, plan, table)
        except BaseException:
            if not committing or not self._commit_landed(app_id, batch_id):
                batch.discard(existed)
            raise
        return self._committed(plan, rows)

    def _table_columns(self, df: Any, table: DeltaTable | None) -> list[str]:
        """The columns to write, in the table's order; a DataFrame must bring exactly the
        table's columns (a file missing one, or holding one the table has not, would be
        read wrong or not at all)."""
        if table is None:
            return list(df.columns)
        columns = [f.name for f in table.schema().fields]
        missing = [c for c in columns if c not in df.columns]
        extra = [c for c in df.columns if c not in columns]
        if missing or extra:
            raise DeltaSinkError(
                f"Delta sink {self.path}: the DataFrame's columns {df.columns} are not the "
                f"table's {columns} (missing {missing}, not in the table {extra}); select the "
                "table's columns before the sink."
            )
        return columns

    def _commit_landed(self, app_id: str, batch_id: int) -> bool:
        """After a failed commit call: did the commit happen anyway (then its files must
        stay)? When the table cannot be read, assume it did (never delete a live file)."""
        try:
            table = _open_table(self.path, self.storage_options)
            version = None if table is None else table.transaction_version(app_id)
            return version is not None and version >= batch_id
        except Exception:
            logger.warning(
                "Delta sink %s: cannot tell whether batch %d committed", self.path, batch_id
            )
            return True

    def _resolve_app_id(self, df: Any) -> str:
        if self.app_id is not None:
            return self.app_id
        query_id = None
        try:
            query_id = df.sparkSession.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
        except Exception:  # Spark Connect has no SparkContext
            logger.debug("cannot read the streaming query id", exc_info=True)
        if not query_id:
            raise DeltaSinkError(
                f"Delta sink {self.path}: no streaming query id to use as the app "
                "transaction id (called outside writeStream.foreachBatch?); pass "
                "DeltaSink(path, app_id=...)."
            )
        return str(query_id)

    def _refresh_table(self) -> DeltaTable | None:
        if self._table is None:
            self._table = _open_table(self.path, self.storage_options)
        else:
            self._table.update_incremental()  # reads only the commits since the last batch
        return self._table

    def _previous_positions(self, table: DeltaTable | None) -> Positions:
        if table is None:
            return {}
        entry = _latest_sink_metadata(table, self.metadata_lookback)
        return _positions_from_offsets(entry["positions"]) if entry else {}

    def _engine(self, df: Any) -> str:
        if self.engine == "delta-rs":
            return "delta-rs"
        available = delta_spark_available(df.sparkSession)
        if self.engine == "delta-spark" and not available:
            raise DeltaSinkError(
                "engine='delta-spark' but the session is not configured for delta-spark "
                f"(spark.sql.extensions must include {_DELTA_SPARK_EXTENSION} and its jars "
                "must be on the classpath); use engine='delta-rs'."
            )
        return "delta-spark" if available else "delta-rs"

    def _commit_properties(self, plan: CommitPlan) -> CommitProperties:
        return CommitProperties(
            custom_metadata=plan.metadata(),
            app_transactions=[Transaction(plan.app_id, plan.batch_id)],
        )

    def _target(self, table: DeltaTable | None) -> str | DeltaTable:
        return table if table is not None else self.path

    def _append(
        self, data: pa.Table | FileBatch, plan: CommitPlan, table: DeltaTable | None
    ) -> None:
        if isinstance(data, FileBatch):
            self._commit_files(data, plan, table, removes=[])
            return
        try:
            write_deltalake(
                self._target(table),
                data,
                mode="append",
                partition_by=self.partition_by if table is None else None,
                storage_options=self.storage_options,
                commit_properties=self._commit_properties(plan),
            )
        except DeltaError as exc:
            raise self._write_error(plan, exc) from exc

    def _replace(
        self, data: pa.Table | FileBatch, plan: CommitPlan, table: DeltaTable | None
    ) -> None:
        for t in plan.truncations:
            logger.warning(
                "Delta sink %s: batch %d re-delivers %s/%d from offset %d (epoch %d) below the "
                "committed end offset %d (epoch %d); replacing rows at or above offset %d",
                self.path,
                plan.batch_id,
                t.topic,
                t.partition,
                t.first_redelivered_offset,
                t.new_epoch,
                t.old_offset,
                t.old_epoch,
                t.divergence_offset,
            )
        if isinstance(data, FileBatch):
            if table is None:  # a truncation compares with a committed position
                raise self._write_error(plan, RuntimeError("the table vanished"))
            try:
                removes = _repair(data, plan, table)
            except DeltaSinkError:
                raise
            except Exception as exc:
                raise self._write_error(plan, exc) from exc
            self._commit_files(data, plan, table, removes)
            return
        try:
            write_deltalake(
                self._target(table),
                data,
                mode="overwrite",
                predicate=plan.predicate(),
                storage_options=self.storage_options,
                commit_properties=self._commit_properties(plan),
            )
        except DeltaError as exc:
            raise self._write_error(plan, exc) from exc

    def _commit_files(
        self,
        batch: FileBatch,
        plan: CommitPlan,
        table: DeltaTable | None,
        removes: Sequence[RemoveAction],
    ) -> None:
        """One Delta commit of the executors' files: adds (and, for a repair, removes), the
        app transaction and the sink's metadata. ``operationParameters.predicate`` says
        which rows a repair replaced, as an overwrite's commit would."""
        adds = [f.add_action() for f in batch.files]
        metadata: dict[str, Any] = dict(plan.metadata())
        metrics = {
            "num_added_files": len(adds),
            "num_removed_files": len(removes),
            "num_added_rows": sum(f.rows for f in batch.files),
        }
        metadata["operationMetrics"] = metrics
        if plan.replaces:
            metadata["operationParameters"] = {"predicate": plan.predicate()}
        props = CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(plan.app_id, plan.batch_id)],
        )
        try:
            if table is None:
                assert batch.schema is not None
                create_table_with_add_actions(
                    self.path,
                    DeltaSchema.from_arrow(batch.schema),
                    adds,
                    mode="error",
                    partition_by=batch.partition_by or None,
                    storage_options=self.storage_options,
                    commit_properties=props,
                )
            else:
                table.create_write_transaction(
                    [*adds, *removes],
                    mode="append",
                    schema=table.schema(),
                    partition_by=batch.partition_by or None,
                    commit_properties=props,
                )
        except DeltaError as exc:
            raise self._write_error(plan, exc) from exc

    def _write_error(self, plan: CommitPlan, exc: Exception) -> DeltaSinkError:
        return DeltaSinkError(
            f"Delta sink {self.path}: committing batch {plan.batch_id} of app {plan.app_id} "
            f"failed: {exc}"
        )

    def _committed(self, plan: CommitPlan, rows: int) -> CommitResult:
        table = self._refresh_table()
        assert table is not None
        result = CommitResult(
            self.path, plan.app_id, plan.batch_id, table.version(), rows, plan.truncations
        )
        logger.info(
            "Delta sink %s: batch %d committed as version %d (%d rows, %s)",
            self.path,
            plan.batch_id,
            result.version,
            rows,
            "replace" if plan.replaces else "append",
        )
        if self.on_commit is not None:
            self.on_commit(result)
        return result

    def _write_delta_spark(
        self, df: Any, batch_id: int, app_id: str, table: DeltaTable | None
    ) -> CommitResult | None:
        """The same commit through delta-spark: the ranges come from a Spark aggregate
        (the rows stay distributed), the app transaction from txnAppId/txnVersion, the
        replace from replaceWhere, the positions from userMetadata. Not exercised here:
        delta-spark's jars cannot be fetched in this environment."""
        from pyspark.sql import functions as F

        summary = (
            df.groupBy("topic", "partition")
            .agg(
                F.min("offset").alias("min_offset"),
                F.max("offset").alias("max_offset"),
                F.min_by("leaderEpoch", "offset").alias("first_epoch"),
                F.max_by("leaderEpoch", "offset").alias("last_epoch"),
                F.count("*").alias("rows"),
                F.count_distinct("offset").alias("distinct_offsets"),
            )
            .collect()
        )
        if not summary:
            return None
        for s in summary:
            if s["rows"] != s["distinct_offsets"]:
                raise DeltaSinkError(
                    f"The micro-batch holds an offset of {s['topic']}/{s['partition']} twice."
                )
        ranges = tuple(
            PartitionRange(
                s["topic"],
                int(s["partition"]),
                int(s["min_offset"]),
                int(s["max_offset"]),
                int(s["first_epoch"]),
                int(s["last_epoch"]),
                int(s["rows"]),
            )
            for s in summary
        )
        plan = plan_commit(
            app_id, batch_id, ranges, self._previous_positions(table), self.resolve_divergence
        )
        writer = (
            df.write.format("delta")
            .option("txnAppId", app_id)
            .option("txnVersion", batch_id)
            .option("userMetadata", json.dumps(plan.metadata()))
        )
        if plan.replaces:
            writer = writer.mode("overwrite").option("replaceWhere", plan.predicate())
        else:
            writer = writer.mode("append")
        if table is None and self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(self.path)
        return self._committed(plan, sum(r.rows for r in ranges))
