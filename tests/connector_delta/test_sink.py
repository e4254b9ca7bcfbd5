"""DeltaSink called directly as ``sink(df, batch_id)`` on real Spark DataFrames."""

from __future__ import annotations

import glob
import json
import os
import pickle
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from quorumlog.connector.delta import (
    METADATA_KEY,
    DeltaSink,
    DeltaSinkError,
    LogDivergenceResolver,
    Position,
    delta_spark_available,
    read_committed_offsets_json,
    read_committed_positions,
)
from quorumlog.connector.schema import ARROW_SCHEMA
from quorumlog.connector.truncation import EpochRun

from .helpers import last_commit, rows, source_df, source_table, table_rows

pytestmark = pytest.mark.spark

APP = "test-app"
#: DeltaSink(small_rows=...) of the two write paths: small batches collected and written on
#: the driver (the default), or every batch written by the executors
WRITE_PATHS = pytest.mark.parametrize("small_rows", [4096, 0], ids=["driver", "executors"])


def keys(path: Path) -> Counter[tuple[str, int, int]]:
    return Counter((t, p, o) for t, p, o, _, _ in table_rows(path))


def assert_unique(path: Path) -> None:
    dup = [k for k, n in keys(path).items() if n > 1]
    assert not dup, f"offsets held twice: {dup}"


@WRITE_PATHS
def test_append_records_positions_and_reads_them_back(
    spark: Any, tmp_path: Path, small_rows: int
) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP, small_rows=small_rows)
    # Gaps (control batches are not rows): the end is max offset + 1 regardless.
    b0 = rows("ev", 0, [0, 1, 3], 1, "a") + rows("ev", 1, [0, 1], 2, "a")
    sink(source_df(spark, b0), 0)
    b1 = rows("ev", 0, [4, 5], 1, "a") + rows("ev", 0, [7], 3, "a") + rows("ot", 0, [10], 5, "a")
    sink(source_df(spark, b1), 1)

    assert table_rows(path) == sorted(b0 + b1)
    dt = DeltaTable(str(path))
    assert dt.version() == 1
    assert dt.transaction_version(APP) == 1
    assert dt.metadata().partition_columns == ["topic", "partition"]
    meta = last_commit(path)[METADATA_KEY]
    assert meta["appId"] == APP and meta["batchId"] == 1 and meta["truncations"] == []
    # ev/1 is not in batch 1: carried forward from batch 0.
    expected = {
        "ev": {0: Position(8, 3), 1: Position(2, 2)},
        "ot": {0: Position(11, 5)},
    }
    assert meta["batch"] == {
        "ev": {"0": {"offset": 8, "epoch": 3}},
        "ot": {"0": {"offset": 11, "epoch": 5}},
    }
    assert read_committed_positions(path) == expected
    assert json.loads(read_committed_offsets_json(path)) == {
        "ev": {"0": {"offset": 8, "epoch": 3}, "1": {"offset": 2, "epoch": 2}},
        "ot": {"0": {"offset": 11, "epoch": 5}},
    }
    # The tuple form the issue asks for.
    assert read_committed_positions(path)["ev"][0] == (8, 3)


def test_replayed_batch_is_skipped(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP)
    b0 = rows("ev", 0, range(5), 1, "a")
    b1 = rows("ev", 0, range(5, 8), 1, "a")
    assert sink.write_batch(source_df(spark, b0), 0) is not None
    assert sink.write_batch(source_df(spark, b1), 1) is not None
    # Spark replays batch 1 (crash before its checkpoint commit), then an older one; a
    # fresh sink object as after a driver restart.
    again = DeltaSink(path, app_id=APP)
    assert again.write_batch(source_df(spark, b1), 1) is None
    assert again.write_batch(source_df(spark, b0), 0) is None
    assert table_rows(path) == sorted(b0 + b1)
    assert DeltaTable(str(path)).version() == 1
    # Another app id is its own bookkeeping (and its re-delivery is caught by offsets).
    other = DeltaSink(path, app_id="other")
    other(source_df(spark, b1), 1)
    assert table_rows(path) == sorted(b0 + b1)


def test_delta_rs_alone_doubles_a_replayed_app_transaction(tmp_path: Path) -> None:
    """Why the sink checks transaction_version itself: delta-rs 1.6 commits the same
    (app id, version) twice."""
    path = str(tmp_path / "t")
    data = source_table(rows("ev", 0, range(3), 1, "a"))
    for _ in range(2):
        write_deltalake(
            path,
            data,
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(APP, 0)]),
        )
    assert DeltaTable(path).to_pyarrow_table().num_rows == 6


@WRITE_PATHS
def test_redelivery_replaces_only_the_truncated_partition_atomically(
    spark: Any, tmp_path: Path, small_rows: int
) -> None:
    path = tmp_path / "t"
    asked: list[tuple[str, int, Position]] = []

    def offsets_for_leader_epoch(topic: str, partition: int, last: Position) -> int:
        asked.append((topic, partition, last))
        return 7  # the new leader's log ends epoch 1 at offset 7

    sink = DeltaSink(
        path, app_id=APP, resolve_divergence=offsets_for_leader_epoch, small_rows=small_rows
    )
    b0 = rows("ev", 0, range(10), 1, "old") + rows("ev", 1, range(6), 1, "p1")
    sink(source_df(spark, b0), 0)
    b1 = rows("ev", 0, range(10, 12), 1, "old") + rows("ev", 2, range(4), 1, "p2")
    sink(source_df(spark, b1), 1)
    version = DeltaTable(str(path)).version()

    # Unclean election: ev/0 truncated to 7 (the new leader had 0..6 of epoch 1), new
    # epoch 4 appends a control record at 7 and data from 8; the source resumes at 7.
    # The batch also carries new rows of ev/1; ev/2 is not in it.
    b2 = rows("ev", 0, range(8, 10), 4, "new") + rows("ev", 1, range(6, 9), 1, "p1")
    result = sink.write_batch(source_df(spark, b2), 2)
    assert result is not None and result.version == version + 1
    assert DeltaTable(str(path)).version() == version + 1  # one atomic commit

    assert asked == [("ev", 0, Position(12, 1))]
    expected = (
        rows("ev", 0, range(7), 1, "old")
        + rows("ev", 0, range(8, 10), 4, "new")
        + rows("ev", 1, range(9), 1, "p1")
        + rows("ev", 2, range(4), 1, "p2")
    )
    # Old 7 is gone (a control record in the new log), so are old 10 and 11 (the new
    # log has not got them yet).
    assert table_rows(path) == sorted(expected)
    assert_unique(path)

    commit = last_commit(path)
    assert commit["operation"] == "WRITE"
    # one commit removing the replaced files and adding the new ones, with its predicate
    assert "offset >= 7" in commit["operationParameters"]["predicate"]
    meta = commit[METADATA_KEY]
    assert meta["truncations"] == [
        {
            "topic": "ev",
            "partition": 0,
            "divergenceOffset": 7,
            "firstRedeliveredOffset": 8,
            "oldOffset": 12,
            "oldEpoch": 1,
            "newEpoch": 4,
        }
    ]
    assert read_committed_positions(path) == {
        "ev": {0: Position(10, 4), 1: Position(9, 1), 2: Position(4, 1)}
    }
    # Files of partitions other than ev/0 were not rewritten (partition pruning).
    log = path / "_delta_log" / f"{version + 1:020d}.json"
    removed = [
        a["remove"]["path"] for a in map(json.loads, log.read_text().splitlines()) if "remove" in a
    ]
    assert removed and all(p.startswith("topic=ev/partition=0/") for p in removed), removed
    assert commit["operationMetrics"]["num_removed_files"] == len(removed)

    # The stream goes on from the new end: a normal append again.
    b3 = rows("ev", 0, range(10, 13), 4, "new")
    sink(source_df(spark, b3), 3)
    assert last_commit(path)["operationParameters"]["mode"] == "Append"
    assert table_rows(path) == sorted(expected + b3)
    assert_unique(path)


def test_without_a_resolver_rows_are_replaced_from_the_first_redelivered_offset(
    spark: Any, tmp_path: Path
) -> None:
    """Rows alone cannot show the divergence offset when the new log holds a control
    record there: the old row at 7 survives (no offset is held twice, though)."""
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP)
    sink(source_df(spark, rows("ev", 0, range(10), 1, "old")), 0)
    sink(source_df(spark, rows("ev", 0, range(8, 9), 4, "new")), 1)
    assert table_rows(path) == sorted(
        rows("ev", 0, range(8), 1, "old") + rows("ev", 0, [8], 4, "new")
    )
    truncation = last_commit(path)[METADATA_KEY]["truncations"][0]
    assert truncation["divergenceOffset"] == truncation["firstRedeliveredOffset"] == 8
    assert read_committed_positions(path) == {"ev": {0: Position(9, 4)}}


def test_redelivery_with_identical_records_is_idempotent(spark: Any, tmp_path: Path) -> None:
    """A new query (new app id) over the same table re-reading from earlier offsets."""
    path = tmp_path / "t"
    b0 = rows("ev", 0, range(6), 1, "a")
    DeltaSink(path, app_id="first")(source_df(spark, b0), 0)
    DeltaSink(path, app_id="second")(source_df(spark, rows("ev", 0, range(3, 6), 1, "a")), 0)
    assert table_rows(path) == sorted(b0)


def _corrupt_all_but_latest(path: Path) -> None:
    """Checkpoint the table, then overwrite every data file and every commit file before
    the checkpoint with garbage: only the checkpoint and newer commits stay readable."""
    dt = DeltaTable(str(path))
    dt.create_checkpoint()
    for f in glob.glob(str(path / "**" / "*.parquet"), recursive=True):
        if "_delta_log" not in f:
            Path(f).write_bytes(b"not parquet")
    for v in range(dt.version()):
        Path(path / "_delta_log" / f"{v:020d}.json").write_text("not json\n")


def test_normal_batch_reads_neither_data_files_nor_old_commits(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP)
    for b in range(3):
        # one file per batch, so the re-delivery below cuts through a file and must read it
        df = source_df(spark, rows("ev", b % 2, range(b * 10, b * 10 + 5), 1, "a"))
        sink(df.coalesce(1), b)
    _corrupt_all_but_latest(path)

    replaced: list[int] = []
    original = DeltaSink._replace

    def spy(self: DeltaSink, data: Any, plan: Any, table: Any) -> None:
        replaced.append(plan.batch_id)
        original(self, data, plan, table)

    monkeypatch.setattr(DeltaSink, "_replace", spy)
    # A scan of data files or of the history would now fail; these batches must not.
    fresh = DeltaSink(path, app_id=APP)
    fresh(source_df(spark, rows("ev", 0, range(30, 35), 1, "a")), 3)
    fresh(source_df(spark, rows("ev", 1, range(30, 35), 1, "a")), 4)
    fresh(source_df(spark, rows("ev", 0, range(35, 36), 1, "a")), 4)  # replay: skipped
    assert replaced == []
    assert DeltaTable(str(path)).version() == 4
    assert read_committed_positions(path)["ev"] == {0: (35, 1), 1: (35, 1)}

    # The check has teeth: a re-delivery must read ev/0's files, which are garbage.
    with pytest.raises(DeltaSinkError, match="batch 5"):
        fresh(source_df(spark, rows("ev", 0, range(22, 24), 2, "b")), 5)
    assert replaced == [5]


@WRITE_PATHS
def test_empty_batch_commits_nothing(spark: Any, tmp_path: Path, small_rows: int) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP, small_rows=small_rows)
    assert sink.write_batch(source_df(spark, []), 0) is None
    assert not DeltaTable.is_deltatable(str(path))
    sink(source_df(spark, rows("ev", 0, range(3), 1, "a")), 1)
    assert sink.write_batch(source_df(spark, []), 2) is None
    assert DeltaTable(str(path)).version() == 0
    sink(source_df(spark, rows("ev", 0, range(3, 5), 1, "a")), 3)
    # Replays of the empty batch 2 and of batch 1 are skipped by the later txn version.
    assert sink.write_batch(source_df(spark, rows("ev", 0, range(3), 1, "a")), 1) is None
    assert DeltaTable(str(path)).transaction_version(APP) == 3
    assert table_rows(path) == sorted(rows("ev", 0, range(5), 1, "a"))


def test_clear_errors(spark: Any, tmp_path: Path) -> None:
    not_delta = tmp_path / "csv"
    not_delta.mkdir()
    (not_delta / "data.csv").write_text("a,b\n")
    with pytest.raises(DeltaSinkError, match="non-empty directory but not a Delta table"):
        DeltaSink(not_delta, app_id=APP)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(DeltaSinkError, match="is a file"):
        DeltaSink(a_file, app_id=APP)
    with pytest.raises(DeltaSinkError, match="not a Delta table"):
        read_committed_positions(not_delta)

    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP)
    df = source_df(spark, rows("ev", 0, range(3), 1, "a"))
    with pytest.raises(DeltaSinkError, match=r"lacks columns \['offset', 'leaderEpoch'\]"):
        sink(df.drop("offset", "leaderEpoch"), 0)
    dup = rows("ev", 0, [1, 2, 2], 1, "a")
    with pytest.raises(DeltaSinkError, match="offset 2 of ev/0 twice"):
        sink(source_df(spark, dup), 0)
    with pytest.raises(DeltaSinkError, match="app_id"):
        DeltaSink(path)(df, 0)  # no streaming query: no query id
    with pytest.raises(DeltaSinkError, match="engine='delta-spark'"):
        DeltaSink(path, app_id=APP, engine="delta-spark")(df, 0)
    assert not delta_spark_available(spark)
    assert not os.path.exists(path)


def test_sink_pickles_without_its_table_handle(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP)
    sink(source_df(spark, rows("ev", 0, range(3), 1, "a")), 0)
    copy = pickle.loads(pickle.dumps(sink))
    assert copy.write_batch(source_df(spark, rows("ev", 0, range(3), 1, "a")), 0) is None
    copy(source_df(spark, rows("ev", 0, range(3, 4), 1, "a")), 1)
    assert len(table_rows(path)) == 4


class ScriptedLog(LogDivergenceResolver):
    """A log that never had the table's last epoch: the exact divergence is 4 (where the
    table's epoch 2 began), and the log holds epoch-1 records 4..7 there, which the stream
    skipped (it resumed at the inexact bound 8)."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1")  # never dialled
        self.asked: list[tuple[str, int, Position, list[EpochRun]]] = []

    def exact(
        self, topic: str, partition: int, position: Position, runs: Callable[[], Any]
    ) -> int | None:
        held = list(runs())
        self.asked.append((topic, partition, position, held))
        return 4

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table:
        assert (topic, partition, start, end) == ("ev", 0, 4, 9)
        return source_table(rows("ev", 0, range(4, 8), 1, "log")).cast(ARROW_SCHEMA)


@WRITE_PATHS
def test_log_records_below_the_redelivered_offsets_join_the_repair(
    spark: Any, tmp_path: Path, small_rows: int
) -> None:
    path = tmp_path / "t"
    log = ScriptedLog()
    sink = DeltaSink(path, app_id=APP, resolve_divergence=log, small_rows=small_rows)
    sink(source_df(spark, rows("ev", 0, range(4), 1, "a") + rows("ev", 0, range(5, 10), 2, "b")), 0)
    sink(source_df(spark, rows("ev", 1, range(3), 1, "p1")), 1)
    # the stream resumed at 8 (the log's control record) and re-delivers 9.. of epoch 5
    sink(source_df(spark, rows("ev", 0, range(9, 11), 5, "new")), 2)
    assert log.asked == [("ev", 0, Position(10, 2), [EpochRun(1, 0, 3), EpochRun(2, 5, 9)])]
    assert table_rows(path) == sorted(
        rows("ev", 0, range(4), 1, "a")
        + rows("ev", 0, range(4, 8), 1, "log")
        + rows("ev", 0, range(9, 11), 5, "new")
        + rows("ev", 1, range(3), 1, "p1")
    )
    assert_unique(path)
    assert last_commit(path)[METADATA_KEY]["truncations"][0]["divergenceOffset"] == 4
    assert read_committed_positions(path)["ev"][0] == Position(11, 5)
