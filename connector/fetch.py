"""Executor side: read one planned offset range of one partition as Arrow batches.

Everything a task needs travels in its ``QuorumLogPartition`` (executors run ``read()``
on a separately unpickled reader). Fetches carry the planned leader epoch as
CurrentLeaderEpoch. If the leader changed since planning, the task re-validates what it
has read so far and the planned end (OffsetsForLeaderEpoch in the new epoch) before
reading on: records always belong to the planned epoch lineage, or the task stops at the
divergence once the leader has committed its epoch (onTruncation=resume: the driver re-reads
from there next batch) or fails with LogTruncationException (onTruncation=fail).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from ..replica.client import (
    DEFAULT_ATTEMPT_TIMEOUT_MS,
    Client,
    LeaderNotAvailableError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
)
from ..replica.client.security import ClientSecurity
from . import planning
from .offsets import Position, TopicPartition
from .planning import FENCED_ERRORS
from .retry import Backoff
from .schema import to_spark_batches
from .truncation import TruncatedPartition
from .validation import (
    QuorumLogSourceError,
    StaleMetadata,
    below_log_start,
    settle_truncations,
    validate,
)

if TYPE_CHECKING:
    from .options import SourceOptions

log = logging.getLogger(__name__)

_RETRY_ERRORS = (*FENCED_ERRORS, NotLeaderError, LeaderNotAvailableError, RequestTimeoutError)
_LONG_POLL_MS = 200


#: The source options a task carries (``SourceOptions`` fields of the same names).
TASK_OPTIONS = (
    "bootstrap",
    "fetch_max_bytes",
    "request_timeout_ms",
    "fail_on_data_loss",
    "on_truncation",
    "security",
    "attempt_timeout_ms",
    "include_headers",
    "isolation_level",
)


@dataclass
class QuorumLogPartition(InputPartition):  # type: ignore[misc]
    """One Spark task: offsets [start_offset, end_offset) of topic/partition."""

    topic: str
    partition: int
    start_offset: int
    start_epoch: int  # epoch of the record before start_offset, -1 unknown
    end_offset: int
    end_epoch: int  # epoch of the record before end_offset, -1 unknown
    leader_epoch: int  # the leader epoch the range was planned in
    # TASK_OPTIONS:
    bootstrap: str
    fetch_max_bytes: int
    request_timeout_ms: int
    fail_on_data_loss: bool
    on_truncation: str
    # TLS files and where the secret comes from (a secret itself only if option 'secret').
    security: ClientSecurity | None = None
    attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS
    include_headers: bool = False  # option includeHeaders: else the column is NULL
    isolation_level: str = "read_committed"  # option isolationLevel

    def __post_init__(self) -> None:
        self.value = None  # InputPartition's attribute; everything is in the fields

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @classmethod
    def for_range(
        cls,
        opts: SourceOptions,
        tp: TopicPartition,
        start: Position,
        end: Position,
        leader_epoch: int,
    ) -> QuorumLogPartition:
        """The task reading [start, end) of ``tp``, planned in ``leader_epoch``."""
        carried = {name: getattr(opts, name) for name in TASK_OPTIONS}
        return cls(tp.topic, tp.partition, *start, *end, leader_epoch, **carried)


def read_partition(partition: Any, client: Client | None = None) -> Iterator[pa.RecordBatch]:
    """``read()`` of both readers. Spark sends a placeholder partition (value None) when a
    batch query plans no ranges: that reads nothing. A task connects its own client; a
    reader on the driver passes the one it has (``client``, left open)."""
    if not isinstance(partition, QuorumLogPartition):
        return iter(())
    if partition.end_offset <= partition.start_offset:
        return iter(())
    if client is not None:
        return _RangeReader(partition, client).run()
    return _read(partition)


def _read(p: QuorumLogPartition) -> Iterator[pa.RecordBatch]:
    client = planning.client_for(p, "executor")
    try:
        yield from _RangeReader(p, client).run()
    finally:
        client.close()


def _in_range(table: pa.Table, start: int, end: int) -> pa.Table:
    """Rows with start <= offset < end. A fetch's offsets ascend, so the range is one
    zero-copy slice (a filter would copy every value)."""
    offsets = table.column("offset")
    first = pc.sum(pc.less(offsets, start)).as_py() or 0
    last = pc.sum(pc.less(offsets, end)).as_py() or 0
    return table.slice(first, max(0, last - first))


class _RangeReader:
    def __init__(self, p: QuorumLogPartition, client: Client) -> None:
        self.p = p
        self.tp = p.topic_partition
        self.client = client
        self.pos = p.start_offset
        self.last_epoch = p.start_epoch
        self.limit = p.end_offset
        self.leader_epoch = p.leader_epoch
        self.backoff = Backoff(client, p.request_timeout_ms)

    def _wait(self, why: str) -> None:
        """Back off before a retry; past requestTimeoutMs without progress, fail."""
        self.backoff.wait(
            QuorumLogSourceError(
                f"{self.tp}: task reading offsets [{self.p.start_offset}, {self.p.end_offset}) "
                f"made no progress at offset {self.pos} for {self.p.request_timeout_ms} ms: "
                f"{why}. Raise option requestTimeoutMs or check the cluster."
            )
        )

    def run(self) -> Iterator[pa.RecordBatch]:
        p = self.p
        while self.pos < self.limit:
            try:
                result = self.client.fetch(
                    p.topic,
                    p.partition,
                    self.pos,
                    current_leader_epoch=self.leader_epoch,
                    max_bytes=p.fetch_max_bytes,
                    isolation=p.isolation_level,
                )
            except _RETRY_ERRORS as exc:
                self._wait(f"{type(exc).__name__}: {exc}")
                self._follow_leader()
                continue
            except OffsetOutOfRangeError as exc:
                self._out_of_range(exc)
                continue
            table = _in_range(result.to_arrow(), self.pos, self.limit)
            if table.num_rows:
                yield from to_spark_batches(table, p.topic, p.partition, p.include_headers)
            last = result.last_offset_and_epoch()
            if last is None or last.offset < self.pos:
                # Nothing at pos yet: the leader's high watermark is below the planned end
                # (a new leader not yet caught up, or the range was truncated).
                self._wait(
                    f"high watermark {result.high_watermark} is below the planned end "
                    f"offset {self.limit}"
                )
                self._follow_leader(force_check=self.backoff.attempt > 2)
                continue
            self.backoff.progress()
            if last.offset >= self.limit - 1:
                if (
                    last.offset == p.end_offset - 1
                    and self.limit == p.end_offset
                    and p.end_epoch >= 0
                    and last.epoch != p.end_epoch
                ):
                    self._check_lineage(
                        f"the record at offset {last.offset} has epoch {last.epoch}, the plan "
                        f"expected {p.end_epoch}"
                    )
                self.pos = max(self.pos, self.limit)
            else:
                self.pos, self.last_epoch = last.offset + 1, last.epoch

    def _follow_leader(self, force_check: bool = False) -> None:
        try:
            pm = self.client.partition_metadata(self.p.topic, self.p.partition, refresh=True)
        except _RETRY_ERRORS as exc:
            log.debug("%s: metadata refresh failed: %s", self.tp, exc)
            return
        if pm.leader_id < 0:
            return
        if pm.leader_epoch > self.leader_epoch or force_check:
            log.info(
                "%s: leader epoch changed from %d to %d while reading [%d, %d); re-validating",
                self.tp,
                self.leader_epoch,
                pm.leader_epoch,
                self.p.start_offset,
                self.p.end_offset,
            )
            self.leader_epoch = pm.leader_epoch
            try:
                self._check_lineage(f"the leader is now in epoch {pm.leader_epoch}")
            except _RETRY_ERRORS as exc:
                log.debug("%s: re-validation must be retried: %s", self.tp, exc)

    def _check_lineage(self, why: str) -> None:
        """Check that what was read so far and the planned end are in the current leader's
        log; on divergence fail (onTruncation=fail) or stop at the divergence (resume).

        Resume stops only at a divergence the leader has committed its epoch over: until
        a majority follows it, an unclean leader's epoch can still be undone (it fails, the
        old majority elects one of its own), and then the next batch, validating this
        batch's planned end against the restored log, would find nothing to re-read and
        the rows this task skipped would be lost. So it waits, bounded by
        requestTimeoutMs, for the truncation to be committed or undone."""
        p = self.p
        first = self._first_divergence(why)
        while first is not None and p.on_truncation == "resume" and not self._epoch_committed():
            self._wait(
                f"the leader of epoch {self.leader_epoch} reports a divergence at offset "
                f"{first.divergence_offset} but has not committed its epoch yet"
            )
            self._refresh_leader_epoch()
            try:
                first = self._first_divergence(why)
            except _RETRY_ERRORS as exc:
                log.debug("%s: re-validation must be retried: %s", self.tp, exc)
        if first is None:
            return
        settle_truncations(
            p.on_truncation,
            [first],
            f"Detected by the Spark task reading offsets [{p.start_offset}, "
            f"{p.end_offset}) of {self.tp} ({why}; planned in leader epoch "
            f"{p.leader_epoch}).",
            resume=f"stopping this task at offset {first.divergence_offset}; the next batch "
            "resumes there.",
        )
        self.limit = min(self.limit, max(first.divergence_offset, p.start_offset))

    def _first_divergence(self, why: str) -> TruncatedPartition | None:
        """The lowest divergence of what was read so far and of the planned end from the
        current leader's log (OffsetsForLeaderEpoch), None if both are in it."""
        p = self.p
        checks: list[Position] = []
        if self.pos > p.start_offset and self.last_epoch >= 0:
            checks.append(Position(self.pos, self.last_epoch))
        elif p.start_epoch >= 0:
            checks.append(Position(p.start_offset, p.start_epoch))
        if p.end_epoch >= 0:
            checks.append(Position(p.end_offset, p.end_epoch))
        pm = self.client.partition_metadata(p.topic, p.partition)
        truncated: list[TruncatedPartition] = []
        for position in checks:
            try:
                divergence = validate(
                    self.client,
                    self.tp,
                    position,
                    leader_epoch=self.leader_epoch,
                    log_start_offset=pm.log_start_offset,
                )
            except StaleMetadata:
                continue  # metadata behind the plan: nothing to compare yet
            if divergence is not None:
                truncated.append(TruncatedPartition.of(self.tp, position, divergence))
        if not truncated and p.end_epoch < 0 and not checks:
            log.warning(
                "%s: %s; offsets [%d, %d) carry no epoch, so the read cannot be checked "
                "for truncation",
                self.tp,
                why,
                p.start_offset,
                p.end_offset,
            )
        return min(truncated, key=lambda t: t.divergence_offset, default=None)

    def _epoch_committed(self) -> bool:
        """Whether the leader's high watermark has passed the start of its epoch: the
        record before it (ListOffsets latest) is of the leader's own epoch (KIP-595: a
        leader commits only once a majority holds a record of its epoch)."""
        try:
            latest = self.client.list_offsets(
                self.p.topic, self.p.partition, "latest", current_leader_epoch=self.leader_epoch
            )
        except _RETRY_ERRORS as exc:
            log.debug("%s: high watermark lookup must be retried: %s", self.tp, exc)
            return False
        return latest.epoch == self.leader_epoch

    def _refresh_leader_epoch(self) -> None:
        """Follow the leader metadata names, even to a lower epoch: an unclean epoch that
        was undone leaves a leader elected below it."""
        try:
            pm = self.client.partition_metadata(self.p.topic, self.p.partition, refresh=True)
        except _RETRY_ERRORS as exc:
            log.debug("%s: metadata refresh failed: %s", self.tp, exc)
            return
        if pm.leader_id >= 0:
            self.leader_epoch = pm.leader_epoch

    def _out_of_range(self, exc: OffsetOutOfRangeError) -> None:
        p = self.p
        pm = self.client.partition_metadata(p.topic, p.partition, refresh=True)
        if self.pos < pm.log_start_offset:
            self.pos, self.last_epoch = below_log_start(
                p.fail_on_data_loss,
                self.tp,
                Position(self.pos, self.last_epoch),
                pm.log_start_offset,
                " before this task read them",
            )
            return
        self.leader_epoch = max(self.leader_epoch, pm.leader_epoch)
        self._check_lineage(f"offset {self.pos} is out of range ({exc})")
        if self.pos < self.limit:
            self._wait(f"offset {self.pos} is out of range: {exc}")
