"""A small streaming micro-batch of the quorumlog source, read on the driver without a job.

The Delta sink's short path for small micro-batches. The Spark job that collects a small
batch cost about 190 ms here (scheduling, a Python worker, rows through the JVM and back
to Arrow) while reading a few records from the log takes milliseconds, so for a streaming
user producing a trickle the job was most of the latency.

It applies when the ``foreachBatch`` DataFrame is the source's rows unchanged: the
query's plan for the batch (``lastExecution``, the one Spark built for this batch id) is
the quorumlog scan alone, with no projection, filter or other source, and the DataFrame
the sink is given is the one Spark handed over for it, not one made from it. Then:

- the batch's start and end offsets are the ones in that plan (Spark planned them and
  wrote them to its offset log before calling the sink);
- the batch is planned again with the source's own planning
  (``QuorumLogStreamReader.replan``: the start and end validated against the log as a
  restarted query validates them, truncation settled by ``onTruncation``);
- each range is read by the tasks' own reader (``read_partition``) on the driver.

So the rows are the ones a Spark task would have read, and a truncation found here fails
or resumes the same way. The scan's ``numOutputRows`` metric gets the rows read, so the
query's progress (``numInputRows``) counts them as if a task had.

Anything else (Spark Connect, another plan shape, a batch with more offsets than the
caller allows) answers None and the caller runs the batch through Spark.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .batch import QuorumLogBatchReader
from .fetch import QuorumLogPartition, read_partition
from .options import QuorumLogOptionError, parse_options
from .schema import ARROW_SCHEMA
from .stream import QuorumLogStreamReader

log = logging.getLogger(__name__)

_QUERY_ID_PROPERTY = "sql.streaming.queryId"
_JOB_GROUP_PROPERTY = "spark.jobGroup.id"
#: Query runs whose plans a sink remembers (one per query it writes for, usually one).
_MAX_RUNS = 4
#: The plan of the DataFrame ``foreachBatch`` hands over: the batch's rows as an RDD.
_BATCH_NODE = "LogicalRDD"
#: The root of a ``foreachBatch`` query's plan for a batch: the sink over the query.
_SINK_NODE = "WriteToMicroBatchDataSourceV1"
#: The logical plan node of a micro-batch's V2 source scan, with its offsets.
_SCAN_RELATION = "StreamingDataSourceV2ScanRelation"
#: The physical scan whose ``numOutputRows`` becomes the progress' ``numInputRows``.
_SCAN_EXEC = "MicroBatchScanExec"


@dataclass(frozen=True)
class TooLarge:
    """A batch the short path did not read: it spans more offsets (or bytes) than the
    caller allows. ``offsets`` is what it spans (at least the bound, when bytes stopped
    the read)."""

    offsets: int


@dataclass(frozen=True)
class PlannedBatch:
    """A micro-batch as the query planned it: the source's options and offsets."""

    run_id: str  # the query run's (a restart is a new run)
    options: dict[str, str]
    start: dict[str, Any]
    end: dict[str, Any]
    scan_exec: Any  # the JVM MicroBatchScanExec of the batch, or None


@dataclass(frozen=True)
class _Run:
    """What one run of a query is, found at its first batch (its plan's shape and the
    source's options do not change from batch to batch)."""

    query: Any  # the JVM StreamExecution
    options: dict[str, str] | None  # None: not the quorumlog source's rows unchanged
    under_sink: bool  # the scan is the child of the sink's node
    scan_leaf: int | None  # the MicroBatchScanExec's index among the executed plan's leaves


class QueryPlans:
    """``planned`` answers which micro-batch a ``foreachBatch`` DataFrame is, from the
    query's plan for the batch; each run of a query is inspected once (py4j calls cost
    about a millisecond each, so a batch makes a dozen)."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}

    def planned(self, df: Any, batch_id: int) -> PlannedBatch | None:
        """The quorumlog micro-batch ``df`` is, if it is the source's rows unchanged and
        the query's plan for ``batch_id`` says which offsets it holds; else None."""
        try:
            context = df.sparkSession.sparkContext
            if not context.getLocalProperty(_QUERY_ID_PROPERTY):
                return None  # not a streaming query's batch
            # a query's batches run in its run id's job group
            run_id = context.getLocalProperty(_JOB_GROUP_PROPERTY)
            if not run_id:
                return None
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = _inspect(df)
                while len(self._runs) > _MAX_RUNS:
                    self._runs.pop(next(iter(self._runs)))
            if run.options is None:
                return None
            execution = run.query.lastExecution()
            if execution is None or execution.currentBatchId() != batch_id:
                return None
            if not _is_batch_itself(df, execution):
                return None  # a DataFrame made from the batch's (filtered, projected, ...)
            plan = execution.logical()
            scan = plan.children().apply(0) if run.under_sink else plan
            scan_exec = (
                None
                if run.scan_leaf is None
                else execution.executedPlan().collectLeaves().apply(run.scan_leaf)
            )
            return PlannedBatch(
                run_id,
                run.options,
                json.loads(scan.startOffset().get().json()),
                json.loads(scan.endOffset().get().json()),
                scan_exec,
            )
        except Exception:  # Spark Connect, another Spark's internals: Spark reads the batch
            log.debug("cannot read the micro-batch's plan; Spark reads it", exc_info=True)
            return None


def _is_batch_itself(df: Any, execution: Any) -> bool:
    """Whether ``df`` is the DataFrame ``foreachBatch`` was given, unchanged: Spark wraps
    the batch's plan (``execution``) as the rows of its RDD, so that is ``df``'s whole
    plan. A sink called by the user's own function with a DataFrame made from the batch
    (a filter, a projection) sees another plan."""
    plan = df._jdf.queryExecution().logical()
    if plan.getClass().getSimpleName() != _BATCH_NODE:
        return False
    return bool(plan.rdd().id() == execution.toRdd().id())


def _inspect(df: Any) -> _Run:
    """The run of the query ``df`` is a batch of: is its plan the quorumlog scan alone?"""
    session = df.sparkSession
    query_id = session.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
    # The batch's session is a clone whose query manager does not list the query; the
    # shared state knows every active query by id.
    uuid = session.sparkContext._jvm.java.util.UUID.fromString(query_id)
    query = session._jsparkSession.sharedState().activeStreamingQueries().get(uuid)
    execution = query.lastExecution()
    plan = execution.logical()
    under_sink = plan.getClass().getSimpleName() == _SINK_NODE and plan.children().size() == 1
    if under_sink:
        plan = plan.children().apply(0)
    if plan.getClass().getSimpleName() != _SCAN_RELATION:
        return _Run(query, None, under_sink, None)  # a projection, filter, join, ... on it
    relation = plan.relation()
    if relation.table().name() != "quorumlog":
        return _Run(query, None, under_sink, None)
    options = dict(relation.options().asCaseSensitiveMap())
    leaves = execution.executedPlan().collectLeaves()
    scans = [
        i for i in range(leaves.size()) if leaves.apply(i).getClass().getSimpleName() == _SCAN_EXEC
    ]
    return _Run(query, options, under_sink, scans[0] if len(scans) == 1 else None)


class DriverReader:
    """Reads planned micro-batches of one query on the driver: the query's own source
    options, one ``QuorumLogStreamReader`` (its client and validated positions kept from
    batch to batch)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.reader = QuorumLogStreamReader(parse_options(options))

    def read(self, batch: PlannedBatch, max_offsets: int, max_bytes: int) -> pa.Table | TooLarge:
        """The batch's rows (``ARROW_SCHEMA``), or ``TooLarge`` when it spans more than
        ``max_offsets`` offsets or its rows pass ``max_bytes`` bytes."""
        tasks = self.reader.replan(batch.start, batch.end)
        offsets = sum(t.end_offset - t.start_offset for t in tasks)
        if offsets > max_offsets:
            return TooLarge(offsets)
        batches: list[pa.RecordBatch] = []
        size = 0
        for task in tasks:
            for record_batch in read_partition(task, self.reader.client):
                batches.append(record_batch)
                size += record_batch.nbytes
                if size > max_bytes:
                    return TooLarge(max(offsets, max_offsets))
        data = pa.Table.from_batches(batches, ARROW_SCHEMA)
        if batch.scan_exec is not None:
            try:
                batch.scan_exec.metrics().apply("numOutputRows").add(data.num_rows)
            except Exception:
                log.debug("cannot count the rows in the query's progress", exc_info=True)
        return data

    def close(self) -> None:
        self.reader.stop()


class DriverReads:
    """The short path of one sink: a ``DriverReader`` per query run (a restarted query
    validates its positions afresh, as its source does)."""

    def __init__(self) -> None:
        self._plans = QueryPlans()
        self._readers: dict[str, DriverReader] = {}

    def read(
        self, df: Any, batch_id: int, max_offsets: int, max_bytes: int
    ) -> pa.Table | TooLarge | None:
        """``df``'s rows read on the driver; ``TooLarge`` if it is a batch of the source
        over the bounds; None if it is not one the short path can read."""
        batch = self._plans.planned(df, batch_id)
        if batch is None:
            return None
        reader = self._readers.get(batch.run_id)
        if reader is None:
            try:
                reader = DriverReader(batch.options)
            except QuorumLogOptionError:
                return None  # the source's own planning reports it
            self._readers[batch.run_id] = reader
            while len(self._readers) > _MAX_RUNS:
                self._readers.pop(next(iter(self._readers))).close()
        return reader.read(batch, max_offsets, max_bytes)


#: The logical plan of ``spark.read.format("quorumlog").load()``.
_BATCH_RELATION = "DataSourceV2Relation"


def batch_read_offsets(df: Any) -> int | None:
    """How many offsets ``df`` spans if it is a batch read of the quorumlog source,
    unchanged (``spark.read.format("quorumlog")...load()``), planned again now by the
    batch reader's own planning; None for any other DataFrame or when planning fails. An
    estimate (a read to "latest" plans again at each action), for choosing a write path."""
    try:
        plan = df._jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() != _BATCH_RELATION:
            return None
        if plan.table().name() != "quorumlog":
            return None
        options = dict(plan.options().asCaseSensitiveMap())
        tasks = QuorumLogBatchReader(parse_options(options)).partitions()
        return sum(
            t.end_offset - t.start_offset for t in tasks if isinstance(t, QuorumLogPartition)
        )
    except Exception:
        log.debug("cannot plan the batch read again; the sink probes its size", exc_info=True)
        return None
