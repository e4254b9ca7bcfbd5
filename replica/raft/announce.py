"""Leadership announcements: BeginQuorumEpoch (a new leader tells the voters) and
EndQuorumEpoch (a resigning leader hands over to ranked successors, KIP-595), and the
answers to them; the common rules for answering an epoch-bearing request.

One role of ``RaftReplica`` (see ``replica.py``), which mixes the roles in: each method
here runs on a ``RaftReplica``. Pure: no clock, file or socket."""

# Methods here run on a RaftReplica, which subclasses this role: mypy takes that self
# type but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..protocol.errors import ErrorCode
from .messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    EpochResponse,
    LeaderAnnouncement,
    WakeRequest,
)
from .output import CoreFields, Output, _Answer
from .state import (
    FollowerState,
    LeaderState,
    ProspectiveState,
    ResignedState,
    Role,
    UnattachedState,
)

if TYPE_CHECKING:
    from .replica import RaftReplica

logger = logging.getLogger(__name__)


class AnnounceRole(CoreFields):
    def _send_begin_quorum_epoch(
        self: RaftReplica, st: LeaderState, now_ms: int, out: Output
    ) -> None:
        """Announce the epoch to each voter in ``begin_unacked`` whose node is heard (a
        silent one is told by ``on_peer_change`` when it is heard again); resend while
        any is."""
        st.begin_resend_at = self._announce(
            BeginQuorumEpochRequest, self._heard(st.begin_unacked, now_ms), now_ms, out
        )

    def _send_end_quorum_epoch(
        self: RaftReplica, st: ResignedState, now_ms: int, out: Output
    ) -> None:
        st.end_resend_at = self._announce(
            EndQuorumEpochRequest,
            sorted(st.end_unacked),
            now_ms,
            out,
            preferred_successors=st.successors,
        )

    def _announce(
        self: RaftReplica,
        cls: type[BeginQuorumEpochRequest | EndQuorumEpochRequest | WakeRequest],
        replicas: list[int],
        now_ms: int,
        out: Output,
        **fields: Any,
    ) -> int | None:
        """Our leadership of this epoch announced to each of ``replicas`` as a ``cls``
        (BeginQuorumEpoch, EndQuorumEpoch, Wake; ``fields`` are the rest of it). Returns
        when to send again to those that have not answered, None if there are none."""
        for dst in replicas:
            out.messages.append(
                cls(
                    cluster_id=self.cluster_id,
                    src=self.node_id,
                    dst=dst,
                    leader_id=self.node_id,
                    leader_epoch=self._epoch,
                    **fields,
                )
            )
        return now_ms + self.config.request_timeout_ms if replicas else None

    def _ranked_successors(self: RaftReplica, st: LeaderState) -> tuple[int, ...]:
        rows = sorted(st.progress.values(), key=lambda r: (-r.end_offset, r.replica_id))
        return tuple(r.replica_id for r in rows if r.replica_id not in st.catching_up)

    def _heard_from_leader(self: RaftReplica, now_ms: int) -> bool:
        if self._role is Role.LEADER:
            return True
        st = self._state
        return (
            isinstance(st, FollowerState)
            and not st.leader_resigned
            and not st.leader_unreachable
            and (
                st.quiet  # its node's heartbeats are fresh, or the driver had woken it
                or (
                    st.last_contact_ms is not None
                    and now_ms - st.last_contact_ms < self.config.fetch_timeout_ms
                )
            )
        )

    def _advertised_leader(self: RaftReplica) -> int | None:
        """The leader we name in answers: a resigned leader names none."""
        return None if self._role is Role.RESIGNED else self._leader_id

    def _answer(
        self: RaftReplica, cls: type[_Answer], dst: int, error: ErrorCode, **fields: Any
    ) -> _Answer:
        """A response with the head every answer shares: the addressing, our epoch and the
        leader we advertise; ``fields`` are the rest of ``cls``."""
        return cls(
            cluster_id=self.cluster_id,
            src=self.node_id,
            dst=dst,
            error=int(error),
            leader_epoch=self._epoch,
            leader_id=self._advertised_leader(),
            **fields,
        )

    def _stale_or_taught(self: RaftReplica, resp: EpochResponse, now_ms: int, out: Output) -> bool:
        """True when a response is for another cluster, or named a newer epoch or a leader
        we did not know (``_maybe_learn`` acted on it): its handler stops there."""
        return resp.cluster_id != self.cluster_id or self._maybe_learn(
            resp.leader_epoch, resp.leader_id, now_ms, out, resp.src
        )

    def _announcement_error(self: RaftReplica, req: LeaderAnnouncement) -> ErrorCode:
        """Begin/EndQuorumEpoch from another cluster or an older epoch are refused."""
        if req.cluster_id != self.cluster_id:
            return ErrorCode.INVALID_CLUSTER_ID
        if req.leader_epoch < self._epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        return ErrorCode.NONE

    # ------------------------------------------------------------------ Begin/EndQuorumEpoch

    def _on_begin_quorum_epoch(
        self: RaftReplica, req: BeginQuorumEpochRequest, now_ms: int, out: Output
    ) -> BeginQuorumEpochResponse:
        error = self._announcement_error(req)
        if error != ErrorCode.NONE:
            pass
        elif req.leader_epoch > self._epoch or (
            self._leader_id is None and self._role is not Role.RESIGNED
        ):
            self._become_follower(
                req.leader_epoch, req.leader_id, now_ms, out, last_contact_ms=now_ms
            )
        elif self._leader_id != req.leader_id:
            logger.error(
                "replica %s: %s claims epoch %s led by %s",
                self.node_id,
                req.leader_id,
                req.leader_epoch,
                self._leader_id,
            )
            error = ErrorCode.INVALID_QUORUM_STATE
        elif isinstance(self._state, FollowerState) and not self._state.leader_resigned:
            self._state.last_contact_ms = now_ms
        return self._answer(BeginQuorumEpochResponse, req.src, error)

    def _on_begin_quorum_epoch_response(
        self: RaftReplica, resp: BeginQuorumEpochResponse, now_ms: int, out: Output
    ) -> None:
        if self._stale_or_taught(resp, now_ms, out):
            return
        if isinstance(self._state, LeaderState) and resp.leader_epoch == self._epoch:
            self._state.begin_unacked.discard(resp.src)

    def _end_quorum_backoff(self: RaftReplica, successors: tuple[int, ...], now_ms: int) -> int:
        """Rank 0 at once; rank N waits min(retry.backoff.max, retry.backoff * 2^(N-1));
        a voter not in the list waits a randomized election timeout."""
        if self.node_id not in successors:
            return self._election_timeout(now_ms)
        rank = successors.index(self.node_id)
        if rank == 0:
            return now_ms
        return now_ms + min(
            self.config.retry_backoff_max_ms, self.config.retry_backoff_ms * (1 << (rank - 1))
        )

    def _on_end_quorum_epoch(
        self: RaftReplica, req: EndQuorumEpochRequest, now_ms: int, out: Output
    ) -> EndQuorumEpochResponse:
        error = self._announcement_error(req)
        if error == ErrorCode.NONE:
            at = self._end_quorum_backoff(tuple(req.preferred_successors), now_ms)
            if req.leader_epoch > self._epoch:
                self._become_unattached(now_ms, out, epoch=req.leader_epoch)
            st = self._state
            if isinstance(st, FollowerState) and self._leader_id == req.leader_id:
                st.leader_resigned = True
                if self._can_elect():
                    st.election_at = at
            elif isinstance(st, UnattachedState | ProspectiveState) and self._can_elect():
                self._become_unattached(now_ms, out, direct_at=at)
            if at <= now_ms:
                out.merge(self.tick(now_ms))
        return self._answer(EndQuorumEpochResponse, req.src, error)

    def _on_end_quorum_epoch_response(
        self: RaftReplica, resp: EndQuorumEpochResponse, now_ms: int, out: Output
    ) -> None:
        if self._stale_or_taught(resp, now_ms, out):
            return
        if isinstance(self._state, ResignedState):
            self._state.end_unacked.discard(resp.src)
            if not self._state.end_unacked:
                self._state.end_resend_at = None
