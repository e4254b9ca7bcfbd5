"""Kafka RecordBatch v2 <-> quorumlog's batch format (Arrow IPC, ``storage.records``).

Kafka -> quorumlog: a produced batch becomes an Arrow RecordBatch with RECORD_SCHEMA
(key, value, timestamp[ms], headers) plus the producer fields the idempotence checks
need. ``columnar`` decodes a batch straight into those columns (and encodes them back),
vectorised; batches decoded by the reference codec (``records``, lists) convert too.

quorumlog -> Kafka: every stored batch becomes one RecordBatch v2 with the same base
offset and leader epoch (partitionLeaderEpoch), offsets base + row, and a CRC32C; a
sparse batch (a clean's, with gaps inside) gives each record its offset delta and the
header its lastOffsetDelta, as a compacted Kafka topic's batch has them. A
quorumlog control batch (the leader-change record a new leader appends) becomes a Kafka
control batch of type LEADER_CHANGE (2), as KRaft writes one, so offsets stay contiguous
and consumers skip it. A batch written in a transaction keeps Kafka's isTransactional
attribute both ways, and a transaction marker becomes the Kafka control batch it was
(its record is Kafka's control record, stored as is); a control batch from a producer
is refused (INVALID_RECORD), never stored as data. Records without headers map to a
null headers list and back to zero headers.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import pyarrow as pa

from ..constants import UNKNOWN
from ..storage.errors import CorruptRecordError
from ..storage.records import (
    HEADER_SIZE,
    RECORD_SCHEMA,
    BatchHeader,
    Producer,
    encode_arrow,
    iter_batches,
    read_records,
)
from .columnar import (
    KafkaBatchFields,
    KafkaColumns,
    columns_from_lists,
    encode_columns,
    encode_many,
)
from .records import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    KafkaRecordBatch,
    encode_sparse_batch,
    refuse_control_batch,
)

__all__ = [
    "LEADER_CHANGE_CONTROL_KEY",
    "ProducedRecords",
    "from_kafka",
    "kafka_to_quorumlog",
    "quorumlog_to_kafka",
    "table_to_kafka",
]

# Control record key: version INT16 0, type INT16 2 (LEADER_CHANGE in Kafka's ControlRecordType).
LEADER_CHANGE_CONTROL_KEY = struct.pack(">hh", 0, 2)


class ProducedRecords(NamedTuple):
    """A produced Kafka batch as quorumlog records and the producer fields it carried."""

    records: pa.RecordBatch  # RECORD_SCHEMA
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool


def from_kafka(batch: KafkaRecordBatch | KafkaColumns) -> ProducedRecords:
    """A decoded Kafka batch -> Arrow columns (keys, values, timestamps, headers) and
    producer id/epoch/base sequence. A control batch raises ``records.InvalidRecord``
    (a KafkaDecodeError, INVALID_RECORD): markers are written by partition leaders."""
    refuse_control_batch(batch)
    columns = batch if isinstance(batch, KafkaColumns) else columns_from_lists(batch)
    return ProducedRecords(
        columns.records,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        batch.is_transactional,
    )


def kafka_to_quorumlog(
    batch: KafkaRecordBatch | KafkaColumns,
    *,
    leader_epoch: int = UNKNOWN,
    compression: str | None = None,
) -> bytes:
    """A Kafka batch as one quorumlog batch (what the leader appends), with its producer
    fields, which the leader's producer state checks. ``compression``: None, "lz4" or
    "zstd", the Arrow IPC buffer compression it is stored with."""
    produced = from_kafka(batch)
    producer = None
    if produced.producer_id >= 0:
        producer = Producer(produced.producer_id, produced.producer_epoch, produced.base_sequence)
    return encode_arrow(
        produced.records,
        leader_epoch=leader_epoch,
        producer=producer,
        compression=compression,
        transactional=produced.is_transactional,
    )


def table_to_kafka(
    table: pa.Table | pa.RecordBatch,
    *,
    base_offset: int,
    leader_epoch: int,
    control: bool = False,
    producer: Producer | None = None,
) -> bytes:
    """Rows with RECORD_SCHEMA columns as one Kafka RecordBatch v2 at ``base_offset``."""
    keys = None
    if control:
        keys = pa.array([LEADER_CHANGE_CONTROL_KEY] * table.num_rows, pa.binary())
    return encode_columns(
        table,
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
        producer_id=producer.producer_id if producer else -1,
        producer_epoch=producer.producer_epoch if producer else -1,
        base_sequence=producer.base_sequence if producer else -1,
        attributes=ATTR_CONTROL if control else 0,
        keys=keys,
    )


# The Arrow IPC schema message every stored batch's payload starts with: a payload that
# starts otherwise is read (and its schema checked) the long way.
_SCHEMA_MESSAGE = RECORD_SCHEMA.serialize().to_pybytes()
_SCHEMA_BUFFER = pa.py_buffer(_SCHEMA_MESSAGE)


def _stored_records(buf: pa.Buffer, header: BatchHeader) -> pa.RecordBatch | pa.Table:
    """A stored batch's rows (zero-copy), checked for schema and row count as
    ``storage.records.batches_to_table`` checks them, without its offset columns."""
    payload = buf.slice(header.position + HEADER_SIZE, header.payload_length)
    try:
        batches = _read_stream(payload)
        if batches is None:
            reader = pa.ipc.open_stream(payload)
            if not reader.schema.equals(RECORD_SCHEMA):
                raise CorruptRecordError(
                    f"batch at position {header.position} has schema {reader.schema}, "
                    f"expected {RECORD_SCHEMA}"
                )
            batches = list(reader)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptRecordError(
            f"batch at position {header.position} has an unreadable Arrow payload: {exc}"
        ) from exc
    rows = sum(b.num_rows for b in batches)
    if rows != header.record_count:
        raise CorruptRecordError(
            f"batch at position {header.position} holds {rows} rows, header says "
            f"{header.record_count}"
        )
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)


_MESSAGE_PREFIX = struct.Struct("<Ii")  # IPC continuation marker, metadata length
_CONTINUATION = 0xFFFFFFFF


def _read_stream(payload: pa.Buffer) -> list[pa.RecordBatch] | None:
    """The record batches of an Arrow IPC stream that starts with RECORD_SCHEMA's schema
    message (as every stored batch does), message by message; None for any other
    stream, which pyarrow's stream reader then reads and checks."""
    start = len(_SCHEMA_MESSAGE)
    if payload.size < start or payload.slice(0, start) != _SCHEMA_BUFFER:
        return None
    batches: list[pa.RecordBatch] = []
    while True:
        if payload.size - start < _MESSAGE_PREFIX.size:
            return None
        marker, length = _MESSAGE_PREFIX.unpack_from(payload, start)
        if marker != _CONTINUATION:
            return None
        if length == 0:  # end of stream
            return batches
        message = pa.ipc.read_message(payload.slice(start))
        batches.append(pa.ipc.read_record_batch(message, RECORD_SCHEMA))
        start += _MESSAGE_PREFIX.size + length + (message.body.size if message.body else 0)


def quorumlog_to_kafka(buf: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> bytes:
    """quorumlog batches (as fetched or read from a segment) -> Kafka RecordBatch v2
    bytes for a Fetch response's ``records``, one Kafka batch per quorumlog batch."""
    pbuf = pa.py_buffer(buf)
    out: list[bytes] = []
    batches: list[tuple[pa.RecordBatch | pa.Table, KafkaBatchFields]] = []
    for header in iter_batches(buf, verify_crc=verify_crc):
        if header.is_sparse:
            out.append(encode_many(batches))
            batches = []
            out.append(_sparse_to_kafka(pbuf, header))
            continue
        records = _stored_records(pbuf, header)
        producer = header.producer
        fields = KafkaBatchFields(
            header.base_offset,
            header.leader_epoch,
            producer.producer_id if producer else -1,
            producer.producer_epoch if producer else -1,
            producer.base_sequence if producer else -1,
        )
        if header.marker is not None:
            # A transaction marker: its record is Kafka's control record already.
            fields = fields._replace(attributes=ATTR_CONTROL | ATTR_TRANSACTIONAL)
        elif header.is_control:  # the leader-change record, under Kafka's control key
            keys = pa.array([LEADER_CHANGE_CONTROL_KEY] * records.num_rows, pa.binary())
            records = records.set_column(0, RECORD_SCHEMA.field("key"), keys)
            fields = fields._replace(attributes=ATTR_CONTROL)
        elif header.is_transactional:
            fields = fields._replace(attributes=ATTR_TRANSACTIONAL)
        batches.append((records, fields))
    out.append(encode_many(batches))
    return b"".join(out)


def _sparse_to_kafka(pbuf: pa.Buffer, header: BatchHeader) -> bytes:
    """A sparse batch (never a control batch) as a RecordBatch v2 with its records'
    offset deltas: the reference codec, record by record (a cleaned log's batches)."""
    parts, deltas = read_records(pbuf, header)
    assert deltas is not None
    rows = pa.Table.from_batches(parts, schema=RECORD_SCHEMA)
    stamps = rows.column("timestamp").cast(pa.int64()).fill_null(-1).to_pylist()
    headers = [
        [(h["key"], h["value"]) for h in hs] if hs else None
        for hs in rows.column("headers").to_pylist()
    ]
    producer = header.producer
    return encode_sparse_batch(
        deltas.tolist(),
        rows.column("value").to_pylist(),
        rows.column("key").to_pylist(),
        stamps,
        headers,
        base_offset=header.base_offset,
        partition_leader_epoch=header.leader_epoch,
        producer_id=producer.producer_id if producer else -1,
        producer_epoch=producer.producer_epoch if producer else -1,
        base_sequence=producer.base_sequence if producer else -1,
        attributes=ATTR_TRANSACTIONAL if header.is_transactional else 0,
    )
