"""Quorum state: what is persisted (``ElectionState``) and the per-role timers and tallies.

One small object per role, as in Kafka's QuorumState (UnattachedState, ProspectiveState,
CandidateState, LeaderState, FollowerState, ResignedState). Only ``RaftReplica`` moves
between them; these objects hold no logic beyond their own bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ..constants import UNKNOWN

__all__ = [
    "CandidateState",
    "ElectionState",
    "FollowerState",
    "LeaderState",
    "ProspectiveState",
    "ReplicaProgress",
    "ResignedState",
    "Role",
    "RoleState",
    "UnattachedState",
]


class Role(StrEnum):
    UNATTACHED = "unattached"  # no leader known in this epoch (voted_id tells a vote)
    PROSPECTIVE = "prospective"  # running a pre-vote, epoch unchanged
    CANDIDATE = "candidate"  # voted for itself in this epoch
    LEADER = "leader"
    FOLLOWER = "follower"  # knows the leader of this epoch and fetches from it
    RESIGNED = "resigned"  # was leader of this epoch; will not lead it again


@dataclass(frozen=True, slots=True)
class ElectionState:
    """The quorum-state file's content. ``leader_id == node`` means it led this epoch;
    ``voted_id`` is the vote it granted in this epoch (itself when a candidate)."""

    epoch: int
    leader_id: int | None = None
    voted_id: int | None = None


@dataclass(slots=True)
class ReplicaProgress:
    """What the leader knows of one replica in its epoch (DescribeQuorum row)."""

    replica_id: int
    end_offset: int = UNKNOWN  # durable end offset reported by its last valid fetch
    last_fetch_ms: int = UNKNOWN
    lag: int = UNKNOWN  # leader end offset - end_offset, at describe time
    # The leader's end offset when it answered that fetch, and the last time the replica
    # was caught up: its fetch reached the leader's end then, or the end the leader had
    # at its previous fetch (Kafka's lastCaughtUpTimestamp: under steady appends a
    # replica that keeps up is never at the leader's end when it is checked).
    fetch_leader_end: int = UNKNOWN
    caught_up_ms: int = UNKNOWN
    request_id: int = UNKNOWN  # of the fetch this row was last updated from


@dataclass(slots=True)
class UnattachedState:
    election_at: int | None  # None for observers and shutting-down nodes
    direct_candidate: bool = False  # after EndQuorumEpoch: skip the pre-vote
    discover_at: int | None = None  # observers: next probe of a voter for the leader


@dataclass(slots=True)
class ProspectiveState:
    election_at: int
    retries: int
    granted: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    resend_at: int | None = None
    retry_at: int | None = None  # set after a failed pre-vote (no leader to go back to)
    last_contact_ms: int | None = None  # carried back to FollowerState if the vote fails
    # The survivors' standing order, carried over from FollowerState (see there).
    stand_order: tuple[int, ...] = ()


@dataclass(slots=True)
class CandidateState:
    election_at: int
    retries: int
    granted: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    resend_at: int | None = None
    backoff_until: int | None = None  # set after a lost election


@dataclass(slots=True)
class FollowerState:
    last_contact_ms: int | None  # last successful fetch / BeginQuorumEpoch; None: never
    fetch_timeout_at: int
    fetch_request_id: int | None = None  # the one outstanding fetch
    fetch_sent_at: int = 0
    fetch_retry_at: int | None = None
    election_at: int | None = None  # the leader resigned (EndQuorumEpoch)
    leader_resigned: bool = False
    # Its node refused connections (a hint, cleared by its next answer): others'
    # pre-votes are not refused on its behalf.
    leader_unreachable: bool = False
    # With leader_unreachable: the order in which the surviving voters stand (the
    # driver's, the same on every node). A pre-vote from one ranked behind this replica
    # is refused while this one can win itself (``RaftReplica._stands_ahead_of``).
    stand_order: tuple[int, ...] = ()
    # With leader_unreachable: the pre-votes it already lost on that hint (its back-off).
    stand_retries: int = 0
    # Quiesced by the leader: no fetches, no fetch timeout; the leader's node heartbeat
    # stands for it until a WakeRequest or the driver's ``on_peer_stale``.
    quiet: bool = False


@dataclass(slots=True)
class LeaderState:
    epoch_start_offset: int
    check_quorum_at: int
    progress: dict[int, ReplicaProgress] = field(default_factory=dict)
    observers: dict[int, ReplicaProgress] = field(default_factory=dict)
    begin_unacked: set[int] = field(default_factory=set)
    begin_resend_at: int | None = None
    fetched_since_check: set[int] = field(default_factory=set)
    catching_up: set[int] = field(default_factory=set)  # voters not counted for the HWM
    unassigned: set[int] = field(default_factory=set)  # replicas not to be added yet
    # Forced by an unclean election: check-quorum waits until a majority has followed.
    forced: bool = False
    last_append_ms: int = 0  # when records were last appended (quiesce after a while)
    # Replicas told to stop fetching (quiesced), and those woken and not fetched since.
    quiet: set[int] = field(default_factory=set)
    quiet_ids: dict[int, int] = field(default_factory=dict)  # the fetch answered quiesce
    wake_unacked: set[int] = field(default_factory=set)
    wake_resend_at: int | None = None
    # The leader-change record not written yet: the log was empty at election, and the
    # record goes in with the epoch's first client records.
    control_pending: bool = False


@dataclass(slots=True)
class ResignedState:
    election_at: int | None
    successors: tuple[int, ...]
    end_unacked: set[int] = field(default_factory=set)
    end_resend_at: int | None = None


RoleState = (
    UnattachedState
    | ProspectiveState
    | CandidateState
    | FollowerState
    | LeaderState
    | ResignedState
)
