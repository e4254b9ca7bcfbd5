"""The streaming reader: a KIP-320 consumer-follower planning micro-batches on the driver.

Spark keeps one long-lived Python process per source per query holding this object
(``initialOffset``, ``latestOffset``, ``partitions``, ``commit``); ``read`` runs on
executors on an unpickled copy, so it only uses its ``QuorumLogPartition``.

Offsets are ``{"topic": {"partition": {"offset": N, "epoch": E}}}`` (see offsets.py).
Every planning step reads Metadata; a position is validated with OffsetsForLeaderEpoch the
first time this process sees it (a new query or a restart from a checkpoint) and whenever
its partition's leader epoch differs from the last one seen. With onTruncation=resume a
truncated position maps to its divergence position, remembered for the batch being
planned (and found again by validation after a restart), so a batch re-reads from there.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..replica.client import Client, PartitionMetadata
from . import planning
from .fetch import QuorumLogPartition, read_partition
from .offsets import (
    Position,
    Positions,
    TopicPartition,
    from_offset_dict,
    to_offset_dict,
)
from .options import SourceOptions
from .planning import Planner, check_known_partitions, split_budget, wanted_position
from .truncation import TruncatedPartition
from .validation import (
    QuorumLogSourceError,
    below_log_start,
    data_loss,
    resolve,
    settle_truncations,
)

log = logging.getLogger(__name__)

_MEMO_PER_PARTITION = 8


class QuorumLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: Client | None = None
        self._planner: Planner | None = None
        self._meta: dict[TopicPartition, PartitionMetadata] = {}
        # leader epoch each partition had when its positions were last validated/planned
        self._known_epochs: dict[TopicPartition, int] = {}
        # checkpointed position -> the position to read from (itself, or its divergence)
        self._resolved: dict[TopicPartition, OrderedDict[Position, Position]] = {}
        self._new_partition_starts: dict[TopicPartition, Position] = {}
        self._target: Positions | None = None
        self._latest: Positions | None = None
        self._last_trigger: float | None = None  # monotonic time the last batch fired

    # The driver's client never travels to executors.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_client=None, _planner=None, _meta={}, _resolved={}, _known_epochs={})
        return state

    def _plan(self) -> Planner:
        if self._planner is None:
            self._client = planning.client_for(self.options, "driver")
            self._planner = Planner(self.options, self._client)
        return self._planner

    def _refresh(self) -> dict[TopicPartition, PartitionMetadata]:
        self._meta = self._plan().partitions()
        return self._meta

    # ---- memo of resolved positions -----------------------------------------------------
    def _remember(self, tp: TopicPartition, position: Position, resolved: Position) -> None:
        memo = self._resolved.setdefault(tp, OrderedDict())
        memo[position] = resolved
        memo.move_to_end(position)
        while len(memo) > _MEMO_PER_PARTITION:
            memo.popitem(last=False)

    def _resolve(
        self,
        tp: TopicPartition,
        position: Position,
        pm: PartitionMetadata,
        truncations: list[TruncatedPartition],
    ) -> Position:
        """The position to read from for a checkpointed ``position``; validates it when it
        is new to this process or the leader epoch moved since it was last checked. No side
        effects: a fenced retry of the caller must find the same truncations again."""
        memo = self._resolved.get(tp, {})
        current = memo.get(position, position)
        if position in memo and self._known_epochs.get(tp) == pm.leader_epoch:
            return current
        current = resolve(self._plan().client, tp, current, pm, truncations)
        return below_log_start(self.options.fail_on_data_loss, tp, current, pm.log_start_offset)

    def _begin(
        self,
        tp: TopicPartition,
        start: Position | None,
        pm: PartitionMetadata,
        truncations: list[TruncatedPartition],
    ) -> Position:
        """Where a batch starts reading ``tp``: its checkpointed ``start`` resolved, or for
        a partition that appeared since (no start) its first planned start (earliest)."""
        if start is not None:
            return self._resolve(tp, start, pm, truncations)
        return self._new_partition_starts.get(tp) or self._plan().earliest(tp, pm)

    # ---- Spark API ------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        meta = self._refresh()
        spec = self.options.starting_offsets or "latest"
        planner = self._plan()
        check_known_partitions("startingOffsets", spec, meta)
        positions: Positions = {}
        for tp in meta:
            wanted = wanted_position(spec, tp)
            ts = self.options.timestamp_for(tp, ending=False)

            def lookup(
                pm: PartitionMetadata,
                tp: TopicPartition = tp,
                wanted: Position = wanted,
                ts: int | None = ts,
            ) -> tuple[Position | None, int]:
                return planner.lookup(tp, pm, wanted, ts), pm.leader_epoch

            looked_up, leader_epoch = planner.with_leader(tp, lookup)
            positions[tp] = wanted if looked_up is None else looked_up
            if looked_up is not None:
                # looked up just now in this leader epoch: nothing to validate; a user's
                # position is validated by the first latestOffset
                self._remember(tp, looked_up, looked_up)
                self._known_epochs[tp] = leader_epoch
        log.info("initial positions: %s", to_offset_dict(positions))
        return to_offset_dict(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        meta = self._refresh()
        planner = self._plan()
        self._target = {
            tp: planner.with_leader(tp, lambda pm, tp=tp: planner.latest(tp, pm)) for tp in meta
        }
        log.info("Trigger.AvailableNow target: %s", to_offset_dict(self._target))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        starts = from_offset_dict(start)
        meta = self._refresh()
        planner = self._plan()
        opts = self.options
        for tp in starts:
            if tp not in meta:
                data_loss(
                    opts.fail_on_data_loss,
                    f"{tp} no longer exists (topic deleted or unsubscribed).",
                    "drop it and continue",
                )

        truncations: list[TruncatedPartition] = []
        froms: Positions = {}
        latest: Positions = {}
        for tp in meta:

            def plan_one(
                pm: PartitionMetadata, tp: TopicPartition = tp
            ) -> tuple[Position, Position, PartitionMetadata, list[TruncatedPartition]]:
                found: list[TruncatedPartition] = []
                begin = self._begin(tp, starts.get(tp), pm, found)
                return begin, planner.latest(tp, pm), pm, found

            begin, latest[tp], pm, found = planner.with_leader(tp, plan_one)
            truncations.extend(found)
            froms[tp] = begin
            if tp in starts:
                self._remember(tp, starts[tp], begin)
            else:
                self._new_partition_starts[tp] = begin
            self._meta[tp] = pm
            self._known_epochs[tp] = pm.leader_epoch
        settle_truncations(
            opts.on_truncation,
            truncations,
            "Found when planning a micro-batch (driver validation).",
        )
        self._latest = latest

        ends: Positions = {}
        for tp, begin in froms.items():
            end = latest[tp]
            if self._target is not None:
                target = self._target.get(tp)
                if target is None:
                    end = begin  # appeared after Trigger.AvailableNow fixed its end
                elif target.offset < end.offset:
                    end = target
            if end.offset < begin.offset:
                # A new leader's high watermark can trail what its predecessor committed
                # until it commits in its own epoch; a position with an epoch was validated
                # above, so wait for the log to reach it.
                log.info(
                    "%s: position %s is beyond the high watermark %d; waiting",
                    tp,
                    begin.describe(),
                    end.offset,
                )
                end = begin
            ends[tp] = end

        if self._delay_batch(froms, ends):
            return start

        max_rows = _max_rows(limit)
        if max_rows is not None:
            capped = split_budget(
                {tp: p.offset for tp, p in froms.items()},
                {tp: p.offset for tp, p in ends.items()},
                max_rows,
            )
            for tp, offset in capped.items():
                if offset < ends[tp].offset:
                    ends[tp] = (
                        froms[tp]
                        if offset <= froms[tp].offset
                        else Position(
                            offset,
                            planner.with_leader(
                                tp, lambda pm, tp=tp, o=offset: planner.epoch_at(tp, o - 1, pm)
                            ),
                        )
                    )
        for tp, end in ends.items():
            self._remember(tp, end, end)  # planned here: trusted in this leader epoch
        return to_offset_dict(ends)

    def _delay_batch(self, froms: Positions, ends: Positions) -> bool:
        """minOffsetsPerTrigger: hold the batch back (Spark then runs none) while fewer
        offsets are available, until maxTriggerDelay has passed since the last batch fired
        (the first check fires, as in Spark's Kafka source). Not under
        Trigger.AvailableNow, which must reach its target."""
        wanted = self.options.min_offsets_per_trigger
        if wanted is None or self._target is not None:
            return False
        available = sum(max(0, end.offset - froms[tp].offset) for tp, end in ends.items())
        now = time.monotonic()
        waited = None if self._last_trigger is None else now - self._last_trigger
        if (
            available >= wanted
            or waited is None
            or waited * 1000 >= self.options.max_trigger_delay_ms
        ):
            self._last_trigger = now
            return False
        log.debug(
            "minOffsetsPerTrigger=%d: %d offsets available, waited %.1f s of %d ms; delaying",
            wanted,
            available,
            waited,
            self.options.max_trigger_delay_ms,
        )
        return True

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_offset_dict(self._latest) if self._latest else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        starts = from_offset_dict(start)
        ends = from_offset_dict(end)
        planner = self._plan()
        meta = self._meta or self._refresh()
        opts = self.options
        ranges: list[tuple[TopicPartition, Position, Position, int]] = []
        truncations: list[TruncatedPartition] = []
        for tp, end_position in ends.items():
            if tp not in meta:
                meta = self._refresh()
                if tp not in meta:
                    raise QuorumLogSourceError(f"{tp} is planned but no longer exists")

            def plan_one(
                pm: PartitionMetadata,
                tp: TopicPartition = tp,
                end_position: Position = end_position,
            ) -> tuple[Position, Position, int, list[TruncatedPartition]]:
                found: list[TruncatedPartition] = []
                begin = self._begin(tp, starts.get(tp), pm, found)
                # An end planned by an earlier process (replay after a restart) or before a
                # leader change is validated too; reading stops at its divergence.
                stop = self._resolve(tp, end_position, pm, found)
                return begin, stop, pm.leader_epoch, found

            begin, stop, leader_epoch, found = planner.with_leader(tp, plan_one)
            truncations.extend(found)
            if tp in starts:
                self._remember(tp, starts[tp], begin)
            self._remember(tp, end_position, stop)
            self._known_epochs[tp] = leader_epoch
            if stop.offset <= begin.offset:
                continue
            ranges.append((tp, begin, stop, leader_epoch))
        settle_truncations(
            opts.on_truncation,
            truncations,
            "Found when planning the tasks of a micro-batch (driver).",
        )
        out = [
            QuorumLogPartition.for_range(opts, tp, begin, stop, leader_epoch)
            for tp, begin, stop, leader_epoch in planner.split(ranges)
        ]
        log.debug("planned %d task(s) for %s -> %s", len(out), start, end)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)

    # ---- a micro-batch read on the driver (driver_read.py) ---------------------------------
    @property
    def client(self) -> Client:
        """The driver's client (connected on first use)."""
        return self._plan().client

    def replan(self, start: dict[str, Any], end: dict[str, Any]) -> list[QuorumLogPartition]:
        """The tasks of a micro-batch another process of the query planned: metadata read
        afresh, as ``latestOffset`` reads it, then ``partitions``, which validates every
        position this reader has not seen in the current leader epoch."""
        self._refresh()
        return [p for p in self.partitions(start, end) if isinstance(p, QuorumLogPartition)]

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("committed up to %s", end)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
            self._planner = None


def _max_rows(limit: ReadLimit) -> int | None:
    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows)
    return None
