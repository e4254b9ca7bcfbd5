"""The Delta sink's short path: a small micro-batch of the quorumlog source's rows, read
from the log on the driver without a Spark job, is the batch Spark would have read; a
DataFrame changed before the sink goes through Spark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from quorumlog.connector.delta import CommitResult, DeltaSink
from quorumlog.connector.driver_read import batch_read_offsets
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.spark import source
from tests.support.waits import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(240)]

ROUNDS = 3
ROWS = ROUNDS * (1 + 2)  # a round: one record to partition 0, two to partition 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("short")) as c:
        yield c


def _log_rows(spark: Any, c: LocalCluster, topic: str) -> list[dict[str, Any]]:
    """The topic as a batch read gives it (key, value, partition, offset, epoch)."""
    df = source(spark, c, topic, includeHeaders="true")
    return sorted(_row(r) for r in df.toArrow().to_pylist())


def _stream_source(spark: Any, c: LocalCluster, topic: str) -> Any:
    return source(spark, c, topic, stream=True, startingOffsets="earliest", includeHeaders="true")


def _row(r: dict[str, Any]) -> tuple[Any, ...]:
    headers = [(h["key"], h["value"]) for h in r["headers"] or []]
    return (r["partition"], r["offset"], r["leaderEpoch"], r["key"], r["value"], headers)


def _table_rows(path: Path) -> list[tuple[Any, ...]]:
    return sorted(_row(r) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist())


def _stream(
    spark: Any, c: LocalCluster, topic: str, tmp_path: Path, sink: DeltaSink, select: bool = False
) -> tuple[Any, list[dict[str, Any]]]:
    """Run a stream of a new 2-partition ``topic`` into ``sink`` while three rounds of
    records are produced, each round waited for in the table; returns the stopped query
    and its progress reports."""
    c.create_topic(topic, 2)
    df = _stream_source(spark, c, topic)
    if select:
        df = df.select(*df.columns)  # the same columns, but not the source's plan alone
    ends: dict[int, int] = {}

    def committed(result: CommitResult) -> None:
        for r in result.ranges:
            ends[r.partition] = max(ends.get(r.partition, 0), r.max_offset + 1)

    sink.on_commit = committed
    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        for round_ in range(ROUNDS):
            last = {
                p: c.produce(topic, p, [f"r{round_}-p{p}-{i}".encode() for i in range(1 + p)])[-1]
                for p in (0, 1)
            }
            wait_until(
                lambda last=last: (
                    query.exception() is not None
                    or all(ends.get(p, 0) > at.offset for p, at in last.items())
                ),
                60,
                f"round {round_} in the table",
            )
            assert query.exception() is None, query.exception()
        # a batch's progress is reported after its commit returns
        wait_until(
            lambda: sum(p["numInputRows"] for p in query.recentProgress) >= ROWS,
            30,
            f"progress reports counting {ROWS} rows",
        )
        progress = list(query.recentProgress)
    finally:
        query.stop()
    return query, progress


def _jobs(spark: Any, query: Any) -> int:
    """Spark jobs the query's run ran (its micro-batches run in the run id's job group)."""
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(str(query.runId)))


def test_small_batches_of_the_source_are_read_on_the_driver_exactly(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    """Every batch is read from the log on the driver: the run ran no Spark job, the
    table holds the log row for row (epochs and headers included), and the query's
    progress counts the rows it read as if its tasks had."""
    table = tmp_path / "t"
    query, progress = _stream(spark, cluster, "short", tmp_path, DeltaSink(table))
    assert _jobs(spark, query) == 0
    assert _table_rows(table) == _log_rows(spark, cluster, "short")
    assert sum(p["numInputRows"] for p in progress) == ROWS == len(_table_rows(table))


def test_the_short_path_off_or_a_changed_dataframe_goes_through_spark(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    """With ``read_small_from_log=False``, or a DataFrame changed before the sink (here a
    projection of the same columns), Spark reads each batch (jobs run) and the table is
    the same."""
    off = tmp_path / "off"
    query, _ = _stream(
        spark, cluster, "short-off", off, DeltaSink(off / "t", read_small_from_log=False)
    )
    assert _jobs(spark, query) > 0
    assert _table_rows(off / "t") == _log_rows(spark, cluster, "short-off")

    changed = tmp_path / "changed"
    query, _ = _stream(
        spark, cluster, "short-changed", changed, DeltaSink(changed / "t"), select=True
    )
    assert _jobs(spark, query) > 0
    assert _table_rows(changed / "t") == _log_rows(spark, cluster, "short-changed")


def test_a_batch_over_the_small_size_goes_through_spark(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    """A batch spanning more offsets than ``small_rows`` is not read on the driver."""
    table = tmp_path / "t"
    query, _ = _stream(spark, cluster, "short-large", tmp_path, DeltaSink(table, small_rows=1))
    assert _jobs(spark, query) > 0
    assert _table_rows(table) == _log_rows(spark, cluster, "short-large")


def test_a_dataframe_made_from_the_batch_in_the_users_function_goes_through_spark(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    """A ``foreachBatch`` function of the user's that filters the batch and hands the
    result to the sink: the query's plan is the scan alone, but the sink's DataFrame is
    not the batch, so Spark reads it and the table holds only the rows kept."""
    topic = "short-filtered"
    cluster.create_topic(topic, 2)
    for p in (0, 1):
        cluster.produce(topic, p, [f"p{p}-{i}".encode() for i in range(3)])
    table = tmp_path / "t"
    sink = DeltaSink(table)
    query = (
        _stream_source(spark, cluster, topic)
        .writeStream.foreachBatch(lambda df, batch_id: sink(df.filter("partition = 1"), batch_id))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    assert _jobs(spark, query) > 0
    kept = [r for r in _log_rows(spark, cluster, topic) if r[0] == 1]
    assert len(kept) == 3
    assert _table_rows(table) == kept


def test_a_large_batch_read_of_the_source_skips_the_size_probe(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    """A batch read of the source spanning more than ``small_rows`` offsets is written by
    the executors without the job that probes its size (that job stops the source's
    Python workers mid-read, and the write's job then starts new ones); a changed
    DataFrame is probed. Both tables hold the same rows."""
    topic = "short-batch"
    cluster.create_topic(topic, 2)
    for p in (0, 1):
        cluster.produce(topic, p, [f"p{p}-{i}".encode() for i in range(5)])
    df = source(spark, cluster, topic, includeHeaders="true")
    client = cluster.client
    spans = [
        client.list_offsets(topic, p, "latest").offset
        - client.list_offsets(topic, p, "earliest").offset
        for p in (0, 1)
    ]
    assert batch_read_offsets(df) == sum(spans)
    assert batch_read_offsets(df.select(*df.columns)) is None

    def jobs(frame: Any, table: Path) -> int:
        context = spark.sparkContext
        context.setJobGroup(table.name, "a batch into Delta")
        try:
            DeltaSink(table, app_id="batch", small_rows=4).write_batch(frame, 0)
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
        return len(context.statusTracker().getJobIdsForGroup(table.name))

    plain = jobs(df, tmp_path / "plain")
    changed = jobs(df.select(*df.columns), tmp_path / "changed")
    assert changed == plain + 1
    expected = _log_rows(spark, cluster, topic)
    assert len(expected) == 10
    assert _table_rows(tmp_path / "plain") == _table_rows(tmp_path / "changed") == expected
