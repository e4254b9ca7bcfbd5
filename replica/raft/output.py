"""What the raft core hands its driver and callers: ``Output`` (one step's work),
``NotLeaderError``, ``QuorumDescription`` (DescribeQuorum), and the constants every
role of ``RaftReplica`` shares."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..constants import UNKNOWN
from ..protocol.errors import ErrorCode
from .config import QuorumConfig
from .log import ReplicaLog
from .messages import EpochResponse, Message
from .state import ElectionState, ReplicaProgress, Role, RoleState

_Answer = TypeVar("_Answer", bound=EpochResponse)

# Epochs an unclean election skips (see RaftReplica.force_leader).
UNCLEAN_EPOCH_GAP = 1000


@dataclass(slots=True)
class Output:
    """What one step asks the driver to do. Rule: write ``persist`` durably before
    sending any of ``messages``; if ``flush_log`` make the log durable (``log.flush()``,
    then ``on_log_flushed``) before sending them too."""

    messages: list[Message] = field(default_factory=list)
    persist: ElectionState | None = None
    flush_log: bool = False
    high_watermark: int | None = None  # the new HWM, when it advanced in this step
    leader_changed: bool = False
    fetch_wakeup: bool = False  # re-handle parked fetch long-polls: new data or new HWM
    truncated_to: int | None = None  # a follower truncated its log to this offset
    truncated_below_high_watermark: bool = False  # committed data removed (unclean only)
    repaired_at: int | None = None  # damaged data found: the log was cut to this offset

    def merge(self, other: Output) -> None:
        """Fold a later step's output into this one (persist: the later state wins)."""
        self.messages.extend(other.messages)
        if other.persist is not None:
            self.persist = other.persist
        self.flush_log |= other.flush_log
        if other.high_watermark is not None:
            self.high_watermark = other.high_watermark
        self.leader_changed |= other.leader_changed
        self.fetch_wakeup |= other.fetch_wakeup
        if other.truncated_to is not None:
            self.truncated_to = other.truncated_to
        self.truncated_below_high_watermark |= other.truncated_below_high_watermark
        if other.repaired_at is not None:
            self.repaired_at = other.repaired_at


class NotLeaderError(Exception):
    """``append`` on a replica that is not the active leader (NOT_LEADER)."""

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        super().__init__(f"not the leader (leader {leader_id}, epoch {epoch})")
        self.error = ErrorCode.NOT_LEADER
        self.leader_id = leader_id
        self.epoch = epoch


@dataclass(slots=True)
class QuorumDescription:
    """DescribeQuorum: progress rows are only known on the leader (empty elsewhere)."""

    node_id: int
    role: str
    leader_id: int | None
    leader_epoch: int
    high_watermark: int
    voters: list[ReplicaProgress]
    observers: list[ReplicaProgress]


def _with_lag(row: ReplicaProgress, leader_end: int) -> ReplicaProgress:
    lag = leader_end - row.end_offset if row.end_offset >= 0 else UNKNOWN
    return ReplicaProgress(row.replica_id, row.end_offset, row.last_fetch_ms, lag)


class CoreFields:
    """The state of a ``RaftReplica`` that its roles read and write (set in its
    ``__init__``), declared once so that every role module type-checks against it."""

    config: QuorumConfig
    node_id: int
    _base_voters: tuple[int, ...]
    cluster_id: str
    log: ReplicaLog
    _rng: random.Random
    _shutting_down: bool
    _disk_fault: bool
    _disk_retry_at: int
    _high_watermark: int
    _next_request_id: int
    truncations_below_high_watermark: int
    _probe_epochs: dict[int, int]
    _probe_id: int
    _probe_sent_at: int | None
    peer_seen: Mapping[int, int]
    _epoch: int
    _leader_id: int | None
    _voted_id: int | None
    _role: Role
    _state: RoleState
    _startup: Output
