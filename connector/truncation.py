"""Truncation detection (KIP-320's consumer validation) and ``LogTruncationException``.

A position ``(offset, epoch)`` is checked with OffsetsForLeaderEpoch(epoch), whose answer
(KIP-101) is the largest epoch the leader knows that is <= ``epoch`` and the offset where
the next higher epoch starts (its log end for its latest epoch). As in Kafka's
``SubscriptionState.maybeCompleteValidation``:

* answer end offset < position offset -> the leader's log diverged from what was consumed
  at the answer's end offset (exact when the answer's epoch is the position's epoch;
  Kafka's best guess otherwise);
* undefined answer (-1, -1): the leader knows no epoch <= ours, so nothing we consumed is
  known to be in its log: divergence at its log start (re-read everything retained);
* answer epoch < position epoch with end offset >= position offset: the leader never had
  our epoch, yet it has records at our last offset; they were written in an older epoch,
  so they are not the record we consumed. Kafka accepts this pathological case; we report
  it, with the only offset known to be safe, the leader's log start (inexact).

Only the text of an exception reaches a Spark user, so the message carries every fact and
a one-line JSON blob after ``MARKER`` that ``from_spark_error`` turns back into facts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from .offsets import UNKNOWN_EPOCH, Position, TopicPartition

MARKER = "QUORUMLOG_TRUNCATION_JSON="


class Divergence(NamedTuple):
    """First offset known to differ (``offset``), the epoch the leader has there
    (-1 if unknown), and whether the offset is exact or only a safe bound."""

    offset: int
    epoch: int
    exact: bool


def check_position(
    position: Position, answer_epoch: int, answer_end_offset: int, log_start_offset: int = 0
) -> Divergence | None:
    """Pure check of a position against an OffsetsForLeaderEpoch(position.epoch) answer.
    Returns None when the position is in the leader's log (or has no epoch to check)."""
    if position.epoch < 0 or position.offset <= max(log_start_offset, 0):
        # no epoch to check, or the record before the position is gone by retention
        return None
    if answer_epoch < 0 or answer_end_offset < 0 or answer_epoch > position.epoch:
        return Divergence(max(log_start_offset, 0), UNKNOWN_EPOCH, False)
    if answer_end_offset < position.offset:
        return Divergence(answer_end_offset, answer_epoch, answer_epoch == position.epoch)
    if answer_epoch != position.epoch:
        return Divergence(max(log_start_offset, 0), UNKNOWN_EPOCH, False)
    return None


class EpochRun(NamedTuple):
    """Rows of one partition a reader holds (a Delta table) in one leader epoch, without a
    row of another epoch between: the first and last offset."""

    epoch: int
    first_offset: int
    last_offset: int


def first_offset_not_in_log(
    runs: Sequence[EpochRun], end_offset_for_epoch: Callable[[int], tuple[int, int]]
) -> int | None:
    """Where held rows (a table's, of one partition) stop being the log's: the offset past
    the last held row whose (offset, epoch) the log has, so that every held row from there
    on is to be replaced by the log's records from there on; None when the log has every
    held row. ``end_offset_for_epoch(e)`` is the log's OffsetsForLeaderEpoch(e) answer: the
    largest epoch <= e it knows and where that epoch ends.

    A log that holds a record (offset, epoch) holds every record below it as it was (an
    epoch's records come from that epoch's one leader, which had the records below them:
    Raft's log matching), so the runs are checked from the newest down to the first the
    log holds part of; each check is one question to the log."""
    newer = False  # a newer run was found not in the log
    for run in sorted(runs, key=lambda r: r.first_offset, reverse=True):
        answer_epoch, end_offset = end_offset_for_epoch(run.epoch)
        if answer_epoch == run.epoch and end_offset > run.first_offset:
            if end_offset <= run.last_offset:
                return end_offset  # the log ends this epoch inside the run
            # the whole run is the log's; what follows it in the log replaces the rest
            return run.last_offset + 1 if newer else None
        newer = True
    return min((r.first_offset for r in runs), default=None)


@dataclass(frozen=True)
class TruncatedPartition:
    topic: str
    partition: int
    position_offset: int
    position_epoch: int
    divergence_offset: int
    divergence_epoch: int
    exact: bool = True

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @classmethod
    def of(cls, tp: TopicPartition, position: Position, d: Divergence) -> TruncatedPartition:
        return cls(
            tp.topic, tp.partition, position.offset, position.epoch, d.offset, d.epoch, d.exact
        )

    def describe(self) -> str:
        where = "at offset" if self.exact else "at or before offset"
        bound = (
            ""
            if self.exact
            else " (exact point unknown; re-reading from the leader's log start is safe)"
        )
        return (
            f"{self.topic}/{self.partition}: consumed position offset {self.position_offset} "
            f"(epoch {self.position_epoch}), log diverges {where} {self.divergence_offset}"
            + (f" (leader epoch {self.divergence_epoch})" if self.divergence_epoch >= 0 else "")
            + bound
        )


class LogTruncationException(Exception):
    """Records this query already consumed are no longer in the log (an unclean leader
    election replaced them). ``truncations`` lists each partition's position and the
    first offset known to diverge; ``divergence_offsets`` is where to resume."""

    def __init__(self, truncations: Iterable[TruncatedPartition], context: str = "") -> None:
        self.truncations = sorted(truncations, key=lambda t: (t.topic, t.partition))
        self.context = context
        super().__init__(self._message())

    @property
    def divergence_offsets(self) -> dict[TopicPartition, int]:
        return {t.topic_partition: t.divergence_offset for t in self.truncations}

    def _message(self) -> str:
        facts = json.dumps(
            {"truncations": [asdict(t) for t in self.truncations]}, separators=(",", ":")
        )
        lines = "; ".join(t.describe() for t in self.truncations)
        return (
            f"Log truncation detected on {len(self.truncations)} partition(s): {lines}. "
            + (f"{self.context} " if self.context else "")
            + "Records at and after the divergence offset were replaced (unclean leader "
            "election). With onTruncation=fail (the default) the query stops here; set "
            "onTruncation=resume to re-read from the divergence offset (downstream must "
            "replace what it holds from there), or restart with startingOffsets at the "
            f"divergence offsets. {MARKER}{facts}"
        )

    @classmethod
    def from_spark_error(cls, error: BaseException | str) -> LogTruncationException | None:
        """Rebuild the exception from a Spark error (StreamingQueryException,
        PythonException, AnalysisException...) or its text; None if it is not one."""
        texts = [error] if isinstance(error, str) else _texts(error)
        for text in texts:
            found = _parse(text)
            if found is not None:
                return found
        return None


def _texts(error: BaseException) -> list[str]:
    out: list[str] = []
    seen: set[int] = set()
    todo: list[Any] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(str(e))
        for attr in ("desc", "stackTrace", "_desc"):
            value = getattr(e, attr, None)
            if isinstance(value, str):
                out.append(value)
        todo.extend([getattr(e, "__cause__", None), getattr(e, "__context__", None)])
    return out


def _parse(text: str) -> LogTruncationException | None:
    start = text.find(MARKER)
    if start < 0:
        return None
    body = text[start + len(MARKER) :]
    decoder = json.JSONDecoder()
    for candidate in (body, body.replace('\\"', '"')):
        try:
            raw, _ = decoder.raw_decode(candidate)
            items = [TruncatedPartition(**t) for t in raw["truncations"]]
        except (ValueError, KeyError, TypeError):
            continue
        return LogTruncationException(items)
    return None
