"""DeltaSink(mode="upsert") on real Spark DataFrames and real Delta tables: one row per
(topic, partition, key) with its latest record, tombstones delete, batches replayed are
skipped, on both the driver's and Spark's reduction; the reduction itself in Arrow."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from quorumlog.connector.delta import DeltaSink, DeltaSinkError, read_committed_positions
from quorumlog.connector.delta.upsert import latest_per_key

from .helpers import SOURCE_SCHEMA

APP = "upsert-app"
# (topic, partition, offset, key, value or None for a tombstone)
Rec = tuple[str, int, int, str, str | None]
_T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def records_table(recs: Sequence[Rec], epoch: int = 1) -> pa.Table:
    return pa.table(
        {
            "key": [r[3].encode() for r in recs],
            "value": [None if r[4] is None else r[4].encode() for r in recs],
            "topic": [r[0] for r in recs],
            "partition": [r[1] for r in recs],
            "offset": [r[2] for r in recs],
            "leaderEpoch": [epoch] * len(recs),
            "timestamp": [_T0 + dt.timedelta(milliseconds=r[2]) for r in recs],
            "headers": [[] for _ in recs],
        },
        schema=SOURCE_SCHEMA,
    )


def expected(recs: Sequence[Rec]) -> dict[tuple[str, int, str], tuple[int, str]]:
    """The latest live record of each key, computed record by record (the test's model)."""
    state: dict[tuple[str, int, str], tuple[int, str]] = {}
    for t, p, o, k, v in sorted(recs, key=lambda r: r[2]):
        if v is None:
            state.pop((t, p, k), None)
        else:
            state[(t, p, k)] = (o, v)
    return state


def table_state(path: Path) -> dict[tuple[str, int, str], tuple[int, str]]:
    rows = (
        DeltaTable(str(path))
        .to_pyarrow_table(columns=["topic", "partition", "key", "offset", "value"])
        .to_pylist()
    )
    out = {
        (r["topic"], r["partition"], r["key"].decode()): (r["offset"], r["value"].decode())
        for r in rows
    }
    assert len(out) == len(rows), "a key has more than one row"
    return out


def versions(topic: str, partition: int, start: int, keys: int, rounds: int) -> list[Rec]:
    """``rounds`` versions of each of ``keys`` keys; every third key of a round is deleted
    (then written again the next round)."""
    out: list[Rec] = []
    offset = start
    for r in range(rounds):
        for k in range(keys):
            value = None if (k + r) % 3 == 0 else f"k{k}-r{r}"
            out.append((topic, partition, offset, f"k{k}", value))
            offset += 1
    return out


def test_latest_per_key_keeps_the_highest_offset_of_each_key() -> None:
    recs = [
        ("a", 0, 5, "x", "x5"),
        ("a", 0, 1, "x", "x1"),
        ("a", 0, 2, "y", "y2"),
        ("a", 0, 7, "y", None),
        ("a", 1, 3, "x", "x3-p1"),
        ("b", 0, 4, "x", "x4-b"),
    ]
    latest = latest_per_key(records_table(recs))
    got = [
        (r["topic"], r["partition"], r["offset"], r["key"].decode(), r["value"])
        for r in latest.to_pylist()
    ]
    assert got == [
        ("a", 0, 5, "x", b"x5"),
        ("a", 0, 7, "y", None),
        ("a", 1, 3, "x", b"x3-p1"),
        ("b", 0, 4, "x", b"x4-b"),
    ]
    assert latest_per_key(records_table([])).num_rows == 0


@pytest.mark.spark
@pytest.mark.parametrize("small_rows", [4096, 0], ids=["driver", "spark"])
def test_upsert_many_versions_and_tombstones(spark: Any, tmp_path: Path, small_rows: int) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP, mode="upsert", small_rows=small_rows)
    b0 = versions("ev", 0, 0, 12, 3) + versions("ev", 1, 0, 5, 2)
    b1 = versions("ev", 0, 36, 12, 4)
    b2 = [("ev", 0, 90, "k1", None), ("ev", 0, 91, "k1", "back"), ("ev", 1, 10, "k0", None)]
    seen: list[Rec] = []
    for batch_id, batch in enumerate([b0, b1, b2]):
        assert sink(spark.createDataFrame(records_table(batch)), batch_id) is None
        seen += batch
        assert table_state(path) == expected(seen), batch_id
    # a replayed batch is skipped: the table stays as it is
    assert sink.write_batch(spark.createDataFrame(records_table(b1)), 1) is None
    assert table_state(path) == expected(seen)
    # a batch of one partition: the merge reads none of the other partition's files
    b3 = [("ev", 1, 11, "k2", "only-p1")]
    sink(spark.createDataFrame(records_table(b3)), 3)
    seen += b3
    assert table_state(path) == expected(seen)
    metrics = DeltaTable(str(path)).history(limit=1)[0]["operationMetrics"]
    assert metrics["num_target_files_scanned"] == 1, metrics
    assert metrics["num_target_files_skipped_during_scan"] >= 1, metrics
    assert DeltaTable(str(path)).transaction_version(APP) == 3
    assert read_committed_positions(path)["ev"][0].offset == 92
    assert read_committed_positions(path)["ev"][1].offset == 12


@pytest.mark.spark
def test_a_record_without_a_key_fails_naming_its_offset(spark: Any, tmp_path: Path) -> None:
    table = records_table([("ev", 0, 0, "a", "v"), ("ev", 0, 1, "b", "v")])
    table = table.set_column(0, "key", pa.array([b"a", None], pa.binary()))
    sink = DeltaSink(tmp_path / "t", app_id=APP, mode="upsert")
    with pytest.raises(DeltaSinkError, match="offset 1 of ev/0 has none"):
        sink.write_batch(spark.createDataFrame(table), 0)


@pytest.mark.spark
def test_upsert_needs_the_key_and_value_columns(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame(records_table([("ev", 0, 0, "a", "v")])).drop("key")
    sink = DeltaSink(tmp_path / "t", app_id=APP, mode="upsert")
    with pytest.raises(DeltaSinkError, match=r"lacks columns \['key'\]"):
        sink.write_batch(df, 0)


def test_an_unknown_mode_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="option 'mode'.*'merge'"):
        DeltaSink(tmp_path / "t", mode="merge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode='upsert' needs engine='delta-rs'"):
        DeltaSink(tmp_path / "t", mode="upsert", engine="auto")


@pytest.mark.spark
def test_a_truncation_without_the_cluster_fails_saying_so(spark: Any, tmp_path: Path) -> None:
    """Re-delivered offsets cannot be merged as they are (a truncated tombstone left no
    row); without the cluster to rebuild from, the batch fails and the table stays."""
    path = tmp_path / "t"
    sink = DeltaSink(path, app_id=APP, mode="upsert")
    first = [("ev", 0, o, f"k{o % 3}", f"v{o}") for o in range(6)]
    sink.write_batch(spark.createDataFrame(records_table(first)), 0)
    again = [("ev", 0, 4, "k0", "new")]
    with pytest.raises(DeltaSinkError, match=r"ev/0 from offset 4.*bootstrap=\.\.\."):
        sink.write_batch(spark.createDataFrame(records_table(again, epoch=2)), 1)
    assert table_state(path) == expected(first)
