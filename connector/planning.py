"""Driver-side reads of the cluster shared by the batch and streaming readers: which
partitions a subscription covers, positions for earliest/latest, KIP-320 validation of a
position, the epoch of an arbitrary offset, and the maxOffsetsPerTrigger budget split."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar

from ..replica.client import (
    DEFAULT_ATTEMPT_TIMEOUT_MS,
    BootstrapUnreachableError,
    Client,
    FencedLeaderEpochError,
    PartitionMetadata,
    UnknownLeaderEpochError,
    UnknownTopicError,
)
from ..replica.client.security import ClientSecurity
from .offsets import EARLIEST, LATEST, UNKNOWN_EPOCH, Position, TopicPartition
from .options import OffsetSpec, SourceOptions
from .retry import Backoff
from .truncation import Divergence
from .validation import QuorumLogSourceError, StaleMetadata, validate

T = TypeVar("T")

FENCED_ERRORS = (FencedLeaderEpochError, UnknownLeaderEpochError)


def connect(
    bootstrap: str,
    request_timeout_ms: int,
    role: str,
    security: ClientSecurity | None = None,
    *,
    attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS,
) -> Client:
    """One Client per reader (driver) or per task (executor). Tests replace this."""
    return Client(
        bootstrap,
        client_id=f"quorumlog-spark-{role}",
        request_timeout_ms=request_timeout_ms,
        attempt_timeout_ms=attempt_timeout_ms,
        security=security,
    )


class ClientSettings(Protocol):
    """How to reach the cluster: ``SourceOptions`` on the driver, a task's
    ``QuorumLogPartition`` on an executor."""

    @property
    def bootstrap(self) -> str: ...
    @property
    def request_timeout_ms(self) -> int: ...
    @property
    def security(self) -> ClientSecurity | None: ...
    @property
    def attempt_timeout_ms(self) -> int: ...


def client_for(settings: ClientSettings, role: str) -> Client:
    """``connect`` with the settings of a reader (role ``driver``) or a task (``executor``)."""
    return connect(
        settings.bootstrap,
        settings.request_timeout_ms,
        role,
        settings.security,
        attempt_timeout_ms=settings.attempt_timeout_ms,
    )


def wanted_position(
    spec: OffsetSpec, tp: TopicPartition, default: Literal["earliest", "latest"] = "earliest"
) -> Position:
    """The position an offsets option (startingOffsets / endingOffsets) asks for ``tp``:
    a user's position, or the EARLIEST / LATEST sentinel (``Planner.lookup``); a partition
    the JSON leaves out gets ``default``, as in Spark's Kafka source."""
    if isinstance(spec, dict):
        return spec.get(tp, Position(EARLIEST if default == "earliest" else LATEST))
    return Position(EARLIEST if spec == "earliest" else LATEST)


def check_known_partitions(
    option: str, spec: OffsetSpec, meta: Mapping[TopicPartition, Any]
) -> None:
    """An offsets option's JSON may only name partitions that exist."""
    if isinstance(spec, dict):
        unknown = sorted(str(tp) for tp in spec if tp not in meta)
        if unknown:
            raise QuorumLogSourceError(
                f"Option '{option}' names partitions that do not exist: {unknown}. "
                f"Existing partitions: {[str(tp) for tp in meta]}."
            )


def split_budget(
    starts: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int], limit: int
) -> dict[TopicPartition, int]:
    """maxOffsetsPerTrigger: give each partition a share of ``limit`` offsets proportional
    to what it has available (Spark Kafka's rule), handing the rounding remainder to the
    largest fractions so the total is exactly ``limit`` when more than that is available."""
    sizes = {tp: max(0, ends[tp] - starts.get(tp, ends[tp])) for tp in ends}
    total = sum(sizes.values())
    if total <= limit:
        return dict(ends)
    shares = {tp: limit * size / total for tp, size in sizes.items()}
    take = {tp: math.floor(share) for tp, share in shares.items()}
    left = limit - sum(take.values())
    by_fraction = sorted(
        (tp for tp in sizes if take[tp] < sizes[tp]),
        key=lambda tp: (-(shares[tp] - take[tp]), tp),
    )
    for tp in by_fraction[:left]:
        take[tp] += 1
    return {tp: min(ends[tp], starts.get(tp, ends[tp]) + take[tp]) for tp in ends}


def split_ranges(
    sizes: Mapping[T, int], min_partitions: int | None, max_records: int | None
) -> dict[T, int]:
    """How many Spark tasks read each range (Spark Kafka's KafkaOffsetRangeCalculator):
    ``maxRecordsPerPartition`` first caps every task's offsets; then, while there are fewer
    tasks than ``minPartitions``, each non-empty range gets a share of ``minPartitions``
    proportional to its size (at least the pieces it already has)."""
    pieces = {
        key: max(1, math.ceil(size / max_records)) if max_records and size > 0 else 1
        for key, size in sizes.items()
    }
    total = sum(size for size in sizes.values() if size > 0)
    if min_partitions and total and sum(pieces.values()) < min_partitions:
        for key, size in sizes.items():
            if size > 0:
                share = max(1, round(size / total * min_partitions))
                pieces[key] = min(size, max(pieces[key], share))
    return pieces


def piece_bounds(start: int, end: int, pieces: int) -> list[int]:
    """``pieces + 1`` increasing offsets from ``start`` to ``end`` cutting [start, end) into
    near-equal parts."""
    size = end - start
    return [start + size * i // pieces for i in range(pieces + 1)]


class Planner:
    """The driver's view of the cluster for one reader (one Client, reused)."""

    def __init__(self, options: SourceOptions, client: Client) -> None:
        self.options = options
        self.client = client

    # ---- subscription ---------------------------------------------------------------
    def partitions(self) -> dict[TopicPartition, PartitionMetadata]:
        """Fresh metadata for every subscribed partition (sorted)."""
        opts = self.options
        try:
            if opts.topic_pattern is None:
                try:
                    meta = self.client.metadata(list(opts.topics))
                except UnknownTopicError:
                    existing = sorted(self.client.metadata(None))
                    missing = [t for t in opts.topics if t not in existing]
                    raise QuorumLogSourceError(
                        f"Topic(s) {missing} given in option 'topic' do not exist on "
                        f"bootstrap {opts.bootstrap}. Existing topics: {existing}. Create "
                        "them first (quorumlog topic create) or fix option 'topic'."
                    ) from None
            else:
                meta = {t: m for t, m in self.client.metadata(None).items() if opts.subscribes(t)}
        except BootstrapUnreachableError as exc:
            raise QuorumLogSourceError(
                f"Cannot reach the quorumlog cluster given in option 'bootstrap' "
                f"({opts.bootstrap}): {exc}"
            ) from None
        out = {
            TopicPartition(topic, p): pm
            for topic, tm in meta.items()
            for p, pm in tm.partitions.items()
        }
        return {tp: out[tp] for tp in sorted(out)}

    # ---- leader-fenced calls ----------------------------------------------------------
    def with_leader(self, tp: TopicPartition, fn: Callable[[PartitionMetadata], T]) -> T:
        """Run ``fn(partition metadata)`` whose requests carry its leader epoch as
        CurrentLeaderEpoch; on FENCED/UNKNOWN_LEADER_EPOCH refresh metadata and retry with
        back-off, up to requestTimeoutMs."""
        timeout_ms = self.options.request_timeout_ms
        backoff = Backoff(self.client, timeout_ms)
        refresh = False
        while True:
            pm = self.client.partition_metadata(tp.topic, tp.partition, refresh=refresh)
            try:
                return fn(pm)
            except (*FENCED_ERRORS, StaleMetadata) as exc:
                backoff.wait(
                    QuorumLogSourceError(
                        f"{tp}: the leader epoch kept changing or metadata stayed behind for "
                        f"{timeout_ms} ms (last: {exc}); raise requestTimeoutMs or check the "
                        "cluster's health"
                    )
                )
            refresh = True

    def earliest(self, tp: TopicPartition, pm: PartitionMetadata) -> Position:
        found = self.client.list_offsets(
            tp.topic, tp.partition, "earliest", current_leader_epoch=pm.leader_epoch
        )
        return Position(found.offset, UNKNOWN_EPOCH)

    def latest(self, tp: TopicPartition, pm: PartitionMetadata) -> Position:
        found = self.client.list_offsets(
            tp.topic,
            tp.partition,
            "latest",
            current_leader_epoch=pm.leader_epoch,
            isolation=self.options.isolation_level,
        )
        return Position(found.offset, found.epoch if found.offset > 0 else UNKNOWN_EPOCH)

    def at_timestamp(self, tp: TopicPartition, pm: PartitionMetadata, timestamp: int) -> Position:
        """The first offset whose record timestamp is >= ``timestamp`` (ListOffsets), with
        the epoch of the record before it; the log end (latest) when every record is
        older."""
        found = self.client.list_offsets(
            tp.topic, tp.partition, timestamp, current_leader_epoch=pm.leader_epoch
        )
        return Position(found.offset, found.epoch if found.offset > 0 else UNKNOWN_EPOCH)

    def lookup(
        self,
        tp: TopicPartition,
        pm: PartitionMetadata,
        wanted: Position,
        timestamp: int | None,
        latest: Position | None = None,
    ) -> Position | None:
        """The position ``wanted`` names, looked up in the log now: by ``timestamp`` when
        given (startingTimestamp & co. win over startingOffsets, as in Spark), else the
        log start (EARLIEST) or end (LATEST; ``latest`` if the caller has it already).
        None for a user's own position, which the caller validates."""
        if timestamp is not None:
            return self.at_timestamp(tp, pm, timestamp)
        if wanted.offset == EARLIEST:
            return self.earliest(tp, pm)
        if wanted.offset == LATEST:
            return latest if latest is not None else self.latest(tp, pm)
        return None

    def validate(
        self, tp: TopicPartition, position: Position, pm: PartitionMetadata
    ) -> Divergence | None:
        """KIP-320 validation of ``position`` against the leader in ``pm``'s epoch."""
        return validate(
            self.client,
            tp,
            position,
            leader_epoch=pm.leader_epoch,
            log_start_offset=pm.log_start_offset,
        )

    def split(
        self, ranges: list[tuple[TopicPartition, Position, Position, int]]
    ) -> list[tuple[TopicPartition, Position, Position, int]]:
        """minPartitions / maxRecordsPerPartition: each range cut into pieces; an inner cut
        carries the epoch of the record before it (OffsetsForLeaderEpoch), so every task
        can validate its end like any planned end."""
        opts = self.options
        if opts.min_partitions is None and opts.max_records_per_partition is None:
            return ranges
        counts = split_ranges(
            {i: end.offset - start.offset for i, (_, start, end, _) in enumerate(ranges)},
            opts.min_partitions,
            opts.max_records_per_partition,
        )
        out = []
        for i, (tp, start, end, leader_epoch) in enumerate(ranges):
            bounds = piece_bounds(start.offset, end.offset, counts[i])
            cuts = [start]
            for offset in bounds[1:-1]:
                epoch = self.with_leader(
                    tp, lambda pm, tp=tp, o=offset: self.epoch_at(tp, o - 1, pm)
                )
                cuts.append(Position(offset, epoch))
            cuts.append(end)
            out.extend((tp, a, b, leader_epoch) for a, b in zip(cuts, cuts[1:], strict=False))
        return out

    def epoch_at(self, tp: TopicPartition, offset: int, pm: PartitionMetadata) -> int:
        """Leader epoch of the record at ``offset`` (control records included), found by
        walking the leader's epochs down with OffsetsForLeaderEpoch: the epoch whose start
        is the largest one <= offset. Usually one request."""
        if offset < 0:
            return UNKNOWN_EPOCH
        epoch = pm.leader_epoch
        for _ in range(10_000):
            if epoch <= 0:
                return epoch
            answer = self.client.offsets_for_leader_epoch(
                tp.topic, tp.partition, epoch - 1, current_leader_epoch=pm.leader_epoch
            )
            # answer.end_offset is where the epoch after answer.epoch (i.e. ``epoch``) starts
            if answer.epoch < 0 or answer.end_offset <= offset:
                return epoch
            epoch = answer.epoch
        return UNKNOWN_EPOCH
