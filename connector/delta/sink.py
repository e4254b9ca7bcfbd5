"""``DeltaSink``, the ``foreachBatch`` function: per micro-batch, the replay check, the
choice of path by size (a small batch written and committed on the driver by delta-rs,
a large one by the executors, ``executors.py``), the plan (``commits.py``) and the
commit; the package's docstring says what the commits guarantee."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError
from deltalake.transaction import RemoveAction

from ...replica.client.security import ClientSecurity
from ..driver_read import DriverReads, TooLarge, batch_read_offsets
from .commits import (
    DEFAULT_METADATA_LOOKBACK,
    DEFAULT_PARTITION_BY,
    REQUIRED_COLUMNS,
    CommitPlan,
    CommitResult,
    DeltaSinkError,
    Positions,
    _latest_sink_metadata,
    _open_table,
    _positions_from_offsets,
    _replanned,
    batch_ranges,
    plan_commit,
)
from .executors import (
    FileBatch,
    _column,
    _local_root,
    _ranges_of_files,
    _repair,
    _stage,
    _write_gap,
    commit_files,
)
from .repair import DivergenceResolver, LogDivergenceResolver, exact_resolver, log_gap
from .spark_engine import (
    DELTA_SPARK_EXTENSION,
    delta_spark_available,
    delta_spark_ranges,
    write_delta_spark,
)
from .staging import DEFAULT_WRITE_TIMEOUT_S, SWEEP_INTERVAL_S, staging_path, sweep
from .upsert import (
    UPSERT_COLUMNS,
    check_keyed,
    latest_per_key,
    latest_per_key_spark,
    merge_latest,
    rebuilt_rows,
)

logger = logging.getLogger(__name__)

#: A micro-batch of at most this many rows and bytes (as Arrow) is collected, written and
#: committed on the driver by delta-rs in one Spark job (the collect); a larger one is
#: written by the executors. Streaming batches are mostly this small, and for them the
#: executors' write (a second job, staging, renames) costs more than the rows.
SMALL_BATCH_ROWS = 4096
SMALL_BATCH_BYTES = 8 << 20
_QUERY_ID_PROPERTY = "sql.streaming.queryId"

Engine = Literal["delta-rs", "delta-spark", "auto"]
Mode = Literal["append", "upsert"]


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
        mode: ``"append"`` (default): every record a row; ``"upsert"``: one row per
            ``(topic, partition, key)`` with its latest record, a tombstone deletes it
            (``upsert.py``; a truncation rebuilds the partition from the log, which
            needs ``bootstrap``).
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
        write_timeout_s: a staging directory of another query's write that has not
            changed for this long is swept (this query's own leftovers at once).
        small_rows, small_bytes: a micro-batch of at most this many rows and Arrow bytes
            is written and committed on the driver; a larger one is written by the
            executors. ``small_rows=0``: always the executors.
        read_small_from_log: a small micro-batch that is the quorumlog source's rows
            unchanged (no projection or filter before the sink) is read from the log on
            the driver, as its Spark task would read it, without a Spark job
            (``connector/driver_read.py``); False: Spark collects every small batch.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        app_id: str | None = None,
        partition_by: Sequence[str] | None = DEFAULT_PARTITION_BY,
        storage_options: dict[str, str] | None = None,
        mode: Mode = "append",
        engine: Engine = "delta-rs",
        on_commit: Callable[[CommitResult], None] | None = None,
        resolve_divergence: DivergenceResolver | None = None,
        bootstrap: str | None = None,
        security: ClientSecurity | None = None,
        metadata_lookback: int = DEFAULT_METADATA_LOOKBACK,
        small_rows: int = SMALL_BATCH_ROWS,
        small_bytes: int = SMALL_BATCH_BYTES,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        read_small_from_log: bool = True,
    ) -> None:
        if engine not in ("delta-rs", "delta-spark", "auto"):
            raise ValueError(f"engine must be 'delta-rs', 'delta-spark' or 'auto', not {engine!r}")
        if mode not in ("append", "upsert"):
            raise ValueError(f"DeltaSink option 'mode' must be 'append' or 'upsert', not {mode!r}")
        if mode == "upsert" and engine != "delta-rs":
            raise ValueError(f"DeltaSink mode='upsert' needs engine='delta-rs', not {engine!r}")
        if app_id is not None and not app_id:
            raise ValueError("app_id must be a non-empty string or None (the query's id)")
        self.path = str(path)
        self.app_id = app_id
        self.partition_by = list(partition_by) if partition_by else None
        self.storage_options = storage_options
        self.mode = mode
        self.engine = engine
        self.on_commit = on_commit
        if resolve_divergence is None and bootstrap is not None:
            resolve_divergence = LogDivergenceResolver(bootstrap, security=security)
        self.resolve_divergence = resolve_divergence
        self.metadata_lookback = metadata_lookback
        self.small_rows = small_rows
        self.small_bytes = small_bytes
        self.write_timeout_s = write_timeout_s
        self.read_small_from_log = read_small_from_log
        self._driver_reads = DriverReads()
        self._table: DeltaTable | None = None
        # staging directories of this sink's writes in progress, and when it last swept
        self._staging_in_use: set[str] = set()
        self._last_sweep: float | None = None
        # per query, not per batch: the apps whose DataFrame's columns were checked, and
        # the positions of this sink's last commit (table version, positions)
        self._checked_apps: set[str] = set()
        self._last_commit: tuple[int, Positions] | None = None
        _open_table(self.path, storage_options)  # fail before the stream starts

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_table"] = None  # a native handle; reopened on first use
        state["_driver_reads"] = DriverReads()  # their clients stay with this process
        state["_last_commit"] = None
        state["_staging_in_use"] = set()
        state["_last_sweep"] = None  # a new process sweeps before its first batch
        return state

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write_batch(df, batch_id)

    def write_batch(self, df: Any, batch_id: int) -> CommitResult | None:
        """Write one micro-batch; ``None`` if it was skipped (replayed or empty)."""
        app_id = self._resolve_app_id(df)
        if app_id not in self._checked_apps:  # a query's batches share its columns
            required = [*REQUIRED_COLUMNS, *(UPSERT_COLUMNS if self.mode == "upsert" else ())]
            missing = [c for c in required if c not in df.columns]
            if missing:
                raise DeltaSinkError(
                    f"Delta sink {self.path}: the DataFrame lacks columns {missing} (has "
                    f"{df.columns}); keep the quorumlog source's columns {required}."
                )
            self._checked_apps.add(app_id)
        self._sweep_staging(app_id)
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
        if self.mode == "upsert":
            return self._write_upsert(df, batch_id, app_id, table)
        engine = self._engine(df)
        if engine == "delta-spark":
            return self._write_delta_spark(df, batch_id, app_id, table)
        from_log = self._read_small_from_log(df, batch_id)
        if isinstance(from_log, pa.Table):
            return self._write_on_driver(from_log, batch_id, app_id, table)
        if _local_root(self.path) is None:
            # object stores: executors cannot be handed the store's credentials here
            return self._write_on_driver(df.toArrow(), batch_id, app_id, table)
        if isinstance(from_log, TooLarge) or self._known_large(df):
            return self._write_distributed(df, batch_id, app_id, table)
        small = self._collect_if_small(df)
        if small is not None:
            return self._write_on_driver(small, batch_id, app_id, table)
        return self._write_distributed(df, batch_id, app_id, table)

    def _write_upsert(
        self, df: Any, batch_id: int, app_id: str, table: DeltaTable | None
    ) -> CommitResult | None:
        """mode='upsert': the batch reduced to its latest record per key (on the driver
        when small, by Spark when large), merged in one commit (``upsert.py``)."""
        from_log = self._read_small_from_log(df, batch_id)
        data = from_log if isinstance(from_log, pa.Table) else None
        if data is None and not isinstance(from_log, TooLarge) and not self._known_large(df):
            data = self._collect_if_small(df)
        if data is not None:
            if data.num_rows == 0:
                return None
            data, ranges = batch_ranges(data)
            latest = latest_per_key(data)
        else:
            ranges = delta_spark_ranges(df)
            if not ranges:
                return None
            latest = latest_per_key_spark(df)
        check_keyed(latest, f"Delta sink {self.path}: batch {batch_id}")
        if table is not None:
            latest = latest.select(self._table_columns(latest.column_names, table))
        previous = self._previous_positions(table)
        plan = plan_commit(app_id, batch_id, ranges, previous)
        resolver = self.resolve_divergence
        parts, rebuilds = rebuilt_rows(
            resolver if isinstance(resolver, LogDivergenceResolver) else None,
            self.path,
            [(t.topic, t.partition, t.first_redelivered_offset) for t in plan.truncations],
            latest.schema,
        )
        if parts:
            latest = latest_per_key(pa.concat_tables([*parts, latest]))
        try:
            merge_latest(
                self.path,
                table,
                latest,
                rebuilds,
                self._commit_properties(plan),
                self.partition_by,
                self.storage_options,
            )
        except DeltaError as exc:
            raise self._write_error(plan, exc) from exc
        return self._committed(plan, sum(r.rows for r in ranges))

    def _read_small_from_log(self, df: Any, batch_id: int) -> pa.Table | TooLarge | None:
        """A small batch of the source's rows unchanged, read from the log on the driver
        (``DriverReads``); ``TooLarge`` for a larger one; None when it is not one (Spark
        reads it then)."""
        if not self.read_small_from_log or self.small_rows <= 0:
            return None
        return self._driver_reads.read(df, batch_id, self.small_rows, self.small_bytes)

    def _known_large(self, df: Any) -> bool:
        """A batch read of the source that spans more than ``small_rows`` offsets
        (``batch_read_offsets``) goes to the executors without the size probe: the probe's
        job stops the source's Python workers mid-read, and the write's job then starts
        new ones (1.6 s of a 1M-row write here)."""
        if self.small_rows <= 0:
            return True
        offsets = batch_read_offsets(df)
        return offsets is not None and offsets > self.small_rows

    def _collect_if_small(self, df: Any) -> pa.Table | None:
        """The batch on the driver if it is small (at most ``small_rows`` rows and
        ``small_bytes`` bytes as Arrow), else None. One Spark job collects at most
        ``small_rows + 1`` rows: for a small batch it is the batch's only job, for a large
        one it reads a few thousand rows before the executors write it."""
        if self.small_rows <= 0:
            return None
        data = df.limit(self.small_rows + 1).toArrow()
        if data.num_rows > self.small_rows or data.nbytes > self.small_bytes:
            logger.debug(
                "Delta sink %s: batch over %d rows or %d bytes; writing it on the executors",
                self.path,
                self.small_rows,
                self.small_bytes,
            )
            return None
        return data

    def _write_on_driver(
        self, data: pa.Table, batch_id: int, app_id: str, table: DeltaTable | None
    ) -> CommitResult | None:
        """A small batch (or any batch on an object store) as one Arrow table on the
        driver, written and committed by delta-rs: no Spark job beyond the one that
        collected it."""
        if data.num_rows == 0:
            # No rows, no new positions; the next batch's txn version supersedes this one.
            logger.debug("Delta sink %s: batch %d is empty; nothing to commit", self.path, batch_id)
            return None
        if table is not None:
            data = data.select(self._table_columns(data.column_names, table))
        data, ranges = batch_ranges(data)
        previous = self._previous_positions(table)
        plan = plan_commit(
            app_id, batch_id, ranges, previous, exact_resolver(self.resolve_divergence, table)
        )
        gap = log_gap(self.resolve_divergence, self.path, plan, data.schema)
        if gap is not None:
            data, ranges = batch_ranges(pa.concat_tables([gap, data]))
            plan = _replanned(plan, ranges, previous)
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
        data = df.select(*(_column(c) for c in self._table_columns(df.columns, table)))
        existed = os.path.isdir(root)
        batch = FileBatch(
            session=df.sparkSession,
            root=root,
            partition_by=partition_by,
            files=[],
            schema=None if table is not None else data.limit(0).toArrow().schema,
            staging=staging_path(root, app_id),
        )
        committing = False
        assert batch.staging is not None
        self._staging_in_use.add(batch.staging)
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
            previous = self._previous_positions(table)
            plan = plan_commit(
                app_id, batch_id, ranges, previous, exact_resolver(self.resolve_divergence, table)
            )
            if table is not None and plan.replaces:
                gap = log_gap(
                    self.resolve_divergence, self.path, plan, pa.schema(table.schema().to_arrow())
                )
                if gap is not None:
                    batch.files.extend(_write_gap(batch, gap))
                    ranges = _ranges_of_files(batch)
                    plan = _replanned(plan, ranges, previous)
            rows = sum(r.rows for r in ranges)
            committing = True
            if plan.replaces:
                self._replace(batch, plan, table)
            else:
                self._append(batch, plan, table)
        except BaseException:
            if not committing or not self._commit_landed(app_id, batch_id):
                batch.discard(existed)
            raise
        finally:
            self._staging_in_use.discard(batch.staging)
        return self._committed(plan, rows)

    def _sweep_staging(self, app_id: str) -> None:
        """Before the first batch and every ``SWEEP_INTERVAL_S``: remove staging
        directories of writes that never finished (``staging.sweep``)."""
        root = _local_root(self.path)
        now = time.monotonic()
        if root is None or (
            self._last_sweep is not None and now - self._last_sweep < SWEEP_INTERVAL_S
        ):
            return
        self._last_sweep = now
        try:
            sweep(root, app_id, self._staging_in_use, self.write_timeout_s, time.time())
        except OSError:
            logger.warning("Delta sink %s: sweeping staging directories failed", self.path)

    def _table_columns(self, given: Sequence[str], table: DeltaTable | None) -> list[str]:
        """The columns to write, in the table's order; a DataFrame must bring exactly the
        table's columns (a file missing one, or holding one the table has not, would be
        read wrong or not at all)."""
        if table is None:
            return list(given)
        columns = [f.name for f in table.schema().fields]
        missing = [c for c in columns if c not in given]
        extra = [c for c in given if c not in columns]
        if missing or extra:
            raise DeltaSinkError(
                f"Delta sink {self.path}: the DataFrame's columns {list(given)} are not the "
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
        if self._last_commit is not None and self._last_commit[0] == table.version():
            return self._last_commit[1]  # nobody committed since this sink's last batch
        entry = _latest_sink_metadata(table, self.metadata_lookback)
        return _positions_from_offsets(entry["positions"]) if entry else {}

    def _engine(self, df: Any) -> str:
        if self.engine == "delta-rs":
            return "delta-rs"
        available = delta_spark_available(df.sparkSession)
        if self.engine == "delta-spark" and not available:
            raise DeltaSinkError(
                "engine='delta-spark' but the session is not configured for delta-spark "
                f"(spark.sql.extensions must include {DELTA_SPARK_EXTENSION} and its jars "
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
        try:
            commit_files(self.path, self.storage_options, batch, plan, table, removes)
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
        self._last_commit = (table.version(), plan.positions)
        result = CommitResult(
            self.path,
            plan.app_id,
            plan.batch_id,
            table.version(),
            rows,
            plan.truncations,
            plan.ranges,
        )
        logger.info(
            "Delta sink %s: batch %d committed as version %d (%d rows, %s)",
            self.path,
            plan.batch_id,
            result.version,
            rows,
            self.mode if self.mode == "upsert" else "replace" if plan.replaces else "append",
        )
        if self.on_commit is not None:
            self.on_commit(result)
        return result

    def _write_delta_spark(
        self, df: Any, batch_id: int, app_id: str, table: DeltaTable | None
    ) -> CommitResult | None:
        """The same commit through delta-spark (``spark_engine``). Not exercised here:
        delta-spark's jars cannot be fetched in this environment."""
        ranges = delta_spark_ranges(df)
        if not ranges:
            return None
        plan = plan_commit(
            app_id, batch_id, ranges, self._previous_positions(table), self.resolve_divergence
        )
        partition_by = self.partition_by if table is None else None
        write_delta_spark(df, self.path, plan, partition_by)
        return self._committed(plan, sum(r.rows for r in ranges))
