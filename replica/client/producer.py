"""Producer: batches records per partition (linger, max batch bytes/records) and appends
them with acks=quorum by default.

Sizes: a batch over the topic's max.message.bytes is split in halves and sent again
(nothing of it was appended); a single record that alone is over the limit is not sent,
and RecordTooLargeError is raised once the rest of its batch has been sent.

Retries: a produce that times out may have been appended anyway; retrying it may append the
same records twice (there is no idempotent producer yet). Each record's (partition, offset,
epoch) comes back in the ProduceResult of its batch.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..protocol.messages import ACKS_LEADER, ACKS_QUORUM
from .client import Client, ProduceResult
from .errors import RecordTooLargeError


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
        data = encode_batch(values, keys=keys, timestamps=timestamps, headers=headers)
        try:
            self._results.append(self.client.produce(topic, partition, data, acks=self.acks))
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

        result = self.client.produce(topic, partition, encode_arrow(batch), acks=self.acks)
        self._results.append(result)
        return result

    def flush(self) -> list[ProduceResult]:
        """Send everything buffered; return (and forget) the results since the last flush."""
        for topic, partition in list(self._pending):
            self._send_pending(topic, partition)
        out, self._results = self._results, []
        return out
