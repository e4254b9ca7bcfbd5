"""Elections: the election timers and back-off, pre-vote (KIP-996) and vote, the
transitions between quorum states (Unattached, Prospective, Candidate, Leader,
Follower, Resigned) and who may stand or vote.

One role of ``RaftReplica`` (see ``replica.py``), which mixes the roles in: each method
here runs on a ``RaftReplica``. Pure: no clock, file or socket."""

# Methods here run on a RaftReplica, which subclasses this role: mypy takes that self
# type but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..protocol.errors import ErrorCode
from .log import DiskError
from .messages import (
    VoteRequest,
    VoteResponse,
)
from .output import CoreFields, Output
from .state import (
    CandidateState,
    ElectionState,
    FollowerState,
    LeaderState,
    ProspectiveState,
    ReplicaProgress,
    ResignedState,
    Role,
    UnattachedState,
)

if TYPE_CHECKING:
    from .replica import RaftReplica

logger = logging.getLogger(__name__)


class ElectionRole(CoreFields):
    # ------------------------------------------------------------------ transitions

    def _set_election(
        self: RaftReplica, epoch: int, leader_id: int | None, voted_id: int | None, out: Output
    ) -> None:
        """The one place epoch, leader and vote change; the driver persists the result
        before it sends anything of this step."""
        if epoch < self._epoch:
            raise AssertionError(f"epoch would go back from {self._epoch} to {epoch}")
        new = ElectionState(epoch, leader_id, voted_id)
        if new != self.election_state:
            self._epoch, self._leader_id, self._voted_id = epoch, leader_id, voted_id
            out.persist = new

    def _election_timeout(self: RaftReplica, now_ms: int) -> int:
        jitter = self.config.jitter_ms
        return (
            now_ms
            + self.config.election_timeout_ms
            + (self._rng.randrange(jitter) if jitter else 0)
        )

    def _election_backoff(self: RaftReplica, retries: int) -> int:
        """min(retry_backoff * rand[0, 2^retries), election.backoff.max) (Kafka's)."""
        spread = 1 << min(retries, 20)
        return min(
            self.config.retry_backoff_ms * self._rng.randrange(spread),
            self.config.election_backoff_max_ms,
        )

    def _can_elect(self: RaftReplica) -> bool:
        return self.electable and not self._shutting_down and not self._may_not_stand

    def _may_vote(self: RaftReplica) -> bool:
        """A replica that lost data it may have acknowledged must not help elect a
        leader that lacks it. Any other answers on its log alone, voter set or not (as
        Raft's servers do): a candidate counts only the votes of its own voter set
        (``_tally``), and a replica a voter change added may be needed before the record
        naming it has reached it (else a leader that appended that change and lost its
        leadership could never be elected again, nor anyone else)."""
        return not self.catching_up

    def _become_unattached(
        self: RaftReplica,
        now_ms: int,
        out: Output,
        *,
        epoch: int | None = None,
        direct_at: int | None = None,
    ) -> None:
        if epoch is not None and epoch > self._epoch:
            self._set_election(epoch, None, None, out)
        was_leader = self._role is Role.LEADER
        self._role = Role.UNATTACHED
        if not self.electable or (self._may_not_stand and not self._shutting_down):
            # Observers, and voters that may not stand: look for the leader to fetch from.
            self._state = UnattachedState(None, discover_at=now_ms)
        elif self._shutting_down:
            self._state = UnattachedState(None)
        elif direct_at is not None:
            self._state = UnattachedState(direct_at, direct_candidate=True)
        else:
            self._state = UnattachedState(self._election_timeout(now_ms))
        out.leader_changed |= was_leader

    def _become_follower(
        self: RaftReplica,
        epoch: int,
        leader_id: int,
        now_ms: int,
        out: Output,
        *,
        last_contact_ms: int | None = None,
    ) -> None:
        """``last_contact_ms`` is when we last heard from the leader itself (None: not
        yet); only that refuses others' pre-votes, so learning of a leader second-hand
        or returning after a failed pre-vote does not block a needed election."""
        if leader_id == self.node_id:
            raise AssertionError(f"replica {leader_id} cannot follow itself")
        voted = self._voted_id if epoch == self._epoch else None
        self._set_election(epoch, leader_id, voted, out)
        self._role = Role.FOLLOWER
        self._state = FollowerState(
            last_contact_ms=last_contact_ms,
            fetch_timeout_at=now_ms + self.config.fetch_timeout_ms,
        )
        out.leader_changed = True
        logger.info("replica %s follows %s in epoch %s", self.node_id, leader_id, epoch)
        self._send_fetch(self._state, now_ms, out)

    def _become_prospective(
        self: RaftReplica,
        now_ms: int,
        out: Output,
        retries: int,
        last_contact_ms: int | None = None,
        stand_order: tuple[int, ...] = (),
    ) -> None:
        """Pre-vote (KIP-996): ask whether we could win, without bumping the epoch."""
        self._role = Role.PROSPECTIVE
        st = ProspectiveState(
            self._election_timeout(now_ms),
            retries,
            granted={self.node_id},
            last_contact_ms=last_contact_ms,
            stand_order=stand_order,
        )
        self._state = st
        if self._tally(st.granted) >= self.majority:
            self._become_candidate(now_ms, out, retries)
            return
        self._send_vote_requests(st, pre_vote=True, now_ms=now_ms, out=out)

    def _become_candidate(self: RaftReplica, now_ms: int, out: Output, retries: int) -> None:
        self._set_election(self._epoch + 1, None, self.node_id, out)
        self._become_candidate_in_current_epoch(now_ms, out, retries)

    def _become_candidate_in_current_epoch(
        self: RaftReplica, now_ms: int, out: Output, retries: int
    ) -> None:
        self._role = Role.CANDIDATE
        st = CandidateState(self._election_timeout(now_ms), retries, granted={self.node_id})
        self._state = st
        logger.info("replica %s is a candidate in epoch %s", self.node_id, self._epoch)
        if self._tally(st.granted) >= self.majority:
            self._become_leader(now_ms, out)
            return
        self._send_vote_requests(st, pre_vote=False, now_ms=now_ms, out=out)

    def _become_leader(self: RaftReplica, now_ms: int, out: Output) -> None:
        self._set_election(self._epoch, self.node_id, self.node_id, out)
        self._role = Role.LEADER
        # Raft commits earlier epochs' entries only through one of this epoch: the
        # leader-change record, written now. An empty log has no earlier entries: the
        # record waits for the epoch's first client records (a new partition's first
        # leader costs no write, file or flush until it is produced to).
        deferred = self._defers_epoch_record()
        try:
            start = (
                0
                if deferred
                else self.log.append_control(
                    self._epoch, self.node_id, list(self.voters), now_ms
                ).first_offset
            )
        except DiskError as exc:
            # Won, but cannot write the epoch's record: let a replica that can lead.
            self._note_disk_fault(str(exc), now_ms)
            self._become_resigned(now_ms, out, tuple(v for v in self.voters if v != self.node_id))
            return
        others = [v for v in self.voters if v != self.node_id]
        st = LeaderState(
            epoch_start_offset=start,
            check_quorum_at=now_ms + self.config.check_quorum_timeout_ms,
            progress={v: ReplicaProgress(v) for v in others},
            begin_unacked=set(others),
            # Nothing was ever appended to an empty log: its followers' first fetches
            # may quiesce them (a new partition settles in one round trip).
            last_append_ms=now_ms - self.config.quiesce_after_ms if deferred else now_ms,
            control_pending=deferred,
        )
        self._state = st
        out.leader_changed = True
        out.fetch_wakeup = True
        logger.info("replica %s leads epoch %s from offset %s", self.node_id, self._epoch, start)
        self._send_begin_quorum_epoch(st, now_ms, out)
        self._maybe_advance_high_watermark(st, out)

    def _defers_epoch_record(self: RaftReplica) -> bool:
        """Only an empty log may wait for its epoch's first records to write the
        leader-change record: with earlier entries there, they could be committed
        before any entry of this epoch (Raft's figure 8)."""
        return self.log.end_offset == 0

    def _become_resigned(
        self: RaftReplica, now_ms: int, out: Output, successors: tuple[int, ...]
    ) -> None:
        was_leader = self._role is Role.LEADER
        self._role = Role.RESIGNED
        others = {v for v in self.voters if v != self.node_id}
        st = ResignedState(
            election_at=self._election_timeout(now_ms) if self._can_elect() else None,
            successors=successors,
            end_unacked=others,
        )
        self._state = st
        out.leader_changed |= was_leader
        logger.info(
            "replica %s resigns epoch %s (successors %s)", self.node_id, self._epoch, successors
        )
        self._send_end_quorum_epoch(st, now_ms, out)

    def _maybe_learn(
        self: RaftReplica, epoch: int, leader_id: int | None, now_ms: int, out: Output, src: int
    ) -> bool:
        """Any message naming a newer epoch (or the unknown leader of ours) moves us
        there first. Returns True if the state changed."""
        if leader_id == self.node_id:
            leader_id = None  # only we can tell ourselves we lead
        contact = now_ms if src == leader_id else None
        if epoch > self._epoch:
            if leader_id is not None:
                self._become_follower(epoch, leader_id, now_ms, out, last_contact_ms=contact)
            else:
                self._become_unattached(now_ms, out, epoch=epoch)
            return True
        if (
            epoch == self._epoch
            and leader_id is not None
            and self._leader_id is None
            and self._role in (Role.UNATTACHED, Role.PROSPECTIVE, Role.CANDIDATE)
        ):
            self._become_follower(epoch, leader_id, now_ms, out, last_contact_ms=contact)
            return True
        return False

    def _prospective_failed(
        self: RaftReplica, st: ProspectiveState, now_ms: int, out: Output
    ) -> None:
        if self._leader_id is not None and self._leader_id != self.node_id:
            # The leader may be fine and only our link was down: fetch from it again.
            self._become_follower(
                self._epoch, self._leader_id, now_ms, out, last_contact_ms=st.last_contact_ms
            )
            if st.stand_order:
                # It stood because the leader's node refuses connections, and a voter
                # that had not learnt so yet (it still heard that leader) refused. Keep
                # the hint and stand again after an election back-off, not a whole fetch
                # timeout: the survivor ranked first still stands first, and the one
                # ranked behind (a fetch timeout later) does not win in its place.
                # The leader's next answer clears the hint, as before.
                follower = self._state
                assert isinstance(follower, FollowerState)
                follower.leader_unreachable = True
                follower.stand_order = st.stand_order
                follower.stand_retries = st.retries + 1
                follower.fetch_timeout_at = now_ms + self._election_backoff(st.retries + 1)
        else:
            st.retries += 1
            st.retry_at = now_ms + self._election_backoff(st.retries)

    def _candidate_failed(self: RaftReplica, st: CandidateState, now_ms: int) -> None:
        st.retries += 1
        st.backoff_until = now_ms + self._election_backoff(st.retries)
        logger.info(
            "replica %s lost the election in epoch %s; retry in %s ms",
            self.node_id,
            self._epoch,
            st.backoff_until - now_ms,
        )

    # ------------------------------------------------------------------ senders

    def _send_vote_requests(
        self: RaftReplica,
        st: ProspectiveState | CandidateState,
        *,
        pre_vote: bool,
        now_ms: int,
        out: Output,
    ) -> None:
        epoch = self._epoch + 1 if pre_vote else self._epoch
        # Our (last epoch, end offset) claim must survive a crash, or votes granted for
        # it could elect us with less data after a restart.
        out.flush_log |= self.log.end_offset > self.log.durable_end_offset
        for v in self.voters:
            if v == self.node_id or v in st.granted or v in st.rejected:
                continue
            out.messages.append(
                VoteRequest(
                    cluster_id=self.cluster_id,
                    src=self.node_id,
                    dst=v,
                    candidate_epoch=epoch,
                    last_offset_epoch=self.log.last_epoch(),
                    last_offset=self.log.end_offset,
                    pre_vote=pre_vote,
                )
            )
        st.resend_at = now_ms + self.config.request_timeout_ms

    # ------------------------------------------------------------------ votes

    def _log_at_least_ours(self: RaftReplica, last_epoch: int, end_offset: int) -> bool:
        return (last_epoch, end_offset) >= (self.log.last_epoch(), self.log.end_offset)

    def _stands_ahead_of(self: RaftReplica, req: VoteRequest) -> bool:
        """This replica, about to stand for a leader whose node refuses connections, is
        ranked ahead of the pre-voting ``req.src`` in the survivors' order and can win
        itself (it may stand, and its log is at least the requester's, so the requester
        will grant its pre-vote): the requester waits, instead of splitting the vote."""
        st = self._state
        order = st.stand_order if isinstance(st, FollowerState | ProspectiveState) else ()
        return (
            self.node_id in order
            and req.src in order
            and order.index(self.node_id) < order.index(req.src)
            and self._can_elect()
            and (self.log.last_epoch(), self.log.end_offset)
            >= (req.last_offset_epoch, req.last_offset)
        )

    def _vote_grantable(self: RaftReplica, req: VoteRequest) -> bool:
        return (
            self._may_vote()
            and self._role in (Role.UNATTACHED, Role.PROSPECTIVE)
            and self._leader_id is None
            and self._voted_id in (None, req.src)
            and self._log_at_least_ours(req.last_offset_epoch, req.last_offset)
        )

    def _vote_response(
        self: RaftReplica, req: VoteRequest, error: ErrorCode, granted: bool
    ) -> VoteResponse:
        return self._answer(
            VoteResponse,
            req.src,
            error,
            vote_granted=granted,
            pre_vote=req.pre_vote,
            candidate_epoch=req.candidate_epoch,
        )

    def _on_vote_request(
        self: RaftReplica, req: VoteRequest, now_ms: int, out: Output
    ) -> VoteResponse:
        if req.cluster_id != self.cluster_id:
            return self._vote_response(req, ErrorCode.INVALID_CLUSTER_ID, False)
        if req.candidate_epoch < self._epoch:
            return self._vote_response(req, ErrorCode.FENCED_LEADER_EPOCH, False)
        if req.pre_vote:
            # Nothing changes for a pre-vote; refuse while a leader is known to be alive.
            if req.candidate_epoch == self._epoch:
                granted = self._vote_grantable(req)
            else:
                granted = self._may_vote() and self._log_at_least_ours(
                    req.last_offset_epoch, req.last_offset
                )
            # Our leader asking means it gave up leading; anyone else must wait for it.
            granted = (
                granted
                and (req.src == self._leader_id or not self._heard_from_leader(now_ms))
                and not self._stands_ahead_of(req)
            )
            return self._vote_response(req, ErrorCode.NONE, granted)
        if req.candidate_epoch > self._epoch:
            self._become_unattached(now_ms, out, epoch=req.candidate_epoch)
        granted = self._vote_grantable(req)
        if granted:
            # Persisted (out.persist) before the response leaves: one vote per epoch.
            self._set_election(self._epoch, None, req.src, out)
            self._role = Role.UNATTACHED
            self._state = UnattachedState(self._election_timeout(now_ms))
            logger.info("replica %s votes for %s in epoch %s", self.node_id, req.src, self._epoch)
        return self._vote_response(req, ErrorCode.NONE, granted)

    def _on_vote_response(self: RaftReplica, resp: VoteResponse, now_ms: int, out: Output) -> None:
        if resp.error == ErrorCode.INVALID_CLUSTER_ID or self._stale_or_taught(resp, now_ms, out):
            return
        st = self._state
        if resp.pre_vote:
            if not isinstance(st, ProspectiveState) or st.retry_at is not None:
                return
            if resp.candidate_epoch != self._epoch + 1:
                return
            (st.granted if resp.vote_granted else st.rejected).add(resp.src)
            if self._tally(st.granted) >= self.majority:
                self._become_candidate(now_ms, out, st.retries)
            elif self._tally(st.rejected) > len(self.voters) - self.majority:
                self._prospective_failed(st, now_ms, out)
        else:
            if not isinstance(st, CandidateState) or st.backoff_until is not None:
                return
            if resp.candidate_epoch != self._epoch:
                return
            (st.granted if resp.vote_granted else st.rejected).add(resp.src)
            if self._tally(st.granted) >= self.majority:
                self._become_leader(now_ms, out)
            elif self._tally(st.rejected) > len(self.voters) - self.majority:
                self._candidate_failed(st, now_ms)

    def _stop_standing(self: RaftReplica, now_ms: int, out: Output) -> None:
        """After the log lost data: re-fetch at once if following, else stop standing
        (a catching-up replica looks for the leader instead)."""
        st = self._state
        if isinstance(st, FollowerState):
            self._send_fetch(st, now_ms, out)
        elif isinstance(st, ResignedState):
            if not self._can_elect():
                st.election_at = None
        elif isinstance(st, ProspectiveState | CandidateState | UnattachedState):
            if not self._can_elect():
                # Forget a leader we stopped following (a prospective replica still names
                # it): only an unknown leader is learned from the answers of the search.
                self._set_election(self._epoch, None, self._voted_id, out)
                self._become_unattached(now_ms, out)
