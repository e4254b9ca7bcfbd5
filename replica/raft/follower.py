"""The follower's side of replication: its Fetch, appending what the leader sends,
truncating to a diverging epoch, repairing damage, and catching up past a floor.

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
from .log import CATCH_UP_UNKNOWN, DiskError
from .messages import (
    FetchRequest,
    FetchResponse,
)
from .output import CoreFields, Output
from .state import (
    FollowerState,
    LeaderState,
    UnattachedState,
)

if TYPE_CHECKING:
    from .replica import RaftReplica

logger = logging.getLogger(__name__)


class FollowerRole(CoreFields):
    def _probe_epochs_of_voters(self: RaftReplica, now_ms: int, out: Output) -> None:
        """Catching up with an unknown floor, the replica does not know the current epoch
        (a lost disk loses the quorum state too): a stale leader of an old epoch would
        give it a floor below records acknowledged in a later one, and then count it. So
        it asks the other voters their epochs (a fetch with epoch UNKNOWN is answered
        FENCED_LEADER_EPOCH with the voter's epoch, changing nothing there) and takes a
        floor only from a leader whose epoch is at least every epoch n - majority + 1 of
        them answered: that many include a voter of the latest epoch anything was
        committed in, so such a leader holds every acknowledged record."""
        if self.log.catch_up_offset != CATCH_UP_UNKNOWN or self._shutting_down:
            return
        if self._probe_sent_at is not None and now_ms < (
            self._probe_sent_at + self.config.request_timeout_ms
        ):
            return
        if self._probe_id == 0:
            # Random, so answers to an earlier incarnation's requests never count.
            self._probe_id = self._rng.randrange(1 << 30, 1 << 31)
        self._probe_sent_at = now_ms
        for v in self.voters:
            if v != self.node_id and v not in self._probe_epochs:
                out.messages.append(
                    self._fetch_request(
                        v, 0, 0, self._probe_id, current_leader_epoch=UNKNOWN, catching_up=True
                    )
                )

    def _floor_source(self: RaftReplica, leader_epoch: int) -> bool:
        """A leader of ``leader_epoch`` may set an unknown catch-up floor (see above)."""
        need = len(self.voters) - self.majority + 1
        return len(self._probe_epochs) >= need and max(self._probe_epochs.values()) <= leader_epoch

    def _fetch_request(
        self: RaftReplica,
        dst: int,
        max_wait_ms: int,
        max_bytes: int,
        request_id: int,
        current_leader_epoch: int | None = None,
        catching_up: bool | None = None,
    ) -> FetchRequest:
        """A Fetch from our log end (the epoch check and catch-up flag ours unless given)."""
        return FetchRequest(
            cluster_id=self.cluster_id,
            replica_id=self.node_id,
            dst=dst,
            current_leader_epoch=self._epoch
            if current_leader_epoch is None
            else current_leader_epoch,
            fetch_offset=self.log.end_offset,
            last_fetched_epoch=self.log.last_epoch(),
            max_wait_ms=max_wait_ms,
            max_bytes=max_bytes,
            request_id=request_id,
            catching_up=self.catching_up if catching_up is None else catching_up,
            assigned=self.assigned,
        )

    def _send_fetch(self: RaftReplica, st: FollowerState, now_ms: int, out: Output) -> None:
        assert self._leader_id is not None
        if st.quiet:
            # Quiesced until now (its log changed under it): its leader's node was
            # heard from meanwhile, so the fetch timeout runs from here.
            st.quiet = False
            st.fetch_timeout_at = max(st.fetch_timeout_at, now_ms + self.config.fetch_timeout_ms)
        self._next_request_id += 1
        st.fetch_request_id = self._next_request_id
        st.fetch_sent_at = now_ms
        st.fetch_retry_at = None
        # fetch_offset tells the leader what we hold durably: flush first.
        out.flush_log |= self.log.end_offset > self.log.durable_end_offset
        out.messages.append(
            self._fetch_request(
                self._leader_id,
                self.config.fetch_max_wait_ms,
                self.config.fetch_max_bytes,
                st.fetch_request_id,
            )
        )
        self._probe_epochs_of_voters(now_ms, out)

    def _discover_leader(self: RaftReplica, st: UnattachedState, now_ms: int, out: Output) -> None:
        """An observer without a leader asks a random voter (any answer names one)."""
        target = self._rng.choice(self.voters)
        out.messages.append(self._fetch_request(target, 0, self.config.fetch_max_bytes, 0))
        st.discover_at = now_ms + self.config.retry_backoff_ms + self.config.request_timeout_ms
        self._probe_epochs_of_voters(now_ms, out)

    def _on_fetch_response(
        self: RaftReplica, resp: FetchResponse, now_ms: int, out: Output
    ) -> None:
        if resp.cluster_id != self.cluster_id:
            return
        if (
            self._probe_id
            and resp.request_id == self._probe_id
            and resp.src in self.voters
            and resp.src != self.node_id
        ):
            self._probe_epochs[resp.src] = max(
                self._probe_epochs.get(resp.src, UNKNOWN), resp.leader_epoch
            )
        if self._maybe_learn(resp.leader_epoch, resp.leader_id, now_ms, out, resp.src):
            return
        st = self._state
        if (
            not isinstance(st, FollowerState)
            or resp.src != self._leader_id
            or resp.request_id != st.fetch_request_id
        ):
            return  # stale or duplicate answer
        st.fetch_request_id = None
        if resp.error != ErrorCode.NONE or resp.leader_epoch != self._epoch:
            if resp.error == ErrorCode.NOT_LEADER and resp.leader_epoch == self._epoch:
                st.leader_resigned = True  # it no longer leads our epoch: don't shield it
            st.fetch_retry_at = now_ms + self.config.retry_backoff_ms
            return
        st.last_contact_ms = now_ms
        st.fetch_timeout_at = now_ms + self.config.fetch_timeout_ms
        st.leader_unreachable = False  # it answered: the hint was wrong or stale
        if resp.diverging_epoch is not None:
            self._truncate_to_diverging(resp.diverging_epoch, out)
        elif resp.fetch_offset == self.log.end_offset:
            if resp.records:
                try:
                    self.log.append_as_follower(resp.records)
                except DiskError as exc:
                    # Nothing was appended: fetch the same offset again later.
                    self._note_disk_fault(str(exc), now_ms)
                    st.fetch_retry_at = now_ms + self.config.disk_retry_ms
                    st.fetch_timeout_at = max(st.fetch_timeout_at, st.fetch_retry_at)
                    return
                except ValueError:
                    logger.exception("replica %s: fetched batches do not fit", self.node_id)
                    st.fetch_retry_at = now_ms + self.config.retry_backoff_ms
                    return
                self._disk_ok()
            if (
                self.log.catch_up_offset == CATCH_UP_UNKNOWN
                and resp.catch_up_floor >= 0
                and self._floor_source(resp.leader_epoch)
            ):
                self.log.mark_catch_up(resp.catch_up_floor)
            hwm = min(resp.high_watermark, self.log.end_offset)
            if hwm > self._high_watermark:
                self._high_watermark = hwm
                out.high_watermark = hwm
                out.fetch_wakeup = True
            if (
                resp.quiesce
                and not resp.records
                and self._high_watermark == self.log.end_offset == self.log.durable_end_offset
                and not self.catching_up
            ):
                st.quiet = True  # until the leader wakes us or its node goes silent
                return
        self._send_fetch(st, now_ms, out)

    def _repair(self: RaftReplica, offset: int, now_ms: int, out: Output) -> None:
        if offset >= self.log.end_offset:
            return
        st = self._state
        logger.error(
            "replica %s (%s, epoch %s): damaged data at offset %s; cutting the log there "
            "and re-fetching from the leader",
            self.node_id,
            self._role.value,
            self._epoch,
            offset,
        )
        if isinstance(st, LeaderState):
            # Resign first: it must neither lead nor serve with a log it is cutting.
            self._become_resigned(now_ms, out, self._ranked_successors(st))
        self.log.truncate_corrupt(offset)
        end = self.log.end_offset
        out.repaired_at = end
        out.truncated_to = end
        self._high_watermark = min(self._high_watermark, end)
        self._stop_standing(now_ms, out)

    def _truncate_to_diverging(self: RaftReplica, diverging: tuple[int, int], out: Output) -> None:
        epoch, leader_end = diverging
        local = self.log.end_offset_for(epoch) if epoch != UNKNOWN else None
        target = leader_end
        if local is not None and local.end_offset >= 0:
            target = min(target, local.end_offset)
        target = max(min(target, self.log.end_offset), self.log.start_offset)
        if target >= self.log.end_offset:
            return
        if target < self._high_watermark:
            # Only an unclean election can take committed data away: surface it loudly.
            self.truncations_below_high_watermark += 1
            out.truncated_below_high_watermark = True
            logger.error(
                "replica %s truncates to %s below its high watermark %s (unclean election?)",
                self.node_id,
                target,
                self._high_watermark,
            )
            self._high_watermark = target
        logger.info(
            "replica %s truncates %s..%s (diverging epoch %s)",
            self.node_id,
            target,
            self.log.end_offset,
            diverging,
        )
        self.log.truncate_to(target)
        out.truncated_to = target
