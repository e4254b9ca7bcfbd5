"""An in-memory stand-in for ``quorumlog.replica.client.Client`` (the contract the
connector codes against): partitions with leader epochs, control records, KIP-101
OffsetsForLeaderEpoch, fenced requests, unclean elections. For unit tests only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from quorumlog.replica.client import (
    FencedLeaderEpochError,
    OffsetOutOfRangeError,
    PartitionMetadata,
    TopicMetadata,
    UnknownLeaderEpochError,
    UnknownTopicError,
)
from quorumlog.replica.storage.types import EpochEndOffset, OffsetAndEpoch

PAYLOAD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.timestamp("ms")),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ),
        pa.field("offset", pa.int64()),
        pa.field("leaderEpoch", pa.int32()),
    ]
)


@dataclass
class Entry:
    offset: int
    epoch: int
    control: bool
    value: bytes = b""
    key: bytes | None = None


@dataclass
class FakePartition:
    leader_epoch: int = 0
    leader_id: int = 1
    log: list[Entry] = field(default_factory=list)
    log_start: int = 0
    hwm: int | None = None  # None: every record is committed

    @property
    def leo(self) -> int:
        return self.log[-1].offset + 1 if self.log else self.log_start

    @property
    def high_watermark(self) -> int:
        return self.leo if self.hwm is None else self.hwm


class FakeCluster:
    def __init__(self) -> None:
        self.topics: dict[str, dict[int, FakePartition]] = {}
        self.requests: list[tuple[str, Any]] = []
        self.fetch_hook: Any = None  # called before each fetch (to change the log mid-read)

    def create_topic(self, name: str, partitions: int) -> None:
        self.topics[name] = {}
        for p in range(partitions):
            part = FakePartition()
            part.log.append(Entry(0, 0, True))  # the first leader's leader-change record
            self.topics[name][p] = part

    def part(self, topic: str, partition: int) -> FakePartition:
        return self.topics[topic][partition]

    def produce(self, topic: str, partition: int, values: list[bytes]) -> list[OffsetAndEpoch]:
        part = self.part(topic, partition)
        out = []
        for v in values:
            e = Entry(part.leo, part.leader_epoch, False, v, b"k" + v)
            part.log.append(e)
            out.append(OffsetAndEpoch(e.offset, e.epoch))
        return out

    def elect(self, topic: str, partition: int, *, truncate_to: int | None = None) -> int:
        """A new leader epoch; ``truncate_to`` drops records at and after that offset first
        (an unclean election of a replica that lacked them)."""
        part = self.part(topic, partition)
        if truncate_to is not None:
            part.log = [e for e in part.log if e.offset < truncate_to]
        part.leader_epoch += 1
        part.leader_id = part.leader_id % 3 + 1
        part.log.append(Entry(part.leo, part.leader_epoch, True))
        return part.leader_epoch

    def client(self, *args: Any, **kwargs: Any) -> FakeClient:
        return FakeClient(self)


@dataclass(frozen=True)
class FakeFetchResult:
    topic: str
    partition: int
    leader_epoch: int
    high_watermark: int
    log_start_offset: int
    entries: tuple[Entry, ...]

    def to_arrow(self, start_offset: int | None = None, end_offset: int | None = None) -> pa.Table:
        rows = [
            e
            for e in self.entries
            if not e.control
            and (start_offset is None or e.offset >= start_offset)
            and (end_offset is None or e.offset < end_offset)
        ]
        return pa.table(
            {
                "key": pa.array([e.key for e in rows], pa.binary()),
                "value": pa.array([e.value for e in rows], pa.binary()),
                "timestamp": pa.array(
                    [1_700_000_000_000 + e.offset for e in rows], pa.int64()
                ).cast(pa.timestamp("ms")),
                "headers": pa.array(
                    [[{"key": "h", "value": e.value}] for e in rows],
                    PAYLOAD_SCHEMA.field("headers").type,
                ),
                "offset": pa.array([e.offset for e in rows], pa.int64()),
                "leaderEpoch": pa.array([e.epoch for e in rows], pa.int32()),
            },
            schema=PAYLOAD_SCHEMA,
        )

    def last_offset_and_epoch(self) -> OffsetAndEpoch | None:
        if not self.entries:
            return None
        return OffsetAndEpoch(self.entries[-1].offset, self.entries[-1].epoch)


class FakeClient:
    def __init__(self, cluster: FakeCluster, batch_records: int = 3) -> None:
        self.cluster = cluster
        self.batch_records = batch_records
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fence(self, part: FakePartition, current_leader_epoch: int | None) -> None:
        if current_leader_epoch is None:
            return
        if current_leader_epoch < part.leader_epoch:
            raise FencedLeaderEpochError("FENCED_LEADER_EPOCH")
        if current_leader_epoch > part.leader_epoch:
            raise UnknownLeaderEpochError("UNKNOWN_LEADER_EPOCH")

    def _meta(self, topic: str, p: int, part: FakePartition) -> PartitionMetadata:
        return PartitionMetadata(
            topic,
            p,
            part.leader_id,
            part.leader_epoch,
            [1, 2, 3],
            part.high_watermark,
            part.log_start,
        )

    def list_topics(self) -> list[str]:
        return sorted(self.cluster.topics)

    def metadata(self, topics: list[str] | None = None) -> dict[str, TopicMetadata]:
        self.cluster.requests.append(("metadata", topics))
        names = sorted(self.cluster.topics) if not topics else topics
        missing = [t for t in names if t not in self.cluster.topics]
        if missing:
            raise UnknownTopicError(f"unknown topic(s): {', '.join(missing)}")
        return {
            t: TopicMetadata(
                t, {p: self._meta(t, p, part) for p, part in self.cluster.topics[t].items()}
            )
            for t in names
        }

    def partition_metadata(
        self, topic: str, partition: int, *, refresh: bool = False
    ) -> PartitionMetadata:
        return self._meta(topic, partition, self.cluster.part(topic, partition))

    def list_offsets(
        self, topic: str, partition: int, spec: str | int, current_leader_epoch: int | None = None
    ) -> OffsetAndEpoch:
        self.cluster.requests.append(("list_offsets", (topic, partition, spec)))
        part = self.cluster.part(topic, partition)
        self._fence(part, current_leader_epoch)
        if spec == "earliest":
            return OffsetAndEpoch(part.log_start, -1)
        hwm = part.high_watermark
        before = [e for e in part.log if e.offset == hwm - 1]
        return OffsetAndEpoch(hwm, before[0].epoch if before else -1)

    def offsets_for_leader_epoch(
        self, topic: str, partition: int, leader_epoch: int, current_leader_epoch: int | None = None
    ) -> EpochEndOffset:
        self.cluster.requests.append(("ofle", (topic, partition, leader_epoch)))
        part = self.cluster.part(topic, partition)
        self._fence(part, current_leader_epoch)
        starts: dict[int, int] = {}
        for e in part.log:
            starts.setdefault(e.epoch, e.offset)
        if not starts:
            return EpochEndOffset(-1, -1)
        latest = max(starts)
        if leader_epoch == latest:
            return EpochEndOffset(latest, part.leo)
        if leader_epoch > latest:
            return EpochEndOffset(-1, -1)
        lower = [e for e in starts if e <= leader_epoch]
        if not lower:
            return EpochEndOffset(-1, -1)
        found = max(lower)
        next_start = min(starts[e] for e in starts if e > found)
        return EpochEndOffset(found, next_start)

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        current_leader_epoch: int | None = None,
        max_bytes: int = 8 << 20,
        max_wait_ms: int = 0,
    ) -> FakeFetchResult:
        if self.cluster.fetch_hook is not None:
            self.cluster.fetch_hook(topic, partition, offset)
        self.cluster.requests.append(("fetch", (topic, partition, offset)))
        part = self.cluster.part(topic, partition)
        self._fence(part, current_leader_epoch)
        if offset < part.log_start or offset > part.leo:
            raise OffsetOutOfRangeError(f"offset {offset} out of range")
        hwm = part.high_watermark
        # whole "batches" of batch_records aligned on multiples, like real batches may start
        # before the requested offset
        first = offset - offset % self.batch_records
        entries = tuple(
            e
            for e in part.log
            if first <= e.offset < hwm and e.offset < offset + self.batch_records * 2
        )
        return FakeFetchResult(topic, partition, part.leader_epoch, hwm, part.log_start, entries)
