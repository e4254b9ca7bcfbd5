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

Delivery (option ``delivery``): ``exactly-once`` (the default) or ``at-least-once``.

Exactly once: each micro-batch (or batch write) is one transaction group (``kafka.txn``)
of the nodes' transaction coordinator, ``spark-sink/<query id>`` (a batch write:
``spark-write/<uuid>``), fenced by the batch id. A task first asks the group's fence: a
batch at or below it was committed already (a replay after the driver died between the
commit and its checkpoint), so the task writes nothing. Otherwise it initialises its
member ``<group>#<partition id>`` (which aborts whatever an earlier attempt of the task
left open and fences it), writes its rows in that member's transaction and leaves it
open; its commit message names the member. The driver's ``commit(messages, batch_id)``
decides the batch with one request: the coordinator writes every member's PrepareCommit
and the group's new fence in one record batch, durable on a quorum, before it answers
and writes the markers (a coordinator that takes over finishes them). A crash before that
leaves the members open, to be aborted by their timeout (``transactionTimeoutMs``) or by
the replay's tasks; a crash after it leaves the batch committed, which the replay finds
at the fence. read_committed readers (the Spark source's default) see a batch's rows
exactly once, each partition's together; an aborted or failed batch, never.

At least once: each task produces its rows idempotently (a produce retry is written once)
and ends; a retried task or micro-batch produces its rows again under a new producer id.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from ..replica.client import Client
from ..replica.client.errors import ProducerFencedError
from ..replica.client.partitioner import DEFAULT_PARTITIONER, UNKEYED, key_partitions
from ..replica.client.producer import Producer
from ..replica.client.security import ClientSecurity
from ..replica.protocol.messages import TxnGroupMember
from .options import QuorumLogOptionError, parse_sink_delivery, parse_sink_options
from .schema import HEADER_TYPE

log = logging.getLogger(__name__)

_HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    request_timeout_ms: int
    security: ClientSecurity | None
    exactly_once: bool = True
    transaction_timeout_ms: int = 60_000


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


def _client(opts: SinkOptions) -> Client:
    return Client(
        opts.bootstrap,
        client_id="quorumlog-spark-sink",
        request_timeout_ms=opts.request_timeout_ms,
        security=opts.security,
    )


def _send_rows(
    opts: SinkOptions, client: Client, producer: Producer, batches: Iterator[pa.RecordBatch]
) -> int:
    """Queue every row on ``producer``; returns how many. Rows without key or partition
    rotate over the partitions one Arrow batch at a time, each task from its own."""
    rows = 0
    counts: dict[str, int] = {}
    turn = _task().partitionId()
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
    return rows


def _write_task(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], group: str | None, batch_id: int
) -> SinkCommit:
    """A task's rows: at least once (produced and done), or exactly once (in its
    member's transaction of ``group``, left open for the driver to decide)."""
    with _client(opts) as client:
        if group is None:
            producer = Producer(client, acks="quorum")  # idempotent: resends written once
            rows = _send_rows(opts, client, producer, batches)
            producer.close()  # raises the first failure
            return SinkCommit(rows)
        if client.txn_group_commit(group, batch_id, [], commit=False) >= batch_id:
            log.info("quorumlog sink: batch %d of %s was committed already", batch_id, group)
            return SinkCommit(0, group)  # a replay of a committed batch writes nothing
        member = f"{group}#{_task().partitionId()}"
        producer = Producer(
            client,
            acks="quorum",
            transactional_id=member,
            transaction_timeout_ms=opts.transaction_timeout_ms,
        )
        try:
            producer.begin()
            rows = _send_rows(opts, client, producer, batches)
            producer.flush()
        except BaseException:
            with contextlib.suppress(Exception):
                producer.abort()  # at once, rather than at its timeout
            raise
        finally:
            producer.close()
        assert producer.producer_id is not None and producer.producer_epoch is not None
        return SinkCommit(rows, group, (member, producer.producer_id, producer.producer_epoch))


def _decide(opts: SinkOptions, messages: list[Any], batch_id: int, commit: bool) -> int:
    """The driver's decision of a batch's transaction group (``commit`` or abort every
    member the tasks named); the rows it wrote."""
    done = [msg for msg in messages if isinstance(msg, SinkCommit)]
    groups = {msg.group for msg in done if msg.group is not None}
    if not groups:
        return sum(msg.rows for msg in done)
    (group,) = groups
    members = [
        TxnGroupMember(transactional_id=tid, producer_id=pid, producer_epoch=epoch)
        for tid, pid, epoch in (msg.member for msg in done if msg.member is not None)
    ]
    with _client(opts) as client:
        try:
            client.txn_group_commit(group, batch_id, members, commit=commit)
        except ProducerFencedError as exc:
            raise ProducerFencedError(
                f"batch {batch_id} of {group} was not committed: a task's transaction was "
                f"ended before the commit (aborted after transactionTimeoutMs, "
                f"{opts.transaction_timeout_ms} ms, or fenced by another attempt of the "
                f"task); nothing of the batch is visible, and the query resumes from its "
                f"checkpoint when restarted ({exc})",
                exc.error_code,
            ) from exc
    return sum(msg.rows for msg in done)


def _task() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the quorumlog sink writes only in Spark tasks")
    return ctx


def _stream_group_and_batch() -> tuple[str, int]:
    """A micro-batch's transaction group (its query's id) and batch id, as Spark's
    micro-batch execution hands them to its tasks."""
    ctx = _task()
    query, batch = ctx.getLocalProperty(_QUERY_ID), ctx.getLocalProperty(_BATCH_ID)
    if not query or batch is None:
        raise RuntimeError(
            "the quorumlog sink's exactly-once stream writer runs in micro-batches only "
            "(Spark did not name the query and batch); use delivery=at-least-once"
        )
    return f"spark-sink/{query}", int(batch)


#: The local properties Spark's micro-batch execution sets for its jobs' tasks.
_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"


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
    """A task's rows; exactly once: its transaction group and its member's open
    transaction (transactional id, producer id, epoch), or none (it wrote nothing)."""

    rows: int
    group: str | None = None
    member: tuple[str, int, int] | None = None


class QuorumLogBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """A batch write (``df.write``): exactly once, one transaction group of its own."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.group = f"spark-write/{uuid.uuid4()}" if options.exactly_once else None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return _write_task(self.options, iterator, self.group, 0)

    def commit(self, messages: list[Any]) -> None:
        log.info("quorumlog sink wrote %d rows", _decide(self.options, messages, 0, True))

    def abort(self, messages: list[Any]) -> None:
        if self.group is None:
            log.warning(
                "quorumlog sink: the write failed; the rows of its successful tasks stay "
                "in the log (delivery=at-least-once)"
            )
            return
        _decide(self.options, messages, 0, False)
        log.warning("quorumlog sink: the write failed; nothing of it is visible")


class QuorumLogStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    """Each micro-batch exactly once (a transaction group per query, fenced by the batch
    id), or at least once."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        if not self.options.exactly_once:
            return _write_task(self.options, iterator, None, 0)
        group, batch_id = _stream_group_and_batch()
        return _write_task(self.options, iterator, group, batch_id)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 (Spark's name)
        rows = _decide(self.options, messages, batchId, True)
        log.debug("quorumlog sink: batch %d wrote %d rows", batchId, rows)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        if self.options.exactly_once:
            _decide(self.options, messages, batchId, False)
            log.warning("quorumlog sink: batch %d failed; nothing of it is visible", batchId)
        else:
            log.warning("quorumlog sink: batch %d failed (its rows may be produced again)", batchId)


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    parsed = parse_sink_options(options)
    delivery = parse_sink_delivery(options)
    return SinkOptions(
        bootstrap=parsed.bootstrap,
        topic=parsed.topics[0] if parsed.topics else None,
        request_timeout_ms=parsed.request_timeout_ms,
        security=parsed.security,
        exactly_once=delivery.exactly_once,
        transaction_timeout_ms=delivery.transaction_timeout_ms,
    )
