"""The files of the distributed write: Spark's own Parquet writer writes them into a
staging directory, tasks describe them, the driver moves them into the table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from quorumlog.connector.delta import STAGING_DIR, DeltaSink, DeltaSinkError, Position, executors
from quorumlog.connector.delta import read_committed_positions as positions

from .helpers import last_commit, rows, source_df, table_rows

pytestmark = pytest.mark.spark

APP = "files-app"


def data_files(path: Path) -> set[str]:
    """Every file under the table but its log, relative to it."""
    return {
        os.path.relpath(os.path.join(d, n), path)
        for d, _dirs, names in os.walk(path)
        for n in names
        if not os.path.relpath(d, path).startswith("_delta_log")
    }


def add_actions(path: Path) -> list[dict[str, Any]]:
    return pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()


@pytest.mark.parametrize("described_by", ["driver", "tasks"])
def test_files_are_sparks_sorted_by_offset_with_footer_stats_and_nothing_else_is_left(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, described_by: str
) -> None:
    if described_by == "tasks":  # as a batch above the driver's share would be
        monkeypatch.setattr(executors, "DRIVER_DESCRIBE_ROWS", 0)
    path = tmp_path / "t"
    # ev/0 arrives out of offset order and in two epochs; ev/1 in another Spark partition
    b0 = rows("ev", 0, [5, 1, 3, 0], 1, "a") + rows("ev", 0, [9, 7], 2, "a")
    b1 = rows("ev", 1, range(4), 3, "b")
    df = source_df(spark, b0).coalesce(1).union(source_df(spark, b1).coalesce(1))
    DeltaSink(path, app_id=APP, small_rows=0)(df, 0)

    assert table_rows(path) == sorted(b0 + b1)
    assert positions(path) == {"ev": {0: Position(10, 2), 1: Position(4, 3)}}
    actions = {a["path"]: a for a in add_actions(path)}
    # the table's directory holds its files and nothing else: no staging directory,
    # no _SUCCESS, no checksum files
    assert data_files(path) == set(actions)
    assert not (path / STAGING_DIR).exists()
    by_partition = {a["partition.partition"]: a for a in actions.values()}
    assert sorted(by_partition) == [0, 1]
    for p, action in by_partition.items():
        assert action["path"].startswith(f"topic=ev/partition={p}/")
        parquet = pq.ParquetFile(path / action["path"])
        # written by Spark's JVM writer (parquet-mr), not by a Python task
        assert "parquet-mr" in parquet.metadata.created_by
        timestamp = parquet.schema_arrow.field("timestamp").type
        assert str(timestamp) == "timestamp[us, tz=UTC]"  # not Spark's default INT96
        offsets = parquet.read(columns=["offset"]).column("offset").to_pylist()
        assert offsets == sorted(offsets)
        # the add action's statistics are the footer's
        assert action["num_records"] == len(offsets)
        assert (action["min.offset"], action["max.offset"]) == (min(offsets), max(offsets))
        assert action["null_count.offset"] == 0
    assert (by_partition[0]["min.leaderEpoch"], by_partition[0]["max.leaderEpoch"]) == (1, 2)


def test_unpartitioned_table_keeps_one_topic_partition_per_file_and_repairs(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP, partition_by=None, small_rows=0)
    b0 = rows("ev", 0, range(6), 1, "old") + rows("ev", 1, range(3), 1, "p1")
    sink(source_df(spark, b0).coalesce(1), 0)  # one task, two topic-partitions
    assert DeltaTable(str(path)).metadata().partition_columns == []
    files = [a["path"] for a in add_actions(path)]
    assert len(files) == 2 and all("/" not in f for f in files)  # at the table root
    held = sorted(
        [
            (r["topic"], r["partition"])
            for r in t.group_by(["topic", "partition"]).aggregate([]).to_pylist()
        ]
        for t in (pq.read_table(path / f, columns=["topic", "partition"]) for f in files)
    )
    assert held == [[("ev", 0)], [("ev", 1)]]
    assert data_files(path) == set(files)

    # ev/0 re-delivered from 4: its file is rewritten below the cut; ev/1's is untouched
    b1 = rows("ev", 0, range(4, 7), 2, "new")
    sink(source_df(spark, b1), 1)
    assert table_rows(path) == sorted(
        rows("ev", 0, range(4), 1, "old") + b1 + rows("ev", 1, range(3), 1, "p1")
    )
    assert last_commit(path)["quorumlog"]["truncations"][0]["divergenceOffset"] == 4
    assert positions(path) == {"ev": {0: Position(7, 2), 1: Position(3, 1)}}
    assert not (path / STAGING_DIR).exists()


def test_columns_must_be_the_tables_and_bad_rows_leave_nothing(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP, small_rows=0)
    df = source_df(spark, rows("ev", 0, range(3), 1, "a"))
    null_topic = df.withColumn(
        "topic", F.when(F.col("offset") == 1, None).otherwise(F.col("topic"))
    )
    with pytest.raises(DeltaSinkError, match="Column 'topic' has null values"):
        sink(null_topic, 0)
    null_epoch = df.withColumn(
        "leaderEpoch", F.when(F.col("offset") == 2, None).otherwise(F.col("leaderEpoch"))
    )
    with pytest.raises(DeltaSinkError, match="Column 'leaderEpoch' has null values"):
        sink(null_epoch, 0)
    assert not path.exists()  # a failed first batch leaves no directory behind

    # another column order is the same table; another column set is refused
    sink(df, 0)
    later = source_df(spark, rows("ev", 0, range(3, 5), 1, "a"))
    sink(later.select(*reversed(later.columns)), 1)
    assert table_rows(path) == sorted(rows("ev", 0, range(5), 1, "a"))
    more = source_df(spark, rows("ev", 0, range(5, 7), 1, "a")).withColumn("extra", F.lit(1))
    with pytest.raises(DeltaSinkError, match=r"not in the table \['extra'\]"):
        sink(more, 2)
    with pytest.raises(DeltaSinkError, match=r"missing \['headers'\]"):
        sink(more.drop("extra", "headers"), 2)
    assert DeltaTable(str(path)).version() == 1
    assert data_files(path) == {a["path"] for a in add_actions(path)}


def test_the_sink_chooses_the_path_by_the_batch_size(spark: Any, tmp_path: Path) -> None:
    """A batch of at most small_rows rows (and small_bytes bytes) is collected and written
    by delta-rs on the driver; a larger one by Spark's writer on the executors; both go
    into one table."""
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP, small_rows=3)
    small, large = rows("ev", 0, range(3), 1, "a"), rows("ev", 0, range(3, 7), 1, "a")
    sink(source_df(spark, small), 0)
    sink(source_df(spark, large), 1)
    DeltaSink(path, app_id=APP, small_bytes=1)(source_df(spark, rows("ev", 0, [7], 1, "a")), 2)
    assert writers(path, 0) == {"delta-rs"}
    assert writers(path, 1) == writers(path, 2) == {"parquet-mr"}
    assert table_rows(path) == sorted(small + large + rows("ev", 0, [7], 1, "a"))
    assert positions(path) == {"ev": {0: Position(8, 1)}}


def writers(path: Path, version: int) -> set[str]:
    """Which Parquet writer wrote the files the commit of ``version`` added."""
    log = (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    adds = [json.loads(line)["add"]["path"] for line in log if line.startswith('{"add"')]
    created = {pq.read_metadata(path / a).created_by or "" for a in adds}
    return {
        "delta-rs" if c.startswith("delta-rs") else "parquet-mr" if "parquet-mr" in c else c
        for c in created
    }
