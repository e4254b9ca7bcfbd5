"""Timers and liveness: what each quorum state waits for, the follower's fetch timeout,
the leader's check-quorum, and quiescence (idle partitions stop fetching; records wake
them).

One role of ``RaftReplica`` (see ``replica.py``), which mixes the roles in: each method
here runs on a ``RaftReplica``. Pure: no clock, file or socket."""

# Methods here run on a RaftReplica, which subclasses this role: mypy takes that self
# type but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..protocol.errors import ErrorCode
from .messages import (
    FetchRequest,
    WakeRequest,
)
from .output import CoreFields, Output
from .state import (
    CandidateState,
    FollowerState,
    LeaderState,
    ProspectiveState,
    UnattachedState,
)

if TYPE_CHECKING:
    from .replica import RaftReplica

logger = logging.getLogger(__name__)


class LivenessRole(CoreFields):
    # ------------------------------------------------------------------ timers

    def _deadlines(self: RaftReplica) -> list[int | None]:
        st = self._state
        if isinstance(st, UnattachedState):
            return [st.election_at, st.discover_at]
        if isinstance(st, ProspectiveState):
            return [st.retry_at] if st.retry_at is not None else [st.election_at, st.resend_at]
        if isinstance(st, CandidateState):
            if st.backoff_until is not None:
                return [st.backoff_until]
            return [st.election_at, st.resend_at]
        if isinstance(st, FollowerState):
            if st.quiet:
                return [st.election_at]
            resend = (
                st.fetch_sent_at + self.config.fetch_max_wait_ms + self.config.request_timeout_ms
                if st.fetch_request_id is not None
                else None
            )
            return [st.fetch_timeout_at, st.fetch_retry_at, st.election_at, resend]
        if isinstance(st, LeaderState):
            # A leader with a majority quiesced checks its quorum only when the driver
            # reports a peer's node silent (``on_peer_change``): no timer of its own.
            check = None if self._quiet_quorum(st) else st.check_quorum_at
            return [check, st.begin_resend_at, st.wake_resend_at]
        return [st.election_at, st.end_resend_at]

    def _tick_once(self: RaftReplica, now_ms: int, out: Output) -> None:
        st = self._state
        if isinstance(st, UnattachedState):
            if st.election_at is not None and now_ms >= st.election_at:
                if not self._can_elect():
                    # It lost data since the timer was set: it may not stand, and a timer
                    # it cannot act on must not stay due. Look for the leader instead.
                    self._become_unattached(now_ms, out)
                elif st.direct_candidate:
                    self._become_candidate(now_ms, out, retries=0)
                else:
                    self._become_prospective(now_ms, out, retries=0)
            elif st.discover_at is not None and now_ms >= st.discover_at:
                if self._can_elect():
                    self._become_unattached(now_ms, out)  # caught up: a voter again
                else:
                    self._discover_leader(st, now_ms, out)
        elif isinstance(st, ProspectiveState):
            if st.retry_at is not None:
                if now_ms >= st.retry_at:
                    self._become_prospective(now_ms, out, st.retries, st.last_contact_ms)
            elif now_ms >= st.election_at:
                self._prospective_failed(st, now_ms, out)
            elif st.resend_at is not None and now_ms >= st.resend_at:
                self._send_vote_requests(st, pre_vote=True, now_ms=now_ms, out=out)
        elif isinstance(st, CandidateState):
            if st.backoff_until is not None:
                if now_ms >= st.backoff_until:
                    self._become_prospective(now_ms, out, st.retries)
            elif now_ms >= st.election_at:
                self._candidate_failed(st, now_ms)
            elif st.resend_at is not None and now_ms >= st.resend_at:
                self._send_vote_requests(st, pre_vote=False, now_ms=now_ms, out=out)
        elif isinstance(st, FollowerState):
            self._tick_follower(st, now_ms, out)
        elif isinstance(st, LeaderState):
            if now_ms >= st.check_quorum_at and not self._quiet_quorum(st):
                if len(self._followed_since_check(st)) + self._self_count >= self.majority:
                    self._reset_check_quorum(st, now_ms)
                elif st.forced:
                    self._reset_check_quorum(st, now_ms, followed=False)
                else:
                    logger.warning(
                        "leader %s of epoch %s not fetched by a majority for %s ms: resigning",
                        self.node_id,
                        self._epoch,
                        self.config.check_quorum_timeout_ms,
                    )
                    self._become_resigned(now_ms, out, self._ranked_successors(st))
                    return
            if st.begin_resend_at is not None and now_ms >= st.begin_resend_at:
                self._send_begin_quorum_epoch(st, now_ms, out)
            if st.wake_resend_at is not None and now_ms >= st.wake_resend_at:
                self._send_wakes(st, now_ms, out)
        else:
            if st.election_at is not None and now_ms >= st.election_at:
                if self._can_elect():
                    self._become_prospective(now_ms, out, retries=0)
                else:
                    self._become_unattached(now_ms, out)  # as above
            elif st.end_resend_at is not None and now_ms >= st.end_resend_at:
                self._send_end_quorum_epoch(st, now_ms, out)

    def _tick_follower(self: RaftReplica, st: FollowerState, now_ms: int, out: Output) -> None:
        if st.election_at is not None and now_ms >= st.election_at:
            if self._can_elect():
                self._become_candidate(now_ms, out, retries=0)
                return
            # The resigned leader's stand came after this replica lost data (it may not
            # stand now): drop the timer, which would otherwise stay due, and follow on.
            st.election_at = None
        if now_ms >= st.fetch_timeout_at:
            logger.info(
                "replica %s: no successful fetch from leader %s for %s ms",
                self.node_id,
                self._leader_id,
                self.config.fetch_timeout_ms,
            )
            if self._can_elect():
                self._become_prospective(
                    now_ms,
                    out,
                    retries=st.stand_retries if st.leader_unreachable else 0,
                    last_contact_ms=st.last_contact_ms,
                    stand_order=st.stand_order if st.leader_unreachable else (),
                )
            elif not self.electable:
                # An observer looks for the leader again; its leader field is advisory.
                self._set_election(self._epoch, None, self._voted_id, out)
                self._become_unattached(now_ms, out)
            else:
                st.fetch_timeout_at = now_ms + self.config.fetch_timeout_ms
        elif st.fetch_retry_at is not None and now_ms >= st.fetch_retry_at:
            self._send_fetch(st, now_ms, out)
        elif (
            st.fetch_request_id is not None
            and now_ms
            >= st.fetch_sent_at + self.config.fetch_max_wait_ms + self.config.request_timeout_ms
        ):
            self._send_fetch(st, now_ms, out)

    def _reset_check_quorum(
        self: RaftReplica, st: LeaderState, now_ms: int, followed: bool = True
    ) -> None:
        """Start a new check-quorum period; ``followed``: a majority fetched in this one
        (from then on even a forced leader must keep one)."""
        st.forced = st.forced and not followed
        st.fetched_since_check.clear()
        st.check_quorum_at = now_ms + self.config.check_quorum_timeout_ms

    # ------------------------------------------------------------------ quiescence
    #
    # An idle partition costs nothing: once nothing has been appended for a long-poll
    # and a replica's fetch shows it holds the whole log, all of it committed, the leader
    # answers ``quiesce``; that replica stops fetching and the leader stops expecting it.
    # The nodes' heartbeats (the driver's, one per pair of nodes) stand for the fetches
    # meanwhile: ``peer_seen`` counts a quiesced voter for check-quorum, a quiesced
    # follower refuses pre-votes while its leader's node is heard, and the driver calls
    # ``on_peer_stale`` when a node goes silent or restarts. Records appended wake the
    # quiesced replicas (WakeRequest, resent until they fetch).

    def _all_quiet(self: RaftReplica, st: LeaderState) -> bool:
        return len(st.quiet) >= len(st.progress) and all(v in st.quiet for v in st.progress)

    def _quiet_quorum(self: RaftReplica, st: LeaderState) -> bool:
        """This leader and its quiesced voters are a majority. Their nodes' heartbeats
        vouch for them (the driver's ``on_peer_change`` unquiets one whose node falls
        silent), so check-quorum needs no timer: a partition with a voter on a dead node
        costs nothing while the others are quiesced."""
        quiet = sum(1 for v in st.quiet if v in st.progress)
        return self._self_count + quiet >= self.majority

    def _followed_since_check(self: RaftReplica, st: LeaderState) -> set[int]:
        """Voters that fetched in this check-quorum period, and quiesced voters whose
        node was heard from in it."""
        since = st.check_quorum_at - self.config.check_quorum_timeout_ms
        alive = {v for v in st.quiet if v in st.progress and self.peer_seen.get(v, -1) >= since}
        return st.fetched_since_check | alive

    def _may_quiesce(self: RaftReplica, st: LeaderState, req: FetchRequest, now_ms: int) -> bool:
        end = self.log.end_offset
        return (
            self.config.quiesce
            and req.replica_id in st.progress  # an observer's node sends no heartbeats here
            and req.max_wait_ms > 0
            and not req.catching_up
            and not st.forced
            and req.replica_id not in st.begin_unacked
            and req.fetch_offset == end == self._high_watermark == self.log.durable_end_offset
            and now_ms - st.last_append_ms >= self.config.quiesce_after_ms
        )

    def _unquiet(self: RaftReplica, st: LeaderState, replica: int, now_ms: int) -> None:
        if replica not in st.quiet:
            return
        slept = self._quiet_quorum(st)
        st.quiet.discard(replica)
        if slept and not self._quiet_quorum(st):
            # Check-quorum slept while a majority was quiesced: a fresh period.
            st.fetched_since_check.clear()
            st.check_quorum_at = now_ms + self.config.check_quorum_timeout_ms

    def _wake_quiet(self: RaftReplica, st: LeaderState, now_ms: int, out: Output) -> None:
        if st.quiet:
            for replica in list(st.quiet):
                self._unquiet(st, replica, now_ms)
                st.wake_unacked.add(replica)
            self._send_wakes(st, now_ms, out)

    def _send_wakes(self: RaftReplica, st: LeaderState, now_ms: int, out: Output) -> None:
        """Wake each replica in ``wake_unacked`` whose node is heard (a silent one is
        woken by ``on_peer_change`` when it is heard again); resend while any is."""
        st.wake_resend_at = self._announce(
            WakeRequest, self._heard(st.wake_unacked, now_ms), now_ms, out
        )

    def _on_wake(self: RaftReplica, req: WakeRequest, now_ms: int, out: Output) -> None:
        if req.cluster_id != self.cluster_id or self._announcement_error(req) != ErrorCode.NONE:
            return
        if self._maybe_learn(req.leader_epoch, req.leader_id, now_ms, out, req.src):
            return
        st = self._state
        if isinstance(st, FollowerState) and st.quiet and self._leader_id == req.leader_id:
            self._resume(st, now_ms, now_ms, out)

    def _resume(
        self: RaftReplica,
        st: FollowerState,
        contact_ms: int | None,
        now_ms: int,
        out: Output,
        *,
        fetch: bool = True,
    ) -> None:
        """A quiesced follower fetches again (unless not ``fetch``: its timers run again),
        its leader last heard from at ``contact_ms``."""
        st.quiet = False
        if contact_ms is not None:
            st.last_contact_ms = max(st.last_contact_ms or contact_ms, contact_ms)
        base = st.last_contact_ms if st.last_contact_ms is not None else now_ms
        st.fetch_timeout_at = base + self.config.fetch_timeout_ms
        if fetch:
            self._send_fetch(st, now_ms, out)

    def _heard(self: RaftReplica, replicas: set[int], now_ms: int) -> list[int]:
        """Those of ``replicas`` whose node was heard within the fetch timeout (or never
        reported on yet): the ones a message may reach."""
        since = now_ms - self.config.fetch_timeout_ms
        return [r for r in sorted(replicas) if self.peer_seen.get(r, now_ms) >= since]
