"""Rows of the quorumlog source's schema, built without the source."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

# (topic, partition, offset, leaderEpoch, value)
Row = tuple[str, int, int, int, str]

_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
SOURCE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("leaderEpoch", pa.int32(), False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("headers", pa.list_(pa.field("element", _HEADER))),
    ]
)
_T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def rows(topic: str, partition: int, offsets: Iterable[int], epoch: int, tag: str) -> list[Row]:
    return [(topic, partition, o, epoch, f"{tag}-{o}") for o in offsets]


def source_table(batch: Sequence[Row]) -> pa.Table:
    return pa.table(
        {
            "key": [f"k{r[2]}".encode() for r in batch],
            "value": [r[4].encode() for r in batch],
            "topic": [r[0] for r in batch],
            "partition": [r[1] for r in batch],
            "offset": [r[2] for r in batch],
            "leaderEpoch": [r[3] for r in batch],
            "timestamp": [_T0 + dt.timedelta(milliseconds=r[2]) for r in batch],
            "headers": [[{"key": "e", "value": str(r[3]).encode()}] for r in batch],
        },
        schema=SOURCE_SCHEMA,
    )


def source_df(spark: Any, batch: Sequence[Row]) -> Any:
    if not batch:
        from pyspark.sql.types import StructType

        schema = StructType.fromJson(_spark_schema_json())
        return spark.createDataFrame([], schema)
    return spark.createDataFrame(source_table(batch))


def _spark_schema_json() -> dict[str, Any]:
    from pyspark.sql.pandas.types import from_arrow_schema

    schema: dict[str, Any] = from_arrow_schema(SOURCE_SCHEMA).jsonValue()
    return schema


def table_rows(path: str | Path) -> list[Row]:
    """The table's rows as (topic, partition, offset, leaderEpoch, value), sorted."""
    t = DeltaTable(str(path)).to_pyarrow_table(
        columns=["topic", "partition", "offset", "leaderEpoch", "value"]
    )
    out = [
        (r["topic"], r["partition"], r["offset"], r["leaderEpoch"], r["value"].decode())
        for r in t.to_pylist()
    ]
    return sorted(out)


def last_commit(path: str | Path) -> dict[str, Any]:
    return DeltaTable(str(path)).history(limit=1)[0]


def write_input_file(input_dir: Path, index: int, batch: Sequence[Row]) -> None:
    """One parquet file per scripted micro-batch; renamed into place whole, with
    increasing modification times so the file source takes them in order."""
    import os
    import time

    import pyarrow.parquet as pq

    input_dir.mkdir(parents=True, exist_ok=True)
    tmp = input_dir.parent / f".{input_dir.name}-{index:04d}.parquet.tmp"
    pq.write_table(source_table(batch), tmp)
    final = input_dir / f"batch-{index:04d}.parquet"
    os.replace(tmp, final)
    mtime = time.time() + index
    os.utime(final, (mtime, mtime))


def start_stream(spark: Any, input_dir: str | Path, checkpoint: str | Path, sink: Any) -> Any:
    """A streaming query of the source's schema over parquet files, one file per batch."""
    from pyspark.sql.types import StructType

    return (
        spark.readStream.schema(StructType.fromJson(_spark_schema_json()))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
