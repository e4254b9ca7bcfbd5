"""The Delta sink's upsert mode (``DeltaSink(path, mode="upsert")``): a keyed topic
mirrored as one row per ``(topic, partition, key)``, the row of its latest record (by
offset); a tombstone (a null value) deletes the row.

A micro-batch becomes one delta-rs MERGE commit carrying the same app transaction and
positions as an append (``commits.CommitPlan``): the batch is first reduced to the last
record of each key with Arrow compute (``latest_per_key``; a large batch by Spark on the
executors, ``latest_per_key_spark``), so what the driver holds is one row per key the
batch touched, never the table.

Exactly once across a truncation
    A batch that re-delivers offsets below the table's committed end of a partition
    (``onTruncation=resume`` after an unclean election) cannot be merged as it is: the
    truncated records' effects are in the table, and a truncated tombstone left no row
    to find them by. The sink rebuilds that partition instead, in the same commit: it
    reads the partition's records from the log start up to the first re-delivered
    offset (``LogDivergenceResolver.read``), reduces them with the batch to the latest
    record per key, and the MERGE upserts those, deletes the keys whose latest record is
    a tombstone and deletes the partition's other rows at or above the log start (keys
    the log no longer holds: their records were truncated). The table then equals the
    latest value of each live key of the log as it is now. Rows below the log start
    (retention removed their records) are kept. The rebuild reads the partition on the
    driver, reducing it to the latest record per key as it is fetched: it holds the
    partition's live keys.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake

from .commits import DeltaSinkError, _sql_string
from .repair import LogDivergenceResolver

logger = logging.getLogger(__name__)

#: The columns a row is identified by; ``key`` and ``value`` must be in the DataFrame.
MERGE_KEYS: tuple[str, ...] = ("topic", "partition", "key")
UPSERT_COLUMNS: tuple[str, ...] = ("key", "value")
_SOURCE, _TARGET = "s", "t"
#: A rebuild's log records are reduced to the latest per key whenever this many are held.
REDUCE_ROWS = 256 * 1024


@dataclass(frozen=True)
class Rebuild:
    """A partition whose rows a commit replaces by the log's latest record per key: its
    rows at or above ``log_start`` whose key the merge's source lacks are deleted."""

    topic: str
    partition: int
    log_start: int

    def target_predicate(self) -> str:
        return (
            f"({_TARGET}.topic = {_sql_string(self.topic)} AND {_TARGET}.partition = "
            f"{self.partition} AND {_TARGET}.offset >= {self.log_start})"
        )


def check_keyed(data: pa.Table, where: str) -> None:
    """A record without a key cannot be upserted: fail naming the first one."""
    keys = data.column("key")
    if keys.null_count:
        i = pc.index(pc.is_null(keys), True).as_py()
        raise DeltaSinkError(
            f"{where}: mode='upsert' needs a key in every record, but offset "
            f"{data.column('offset')[i].as_py()} of {data.column('topic')[i].as_py()}/"
            f"{data.column('partition')[i].as_py()} has none; mirror a keyed (compacted) "
            "topic, or use mode='append'."
        )


def latest_per_key(data: pa.Table) -> pa.Table:
    """The last record (highest offset) of each ``(topic, partition, key)``, tombstones
    included, sorted by those columns. Arrow compute only: a sort, then each run's last
    row."""
    data = data.sort_by([(c, "ascending") for c in (*MERGE_KEYS, "offset")])
    n = data.num_rows
    if n < 2:
        return data
    ends = None
    for name in MERGE_KEYS:
        column = data.column(name)
        differs = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        ends = differs if ends is None else pc.or_(ends, differs)
    assert ends is not None
    last = pa.chunked_array([*ends.chunks, pa.array([True])], pa.bool_())
    return data.filter(last)


def latest_per_key_spark(df: Any) -> pa.Table:
    """``latest_per_key`` of a large batch, computed by Spark on the executors: only one
    row per key the batch touched reaches the driver."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rank = "__quorumlog_rank"
    window = Window.partitionBy(*MERGE_KEYS).orderBy(F.col("offset").desc())
    latest = df.withColumn(rank, F.row_number().over(window)).where(F.col(rank) == 1).drop(rank)
    return latest_per_key(latest.toArrow())


def rebuilt_rows(
    resolver: LogDivergenceResolver | None,
    path: str,
    truncated: Sequence[tuple[str, int, int]],
    schema: pa.Schema,
) -> tuple[list[pa.Table], list[Rebuild]]:
    """For each truncated ``(topic, partition, first re-delivered offset)``: the latest
    record per key of the log's records from its log start up to that offset (as rows of
    ``schema``), and the ``Rebuild`` the merge applies."""
    if not truncated:
        return [], []
    if resolver is None:
        raise DeltaSinkError(
            f"Delta sink {path}: the log was truncated under the upsert table "
            f"({[f'{t}/{p} from offset {o}' for t, p, o in truncated]}); to undo the "
            "truncated records' effects the sink rebuilds those partitions from the log: "
            "pass DeltaSink(..., bootstrap=...)."
        )
    parts, rebuilds = [], []
    for topic, partition, first_redelivered in truncated:
        log_start = resolver.log_start(topic, partition)
        part, records = _reduced_log(
            resolver, path, topic, partition, log_start, first_redelivered, schema
        )
        logger.warning(
            "Delta sink %s: %s/%d was truncated; rebuilding its rows from the log's %d "
            "records in [%d, %d) and the batch",
            path,
            topic,
            partition,
            records,
            log_start,
            first_redelivered,
        )
        parts.append(part)
        rebuilds.append(Rebuild(topic, partition, log_start))
    return parts, rebuilds


def _reduced_log(
    resolver: LogDivergenceResolver,
    path: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    schema: pa.Schema,
) -> tuple[pa.Table, int]:
    """The latest record per key of the log's records in [start, end), as rows of
    ``schema``, reduced as they are fetched (at most the live keys and
    ``REDUCE_ROWS`` more are held), and how many records were read."""
    held: list[pa.Table] = []
    rows = records = 0
    for batch in resolver.read_batches(topic, partition, start, end):
        missing = [n for n in schema.names if n not in batch.schema.names]
        if missing:
            raise DeltaSinkError(
                f"Delta sink {path}: rebuilding {topic}/{partition} from the log needs the "
                f"source's columns, but the table has {missing} the source's rows have not."
            )
        held.append(pa.Table.from_batches([batch]).select(schema.names).cast(schema))
        rows += batch.num_rows
        records += batch.num_rows
        if rows >= REDUCE_ROWS:
            reduced = latest_per_key(pa.concat_tables(held))
            held, rows = [reduced], reduced.num_rows
    return latest_per_key(pa.concat_tables(held) if held else schema.empty_table()), records


def merge_latest(
    path: str,
    table: DeltaTable | None,
    latest: pa.Table,
    rebuilds: Sequence[Rebuild],
    properties: CommitProperties,
    partition_by: list[str] | None,
    storage_options: dict[str, str] | None,
) -> None:
    """One commit: upsert the live records of ``latest``, delete the keys whose latest
    record is a tombstone, and for each rebuilt partition delete its rows the source
    lacks. A new table is created by the commit from the live records."""
    if table is None:
        write_deltalake(
            path,
            latest.filter(pc.is_valid(latest.column("value"))),
            mode="append",
            partition_by=partition_by,
            storage_options=storage_options,
            commit_properties=properties,
        )
        return
    on = " AND ".join(f"{_TARGET}.`{c}` = {_SOURCE}.`{c}`" for c in MERGE_KEYS)
    tombstone = f"{_SOURCE}.value IS NULL"
    merger = (
        table.merge(
            latest,
            predicate=on,
            source_alias=_SOURCE,
            target_alias=_TARGET,
            commit_properties=properties,
            # the source is in memory already: not streamed, its statistics give the
            # early pruning predicate (only the partitions and key ranges it touches)
            streamed_exec=False,
        )
        .when_matched_delete(predicate=tombstone)
        .when_matched_update_all()
        .when_not_matched_insert_all(predicate=f"{_SOURCE}.value IS NOT NULL")
    )
    if rebuilds:
        merger = merger.when_not_matched_by_source_delete(
            predicate=" OR ".join(r.target_predicate() for r in rebuilds)
        )
    metrics = merger.execute()
    logger.debug("Delta sink %s: merge %s", path, metrics)
