"""What a Delta sink commit says and how it is planned, driver side: the batch's summary
per topic-partition (``batch_ranges``), the comparison with the table's last committed
positions that finds re-deliveries after a truncation (``plan_commit``), and the sink's
metadata in each commit's ``commitInfo`` (``read_committed_positions``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ..offsets import Position
from .repair import DivergenceResolver

#: Key of the sink's entry in each commit's ``commitInfo``.
METADATA_KEY = "quorumlog"
METADATA_FORMAT_VERSION = 1
#: Columns the sink needs; every other column of the source's schema is optional.
REQUIRED_COLUMNS: tuple[str, ...] = ("topic", "partition", "offset", "leaderEpoch")
DEFAULT_PARTITION_BY: tuple[str, ...] = ("topic", "partition")
#: How many commits to look back for the sink's metadata when the latest commit was made
#: by another writer (e.g. OPTIMIZE); the sink's own commits always carry it.
DEFAULT_METADATA_LOOKBACK = 100

Positions = dict[str, dict[int, Position]]


class DeltaSinkError(RuntimeError):
    """A sink failure the user can act on; the message names the table and the fix."""


@dataclass(frozen=True)
class Truncation:
    """Offsets of one topic-partition re-delivered after a log truncation."""

    topic: str
    partition: int
    divergence_offset: int  # rows at or above it are replaced
    first_redelivered_offset: int  # the batch's lowest offset of this partition
    old_offset: int
    old_epoch: int
    new_epoch: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "divergenceOffset": self.divergence_offset,
            "firstRedeliveredOffset": self.first_redelivered_offset,
            "oldOffset": self.old_offset,
            "oldEpoch": self.old_epoch,
            "newEpoch": self.new_epoch,
        }


@dataclass(frozen=True)
class PartitionRange:
    """What one micro-batch (or one file of it) holds for one topic-partition; a task
    describes a file it wrote with these fields (``files.RANGE_FIELDS``)."""

    topic: str
    partition: int
    min_offset: int
    max_offset: int
    first_epoch: int
    last_epoch: int
    rows: int


@dataclass(frozen=True)
class CommitPlan:
    """One micro-batch's commit: append, or replace from the divergence offsets up."""

    app_id: str
    batch_id: int
    ranges: tuple[PartitionRange, ...]
    positions: Positions
    truncations: tuple[Truncation, ...] = ()

    @property
    def replaces(self) -> bool:
        return bool(self.truncations)

    def predicate(self) -> str:
        """Rows the commit replaces: each truncated partition from its divergence offset
        up, every other partition of the batch from its lowest offset up (delta-rs
        requires all new rows to match an overwrite predicate)."""
        cut = {(t.topic, t.partition): t.divergence_offset for t in self.truncations}
        terms = []
        for r in self.ranges:
            start = cut.get((r.topic, r.partition), r.min_offset)
            terms.append(
                f"(topic = {_sql_string(r.topic)} AND partition = {r.partition}"
                f" AND offset >= {start})"
            )
        return " OR ".join(terms)

    def batch_positions(self) -> Positions:
        """End positions of the partitions in this batch only."""
        out: Positions = {}
        for r in self.ranges:
            out.setdefault(r.topic, {})[r.partition] = Position(r.max_offset + 1, r.last_epoch)
        return out

    def metadata(self) -> dict[str, Any]:
        return {
            METADATA_KEY: {
                "formatVersion": METADATA_FORMAT_VERSION,
                "appId": self.app_id,
                "batchId": self.batch_id,
                "positions": positions_to_offsets(self.positions),
                "batch": positions_to_offsets(self.batch_positions()),
                "truncations": [t.to_json() for t in self.truncations],
            }
        }


@dataclass(frozen=True)
class CommitResult:
    """Handed to ``DeltaSink(on_commit=...)`` right after a Delta commit."""

    path: str
    app_id: str
    batch_id: int
    version: int
    rows: int
    truncations: tuple[Truncation, ...] = field(default=())
    #: what the batch held per topic-partition (offset range, epochs, rows)
    ranges: tuple[PartitionRange, ...] = field(default=())


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def positions_to_offsets(
    positions: Mapping[str, Mapping[int, tuple[int, int]]],
) -> dict[str, dict[str, dict[str, int]]]:
    """Positions as the source's offsets dict ``{"topic": {"0": {"offset": N, "epoch":
    E}}}``, topics and partitions sorted (the same positions give the same JSON)."""
    return {
        topic: {
            str(p): {"offset": int(pos[0]), "epoch": int(pos[1])}
            for p, pos in sorted(positions[topic].items())
        }
        for topic in sorted(positions)
    }


def positions_to_json(positions: Mapping[str, Mapping[int, tuple[int, int]]]) -> str:
    """Positions as the source's offsets JSON (``startingOffsets`` accepts it)."""
    return json.dumps(positions_to_offsets(positions), separators=(",", ":"))


def _positions_from_offsets(raw: Mapping[str, Any]) -> Positions:
    out: Positions = {}
    for topic, parts in raw.items():
        for p, pos in parts.items():
            out.setdefault(topic, {})[int(p)] = Position(int(pos["offset"]), int(pos["epoch"]))
    return out


def _sink_metadata(commit: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The sink's entry in one commitInfo; delta-spark writes it as ``userMetadata``."""
    entry = commit.get(METADATA_KEY)
    if entry is None and isinstance(commit.get("userMetadata"), str):
        try:
            entry = json.loads(commit["userMetadata"]).get(METADATA_KEY)
        except (json.JSONDecodeError, AttributeError):
            entry = None
    return entry if isinstance(entry, Mapping) else None


def _latest_sink_metadata(
    table: DeltaTable, lookback: int = DEFAULT_METADATA_LOOKBACK
) -> Mapping[str, Any] | None:
    """The sink's metadata of the newest commit that has it. Reads the latest commit file
    only, unless another writer committed since (then pages back, up to ``lookback``)."""
    limit = 1
    while True:
        commits = table.history(limit=limit)
        for commit in commits:
            entry = _sink_metadata(commit)
            if entry is not None:
                return entry
        if len(commits) < limit:
            return None  # the whole history was read
        if limit >= lookback:
            raise DeltaSinkError(
                f"Delta table {table.table_uri}: none of the last {limit} commits carries "
                f"the quorumlog sink's positions (commitInfo key {METADATA_KEY!r}); other "
                "writers committed since. Re-delivered offsets cannot be detected; let the "
                "sink write once more before other writers, or raise metadata_lookback."
            )
        limit = min(limit * 10, lookback)


def read_committed_positions(
    path: str | os.PathLike[str], *, storage_options: dict[str, str] | None = None
) -> Positions:
    """The source positions the table last committed: ``{topic: {partition: (offset,
    epoch)}}``; empty if the sink never wrote to it. Restart a stream from them with
    ``startingOffsets=read_committed_offsets_json(path)``."""
    table = _open_table(str(path), storage_options)
    if table is None:
        raise DeltaSinkError(f"{path} is not a Delta table; no positions to read.")
    entry = _latest_sink_metadata(table)
    return _positions_from_offsets(entry["positions"]) if entry else {}


def read_committed_offsets_json(
    path: str | os.PathLike[str], *, storage_options: dict[str, str] | None = None
) -> str:
    """``read_committed_positions`` as the source's offsets JSON."""
    return positions_to_json(read_committed_positions(path, storage_options=storage_options))


def _open_table(path: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    local = None if "://" in path else Path(path)
    if local is not None and local.exists() and not local.is_dir():
        raise DeltaSinkError(f"Delta sink path {path} is a file; give a directory.")
    if DeltaTable.is_deltatable(path, storage_options):
        return DeltaTable(path, storage_options=storage_options)
    if local is not None and local.exists() and any(local.iterdir()):
        raise DeltaSinkError(
            f"Delta sink path {path} is a non-empty directory but not a Delta table "
            "(no _delta_log); give an empty or new directory or an existing Delta table."
        )
    return None


def batch_ranges(data: pa.Table) -> tuple[pa.Table, tuple[PartitionRange, ...]]:
    """Sort a micro-batch by (topic, partition, offset) and summarize each topic-partition.
    Raises if a required column is null or an offset appears twice."""
    for name in REQUIRED_COLUMNS:
        if data.column(name).null_count:
            raise DeltaSinkError(f"Column {name!r} has null values; the sink needs it set.")
    data = data.sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    if data.num_rows > 1:
        topic, partition, offset = (data.column(c) for c in ("topic", "partition", "offset"))
        same = pc.and_(
            pc.and_(
                pc.equal(topic.slice(1), topic.slice(0, data.num_rows - 1)),
                pc.equal(partition.slice(1), partition.slice(0, data.num_rows - 1)),
            ),
            pc.equal(offset.slice(1), offset.slice(0, data.num_rows - 1)),
        )
        if pc.any(same).as_py():
            i = pc.index(same, True).as_py() + 1
            raise DeltaSinkError(
                f"The micro-batch holds offset {offset[i].as_py()} of "
                f"{topic[i].as_py()}/{partition[i].as_py()} twice; a batch must hold each "
                "(topic, partition, offset) once."
            )
    grouped = data.group_by(["topic", "partition"], use_threads=False).aggregate(
        [
            ("offset", "min"),
            ("offset", "max"),
            ("leaderEpoch", "first"),
            ("leaderEpoch", "last"),
            ("offset", "count"),
        ]
    )
    ranges = tuple(
        PartitionRange(
            topic=row["topic"],
            partition=int(row["partition"]),
            min_offset=int(row["offset_min"]),
            max_offset=int(row["offset_max"]),
            first_epoch=int(row["leaderEpoch_first"]),
            last_epoch=int(row["leaderEpoch_last"]),
            rows=int(row["offset_count"]),
        )
        for row in grouped.to_pylist()  # one dict per topic-partition, not per row
    )
    return data, ranges


def plan_commit(
    app_id: str,
    batch_id: int,
    ranges: Sequence[PartitionRange],
    previous: Positions,
    resolve_divergence: DivergenceResolver | None = None,
) -> CommitPlan:
    """Compare the batch with the last committed end positions: a lowest offset below
    the committed end offset is a re-delivery; the new positions carry the rest forward.

    Rows are replaced from the lowest re-delivered offset, or from the divergence offset
    ``resolve_divergence`` gives if lower: the offsets in between are control records in
    the new log (never rows), so old rows there are truncated data the batch cannot show."""
    positions: Positions = {t: dict(by_p) for t, by_p in previous.items()}
    truncations = []
    for r in ranges:
        last = previous.get(r.topic, {}).get(r.partition)
        if last is not None and r.min_offset < last.offset:
            divergence = r.min_offset
            if resolve_divergence is not None:
                resolved = resolve_divergence(r.topic, r.partition, last)
                if resolved is not None and 0 <= resolved < divergence:
                    divergence = resolved
            truncations.append(
                Truncation(
                    topic=r.topic,
                    partition=r.partition,
                    divergence_offset=divergence,
                    first_redelivered_offset=r.min_offset,
                    old_offset=last.offset,
                    old_epoch=last.epoch,
                    new_epoch=r.first_epoch,
                )
            )
        positions.setdefault(r.topic, {})[r.partition] = Position(r.max_offset + 1, r.last_epoch)
    return CommitPlan(app_id, batch_id, tuple(ranges), positions, tuple(truncations))


def _replanned(
    plan: CommitPlan, ranges: Sequence[PartitionRange], previous: Positions
) -> CommitPlan:
    """``plan`` for the batch's ranges once the log's records below the re-delivered
    offsets joined it: the same divergence offsets."""
    cut = {(t.topic, t.partition): t.divergence_offset for t in plan.truncations}
    return plan_commit(
        plan.app_id, plan.batch_id, ranges, previous, lambda t, p, _last: cut.get((t, p))
    )
