"""The batch reader (``spark.read.format("quorumlog")``) and the helpers that give the
epoch-aware offsets to start the next incremental batch from.

Ranges are fixed when Spark plans the query: ``startingOffsets`` (default earliest) to
``endingOffsets`` (default latest = each partition's high watermark with the epoch of the
record before it). Starting and ending positions with an epoch are validated (KIP-320) and
follow ``onTruncation``; positions without an epoch are taken on trust.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..replica.client import PartitionMetadata
from . import planning
from .fetch import QuorumLogPartition, read_partition
from .offsets import (
    Position,
    Positions,
    TopicPartition,
    from_offset_dict,
    offsets_json,
    parse_offsets_json,
)
from .options import SourceOptions, parse_options
from .planning import Planner, check_known_partitions, wanted_position
from .truncation import TruncatedPartition
from .validation import QuorumLogSourceError, below_log_start, resolve, settle_truncations

log = logging.getLogger(__name__)


def plan_ranges(
    options: SourceOptions, planner: Planner
) -> list[tuple[TopicPartition, Position, Position, int]]:
    """(partition, start, end, leader epoch) for every subscribed partition."""
    meta = planner.partitions()
    starting = options.starting_offsets or "earliest"
    ending = options.ending_offsets or "latest"
    check_known_partitions("startingOffsets", starting, meta)
    check_known_partitions("endingOffsets", ending, meta)
    truncations: list[TruncatedPartition] = []
    out: list[tuple[TopicPartition, Position, Position, int]] = []
    for tp in meta:
        want_start = wanted_position(starting, tp)
        want_end = wanted_position(ending, tp, "latest")

        start_ts = options.timestamp_for(tp, ending=False)
        end_ts = options.timestamp_for(tp, ending=True)

        def plan_one(
            pm: PartitionMetadata,
            tp: TopicPartition = tp,
            want_start: Position = want_start,
            want_end: Position = want_end,
            start_ts: int | None = start_ts,
            end_ts: int | None = end_ts,
        ) -> tuple[Position, Position, Position, int, list[TruncatedPartition]]:
            found: list[TruncatedPartition] = []
            latest = planner.latest(tp, pm)

            def position(wanted: Position, ts: int | None) -> Position:
                looked_up = planner.lookup(tp, pm, wanted, ts, latest)
                if looked_up is not None:
                    return looked_up
                return resolve(planner.client, tp, wanted, pm, found)

            return (
                position(want_start, start_ts),
                position(want_end, end_ts),
                latest,
                pm.leader_epoch,
                found,
            )

        start, end, latest, leader_epoch, found = planner.with_leader(tp, plan_one)
        truncations.extend(found)
        pm = planner.client.partition_metadata(tp.topic, tp.partition)
        start = below_log_start(options.fail_on_data_loss, tp, start, pm.log_start_offset)
        if end.offset > latest.offset:
            raise QuorumLogSourceError(
                f"Option 'endingOffsets' asks for {tp} up to offset {end.offset}, but its log "
                f"ends at offset {latest.offset} (high watermark). Use 'latest' or an offset "
                f"<= {latest.offset}."
            )
        if start.offset > end.offset:
            if found:
                end = start  # resumed past the requested end: nothing to read
            else:
                raise QuorumLogSourceError(
                    f"{tp}: startingOffsets offset {start.offset} is after endingOffsets "
                    f"offset {end.offset}."
                )
        out.append((tp, start, end, leader_epoch))
    settle_truncations(options.on_truncation, truncations, "Found when planning a batch read.")
    return out


class QuorumLogBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        opts = self.options
        client = planning.client_for(opts, "driver")
        try:
            planner = Planner(opts, client)
            ranges = planner.split(
                [r for r in plan_ranges(opts, planner) if r[2].offset > r[1].offset]
            )
        finally:
            client.close()
        parts: list[InputPartition] = [
            QuorumLogPartition.for_range(opts, tp, start, end, leader_epoch)
            for tp, start, end, leader_epoch in ranges
            if end.offset > start.offset
        ]
        log.info("batch read planned %d task(s)", len(parts))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


def next_offsets(df: Any, previous: str | Mapping[str, Any] | None = None) -> str:
    """Epoch-aware ``startingOffsets`` JSON for the batch after ``df`` (a DataFrame read
    from this source): per partition ``max(offset) + 1`` with the epoch of that record,
    computed with one Spark aggregation. Partitions without rows in ``df`` keep their
    position from ``previous`` (the startingOffsets JSON ``df`` was read with), or are
    left out (they then start at earliest).

    Prefer ``ending_offsets_json`` when you can fix the end before reading: it also covers
    partitions with no new rows and control records at the end of the range."""
    from pyspark.sql import functions as F

    rows = (
        df.groupBy("topic", "partition")
        .agg(
            F.max("offset").alias("last_offset"),
            F.max_by("leaderEpoch", "offset").alias("last_epoch"),
        )
        .collect()
    )
    positions: Positions = {}
    if previous is not None:
        positions.update(
            parse_offsets_json(previous, option="previous")
            if isinstance(previous, str)
            else from_offset_dict(previous, what="previous offsets")
        )
        positions = {tp: p for tp, p in positions.items() if p.offset >= 0}
    for row in rows:
        positions[TopicPartition(row["topic"], int(row["partition"]))] = Position(
            int(row["last_offset"]) + 1, int(row["last_epoch"])
        )
    return offsets_json(positions)


def ending_offsets_json(
    bootstrap: str,
    topic: str | None = None,
    *,
    topic_pattern: str | None = None,
    request_timeout_ms: int = 30000,
) -> str:
    """The current end of every subscribed partition as epoch-aware offsets JSON (high
    watermark + epoch of the record before it). Read a batch with
    ``endingOffsets=<this>``, then start the next one with ``startingOffsets=<this>``."""
    raw: dict[str, str] = {"bootstrap": bootstrap, "requestTimeoutMs": str(request_timeout_ms)}
    if topic is not None:
        raw["topic"] = topic
    if topic_pattern is not None:
        raw["topicPattern"] = topic_pattern
    opts = parse_options(raw)
    client = planning.client_for(opts, "driver")
    try:
        planner = Planner(opts, client)
        positions = {
            tp: planner.with_leader(tp, lambda pm, tp=tp: planner.latest(tp, pm))
            for tp in planner.partitions()
        }
    finally:
        client.close()
    return offsets_json(positions)
