"""Executor side of the Delta sink: describing the Parquet files Spark wrote, and
rewriting the files a truncation repair keeps part of.

A micro-batch's rows are written by Spark's own (JVM) Parquet writer into a staging
directory under the table (``executors.py``), partitioned by the table's partition columns
and the topic-partition and sorted by offset, so every staged file holds one
topic-partition in offset order and no row crosses into Python. ``FileDescriber`` then
runs in ``mapInArrow`` over the staged files' names: a task reads a file's footer (size,
row count, column statistics) and its ``offset`` and ``leaderEpoch`` columns only, and
yields one small row describing it (``FILES_SCHEMA``): the add action's path, partition
values and statistics, plus what the driver's commit plan needs (offset range, epochs at
both ends, rows, an offset held twice). ``FileRewriter`` does the same for a truncation
repair: it reads a file the repair keeps part of, drops the replaced rows and writes the
rest as a new file. The driver never sees a row of data; it moves the described files
into the table and commits them in one Delta transaction.

Problems found in the data (a null in a required column, an offset twice) are reported
as rows with ``error`` set rather than raised, so the driver raises ``DeltaSinkError``
with the message and removes the batch's files, as it does for any failure before the
commit.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: One row per written (or replaced) file; Spark DDL for ``mapInArrow``'s output.
FILES_SCHEMA = (
    "action string, path string, staged string, size long, modification_time long, "
    "partition_values string, stats string, topic string, partition int, "
    "min_offset long, max_offset long, first_epoch int, last_epoch int, rows long, "
    "duplicate_offset long, replaces string, error string"
)
#: What a file's row says about the rows it holds: the fields of ``delta.PartitionRange``
#: (named alike in ``_Offsets`` and ``FILES_SCHEMA``).
RANGE_FIELDS = (
    "topic",
    "partition",
    "min_offset",
    "max_offset",
    "first_epoch",
    "last_epoch",
    "rows",
)
_FILES_ARROW = pa.schema(
    [
        ("action", pa.string()),
        ("path", pa.string()),
        ("staged", pa.string()),
        ("size", pa.int64()),
        ("modification_time", pa.int64()),
        ("partition_values", pa.string()),
        ("stats", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("min_offset", pa.int64()),
        ("max_offset", pa.int64()),
        ("first_epoch", pa.int32()),
        ("last_epoch", pa.int32()),
        ("rows", pa.int64()),
        ("duplicate_offset", pa.int64()),
        ("replaces", pa.string()),
        ("error", pa.string()),
    ]
)
#: Rows buffered per Parquet row group of a rewritten file.
ROW_GROUP_ROWS = 256 * 1024
ROW_GROUP_BYTES = 64 << 20
#: Rows of ``offset`` and ``leaderEpoch`` a describing task holds at once.
_READ_ROWS = 256 * 1024
_SAFE_VALUE = re.compile(r"[A-Za-z0-9._-]{1,200}")
#: Spark's directory name for a null partition value.
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: Staging partition columns for the topic-partition when the table is not partitioned by
#: it: copies of ``topic`` and ``partition`` (the files keep the real columns).
STAGED_TOPIC = "__quorumlog_topic"
STAGED_PARTITION = "__quorumlog_partition"


def partition_value(value: Any) -> str | None:
    """A partition value as Delta serializes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def null_error(column: str) -> str:
    return f"Column {column!r} has null values; the sink needs it set."


def _row(**values: Any) -> dict[str, Any]:
    return {name: values.get(name) for name in _FILES_ARROW.names}


def _batch(rows: Sequence[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(list(rows), schema=_FILES_ARROW)


@dataclass
class _Offsets:
    """The offsets of one topic-partition's rows, fed in file order: their range, the
    epochs at both ends, and whether they strictly increased (then none is held twice)."""

    rows: int = 0
    min_offset: int | None = None
    max_offset: int | None = None
    first_epoch: int = -1
    last_epoch: int = -1
    increasing: bool = True

    def add(self, offsets: pa.Array, epochs: pa.Array) -> None:
        n = len(offsets)
        if n == 0:
            return
        bounds = pc.min_max(offsets)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if self.increasing:
            ordered = n < 2 or pc.all(pc.greater(offsets.slice(1), offsets.slice(0, n - 1))).as_py()
            self.increasing = bool(ordered) and (self.max_offset is None or low > self.max_offset)
        if self.min_offset is None or low < self.min_offset:
            self.min_offset = low
            self.first_epoch = epochs[pc.index(offsets, low).as_py()].as_py()
        if self.max_offset is None or high >= self.max_offset:
            self.max_offset = high
            # the last row holding the highest offset (equal offsets are duplicates anyway)
            self.last_epoch = epochs[_last_index(offsets, high)].as_py()
        self.rows += n

    def fields(self) -> dict[str, Any]:
        return {
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "first_epoch": self.first_epoch,
            "last_epoch": self.last_epoch,
            "rows": self.rows,
        }


def file_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """A Parquet file's Delta statistics from its footer: ``numRecords`` and the min, max
    and null count of its top-level integer columns (offset, leaderEpoch, ...), what Delta
    readers prune files with and all a repair needs. A column some row group has no
    statistics for is left out (no statistic is better than a wrong one)."""
    schema = metadata.schema
    columns = {}
    for j in range(metadata.num_columns):
        col = schema.column(j)
        if (
            col.max_repetition_level == 0
            and col.path == col.name
            and col.physical_type in ("INT32", "INT64")
            and col.logical_type.type in ("NONE", "INT")
        ):
            columns[j] = col.name
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    no_bounds: set[str] = set()
    no_nulls: set[str] = set()
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if group.num_rows == 0:
            continue
        for j, name in columns.items():
            st = group.column(j).statistics
            if st is None or not st.has_null_count:
                no_nulls.add(name)
            else:
                nulls[name] = nulls.get(name, 0) + st.null_count
            if st is None or not st.has_min_max:
                # a row group of nulls only has no bounds and needs none
                if st is None or not st.has_null_count or st.null_count != group.num_rows:
                    no_bounds.add(name)
                continue
            if name not in mins or st.min < mins[name]:
                mins[name] = st.min
            if name not in maxs or st.max > maxs[name]:
                maxs[name] = st.max
    return {
        "numRecords": metadata.num_rows,
        "minValues": {k: v for k, v in mins.items() if k not in no_bounds},
        "maxValues": {k: v for k, v in maxs.items() if k not in no_bounds},
        "nullCount": {k: v for k, v in nulls.items() if k not in no_nulls},
    }


def _described(
    full_path: str, offsets: _Offsets, metadata: pq.FileMetaData | None = None, **values: Any
) -> dict[str, Any]:
    """The ``add`` row of a finished file: size and time from the file system, statistics
    from the footer, the offsets' summary, and ``values`` (path, partition values, ...)."""
    st = os.stat(full_path)
    if metadata is None:
        metadata = pq.read_metadata(full_path)
    duplicate = None if offsets.increasing else _first_duplicate(full_path)
    return _row(
        action="add",
        size=st.st_size,
        modification_time=int(st.st_mtime * 1000),
        stats=json.dumps(file_stats(metadata)),
        **offsets.fields(),
        duplicate_offset=duplicate,
        **values,
    )


@dataclass
class OpenFile:
    """One data file a repair writes: buffered row groups, the running offsets."""

    root: str
    rel_path: str
    topic: str
    partition: int
    partition_values: dict[str, str | None]
    columns: list[str]  # columns stored in the file (the partition columns are not)
    writer: pq.ParquetWriter | None = None
    buffer: list[pa.RecordBatch] = field(default_factory=list)
    buffered_rows: int = 0
    buffered_bytes: int = 0
    offsets: _Offsets = field(default_factory=_Offsets)

    @property
    def full_path(self) -> str:
        return os.path.join(self.root, self.rel_path)

    def add(self, batch: pa.RecordBatch) -> None:
        self.offsets.add(batch.column("offset"), batch.column("leaderEpoch"))
        self.buffer.append(batch.select(self.columns))
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self.buffer:
            return
        table = pa.Table.from_batches(self.buffer)
        if self.writer is None:
            os.makedirs(os.path.dirname(self.full_path), exist_ok=True)
            self.writer = pq.ParquetWriter(self.full_path, table.schema, compression="snappy")
        self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.buffer, self.buffered_rows, self.buffered_bytes = [], 0, 0

    def close(self, replaces: str | None = None) -> dict[str, Any]:
        self._flush()
        assert self.writer is not None
        self.writer.close()
        return _described(
            self.full_path,
            self.offsets,
            path=self.rel_path,
            partition_values=json.dumps(self.partition_values),
            topic=self.topic,
            partition=self.partition,
            replaces=replaces,
        )

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
        try:
            os.remove(self.full_path)
        except FileNotFoundError:
            pass


def _last_index(values: pa.Array, value: int) -> int:
    matches = pc.indices_nonzero(pc.equal(values, value))
    return int(matches[len(matches) - 1].as_py())


def _first_duplicate(path: str) -> int | None:
    """The lowest offset a file holds twice (only read back when the file's offsets did not
    strictly increase)."""
    offsets = pq.read_table(path, columns=["offset"]).column("offset").combine_chunks()
    column = offsets.take(pc.array_sort_indices(offsets))
    if len(column) < 2:
        return None
    same = pc.equal(column.slice(1), column.slice(0, len(column) - 1))
    if not pc.any(same).as_py():
        return None
    return int(column[pc.index(same, True).as_py()].as_py())


def file_name(values: dict[str, str | None]) -> str:
    """Hive-style directories when every partition value is plain (the common case:
    topic and partition); otherwise at the table root (Delta needs no directories)."""
    name = f"part-{uuid.uuid4().hex}-c000.snappy.parquet"
    if values and all(v is not None and _SAFE_VALUE.fullmatch(v) for v in values.values()):
        return "/".join([*(f"{k}={v}" for k, v in values.items()), name])
    return name


def _directory_values(rel_path: str) -> dict[str, str | None]:
    """The partition values in a path Spark's writer made (``k=v`` directories, values
    escaped as ``%XX``, a null as ``__HIVE_DEFAULT_PARTITION__``)."""
    values: dict[str, str | None] = {}
    for part in rel_path.split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep:
            values[unquote(key)] = None if value == _HIVE_NULL else unquote(value)
    return values


@dataclass(frozen=True)
class FileDescriber:
    """``mapInArrow`` function describing staged files. Input rows: ``staged`` (a file's
    path relative to ``staging``). Yields per file one ``add`` row whose ``path`` is where
    the driver is to move it in the table, an ``error`` row, or nothing (an empty file).
    ``partition_by``: the table's partition columns; ``topic_key``/``partition_key``: the
    staging directories' names for the topic-partition."""

    staging: str
    partition_by: tuple[str, ...]
    topic_key: str
    partition_key: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = [self._describe(s) for s in batch.column("staged").to_pylist()]
            found = [r for r in rows if r is not None]
            if found:
                yield _batch(found)

    def _describe(self, staged: str) -> dict[str, Any] | None:
        dirs = _directory_values(staged)
        topic, partition = dirs.get(self.topic_key), dirs.get(self.partition_key)
        for name, value in (("topic", topic), ("partition", partition)):
            if value is None:
                return _row(action="error", error=null_error(name))
        full_path = os.path.join(self.staging, staged)
        parquet = pq.ParquetFile(full_path)
        if parquet.metadata.num_rows == 0:
            return None
        offsets = _Offsets()
        for b in parquet.iter_batches(batch_size=_READ_ROWS, columns=["offset", "leaderEpoch"]):
            for name in ("offset", "leaderEpoch"):
                if b.column(name).null_count:
                    return _row(action="error", error=null_error(name))
            offsets.add(b.column("offset"), b.column("leaderEpoch"))
        values = {name: dirs.get(name) for name in self.partition_by}
        return _described(
            full_path,
            offsets,
            parquet.metadata,
            path=file_name(values),
            staged=staged,
            partition_values=json.dumps(values),
            topic=topic,
            partition=int(partition),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class FileRewriter:
    """``mapInArrow`` function of a truncation repair. Input rows: ``path`` (relative, as
    in the Delta log), ``partition_values`` (JSON), ``cuts`` (JSON list of [topic,
    partition, offset]: rows of that topic-partition at or above offset are dropped).
    Yields per input file one ``add`` row (the kept rows, rewritten, ``replaces`` = the
    old path) or a ``remove`` row (nothing kept), or ``keep`` (nothing dropped)."""

    root: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for item in batch.to_pylist():
                yield _batch([self._rewrite(item)])

    def _rewrite(self, item: dict[str, Any]) -> dict[str, Any]:
        old = item["path"]
        values: dict[str, str | None] = json.loads(item["partition_values"])
        data = pq.read_table(os.path.join(self.root, unquote(old)))
        n = data.num_rows
        drop = pa.array([False] * n, pa.bool_())
        for topic, partition, offset in json.loads(item["cuts"]):
            term = pc.greater_equal(data.column("offset"), offset)
            for name, want in (("topic", str(topic)), ("partition", int(partition))):
                if name in data.column_names:
                    term = pc.and_(term, pc.equal(data.column(name), want))
                elif values.get(name) != partition_value(want):
                    term = pa.array([False] * n, pa.bool_())
            drop = pc.or_(drop, term)
        dropped = pc.sum(drop.cast(pa.int64())).as_py() or 0
        if dropped == 0:
            return _row(action="keep", replaces=old)
        if dropped == n:
            return _row(action="remove", replaces=old)
        kept = data.filter(pc.invert(drop))
        topic = values.get("topic") if "topic" not in kept.column_names else None
        partition = values.get("partition") if "partition" not in kept.column_names else None
        f = OpenFile(
            root=self.root,
            rel_path=file_name(values),
            topic=str(topic if topic is not None else kept.column("topic")[0].as_py()),
            partition=int(
                partition if partition is not None else kept.column("partition")[0].as_py()
            ),
            partition_values=values,
            columns=kept.column_names,
        )
        try:
            for b in kept.to_batches(max_chunksize=ROW_GROUP_ROWS):
                f.add(b)
            return f.close(replaces=old)
        except BaseException:
            f.abort()
            raise


def now_ms() -> int:
    return int(time.time() * 1000)
