"""The Delta sink with truncation-safe checkpoints.

``df.writeStream.foreachBatch(DeltaSink(path)).option("checkpointLocation", ...).start()``
writes every micro-batch to a Delta table with ``deltalake`` (delta-rs) on the driver.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError

from ..replica.client import Client
from ..replica.client.security import ClientSecurity

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
_QUERY_ID_PROPERTY = "sql.streaming.queryId"

Engine = Literal["delta-rs", "delta-spark", "auto"]


class Position(NamedTuple):
    """``offset`` is the next offset to read; ``epoch`` the leader epoch of the record
    just before it (KIP-320)."""

    offset: int
    epoch: int


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
    """What one micro-batch holds for one topic-partition."""

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
            answer = client.offsets_for_leader_epoch(topic, partition, position.epoch)
        if answer.end_offset < 0:
            return None
        return min(position.offset, answer.end_offset)


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

    def _append(self, data: pa.Table, plan: CommitPlan, table: DeltaTable | None) -> None:
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

    def _replace(self, data: pa.Table, plan: CommitPlan, table: DeltaTable | None) -> None:
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
