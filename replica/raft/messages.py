"""Quorum messages: frozen, slotted, keyword-only dataclasses of plain fields only.

A generic codec can encode any of them as its field values in declaration order. Each
message names its sender (``src``, or ``replica_id`` for Fetch) and receiver (``dst``)
and carries what its handler needs (responses echo the request's epoch, offset or
``request_id``), so the transport needs no request/response correlation: the node routes
every message by (topic, partition) to the core and delivers responses like requests.
Ids that may be unknown are ``None`` (KIP-595's -1), except ``FetchRequest.replica_id``
which is ``CONSUMER_REPLICA_ID`` for a consumer as in Kafka; other fields without a value
hold ``UNKNOWN`` (``replica.constants``).

Field order, one convention (as in ``replica.protocol.messages``): on a response ``error``
first; then the addressing (``cluster_id``, ``src``/``replica_id``, ``dst``); then the
epoch fields (``leader_epoch``, ``leader_id`` of the responder, or of the announced
leader on a request); then the rest, fields with a default last. The base classes
``QuorumRequest``, ``LeaderAnnouncement``, ``QuorumResponse`` and ``EpochResponse`` carry
those shared heads. Build messages with keywords.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..constants import CONSUMER_REPLICA_ID, UNKNOWN

__all__ = [
    "CONSUMER_REPLICA_ID",
    "BeginQuorumEpochRequest",
    "BeginQuorumEpochResponse",
    "EndQuorumEpochRequest",
    "EndQuorumEpochResponse",
    "EpochResponse",
    "FetchRequest",
    "FetchResponse",
    "LeaderAnnouncement",
    "Message",
    "QuorumRequest",
    "QuorumResponse",
    "VoteRequest",
    "VoteResponse",
    "WakeRequest",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class QuorumRequest:
    """The addressing every request but Fetch starts with."""

    cluster_id: str
    src: int
    dst: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAnnouncement(QuorumRequest):
    """A leader speaking for its epoch (BeginQuorumEpoch, EndQuorumEpoch)."""

    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class QuorumResponse:
    """The head of every response: how it went, then the addressing."""

    error: int
    cluster_id: str
    src: int
    dst: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochResponse(QuorumResponse):
    """A response naming the responder's epoch after handling the request and the leader
    it knows in it (None: none)."""

    leader_epoch: int
    leader_id: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteRequest(QuorumRequest):
    """A (pre-)candidate asks for a vote. ``candidate_epoch`` is the epoch it runs in;
    for a pre-vote that is its current epoch + 1 and nobody changes state for it."""

    candidate_epoch: int
    last_offset_epoch: int
    last_offset: int  # the candidate's log end offset
    pre_vote: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteResponse(EpochResponse):
    vote_granted: bool
    pre_vote: bool
    candidate_epoch: int  # echo, so a stale answer for another election is ignored


@dataclass(frozen=True, slots=True, kw_only=True)
class BeginQuorumEpochRequest(LeaderAnnouncement):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class BeginQuorumEpochResponse(EpochResponse):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class EndQuorumEpochRequest(LeaderAnnouncement):
    """A resigning leader hands over: successors sorted by replicated offset, best first."""

    preferred_successors: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EndQuorumEpochResponse(EpochResponse):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequest:
    """``replica_id`` is the sender: a voter, an observer, or CONSUMER_REPLICA_ID.
    ``fetch_offset`` is the fetcher's log end offset and, from a replica, durable (the
    driver flushes before sending it); ``last_fetched_epoch`` is the epoch of the record
    before it. ``current_leader_epoch`` UNKNOWN (consumers only) skips the epoch check.
    ``catching_up``: the fetcher lost data it may have acknowledged and has not yet
    re-fetched past its old log end, so the leader must not count it towards the HWM.
    ``assigned``: the fetcher's node, on its own view of the partition's moves, hosts
    this replica (it will not delete it as moved off), so the leader may add it."""

    cluster_id: str
    replica_id: int
    dst: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int
    max_bytes: int
    request_id: int = 0
    catching_up: bool = False
    assigned: bool = True

    @property
    def src(self) -> int:
        return self.replica_id


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResponse(EpochResponse):
    """``diverging_epoch`` is (epoch, end offset) when the fetcher's log diverged; then
    ``records`` is empty. ``records`` are whole batches, opaque to the core."""

    high_watermark: int
    log_start_offset: int
    diverging_epoch: tuple[int, int] | None
    records: bytes
    fetch_offset: int  # echo of the request
    request_id: int = 0  # echo of the request
    # To a fetcher that says ``catching_up``, from a leader: every record this leader
    # ever acknowledged, or will count as committed from before its epoch, lies below
    # this (max of its HWM and its epoch start); UNKNOWN otherwise.
    catch_up_floor: int = UNKNOWN
    # The partition is idle (the fetcher holds everything, all of it committed): the
    # fetcher stops fetching until the leader wakes it (``WakeRequest``); liveness and
    # check-quorum ride on the nodes' heartbeats meanwhile (see ``RaftReplica``).
    quiesce: bool = False

    def is_empty(self) -> bool:
        """True for an answer a driver may park as a long-poll (nothing new to say)."""
        return self.error == 0 and self.diverging_epoch is None and not self.records


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeRequest(LeaderAnnouncement):
    """A leader to a follower it quiesced: records arrived, fetch again. One-way; the
    leader resends it until the follower fetches."""


Message = (
    VoteRequest
    | VoteResponse
    | BeginQuorumEpochRequest
    | BeginQuorumEpochResponse
    | EndQuorumEpochRequest
    | EndQuorumEpochResponse
    | FetchRequest
    | FetchResponse
    | WakeRequest
)
