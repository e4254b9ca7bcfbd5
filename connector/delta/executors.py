"""The Delta sink's distributed write, driver side: Spark's Parquet writer stages a
micro-batch's files under the table (``_stage``), tasks describe them (``files.py``), the
driver moves them into the table (``FileBatch``), summarizes them per topic-partition, and
for a truncation repair removes or rewrites the table's files at or above the divergence
(``_repair``); ``commit_files`` commits them in one Delta transaction."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from .commits import CommitPlan, DeltaSinkError, PartitionRange
from .files import (
    FILES_SCHEMA,
    RANGE_FIELDS,
    STAGED_PARTITION,
    STAGED_TOPIC,
    FileDescriber,
    FileRewriter,
    OpenFile,
    file_name,
    now_ms,
    partition_value,
)

logger = logging.getLogger(__name__)

#: Most tasks describing a batch's staged files (each reads two columns of a few files).
_DESCRIBE_TASKS = 64
#: A batch of at most this many rows is described on the driver: reading its offset and
#: epoch columns takes milliseconds, a Spark job a second. A larger one is described by
#: tasks, so the driver's work stays bounded whatever the batch size.
DRIVER_DESCRIBE_ROWS = 256 * 1024


def _write_gap(batch: FileBatch, gap: pa.Table) -> list[WrittenFile]:
    """The log's records below the re-delivered offsets as files in the table, one per
    topic-partition, for a table partitioned by topic and partition (or not at all)."""
    if not set(batch.partition_by) <= {"topic", "partition"}:
        raise DeltaSinkError(
            f"Delta sink {batch.root}: the log's records below the re-delivered offsets "
            f"cannot be written into a table partitioned by {batch.partition_by}."
        )
    out = []
    for topic, partition in sorted(
        {(r["topic"], r["partition"]) for r in gap.select(["topic", "partition"]).to_pylist()}
    ):
        rows = gap.filter(
            pc.and_(
                pc.equal(gap.column("topic"), topic), pc.equal(gap.column("partition"), partition)
            )
        ).sort_by("offset")
        values = {"topic": topic, "partition": str(partition)}
        values = {k: v for k, v in values.items() if k in batch.partition_by}
        f = OpenFile(
            root=batch.root,
            rel_path=file_name(values),
            topic=topic,
            partition=partition,
            partition_values=dict(values),
            columns=[c for c in rows.column_names if c not in batch.partition_by],
        )
        try:
            for b in rows.to_batches():
                f.add(b)
            out.append(WrittenFile.from_row(f.close()))
        except BaseException:
            f.abort()
            raise
    return out


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
    """A Parquet file a task wrote, as it described it (``files.FILES_SCHEMA``): the
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


def commit_files(
    path: str,
    storage_options: dict[str, str] | None,
    batch: FileBatch,
    plan: CommitPlan,
    table: DeltaTable | None,
    removes: Sequence[RemoveAction],
) -> None:
    """One Delta commit of the executors' files: adds (and, for a repair, removes), the
    app transaction and the sink's metadata. ``operationParameters.predicate`` says
    which rows a repair replaced, as an overwrite's commit would. Raises delta-rs'
    ``DeltaError`` as it comes."""
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
    if table is None:
        assert batch.schema is not None
        create_table_with_add_actions(
            path,
            DeltaSchema.from_arrow(batch.schema),
            adds,
            mode="error",
            partition_by=batch.partition_by or None,
            storage_options=storage_options,
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
