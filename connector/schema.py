"""The row schema (Spark Kafka source's, plus ``leaderEpoch``) and the Arrow conversion.

The fetched payload is already Arrow (key, value, timestamp[ms], headers, offset,
leaderEpoch); a Spark batch is the same columns reordered, plus constant topic and
partition columns, with the timestamp cast to Spark's ``timestamp[us, tz=UTC]``. Every
step is an Arrow kernel or a zero-copy view: no per-record Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADER_TYPE = StructType(
    [StructField("key", StringType(), True), StructField("value", BinaryType(), True)]
)

SPARK_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("leaderEpoch", IntegerType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("headers", ArrayType(HEADER_TYPE, True), True),
    ]
)

_ARROW_HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
_ARROW_HEADERS = pa.list_(pa.field("element", _ARROW_HEADER))
_ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")

# Exactly what pyspark's to_arrow_schema(SPARK_SCHEMA, timezone="UTC") produces; Spark
# rejects a batch whose schema differs (nullability included).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), True),
        pa.field("value", pa.binary(), True),
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("offset", pa.int64(), False),
        pa.field("leaderEpoch", pa.int32(), False),
        pa.field("timestamp", _ARROW_TIMESTAMP, True),
        pa.field("headers", _ARROW_HEADERS, True),
    ]
)


def schema_matches(schema: Any) -> bool:
    """True if a user-specified schema is the source's fixed schema (names and types)."""
    if not isinstance(schema, StructType) or len(schema.fields) != len(SPARK_SCHEMA.fields):
        return False
    return all(
        a.name == b.name and a.dataType == b.dataType
        for a, b in zip(schema.fields, SPARK_SCHEMA.fields, strict=True)
    )


def _headers(column: pa.Array) -> pa.Array:
    if column.type == _ARROW_HEADERS and column.type.value_field.name == "element":
        return column
    try:
        return column.view(_ARROW_HEADERS)  # same layout, only the list field name differs
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
        return column.cast(_ARROW_HEADERS)


def _timestamp(column: pa.Array) -> pa.Array:
    if column.type == _ARROW_TIMESTAMP:
        return column
    if pa.types.is_timestamp(column.type) and column.type.tz is None:
        column = column.cast(pa.timestamp(column.type.unit, tz="UTC"))
    return pc.cast(column, _ARROW_TIMESTAMP)


#: Fetched record batches of fewer rows than this on average are merged into one before
#: Spark sees them: Spark's Arrow reader pays per batch, and a stream of single-record
#: produce requests fetches as one batch per record.
MERGE_BELOW_ROWS = 1024


def to_spark_batches(
    payload: pa.Table, topic: str, partition: int, include_headers: bool = True
) -> Iterator[pa.RecordBatch]:
    """Fetched rows (key, value, timestamp, headers, offset, leaderEpoch) -> RecordBatches
    with ``ARROW_SCHEMA``; ``headers`` NULL unless ``include_headers`` (option
    includeHeaders, as Spark's Kafka source). Empty input yields nothing."""
    topic_scalar = pa.scalar(topic, pa.string())
    partition_scalar = pa.scalar(partition, pa.int32())
    chunks = payload.column(0).num_chunks if payload.num_columns else 0
    if chunks > 1 and payload.num_rows < MERGE_BELOW_ROWS * chunks:
        payload = payload.combine_chunks()
    for batch in payload.to_batches():
        n = batch.num_rows
        if n == 0:
            continue
        yield pa.RecordBatch.from_arrays(
            [
                batch.column("key"),
                batch.column("value"),
                pa.repeat(topic_scalar, n),
                pa.repeat(partition_scalar, n),
                batch.column("offset").cast(pa.int64()),
                batch.column("leaderEpoch").cast(pa.int32()),
                _timestamp(batch.column("timestamp")),
                _headers(batch.column("headers"))
                if include_headers
                else pa.nulls(n, _ARROW_HEADERS),
            ],
            schema=ARROW_SCHEMA,
        )
