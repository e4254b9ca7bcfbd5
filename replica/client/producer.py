"""Producer: batches records per partition (linger, max batch bytes/records) and appends
them with acks=quorum by default.

Sizes: a batch over the topic's max.message.bytes is split in halves and sent again
(nothing of it was appended); a single record that alone is over the limit is not sent,
and RecordTooLargeError is raised once the rest of its batch has been sent.

Idempotent by default (as Kafka's Java client since 3.0): the producer takes an id and
epoch from the cluster (InitProducerId) and numbers each partition's records; a retried
batch carries the same numbers, and the leader appends it once, answering a retry with the
first append's offsets, across leader changes too. A send that fails for good leaves that
batch's numbers in doubt: the next send moves to the next epoch of the id (sequences start
again at 0), so later batches are not refused for the gap. A fenced
producer (a newer epoch of its id wrote) raises InvalidProducerEpochError. With
``idempotent=False`` a retry may append the same records twice. Each record's (partition,
offset, epoch) comes back in the ProduceResult of its batch.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..protocol.messages import ACKS_LEADER, ACKS_QUORUM
from ..storage.producers import last_sequence
from ..storage.records import Producer as ProducerFields
from .client import Client, ProduceResult
from .errors import InvalidProducerEpochError, RecordTooLargeError


@dataclass
class _Pending:
    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[list[tuple[str, bytes]]] = field(default_factory=list)
    size: int = 0
    since: float = 0.0


class Producer:
    def __init__(
        self,
        client: Client,
        *,
        acks: str = "quorum",
        linger_ms: int = defaults.LINGER_MS,
        max_batch_bytes: int = defaults.BATCH_MAX_BYTES,
        max_batch_records: int = defaults.BATCH_MAX_RECORDS,
        idempotent: bool = True,
    ) -> None:
        if acks not in ("quorum", "leader"):
            raise ValueError(f"acks must be 'quorum' or 'leader', got {acks!r}")
        self.client = client
        self.acks = ACKS_QUORUM if acks == "quorum" else ACKS_LEADER
        self.linger_s = linger_ms / 1000
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_records = max_batch_records
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._results: list[ProduceResult] = []
        self._partitions: dict[str, int] = {}
        self._sticky: dict[str, int] = {}
        self.idempotent = idempotent
        self._identity: tuple[int, int] | None = None  # (producer id, epoch), on first send
        self._sequences: dict[tuple[str, int], int] = {}  # next sequence per partition
        self._renew = False  # a send failed: its sequence numbers are in doubt

    @property
    def producer_id(self) -> int | None:
        return self._identity[0] if self._identity else None

    def _append(self, topic: str, partition: int, encode: Any, count: int) -> ProduceResult:
        """``encode(producer fields or None)`` -> batch bytes, appended under this
        producer's identity and the partition's next sequence number."""
        if not self.idempotent:
            return self.client.produce(topic, partition, encode(None), acks=self.acks)
        if self._identity is None or self._renew:
            self._identity = self.client.init_producer_id(*(self._identity or (-1, -1)))
            self._sequences.clear()
            self._renew = False
        key = (topic, partition)
        first = self._sequences.get(key, 0)
        fields = ProducerFields(*self._identity, first)
        try:
            result = self.client.produce(topic, partition, encode(fields), acks=self.acks)
        except (RecordTooLargeError, InvalidProducerEpochError):
            raise  # nothing appended / fenced: no sequence is in doubt
        except Exception:
            # Whether the batch was appended is unknown: the next send continues in the
            # next epoch of this id, where every partition's sequences start at 0.
            self._renew = True
            raise
        self._sequences[key] = (last_sequence(first, count) + 1) % (1 << 31)
        return result

    def _partition_count(self, topic: str) -> int:
        n = self._partitions.get(topic)
        if n is None:
            n = len(self.client.metadata([topic])[topic].partitions)
            self._partitions[topic] = n
        return n

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        if partition is None:
            n = self._partition_count(topic)
            if key is not None:
                partition = zlib.crc32(key) % n
            else:
                partition = self._sticky.setdefault(topic, 0) % n
        p = self._pending.setdefault((topic, partition), _Pending())
        if not p.values:
            p.since = time.monotonic()
        p.values.append(value)
        p.keys.append(key)
        p.timestamps.append(timestamp_ms if timestamp_ms is not None else int(time.time() * 1000))
        p.headers.append(headers or [])
        p.size += (len(value) if value else 0) + (len(key) if key else 0) + 24
        if (
            p.size >= self.max_batch_bytes
            or len(p.values) >= self.max_batch_records
            or time.monotonic() - p.since >= self.linger_s
        ):
            self._send_pending(topic, partition)

    def _send_pending(self, topic: str, partition: int) -> None:
        p = self._pending.pop((topic, partition), None)
        if p is None or not p.values:
            return
        rejected: list[RecordTooLargeError] = []
        rows = list(zip(p.values, p.keys, p.timestamps, p.headers, strict=True))
        self._send_rows(topic, partition, rows, rejected)
        if topic in self._sticky:
            self._sticky[topic] += 1
        if rejected:
            raise RecordTooLargeError(
                f"{len(rejected)} record(s) to {topic}/{partition} not sent, each alone over "
                f"the topic's limit (the rest of the batch was sent): {rejected[0]}"
            )

    def _send_rows(
        self,
        topic: str,
        partition: int,
        rows: list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]]],
        rejected: list[RecordTooLargeError],
    ) -> None:
        from ..storage.records import encode_batch

        values, keys, timestamps, headers = (list(c) for c in zip(*rows, strict=True))

        def encode(producer: ProducerFields | None) -> bytes:
            return encode_batch(
                values, keys=keys, timestamps=timestamps, headers=headers, producer=producer
            )

        try:
            self._results.append(self._append(topic, partition, encode, len(rows)))
        except RecordTooLargeError as exc:
            if len(rows) == 1:
                rejected.append(exc)
                return
            half = len(rows) // 2
            self._send_rows(topic, partition, rows[:half], rejected)
            self._send_rows(topic, partition, rows[half:], rejected)

    def send_batch(self, topic: str, partition: int, batch: Any) -> ProduceResult:
        """Append a pyarrow Table/RecordBatch (key, value[, timestamp, headers]) as is."""
        from ..storage.records import encode_arrow

        def encode(producer: ProducerFields | None) -> bytes:
            return encode_arrow(batch, producer=producer)

        result = self._append(topic, partition, encode, batch.num_rows)
        self._results.append(result)
        return result

    def flush(self) -> list[ProduceResult]:
        """Send everything buffered; return (and forget) the results since the last flush."""
        for topic, partition in list(self._pending):
            self._send_pending(topic, partition)
        out, self._results = self._results, []
        return out
