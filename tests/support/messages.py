"""Messages as tests build them: one function per type, every field a keyword with a
default, so a test names only the fields it is about, e.g.
``fetch_response(leader_epoch=4, diverging_epoch=(1, 5), fetch_offset=9)``.

Raft messages default to one scene: in ``CLUSTER``, epoch 1, node 1 leads (or stands for
election) and node 2 follows (or votes); logs are empty, nothing went wrong (error 0),
request ids are 0. Unknown field names raise, as the dataclasses do."""

from __future__ import annotations

from typing import Any

from quorumlog.replica.constants import UNKNOWN
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)

CLUSTER = "test-cluster"

_FROM_LEADER: dict[str, Any] = {"cluster_id": CLUSTER, "src": 1, "dst": 2}
_TO_LEADER: dict[str, Any] = {"cluster_id": CLUSTER, "src": 2, "dst": 1}
_ANSWER: dict[str, Any] = {"error": 0, "leader_epoch": 1}
_ANNOUNCEMENT: dict[str, Any] = {**_FROM_LEADER, "leader_id": 1, "leader_epoch": 1}


def vote_request(**fields: Any) -> VoteRequest:
    """Candidate 1 asks voter 2 for its vote in epoch 1, its log empty; not a pre-vote."""
    vote = {"candidate_epoch": 1, "last_offset_epoch": UNKNOWN, "last_offset": 0, "pre_vote": False}
    return VoteRequest(**(_FROM_LEADER | vote | fields))


def vote_response(**fields: Any) -> VoteResponse:
    """Voter 2 grants candidate 1 its vote in epoch 1 and knows no leader."""
    vote = {"vote_granted": True, "pre_vote": False, "candidate_epoch": 1, "leader_id": None}
    return VoteResponse(**(_TO_LEADER | _ANSWER | vote | fields))


def begin_quorum_epoch(**fields: Any) -> BeginQuorumEpochRequest:
    """Leader 1 announces its epoch 1 to node 2."""
    return BeginQuorumEpochRequest(**(_ANNOUNCEMENT | fields))


def end_quorum_epoch(**fields: Any) -> EndQuorumEpochRequest:
    """Leader 1 resigns epoch 1 to node 2, naming no successor."""
    return EndQuorumEpochRequest(**(_ANNOUNCEMENT | {"preferred_successors": ()} | fields))


def fetch_request(**fields: Any) -> FetchRequest:
    """Follower 2 fetches from leader 1 in epoch 1 from the start of an empty log, without
    waiting, up to 1 MiB."""
    fetcher = {"cluster_id": CLUSTER, "replica_id": 2, "dst": 1, "current_leader_epoch": 1}
    position = {"fetch_offset": 0, "last_fetched_epoch": UNKNOWN}
    return FetchRequest(**(fetcher | position | {"max_wait_ms": 0, "max_bytes": 1 << 20} | fields))


def fetch_response(**fields: Any) -> FetchResponse:
    """Leader 1 answers follower 2's fetch from offset 0 in epoch 1: no divergence, no
    records, high watermark and log start 0."""
    offsets = {"high_watermark": 0, "log_start_offset": 0, "fetch_offset": 0}
    data = {"diverging_epoch": None, "records": b""}
    return FetchResponse(**(_FROM_LEADER | _ANSWER | {"leader_id": 1} | offsets | data | fields))


def consumer_fetch(**fields: Any) -> m.FetchRequest:
    """A consumer's Fetch of partition ("t", 0) from offset 0 at no leader epoch (unfenced),
    answered at once, up to 1 MiB."""
    where = {"topic": "t", "partition": 0, "current_leader_epoch": m.NO_EPOCH, "fetch_offset": 0}
    limits = {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20}
    return m.FetchRequest(**(where | limits | fields))
