"""The consumer-validation core (KIP-320) every read path of the connector uses: streaming
and batch planning (``planning.Planner``), the executors' range reader (``fetch``) and the
Delta sink's divergence resolver (``delta.LogDivergenceResolver``).

It owns the one OffsetsForLeaderEpoch validation of a position (``validate``, judged by
``truncation.check_position``) and the two decisions a reader takes on what it finds:
``onTruncation`` (``settle_truncations``: fail, or resume from ``divergence_position``)
and ``failOnDataLoss`` (``data_loss`` / ``below_log_start``: fail, or go on without what
is gone). The callers only say where they are (their messages' context) and what
"resume" means for them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..replica.client import Client, PartitionMetadata
from .offsets import UNKNOWN_EPOCH, Position, TopicPartition
from .truncation import Divergence, LogTruncationException, TruncatedPartition, check_position

log = logging.getLogger(__name__)


class QuorumLogSourceError(RuntimeError):
    """A failure of the source that is not a truncation: the message names the partition,
    the offsets involved and the fix."""


class StaleMetadata(Exception):
    """Our metadata's leader epoch is older than the epoch of the position to validate
    (KIP-320: wait until metadata catches up before validating)."""


# ---- validation ---------------------------------------------------------------------------
def validate(
    client: Client,
    tp: TopicPartition,
    position: Position,
    *,
    leader_epoch: int | None,
    log_start_offset: int,
) -> Divergence | None:
    """KIP-320 validation of ``position``: OffsetsForLeaderEpoch(position.epoch) sent
    fenced by ``leader_epoch`` as CurrentLeaderEpoch (None: unfenced), the answer judged by
    ``check_position``. None when the position is in the leader's log or cannot be checked
    (no epoch, or nothing of ours is left above the log start). Raises ``StaleMetadata``
    when ``leader_epoch`` is older than the position's epoch, and the client's fenced
    errors when the leader moved on."""
    if position.epoch < 0 or position.offset <= max(log_start_offset, 0):
        return None
    if leader_epoch is not None and position.epoch > leader_epoch:
        raise StaleMetadata(
            f"position epoch {position.epoch} is ahead of metadata leader epoch {leader_epoch}"
        )
    answer = client.offsets_for_leader_epoch(
        tp.topic, tp.partition, position.epoch, current_leader_epoch=leader_epoch
    )
    divergence = check_position(position, answer.epoch, answer.end_offset, log_start_offset)
    log.debug(
        "validated %s %s in leader epoch %s: answer %s -> %s",
        tp,
        position.describe(),
        leader_epoch,
        answer,
        divergence,
    )
    return divergence


def divergence_position(divergence: Divergence) -> Position:
    """Where to resume after a truncation: the divergence offset, with the epoch of the
    record before it when the answer gave one (the leader's last record of that epoch)."""
    epoch = divergence.epoch if divergence.epoch >= 0 and divergence.offset > 0 else UNKNOWN_EPOCH
    return Position(divergence.offset, epoch)


def resolve(
    client: Client,
    tp: TopicPartition,
    position: Position,
    pm: PartitionMetadata,
    truncations: list[TruncatedPartition],
) -> Position:
    """The position to read from for ``position``, validated against the leader in
    ``pm``'s epoch: itself when it validates, else its divergence position, the truncation
    appended to ``truncations`` for ``settle_truncations`` (which fails or lets the caller
    resume from there)."""
    divergence = validate(
        client, tp, position, leader_epoch=pm.leader_epoch, log_start_offset=pm.log_start_offset
    )
    if divergence is None:
        return position
    truncations.append(TruncatedPartition.of(tp, position, divergence))
    return divergence_position(divergence)


# ---- decisions -----------------------------------------------------------------------------
def settle_truncations(
    on_truncation: str,
    truncations: Iterable[TruncatedPartition],
    context: str,
    resume: str = "re-reading from the divergence offsets.",
) -> None:
    """onTruncation: ``fail`` raises one LogTruncationException naming every partition;
    ``resume`` logs a warning with the same facts and what the caller does instead
    (``resume``; the caller already moved its positions to the divergence)."""
    found = list(truncations)
    if not found:
        return
    exc = LogTruncationException(found, context=context)
    if on_truncation == "fail":
        raise exc
    log.warning("onTruncation=resume: %s %s", resume, exc)


def data_loss(fail_on_data_loss: bool, message: str, instead: str) -> None:
    """failOnDataLoss for records that can no longer be read (``message`` says which and
    why): true raises QuorumLogSourceError naming the option; false logs a warning and the
    caller does ``instead``."""
    if fail_on_data_loss:
        raise QuorumLogSourceError(f"{message} Set failOnDataLoss=false to {instead}.")
    log.warning("%s failOnDataLoss=false: going on to %s.", message, instead)


def below_log_start(
    fail_on_data_loss: bool,
    tp: TopicPartition,
    position: Position,
    log_start_offset: int,
    when: str = "",
) -> Position:
    """``position`` when it is at or above the log start; else (retention removed
    ``when`` what it names) ``data_loss``, and go on from the log start (without epoch)."""
    if position.offset >= log_start_offset:
        return position
    data_loss(
        fail_on_data_loss,
        f"{tp}: position offset {position.offset} is below the log start offset "
        f"{log_start_offset}; offsets [{position.offset}, {log_start_offset}) were removed "
        f"from the log (retention){when} and cannot be read.",
        "continue from the log start",
    )
    return Position(log_start_offset, UNKNOWN_EPOCH)
