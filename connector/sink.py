"""The quorumlog sink: ``df.write.format("quorumlog")`` and ``df.writeStream.format(...)``.

Columns as Spark's Kafka sink: ``value`` (binary or string) required; ``key`` (binary or
string), ``partition`` (int), ``headers`` (array<struct<key string, value binary>>) and
``topic`` (string; else option ``topic``) optional; other columns are an error. Each
task produces its rows through the native client with acks=quorum, one record batch per
topic-partition and Arrow batch (``Producer.send_batch``); a produce that fails fails
the task with the client's error. Rows without a partition go where ``Producer.send``
puts their key (its default partitioner, ``murmur2_random``: the Java client's, so a key
lands where Kafka clients put it) or, without a key, to one partition per Arrow batch,
rotating.

Delivery: at least once. A task's produce retries are idempotent (written once), but a
retried task or micro-batch produces its rows again under a new producer id, so a stream
restarted after a failure may append duplicates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from ..replica.client import Client
from ..replica.client.partitioner import DEFAULT_PARTITIONER, UNKEYED, key_partitions
from ..replica.client.producer import Producer
from ..replica.client.security import ClientSecurity
from .options import QuorumLogOptionError, parse_sink_options
from .schema import HEADER_TYPE

log = logging.getLogger(__name__)

_HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    request_timeout_ms: int
    security: ClientSecurity | None


def check_sink_schema(schema: StructType, topic_option: str | None) -> None:
    """The DataFrame's columns against Spark's Kafka sink conventions; raises
    ``QuorumLogOptionError`` naming the column and what is accepted."""
    from pyspark.sql.types import ArrayType

    fields = {f.name: f.dataType for f in schema.fields}
    accepted = {
        "value": (BinaryType(), StringType()),
        "key": (BinaryType(), StringType()),
        "topic": (StringType(),),
        "partition": (IntegerType(),),
        "headers": (ArrayType(HEADER_TYPE, True), ArrayType(HEADER_TYPE, False)),
    }
    if "value" not in fields:
        raise QuorumLogOptionError(
            f"The quorumlog sink needs a 'value' column (binary or string); the DataFrame "
            f"has {sorted(fields)}."
        )
    for name, dtype in fields.items():
        if name not in accepted:
            raise QuorumLogOptionError(
                f"Column {name!r} is not written by the quorumlog sink. Accepted columns: "
                "value (required), key, topic, partition, headers; select only those."
            )
        if name == "headers" and _is_headers(dtype):
            continue
        if dtype not in accepted[name]:
            raise QuorumLogOptionError(
                f"Column {name!r} has type {dtype.simpleString()}; accepted: "
                + " or ".join(t.simpleString() for t in accepted[name])
                + "."
            )
    if "topic" not in fields and topic_option is None:
        raise QuorumLogOptionError(
            "The quorumlog sink needs option 'topic' or a 'topic' column (string)."
        )


def _is_headers(dtype: Any) -> bool:
    """array<struct<key string, value binary>>, whatever the nullability."""
    from pyspark.sql.types import ArrayType

    if not isinstance(dtype, ArrayType) or not isinstance(dtype.elementType, StructType):
        return False
    fields = [(f.name, f.dataType) for f in dtype.elementType.fields]
    return fields == [("key", StringType()), ("value", BinaryType())]


def _produce(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
    """Produce every row; returns how many. Raises the client's error on failure."""
    rows = 0
    client = Client(
        opts.bootstrap,
        client_id="quorumlog-spark-sink",
        request_timeout_ms=opts.request_timeout_ms,
        security=opts.security,
    )
    try:
        producer = Producer(client, acks="quorum")  # idempotent: its resends are written once
        counts: dict[str, int] = {}
        turn = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            for topic, part in _by_topic(table, opts.topic):
                n = counts.get(topic)
                if n is None:
                    n = counts[topic] = len(client.metadata([topic])[topic].partitions)
                for partition, rows_of in _by_partition(part, n, turn):
                    if not 0 <= partition < n:
                        raise QuorumLogOptionError(
                            f"Row partition {partition} does not exist in topic {topic!r} "
                            f"({n} partitions)."
                        )
                    producer.send_batch(topic, partition, _record_columns(rows_of))
                    rows += rows_of.num_rows
            turn += 1
        producer.close()  # raises the first failure
    finally:
        client.close()
    return rows


def _by_topic(table: pa.Table, default: str | None) -> Iterator[tuple[str, pa.Table]]:
    if "topic" not in table.column_names:
        assert default is not None
        yield default, table
        return
    column = table.column("topic")
    if column.null_count and default is None:
        raise QuorumLogOptionError("A row has a null 'topic' and no option 'topic' is set.")
    if default is not None:
        column = pc.fill_null(column, default)
        table = table.set_column(table.column_names.index("topic"), "topic", column)
    for topic in pc.unique(column).to_pylist():
        yield topic, table.filter(pc.equal(column, topic))


def _by_partition(table: pa.Table, n: int, turn: int) -> Iterator[tuple[int, pa.Table]]:
    if "partition" in table.column_names and table.column("partition").null_count == 0:
        column = table.column("partition")
        for p in pc.unique(column).to_pylist():
            yield int(p), table.filter(pc.equal(column, p))
        return
    if "key" in table.column_names:
        keys = table.column("key").cast(pa.binary()).combine_chunks()
        lanes = key_partitions(DEFAULT_PARTITIONER, keys, n)  # where Producer.send puts them
        column = pa.array(np.where(lanes == UNKEYED, turn % n, lanes), pa.int32())
        if "partition" in table.column_names:  # some rows set it
            given = table.column("partition").combine_chunks().cast(pa.int32())
            column = pc.coalesce(given, column)
        for p in pc.unique(column).to_pylist():
            yield int(p), table.filter(pc.equal(column, p))
        return
    yield turn % n, table


def _record_columns(table: pa.Table) -> pa.Table:
    out = {"value": table.column("value").cast(pa.binary())}
    if "key" in table.column_names:
        out["key"] = table.column("key").cast(pa.binary())
    if "headers" in table.column_names:
        out["headers"] = table.column("headers").cast(_HEADERS)
    return pa.table(out)


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):  # type: ignore[misc]
    rows: int


class QuorumLogBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return SinkCommit(_produce(self.options, iterator))

    def commit(self, messages: list[Any]) -> None:
        log.info("quorumlog sink wrote %d rows", sum(m.rows for m in messages if m))

    def abort(self, messages: list[Any]) -> None:
        log.warning(
            "quorumlog sink: the write failed; %d rows of successful tasks stay in the log "
            "(at-least-once)",
            sum(m.rows for m in messages if m),
        )


class QuorumLogStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    """At least once: a micro-batch retried after a failure produces its rows again."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return SinkCommit(_produce(self.options, iterator))

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 (Spark's name)
        log.debug(
            "quorumlog sink: batch %d wrote %d rows", batchId, sum(m.rows for m in messages if m)
        )

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        log.warning("quorumlog sink: batch %d failed (its rows may be produced again)", batchId)


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    parsed = parse_sink_options(options)
    return SinkOptions(
        bootstrap=parsed.bootstrap,
        topic=parsed.topics[0] if parsed.topics else None,
        request_timeout_ms=parsed.request_timeout_ms,
        security=parsed.security,
    )
