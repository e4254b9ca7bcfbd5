"""Voter-set changes (KIP-853), one voter at a time, in the log they govern.

The voter set in force is that of the latest voter-set record in the replica's log,
committed or not (``ReplicaLog.voters``), or, when the log holds none, the voters the
replica was created with. So a follower takes a change as soon as it appends it, and
drops it with the truncation that removes it; every role reads ``voters`` afresh.

A leader appends a change (``change_voters``) only when:

* it has committed an entry of its own epoch (Ongaro's fix of the single-server change
  rule: a leader elected by the old set with an uncommitted change of an earlier leader
  in some log could otherwise commit a set two changes away from another's);
* the previous change is committed (at most one uncommitted change in any log);
* the new set differs from the current one by exactly one voter (any majority of the
  one overlaps any majority of the other: two leaders of one epoch stay impossible);
* a voter it adds has caught up within a fetch timeout, and since the change was asked
  for: a fetch of it, as an observer, reached the leader's end offset, or the end the
  leader had at its previous fetch (``ReplicaProgress.caught_up_ms``; adding a
  far-behind voter would stall commits). What the leader knows of a replica may predate
  it: a voter removed keeps its row as an observer, and its node may delete the replica
  and make it anew, empty, when a move brings it back; a fetch from below the offset the
  row holds (a log that lost its end) clears the row's catch-up too;
* a replica it adds is hosted by its node on that node's own view of the moves: its
  latest fetch says ``assigned``. A node whose view lags the leader's may still delete
  the old copy as moved off (``PartitionManager.drop_removed``) after the leader added
  it on that copy's fetches, leaving a new, empty copy the voter: one that neither votes
  nor counts until it has caught up (of two voters, the other could then neither lead
  nor commit).

A voter the latest change added counts towards the high watermark only once its fetch
is past that record (``counts``): until its log holds it, its log does not say it is a
voter, and its node may still delete it as moved off (``PartitionManager.drop_removed``
on a view of the move that lags the leader's), so what it was counted for would rest on
a copy that is gone. A voter an earlier change added counts as any other: the latest
change was appended only once that one committed, so what such a voter lacks below it
is committed already.

A replica removed by a change it does not know to be committed may still stand
(``electable``); any replica not catching up answers votes (``_may_vote``). A leader
that removes itself keeps leading (counting only the new voters towards the high
watermark) until the change commits, then resigns: its followers keep fetching from it
until then, and the new set elects its successor.

One role of ``RaftReplica`` (see ``replica.py``). Pure: no clock, file or socket."""

# Methods here run on a RaftReplica, which subclasses this role: mypy takes that self
# type but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..constants import UNKNOWN
from ..protocol.errors import ErrorCode
from .output import CoreFields, Output
from .state import LeaderState, ReplicaProgress

if TYPE_CHECKING:
    from .replica import RaftReplica

logger = logging.getLogger(__name__)


class VoterChangeError(Exception):
    """A voter-set change this replica cannot make now: ``error`` says whether to retry
    (REQUEST_TIMED_OUT: not yet; NOT_LEADER: ask the leader) or not (INVALID_REQUEST)."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


class MembershipRole(CoreFields):
    @property
    def voters(self: RaftReplica) -> tuple[int, ...]:
        """The voter set in force: the latest voter-set record in the log, else the
        voters this replica was created with."""
        return self.log.voters or self._base_voters

    @property
    def electable(self: RaftReplica) -> bool:
        """It may stand: a voter, or a voter of the set before a change it
        does not know to be committed (it may still be needed to elect a leader that
        commits the change, as in Raft's dissertation, 4.2.2: a replica that holds a
        change removing it, while the others lack it, would otherwise block them all).
        Either way a candidate counts only the votes of the voter set in force
        (``_tally``)."""
        if self.is_voter:
            return True
        if not self.voter_change_pending:
            return False
        return self.node_id in (self.log.voters_before or self._base_voters)

    def counts(self: RaftReplica, row: ReplicaProgress) -> bool:
        """Whether a voter's row counts towards the high watermark: not while it is
        catching up, and, for a voter the latest voter-set record added, not before its
        fetch is past that record (see the module docstring)."""
        st = self._state
        if isinstance(st, LeaderState) and row.replica_id in st.catching_up:
            return False
        at = self.log.voters_offset
        if at < 0 or row.end_offset > at:
            return True
        return row.replica_id in (self.log.voters_before or self._base_voters)

    def _tally(self: RaftReplica, ids: set[int]) -> int:
        """How many of ``ids`` are voters of the voter set in force."""
        voters = self.voters
        return sum(1 for v in ids if v in voters)

    @property
    def voter_change_pending(self: RaftReplica) -> bool:
        """A voter-set record in the log is not committed yet (as this replica knows)."""
        return self.log.voters_offset >= self._high_watermark

    def voter_change_problem(
        self: RaftReplica, voters: Sequence[int], now_ms: int, *, asked_ms: int = UNKNOWN
    ) -> str | None:
        """Why ``change_voters(voters)`` would be refused now (None: it would not)."""
        try:
            self._check_voter_change(tuple(sorted(set(voters))), now_ms, asked_ms)
        except VoterChangeError as exc:
            return str(exc)
        return None

    def change_voters(
        self: RaftReplica, voters: Sequence[int], now_ms: int, *, asked_ms: int = UNKNOWN
    ) -> Output:
        """Append a voter-set record naming ``voters`` (the current set with one voter
        added or removed). Raises ``VoterChangeError`` when it may not (see the module
        docstring); the change is in force at once, and done once committed. ``asked_ms``:
        when the change was asked for; a voter it adds must have caught up since then."""
        new = tuple(sorted(set(voters)))
        st = self._check_voter_change(new, now_ms, asked_ms)
        out = Output(fetch_wakeup=True)
        old = self.voters
        self.log.append_voters(self._epoch, self.node_id, list(new), now_ms)
        st.last_append_ms = now_ms
        for added in set(new) - set(old):
            if added != self.node_id:
                st.progress[added] = st.observers.pop(added, ReplicaProgress(added))
        for removed in set(old) - set(new):
            row = st.progress.pop(removed, None)
            if row is not None:
                st.observers[removed] = row
            st.catching_up.discard(removed)
            st.begin_unacked.discard(removed)
            st.fetched_since_check.discard(removed)
        logger.info(
            "replica %s (leader of epoch %s) changes the voters %s -> %s",
            self.node_id,
            self._epoch,
            list(old),
            list(new),
        )
        self._wake_quiet(st, now_ms, out)
        self._maybe_advance_high_watermark(st, out)
        self._resign_if_removed(st, now_ms, out)
        return out

    def _check_voter_change(
        self: RaftReplica, new: tuple[int, ...], now_ms: int, asked_ms: int = UNKNOWN
    ) -> LeaderState:
        st = self._state
        if not isinstance(st, LeaderState) or self._shutting_down:
            raise VoterChangeError(ErrorCode.NOT_LEADER, "not the leader")
        old = self.voters
        if new == old:
            raise VoterChangeError(ErrorCode.INVALID_REQUEST, f"the voters are {list(old)} already")
        if not new:
            raise VoterChangeError(ErrorCode.INVALID_REQUEST, "a quorum needs at least one voter")
        changed = set(new) ^ set(old)
        if len(changed) != 1:
            raise VoterChangeError(
                ErrorCode.INVALID_REQUEST,
                f"voters {list(old)} -> {list(new)} changes {len(changed)} voters; "
                "change one voter at a time",
            )
        if st.control_pending or self._high_watermark <= st.epoch_start_offset:
            raise VoterChangeError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"leader {self.node_id} has not committed an entry of epoch {self._epoch} yet",
            )
        if self.voter_change_pending:
            raise VoterChangeError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"the voter change at offset {self.log.voters_offset} is not committed yet",
            )
        (voter,) = changed
        if voter in new and voter != self.node_id:
            if voter in st.catching_up:
                # Added, it could not vote nor count until caught back up: with the
                # voters it joins, no majority might be left to elect or commit.
                raise VoterChangeError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"replica {voter} is catching up after losing data (no vote yet)",
                )
            if voter in st.unassigned:
                # Its node has not seen the move yet: it may still delete this copy as
                # moved off, and a new, empty one would be the voter added.
                raise VoterChangeError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"node {voter} does not host its replica yet (it has not seen the move)",
                )
            row = st.observers.get(voter)
            recent = max(now_ms - self.config.fetch_timeout_ms, asked_ms)
            if row is None or row.caught_up_ms == UNKNOWN or row.caught_up_ms < recent:
                raise VoterChangeError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"replica {voter} has not caught up (fetched to "
                    f"{row.end_offset if row else 'nothing'}, high watermark "
                    f"{self._high_watermark})",
                )
        return st

    def write_epoch_record(self: RaftReplica, now_ms: int) -> Output:
        """A leader of a log that was empty at its election defers its leader-change
        record to the epoch's first client records; a voter change cannot wait for them
        (it needs an entry of this epoch committed first): write it now."""
        st = self._state
        out = Output()
        if isinstance(st, LeaderState) and st.control_pending and not self._shutting_down:
            self.log.append_control(self._epoch, self.node_id, list(self.voters), now_ms)
            st.control_pending = False
            st.last_append_ms = now_ms
            out.fetch_wakeup = True
            self._wake_quiet(st, now_ms, out)  # its followers fetch it, and it commits
        return out

    def _resign_if_removed(self: RaftReplica, st: LeaderState, now_ms: int, out: Output) -> None:
        """A leader that removed itself resigns once that change is committed."""
        if not self.is_voter and self._high_watermark > self.log.voters_offset >= 0:
            logger.info(
                "replica %s: its removal from the voters is committed; resigning epoch %s",
                self.node_id,
                self._epoch,
            )
            self._become_resigned(now_ms, out, self._ranked_successors(st))

    @property
    def _self_count(self: RaftReplica) -> int:
        """What this replica adds to a tally of voters: 1 if it is one."""
        return 1 if self.is_voter else 0
