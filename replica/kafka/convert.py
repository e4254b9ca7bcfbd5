"""Kafka RecordBatch v2 <-> quorumlog's batch format (Arrow IPC, ``storage.records``).

Kafka -> quorumlog: a produced batch becomes an Arrow RecordBatch with RECORD_SCHEMA
(key, value, timestamp[ms], headers) plus the producer fields the idempotence checks
need. Column arrays are built from the decoded lists in one Arrow call each.

quorumlog -> Kafka: every stored batch becomes one RecordBatch v2 with the same base
offset and leader epoch (partitionLeaderEpoch), offsets base + row, and a CRC32C. A
quorumlog control batch (the leader-change record a new leader appends) becomes a Kafka
control batch of type LEADER_CHANGE (2), as KRaft writes one, so offsets stay contiguous
and consumers skip it. Records without headers map to a null headers list and back to
zero headers.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import pyarrow as pa

from ..constants import UNKNOWN
from ..storage.records import (
    HEADER_FIELD,
    RECORD_SCHEMA,
    Producer,
    batches_to_table,
    encode_arrow,
    iter_batches,
)
from .records import ATTR_CONTROL, Header, KafkaRecordBatch, encode_batch

__all__ = [
    "LEADER_CHANGE_CONTROL_KEY",
    "ProducedRecords",
    "from_kafka",
    "kafka_to_quorumlog",
    "quorumlog_to_kafka",
    "table_to_kafka",
]

_HEADERS_TYPE = pa.list_(HEADER_FIELD)
# Control record key: version INT16 0, type INT16 2 (LEADER_CHANGE in Kafka's ControlRecordType).
LEADER_CHANGE_CONTROL_KEY = struct.pack(">hh", 0, 2)


class ProducedRecords(NamedTuple):
    """A produced Kafka batch as quorumlog records and the producer fields it carried."""

    records: pa.RecordBatch  # RECORD_SCHEMA
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool


def _headers_column(headers: list[list[Header]]) -> pa.Array:
    if not any(headers):
        return pa.nulls(len(headers), _HEADERS_TYPE)
    return pa.array([hs or None for hs in headers], _HEADERS_TYPE)


def from_kafka(batch: KafkaRecordBatch) -> ProducedRecords:
    """A decoded Kafka batch -> Arrow columns (keys, values, timestamps, headers) and
    producer id/epoch/base sequence."""
    records = pa.RecordBatch.from_arrays(
        [
            pa.array(batch.keys, pa.binary()),
            pa.array(batch.values, pa.binary()),
            pa.array(batch.timestamps, pa.int64()).cast(pa.timestamp("ms")),
            _headers_column(batch.headers),
        ],
        schema=RECORD_SCHEMA,
    )
    return ProducedRecords(
        records,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        batch.is_transactional,
    )


def kafka_to_quorumlog(batch: KafkaRecordBatch, *, leader_epoch: int = UNKNOWN) -> bytes:
    """A Kafka batch as one quorumlog batch (what the leader appends), with its producer
    fields, which the leader's producer state checks."""
    produced = from_kafka(batch)
    producer = None
    if produced.producer_id >= 0:
        producer = Producer(produced.producer_id, produced.producer_epoch, produced.base_sequence)
    return encode_arrow(produced.records, leader_epoch=leader_epoch, producer=producer)


def _header_lists(column: pa.Array | pa.ChunkedArray) -> list[list[Header]] | None:
    if column.null_count == len(column):
        return None
    return [[(h["key"], h["value"]) for h in hs] if hs else [] for hs in column.to_pylist()]


def table_to_kafka(
    table: pa.Table | pa.RecordBatch,
    *,
    base_offset: int,
    leader_epoch: int,
    control: bool = False,
    producer: Producer | None = None,
) -> bytes:
    """Rows with RECORD_SCHEMA columns as one Kafka RecordBatch v2 at ``base_offset``."""
    timestamps = [
        -1 if ts is None else ts for ts in table.column("timestamp").cast(pa.int64()).to_pylist()
    ]
    values = table.column("value").to_pylist()
    keys = table.column("key").to_pylist()
    if control:
        keys = [LEADER_CHANGE_CONTROL_KEY] * len(values)
    return encode_batch(
        values,
        keys,
        timestamps,
        _header_lists(table.column("headers")),
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
        producer_id=producer.producer_id if producer else -1,
        producer_epoch=producer.producer_epoch if producer else -1,
        base_sequence=producer.base_sequence if producer else -1,
        attributes=ATTR_CONTROL if control else 0,
    )


def quorumlog_to_kafka(buf: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> bytes:
    """quorumlog batches (as fetched or read from a segment) -> Kafka RecordBatch v2
    bytes for a Fetch response's ``records``, one Kafka batch per quorumlog batch."""
    view = memoryview(buf)
    out: list[bytes] = []
    for header in iter_batches(view, verify_crc=verify_crc):
        table = batches_to_table(
            view[header.position : header.end], include_control=True, verify_crc=False
        )
        out.append(
            table_to_kafka(
                table,
                base_offset=header.base_offset,
                leader_epoch=header.leader_epoch,
                control=header.is_control,
                producer=header.producer,
            )
        )
    return b"".join(out)
