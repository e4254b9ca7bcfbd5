"""The leader's side of replication: answering a follower's Fetch (records, a diverging
epoch, or an error), tracking each replica's durable end, and the high watermark.

One role of ``RaftReplica`` (see ``replica.py``), which mixes the roles in: each method
here runs on a ``RaftReplica``. Pure: no clock, file or socket."""

# Methods here run on a RaftReplica, which subclasses this role: mypy takes that self
# type but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..constants import UNKNOWN
from ..protocol.errors import ErrorCode
from .log import CorruptDataError
from .messages import (
    FetchRequest,
    FetchResponse,
)
from .output import CoreFields, Output
from .state import (
    LeaderState,
    ReplicaProgress,
)

if TYPE_CHECKING:
    from .replica import RaftReplica

logger = logging.getLogger(__name__)


class LeaderRole(CoreFields):
    # ------------------------------------------------------------------ fetch

    def _fetch_error(self: RaftReplica, req: FetchRequest, error: ErrorCode) -> FetchResponse:
        return self._answer(
            FetchResponse,
            req.replica_id,
            error,
            high_watermark=self._high_watermark,
            log_start_offset=self.log.start_offset,
            diverging_epoch=None,
            records=b"",
            fetch_offset=req.fetch_offset,
            request_id=req.request_id,
        )

    def _on_fetch_request(
        self: RaftReplica, req: FetchRequest, now_ms: int, out: Output
    ) -> FetchResponse:
        """A replica's fetch (voter or observer). Consumers are served by the driver from
        the log, never here: a fetch without a replica id is refused."""
        if req.cluster_id != self.cluster_id:
            return self._fetch_error(req, ErrorCode.INVALID_CLUSTER_ID)
        if req.replica_id < 0:
            return self._fetch_error(req, ErrorCode.INVALID_REQUEST)
        if req.current_leader_epoch < self._epoch:
            return self._fetch_error(req, ErrorCode.FENCED_LEADER_EPOCH)
        if req.current_leader_epoch > self._epoch:
            return self._fetch_error(req, ErrorCode.UNKNOWN_LEADER_EPOCH)
        st = self._state
        if not isinstance(st, LeaderState):
            return self._fetch_error(req, ErrorCode.NOT_LEADER)
        if req.fetch_offset < self.log.start_offset or req.fetch_offset < 0:
            return self._fetch_error(req, ErrorCode.OFFSET_OUT_OF_RANGE)

        is_voter = req.replica_id in st.progress
        # A late copy of the fetch this leader answered ``quiesce`` (or of an older one)
        # is answered, but says nothing of whether that replica fetches again.
        copy = req.request_id <= st.quiet_ids.get(req.replica_id, -1) and (
            req.replica_id in st.quiet or req.replica_id in st.wake_unacked
        )
        if not copy:
            st.wake_unacked.discard(req.replica_id)
        rows = st.progress if is_voter else st.observers
        row = rows.get(req.replica_id)
        # The fetch this row was last updated from, handled again (a long-poll answered
        # later, or a copy delivered twice): it tells nothing of the replica since it
        # first arrived (a copy deleted meanwhile, say), so what the leader knows of the
        # replica stays what it learned then; only the answer is made anew.
        again = row is not None and (row.request_id, row.end_offset) == (
            req.request_id,
            req.fetch_offset,
        )
        if not again:
            # A replica that lost data (or a move's new copy) neither counts nor joins
            # the voters until it says it has caught back up, nor one whose node does
            # not host it yet on its view of the move (raft.membership).
            _flag(st.catching_up, req.replica_id, req.catching_up)
            _flag(st.unassigned, req.replica_id, not req.assigned)
        if is_voter:
            # A fetch in this epoch acknowledges BeginQuorumEpoch (as Kafka's leader
            # counts it): it may be what arrives first, in the frame that carries both.
            st.begin_unacked.discard(req.replica_id)
            st.fetched_since_check.add(req.replica_id)
            if len(st.fetched_since_check) + self._self_count >= self.majority:
                self._reset_check_quorum(st, now_ms)

        diverging: tuple[int, int] | None = None
        if req.fetch_offset > 0:
            end = self.log.end_offset_for(req.last_fetched_epoch)
            if end.epoch != req.last_fetched_epoch or end.end_offset < req.fetch_offset:
                diverging = (end.epoch, end.end_offset)

        if diverging is None and not again:
            row = rows.setdefault(req.replica_id, ReplicaProgress(req.replica_id))
            row.request_id = req.request_id
            if req.fetch_offset < row.end_offset:
                # Its log lost its end (truncated, or a replica made anew): what it
                # caught up before is gone (raft.membership).
                row.caught_up_ms = row.fetch_leader_end = UNKNOWN
            # fetch_offset is durable on the fetcher and matches our log below it.
            row.end_offset = req.fetch_offset
            leader_end = self.log.end_offset
            if req.fetch_offset >= leader_end:
                row.caught_up_ms = now_ms
            elif row.fetch_leader_end != UNKNOWN and req.fetch_offset >= row.fetch_leader_end:
                row.caught_up_ms = max(row.caught_up_ms, row.last_fetch_ms)
            row.fetch_leader_end = leader_end
            row.last_fetch_ms = now_ms
            if is_voter:
                self._maybe_advance_high_watermark(st, out)

        records = b""
        # A fetch asking for no bytes (a new replica waiting its turn to copy, which its
        # leader's driver answers with none) reads nothing: the log would read, check
        # and copy at least one batch only to throw it away.
        if diverging is None and req.fetch_offset < self.log.end_offset and req.max_bytes > 0:
            try:
                records = self.log.read(req.fetch_offset, req.max_bytes)
            except CorruptDataError as exc:
                self._repair(exc.offset, now_ms, out)
                return self._fetch_error(req, ErrorCode.NOT_LEADER)
        quiesce = diverging is None and self._may_quiesce(st, req, now_ms)
        if copy:
            quiesce = (
                quiesce
                and req.replica_id in st.quiet
                and req.request_id == st.quiet_ids[req.replica_id]
            )
        elif quiesce:
            st.quiet.add(req.replica_id)
            st.quiet_ids[req.replica_id] = req.request_id
        else:
            self._unquiet(st, req.replica_id, now_ms)
        return FetchResponse(
            cluster_id=self.cluster_id,
            src=self.node_id,
            dst=req.replica_id,
            error=int(ErrorCode.NONE),
            leader_id=self.node_id,
            leader_epoch=self._epoch,
            high_watermark=self._high_watermark,
            log_start_offset=self.log.start_offset,
            diverging_epoch=diverging,
            records=records,
            fetch_offset=req.fetch_offset,
            request_id=req.request_id,
            catch_up_floor=max(self._high_watermark, st.epoch_start_offset)
            if req.catching_up
            else UNKNOWN,
            quiesce=quiesce,
        )

    def _maybe_advance_high_watermark(self: RaftReplica, st: LeaderState, out: Output) -> None:
        """HWM = the largest offset durable on a majority of voters, once that covers
        the leader's own epoch start; never moves back."""
        offsets = sorted(self._counted_offsets(st), reverse=True)
        if len(offsets) < self.majority:
            return
        candidate = offsets[self.majority - 1]
        if candidate > self._commit_floor(st) and candidate > self._high_watermark:
            self._high_watermark = candidate
            out.high_watermark = candidate
            out.fetch_wakeup = True

    def _counted_offsets(self: RaftReplica, st: LeaderState) -> list[int]:
        """What counts towards the HWM: the leader's durable end (while it is a voter) and
        each voter's fetch offset (durable there) that ``counts``; observers never
        count."""
        own = [self.log.durable_end_offset] if self.is_voter else []
        return own + [r.end_offset for r in st.progress.values() if self.counts(r)]

    def _commit_floor(self: RaftReplica, st: LeaderState) -> int:
        """The HWM must pass this first: the leader's own epoch start (Raft commits
        earlier epochs' entries only through one of its own)."""
        return st.epoch_start_offset


def _flag(members: set[int], replica: int, on: bool) -> None:
    """Put ``replica`` in ``members`` or take it out."""
    if on:
        members.add(replica)
    else:
        members.discard(replica)
