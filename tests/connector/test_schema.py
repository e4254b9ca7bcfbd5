"""The Arrow batches read() yields match the declared Spark schema exactly."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from quorumlog.connector import schema
from quorumlog.connector.schema import ARROW_SCHEMA, SPARK_SCHEMA, to_spark_batches
from quorumlog.replica.storage.records import (
    OUTPUT_SCHEMA as PAYLOAD_SCHEMA,
)  # FetchResult.to_arrow


def payload(n: int, start: int = 10) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([None] + [b"k%d" % i for i in range(1, n)], pa.binary()),
            "value": pa.array([b"v%d" % i for i in range(n)], pa.binary()),
            "timestamp": pa.array([1_700_000_000_123 + i for i in range(n)], pa.int64()).cast(
                pa.timestamp("ms")
            ),
            "headers": pa.array(
                [[{"key": "a", "value": b"b"}]] + [[] for _ in range(n - 1)],
                PAYLOAD_SCHEMA.field("headers").type,
            ),
            "offset": pa.array(range(start, start + n), pa.int64()),
            "leaderEpoch": pa.array([4] * n, pa.int32()),
        },
        schema=PAYLOAD_SCHEMA,
    )


def test_arrow_schema_is_sparks() -> None:
    expected = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
    assert ARROW_SCHEMA.equals(expected)
    assert [f.nullable for f in ARROW_SCHEMA] == [f.nullable for f in expected]
    assert ARROW_SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_conversion_values_and_schema() -> None:
    table = pa.concat_tables([payload(3), payload(2, start=20)])
    batches = list(to_spark_batches(table, "events", 7))
    assert len(batches) == 1  # small fetched batches reach Spark merged
    for b in batches:
        assert b.schema.equals(ARROW_SCHEMA)
        assert b.schema == ARROW_SCHEMA
    rows = pa.Table.from_batches(batches).to_pylist()
    assert [r["offset"] for r in rows] == [10, 11, 12, 20, 21]
    assert {r["topic"] for r in rows} == {"events"} and {r["partition"] for r in rows} == {7}
    assert rows[0]["key"] is None and rows[0]["value"] == b"v0" and rows[0]["leaderEpoch"] == 4
    assert rows[0]["headers"] == [{"key": "a", "value": b"b"}] and rows[1]["headers"] == []
    assert rows[0]["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)


def test_empty_payload_yields_nothing() -> None:
    assert list(to_spark_batches(PAYLOAD_SCHEMA.empty_table(), "t", 0)) == []


def test_small_fetched_batches_are_merged_and_large_ones_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    singles = pa.concat_tables([payload(1, start=i) for i in range(50)])
    assert singles.column(0).num_chunks == 50
    merged = list(to_spark_batches(singles, "t", 0))
    assert len(merged) == 1 and merged[0].num_rows == 50
    assert merged[0].column(4).to_pylist() == list(range(50))
    # batches of MERGE_BELOW_ROWS rows or more on average stay as fetched (no copy)
    monkeypatch.setattr(schema, "MERGE_BELOW_ROWS", 2)
    table = pa.concat_tables([payload(3), payload(2, start=20)])
    assert [b.num_rows for b in to_spark_batches(table, "t", 0)] == [3, 2]
