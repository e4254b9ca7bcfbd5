"""Executor side of the Delta sink: Parquet files written by Spark tasks.

``FileWriter`` runs in ``df.mapInArrow``: each task writes its rows under the table path
(one file per partition-column values and topic-partition, so every file holds one
topic-partition) and yields one small row per file describing it (``FILES_SCHEMA``):
the add action's path, size, partition values and statistics, plus what the driver's
commit plan needs (offset range, epochs at both ends, rows). ``FileRewriter`` does the
same for a truncation repair: it reads a file the repair keeps part of, drops the
replaced rows and writes the rest as a new file. The driver never sees a row of data;
it commits the described files in one Delta transaction (``connector/delta.py``).

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
    "action string, path string, size long, modification_time long, "
    "partition_values string, stats string, topic string, partition int, "
    "min_offset long, max_offset long, first_epoch int, last_epoch int, rows long, "
    "duplicate_offset long, replaces string, error string"
)
#: What a file's row says about the rows it holds: the fields of ``delta.PartitionRange``
#: (named alike in ``_OpenFile`` and ``FILES_SCHEMA``).
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
#: Rows buffered per Parquet row group (Spark hands mapInArrow 10k-row batches).
ROW_GROUP_ROWS = 256 * 1024
ROW_GROUP_BYTES = 64 << 20
_SAFE_VALUE = re.compile(r"[A-Za-z0-9._-]{1,200}")
_REQUIRED = ("topic", "partition", "offset", "leaderEpoch")


def partition_value(value: Any) -> str | None:
    """A partition value as Delta serializes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _row(**values: Any) -> dict[str, Any]:
    return {name: values.get(name) for name in _FILES_ARROW.names}


def _batch(rows: Sequence[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(list(rows), schema=_FILES_ARROW)


def _error(message: str) -> pa.RecordBatch:
    return _batch([_row(action="error", error=message)])


@dataclass
class _OpenFile:
    """One data file being written: buffered row groups, the running statistics."""

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
    rows: int = 0
    min_offset: int | None = None
    max_offset: int | None = None
    first_epoch: int = -1
    last_epoch: int = -1
    increasing: bool = True  # offsets strictly increasing in arrival order: no duplicates
    mins: dict[str, Any] = field(default_factory=dict)
    maxs: dict[str, Any] = field(default_factory=dict)
    nulls: dict[str, int] = field(default_factory=dict)

    @property
    def full_path(self) -> str:
        return os.path.join(self.root, self.rel_path)

    def add(self, batch: pa.RecordBatch) -> None:
        offsets = batch.column("offset")
        epochs = batch.column("leaderEpoch")
        bounds = pc.min_max(offsets)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if self.increasing:
            n = batch.num_rows
            ordered = n < 2 or pc.all(pc.greater(offsets.slice(1), offsets.slice(0, n - 1))).as_py()
            self.increasing = bool(ordered) and (self.max_offset is None or low > self.max_offset)
        if self.min_offset is None or low < self.min_offset:
            self.min_offset = low
            self.first_epoch = epochs[pc.index(offsets, low).as_py()].as_py()
        if self.max_offset is None or high >= self.max_offset:
            self.max_offset = high
            # the last row holding the highest offset (equal offsets are duplicates anyway)
            self.last_epoch = epochs[_last_index(offsets, high)].as_py()
        self._stats(batch)
        self.rows += batch.num_rows
        self.buffer.append(batch.select(self.columns))
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _stats(self, batch: pa.RecordBatch) -> None:
        """Min, max and null count of the integer columns (offset, leaderEpoch, ...): what
        Delta readers prune files with, and all a repair needs."""
        for name in self.columns:
            column = batch.column(name)
            if not pa.types.is_integer(column.type):
                continue
            self.nulls[name] = self.nulls.get(name, 0) + column.null_count
            bounds = pc.min_max(column)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low is not None and (name not in self.mins or low < self.mins[name]):
                self.mins[name] = low
            if high is not None and (name not in self.maxs or high > self.maxs[name]):
                self.maxs[name] = high

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
        duplicate = None if self.increasing else _first_duplicate(self.full_path)
        st = os.stat(self.full_path)
        stats = {
            "numRecords": self.rows,
            "minValues": self.mins,
            "maxValues": self.maxs,
            "nullCount": self.nulls,
        }
        return _row(
            action="add",
            path=self.rel_path,
            size=st.st_size,
            modification_time=int(st.st_mtime * 1000),
            partition_values=json.dumps(self.partition_values),
            stats=json.dumps(stats),
            **{name: getattr(self, name) for name in RANGE_FIELDS},
            duplicate_offset=duplicate,
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
    """The lowest offset a file holds twice (only read back when the task's rows did not
    arrive in increasing offset order, e.g. after a user's repartition)."""
    offsets = pq.read_table(path, columns=["offset"]).column("offset").combine_chunks()
    column = offsets.take(pc.array_sort_indices(offsets))
    if len(column) < 2:
        return None
    same = pc.equal(column.slice(1), column.slice(0, len(column) - 1))
    if not pc.any(same).as_py():
        return None
    return int(column[pc.index(same, True).as_py()].as_py())


def _file_name(root: str, values: dict[str, str | None]) -> str:
    """Hive-style directories when every partition value is plain (the common case:
    topic and partition); otherwise at the table root (Delta needs no directories)."""
    name = f"part-{uuid.uuid4().hex}-c000.snappy.parquet"
    if values and all(v is not None and _SAFE_VALUE.fullmatch(v) for v in values.values()):
        return "/".join([*(f"{k}={v}" for k, v in values.items()), name])
    return name


def _distinct_keys(batch: pa.RecordBatch, keys: Sequence[str]) -> list[tuple[Any, ...]]:
    constant = []
    for name in keys:
        column = batch.column(name)
        if column.null_count:
            break
        bounds = pc.min_max(column)
        if bounds["min"] != bounds["max"]:
            break
        constant.append(bounds["min"].as_py())
    else:
        return [tuple(constant)]  # the usual batch: one topic-partition
    distinct = pa.Table.from_batches([batch]).group_by(list(keys)).aggregate([])
    return [tuple(row[k] for k in keys) for row in distinct.to_pylist()]


def _rows_of(batch: pa.RecordBatch, keys: Sequence[str], key: tuple[Any, ...]) -> pa.RecordBatch:
    mask = None
    for name, value in zip(keys, key, strict=True):
        column = batch.column(name)
        term = pc.is_null(column) if value is None else pc.equal(column, value)
        mask = term if mask is None else pc.and_(mask, term)
    return batch.filter(mask)


@dataclass(frozen=True)
class FileWriter:
    """``mapInArrow`` function writing a micro-batch's rows as Parquet files under
    ``root`` (a local or mounted directory every executor reaches)."""

    root: str
    partition_by: tuple[str, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        keys = list(dict.fromkeys([*self.partition_by, "topic", "partition"]))
        files: dict[tuple[Any, ...], _OpenFile] = {}
        done = False
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                for name in _REQUIRED:
                    if batch.column(name).null_count:
                        yield _error(f"Column {name!r} has null values; the sink needs it set.")
                        return
                found = _distinct_keys(batch, keys)
                for key in found:
                    f = files.get(key)
                    if f is None:
                        f = files[key] = self._open(batch.schema, keys, key)
                    f.add(batch if len(found) == 1 else _rows_of(batch, keys, key))
            rows = [f.close() for f in files.values()]
            done = True
            if rows:
                yield _batch(rows)
        finally:
            if not done:
                for f in files.values():
                    f.abort()

    def _open(self, schema: pa.Schema, keys: Sequence[str], key: tuple[Any, ...]) -> _OpenFile:
        by_name = dict(zip(keys, key, strict=True))
        values = {name: partition_value(by_name[name]) for name in self.partition_by}
        return _OpenFile(
            root=self.root,
            rel_path=_file_name(self.root, values),
            topic=str(by_name["topic"]),
            partition=int(by_name["partition"]),
            partition_values=values,
            columns=[n for n in schema.names if n not in self.partition_by],
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
        f = _OpenFile(
            root=self.root,
            rel_path=_file_name(self.root, values),
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
