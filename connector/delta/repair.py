"""Where the log diverged from a Delta table, exactly, and the log's records from there.

``LogDivergenceResolver`` answers the sink's question for a re-delivered partition: from
which offset are the table's rows not the log's? OffsetsForLeaderEpoch for the epoch of
the table's last committed position answers it exactly when the leader had that epoch.
When it never had it (an unclean leader that stayed in an older epoch), the answer only
bounds the divergence, and the table's own epochs give the exact point: the rows of each
leader epoch the table holds (``table_epoch_runs``) are checked against the log from the
newest down (``truncation.first_offset_not_in_log``). The log's records between that
point and the first offset the stream re-delivered (``LogDivergenceResolver.read``) go
into the same commit, so the table equals the log row for row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ...replica.client import Client
from ...replica.client.security import ClientSecurity
from ..offsets import UNKNOWN_EPOCH, Position, TopicPartition
from ..truncation import EpochRun, first_offset_not_in_log
from ..validation import validate

if TYPE_CHECKING:
    from .commits import CommitPlan

logger = logging.getLogger(__name__)

#: ``(topic, partition, last committed end position) -> divergence offset`` (or None).
DivergenceResolver = Callable[[str, int, Position], int | None]
#: Bytes per fetch of ``LogDivergenceResolver.read``.
_FETCH_MAX_BYTES = 8 << 20


def table_epoch_runs(table: DeltaTable, topic: str, partition: int) -> list[EpochRun]:
    """The table's rows of ``topic/partition`` as runs of one leader epoch, in offset order
    (reads the partition's ``offset`` and ``leaderEpoch`` columns; only on a truncation)."""
    data = table.to_pyarrow_table(
        columns=["offset", "leaderEpoch"],
        filters=[("topic", "=", topic), ("partition", "=", partition)],
    ).sort_by("offset")
    n = data.num_rows
    if n == 0:
        return []
    offsets = data.column("offset").combine_chunks()
    epochs = data.column("leaderEpoch").combine_chunks()
    changes = pc.indices_nonzero(pc.not_equal(epochs.slice(1), epochs.slice(0, n - 1)))
    starts = [0, *(int(i) + 1 for i in changes.to_pylist())]
    ends = [*(s - 1 for s in starts[1:]), n - 1]
    return [
        EpochRun(int(epochs[s].as_py()), int(offsets[s].as_py()), int(offsets[e].as_py()))
        for s, e in zip(starts, ends, strict=True)
    ]


class LogDivergenceResolver:
    """KIP-320's answer for a re-delivered partition: OffsetsForLeaderEpoch for the epoch of
    the table's last committed position gives where the log diverged from what the table
    holds, made exact from the table's epochs when the leader never had that epoch
    (``exact``). Picklable (it keeps only how to reach the cluster); asks the cluster only
    when a truncation is being reconciled."""

    def __init__(
        self,
        bootstrap: str,
        *,
        security: ClientSecurity | None = None,
        request_timeout_ms: int = 30000,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.request_timeout_ms = request_timeout_ms

    def _client(self) -> Client:
        return Client(
            self.bootstrap, request_timeout_ms=self.request_timeout_ms, security=self.security
        )

    def __call__(self, topic: str, partition: int, position: Position) -> int | None:
        """The log's answer alone (no table): exact, or the inexact bound it gives."""
        if position.epoch < 0:
            return None  # no epoch known: the log cannot say where it diverged
        with self._client() as client:
            divergence = validate(
                client,
                TopicPartition(topic, partition),
                position,
                leader_epoch=None,
                log_start_offset=0,
            )
        if divergence is None:
            return position.offset  # the log holds everything the table does
        # Only an offset the log names is a divergence point; the inexact "log start"
        # answers would make the table drop rows retention already removed from the log.
        return divergence.offset if divergence.epoch >= 0 else None

    def exact(
        self,
        topic: str,
        partition: int,
        position: Position,
        runs: Callable[[], Sequence[EpochRun]],
    ) -> int | None:
        """The exact divergence of the table (whose rows of the partition ``runs`` gives,
        read only when the log's answer is inexact) from the log. Rows below the log start
        are not judged: retention removed them from the log, not a truncation."""
        if position.epoch < 0:
            return None
        tp = TopicPartition(topic, partition)
        with self._client() as client:
            divergence = validate(client, tp, position, leader_epoch=None, log_start_offset=0)
            if divergence is None:
                return position.offset
            if divergence.exact:
                return divergence.offset
            log_start = client.list_offsets(topic, partition, "earliest").offset
            held = [
                EpochRun(r.epoch, max(r.first_offset, log_start), r.last_offset)
                for r in runs()
                if r.last_offset >= log_start
            ]

            def end_offset_for_epoch(epoch: int) -> tuple[int, int]:
                answer = client.offsets_for_leader_epoch(topic, partition, epoch)
                return answer.epoch, answer.end_offset

            found = first_offset_not_in_log(held, end_offset_for_epoch)
        return position.offset if found is None else found

    def log_start(self, topic: str, partition: int) -> int:
        """The partition's log start offset (ListOffsets earliest)."""
        with self._client() as client:
            return int(client.list_offsets(topic, partition, "earliest").offset)

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table:
        """The log's records of ``topic/partition`` in [start, end), as the source's rows
        (headers included); fails if the log is truncated again meanwhile."""
        from ..schema import ARROW_SCHEMA

        return pa.Table.from_batches(
            list(self.read_batches(topic, partition, start, end)), ARROW_SCHEMA
        )

    def read_batches(
        self, topic: str, partition: int, start: int, end: int
    ) -> Iterator[pa.RecordBatch]:
        """``read``'s rows as they are fetched, batch by batch."""
        from ..fetch import QuorumLogPartition, read_partition

        if end <= start:
            return
        with self._client() as client:
            leader_epoch = client.partition_metadata(topic, partition, refresh=True).leader_epoch
        task = QuorumLogPartition(
            topic,
            partition,
            start,
            UNKNOWN_EPOCH,
            end,
            UNKNOWN_EPOCH,
            leader_epoch,
            bootstrap=self.bootstrap,
            fetch_max_bytes=_FETCH_MAX_BYTES,
            request_timeout_ms=self.request_timeout_ms,
            fail_on_data_loss=True,
            on_truncation="fail",
            security=self.security,
            include_headers=True,
        )
        yield from read_partition(task)


def exact_resolver(
    resolver: DivergenceResolver | None, table: DeltaTable | None
) -> DivergenceResolver | None:
    """The divergence resolver for a batch: the log's answer made exact from the table's
    epochs when the sink can ask the log (``LogDivergenceResolver``)."""
    if not isinstance(resolver, LogDivergenceResolver) or table is None:
        return resolver
    log = resolver

    def exact(topic: str, partition: int, last: Position) -> int | None:
        return log.exact(topic, partition, last, lambda: table_epoch_runs(table, topic, partition))

    return exact


def log_gap(
    resolver: DivergenceResolver | None, path: str, plan: CommitPlan, schema: pa.Schema
) -> pa.Table | None:
    """The log's records between each truncation's divergence offset and the first
    offset the batch re-delivers (after an inexact answer the stream resumed past the
    divergence; after an exact one only control records lie there), as rows of
    ``schema``; None when there are none or the sink cannot ask the log."""
    from .commits import DeltaSinkError

    if not isinstance(resolver, LogDivergenceResolver):
        return None
    parts = [
        resolver.read(t.topic, t.partition, t.divergence_offset, t.first_redelivered_offset)
        for t in plan.truncations
        if t.divergence_offset < t.first_redelivered_offset
    ]
    gap = pa.concat_tables(parts) if parts else None
    if gap is None or gap.num_rows == 0:
        return None
    missing = [name for name in schema.names if name not in gap.column_names]
    if missing:
        raise DeltaSinkError(
            f"Delta sink {path}: batch {plan.batch_id}: the log's records "
            f"{[(t.topic, t.partition, t.divergence_offset) for t in plan.truncations]} "
            f"onwards must replace the table's, but the table has columns {missing} the "
            "source's rows have not; keep the source's columns to repair exactly."
        )
    logger.warning(
        "Delta sink %s: batch %d: %d records of the log below the re-delivered offsets "
        "replace the table's rows there",
        path,
        plan.batch_id,
        gap.num_rows,
    )
    return gap.select(schema.names).cast(schema)
