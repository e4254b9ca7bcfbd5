"""The per-partition quorum replica: KIP-595 (pull-based Raft) as a pure state machine.

Stepped with ``handle`` (a message), ``tick`` (time passed), ``append`` (client data on
the leader) and ``on_log_flushed`` (the driver's group commit finished); every step
returns an ``Output`` the driver executes in this order:

1. persist ``out.persist`` (the quorum-state file) if set;
2. flush the log if ``out.flush_log``, then call ``on_log_flushed``;
3. send ``out.messages`` (each names its ``dst``).

See the package docstring for the full driver contract.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..constants import UNKNOWN
from ..protocol.errors import ErrorCode
from .config import QuorumConfig
from .log import CATCH_UP_UNKNOWN, AppendInfo, CorruptDataError, ReplicaLog
from .messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    EpochResponse,
    FetchRequest,
    FetchResponse,
    LeaderAnnouncement,
    Message,
    VoteRequest,
    VoteResponse,
    WakeRequest,
)
from .state import (
    CandidateState,
    ElectionState,
    FollowerState,
    LeaderState,
    ProspectiveState,
    ReplicaProgress,
    ResignedState,
    Role,
    RoleState,
    UnattachedState,
)

__all__ = ["UNCLEAN_EPOCH_GAP", "NotLeaderError", "Output", "QuorumDescription", "RaftReplica"]

logger = logging.getLogger(__name__)

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


class RaftReplica:
    """One replica of one partition's quorum.

    ``voters`` is the voter set; a node not in it is an observer (fetches, never votes,
    never counts towards the HWM). ``persisted`` is the quorum-state file's content or
    None for a fresh replica. Nothing here reads a clock or does I/O besides calls on
    ``log``; all randomness comes from ``rng``.
    """

    def __init__(
        self,
        config: QuorumConfig,
        node_id: int,
        voters: list[int] | tuple[int, ...] | frozenset[int],
        cluster_id: str,
        log: ReplicaLog,
        persisted: ElectionState | None,
        rng: random.Random,
        now_ms: int,
    ) -> None:
        if not voters:
            raise ValueError("a quorum needs at least one voter")
        self.config = config
        self.node_id = node_id
        self.voters: tuple[int, ...] = tuple(sorted(set(voters)))
        self.cluster_id = cluster_id
        self.log = log
        self._rng = rng
        self._shutting_down = False
        self._high_watermark = 0
        # Request ids grow across restarts too (monotonic time), so a leader can tell a
        # late copy of a fetch from before it quiesced this replica from a new fetch.
        self._next_request_id = max(0, now_ms) * 1000
        self.truncations_below_high_watermark = 0
        # Catching up with an unknown floor: the epochs other voters answered our probes
        # with (see _probe_epochs_of_voters), the probes' request id and when last sent.
        self._probe_epochs: dict[int, int] = {}
        self._probe_id = 0
        self._probe_sent_at: int | None = None
        # When each peer node was last heard from (monotonic ms), kept by the driver from
        # its node heartbeats: what stands for a quiesced replica's fetches.
        self.peer_seen: Mapping[int, int] = {}

        state = persisted if persisted is not None else ElectionState(0)
        self._epoch = state.epoch
        self._leader_id = state.leader_id
        self._voted_id = state.voted_id
        self._role = Role.UNATTACHED
        self._state: RoleState = UnattachedState(None)
        # Not persisted yet: a replica raised to its log's epoch. A fresh one persists
        # nothing: epoch 0 and no vote is what no persisted state stands for (a node
        # opening 10,000 new replicas wrote and fdatasync'd 10,000 such states).
        self._startup = Output()

        log_epoch = log.last_epoch()
        if log_epoch > self._epoch:
            # A stored epoch below the log's last epoch is stale: raise it, forget vote.
            self._set_election(log_epoch, None, None, self._startup)
            self._become_unattached(now_ms, self._startup)
        elif self._leader_id == node_id:
            # It led this epoch and may have lost unflushed data: never lead it again.
            self._become_resigned(now_ms, self._startup, successors=())
        elif self._voted_id == node_id and self._leader_id is None and not self.catching_up:
            self._become_candidate_in_current_epoch(now_ms, self._startup, retries=0)
        elif self._leader_id is not None:
            self._become_follower(self._epoch, self._leader_id, now_ms, self._startup)
        else:
            self._become_unattached(now_ms, self._startup)
        logger.info(
            "replica %s starts %s in epoch %s (leader %s, voted %s)",
            node_id,
            self._role.value,
            self._epoch,
            self._leader_id,
            self._voted_id,
        )

    # ------------------------------------------------------------------ properties

    @property
    def role(self) -> Role:
        return self._role

    @property
    def state_name(self) -> str:
        return self._role.value

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def leader_id(self) -> int | None:
        return self._leader_id

    @property
    def voted_id(self) -> int | None:
        return self._voted_id

    @property
    def election_state(self) -> ElectionState:
        return ElectionState(self._epoch, self._leader_id, self._voted_id)

    @property
    def high_watermark(self) -> int:
        """Offsets below this are committed; a consumer's reads stop here."""
        return self._high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.end_offset

    @property
    def durable_end_offset(self) -> int:
        return self.log.durable_end_offset

    @property
    def is_voter(self) -> bool:
        return self.node_id in self.voters

    @property
    def catching_up(self) -> bool:
        """The log lost data it may have acknowledged (``truncate_corrupt``) and is not
        yet durably back past its old end: no votes, no candidacy, no HWM count."""
        return self.log.catch_up_offset > self.log.durable_end_offset

    @property
    def is_leader(self) -> bool:
        return self._role is Role.LEADER

    @property
    def forced(self) -> bool:
        """A leader forced by an unclean election that no majority has followed yet (it
        keeps leading without one: check-quorum waits for it)."""
        st = self._state
        return isinstance(st, LeaderState) and st.forced

    @property
    def epoch_start_offset(self) -> int | None:
        """The leader's first offset of its epoch (its leader-change batch)."""
        return self._state.epoch_start_offset if isinstance(self._state, LeaderState) else None

    @property
    def leader_committed(self) -> bool:
        """A leader that knows everything earlier leaders wrote is committed: an entry of
        its own epoch is, or there was nothing before its epoch (an empty log)."""
        st = self._state
        return isinstance(st, LeaderState) and (
            st.epoch_start_offset == 0 or self._high_watermark > st.epoch_start_offset
        )

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    # ------------------------------------------------------------------ driver API

    def startup_output(self) -> Output:
        """What construction decided (persist, first messages); call once after init."""
        out, self._startup = self._startup, Output()
        return out

    def next_deadline_ms(self) -> int | None:
        """The earliest time ``tick`` has something to do, or None."""
        times = [t for t in self._deadlines() if t is not None]
        return min(times) if times else None

    def tick(self, now_ms: int) -> Output:
        out = Output()
        # A handful of rounds: a timer may start a state whose own timer is already due.
        for _ in range(4):
            before = (self._role, self._epoch, id(self._state))
            self._tick_once(now_ms, out)
            if (self._role, self._epoch, id(self._state)) == before:
                break
        return out

    def handle(self, message: Message, now_ms: int) -> Output:
        out = Output()
        if message.dst != self.node_id:
            logger.warning("replica %s dropped a message for %s", self.node_id, message.dst)
            return out
        if isinstance(message, FetchRequest):
            out.messages.append(self._on_fetch_request(message, now_ms, out))
        elif isinstance(message, FetchResponse):
            self._on_fetch_response(message, now_ms, out)
        elif isinstance(message, VoteRequest):
            out.messages.append(self._on_vote_request(message, now_ms, out))
        elif isinstance(message, VoteResponse):
            self._on_vote_response(message, now_ms, out)
        elif isinstance(message, BeginQuorumEpochRequest):
            out.messages.append(self._on_begin_quorum_epoch(message, now_ms, out))
        elif isinstance(message, BeginQuorumEpochResponse):
            self._on_begin_quorum_epoch_response(message, now_ms, out)
        elif isinstance(message, EndQuorumEpochRequest):
            out.messages.append(self._on_end_quorum_epoch(message, now_ms, out))
        elif isinstance(message, WakeRequest):
            self._on_wake(message, now_ms, out)
        else:
            self._on_end_quorum_epoch_response(message, now_ms, out)
        return out

    def append(self, records: bytes, now_ms: int) -> tuple[AppendInfo, int, Output]:
        """Append client batches as leader; returns (offsets, leader epoch, output).
        The records are committed once ``high_watermark > info.last_offset``."""
        if self._role is not Role.LEADER or self._shutting_down:
            leader = None if self._role is Role.LEADER else self._advertised_leader()
            raise NotLeaderError(leader, self._epoch)
        st = self._state
        assert isinstance(st, LeaderState)
        if st.control_pending:
            st.control_pending = False
            self.log.append_control(self._epoch, self.node_id, list(self.voters), now_ms)
        info = self.log.append_as_leader(records, self._epoch)
        out = Output(fetch_wakeup=True)
        st.last_append_ms = now_ms
        self._wake_quiet(st, now_ms, out)
        return info, self._epoch, out

    def on_log_flushed(self, now_ms: int) -> Output:
        """The driver fsync'd the log: the leader's own durable offset counts now."""
        out = Output()
        if isinstance(self._state, LeaderState):
            self._maybe_advance_high_watermark(self._state, out)
        return out

    def begin_shutdown(self, now_ms: int) -> Output:
        """Graceful shutdown: a leader resigns and sends EndQuorumEpoch with successors
        ranked by replicated offset; this replica will not start elections any more."""
        out = Output()
        self._shutting_down = True
        if isinstance(self._state, LeaderState):
            self._become_resigned(now_ms, out, successors=self._ranked_successors(self._state))
        elif isinstance(self._state, UnattachedState):
            self._state.election_at = None
        return out

    def on_corruption(self, offset: int, now_ms: int) -> Output:
        """The driver found damaged data at ``offset`` in this replica's log (a read, a
        scrub, recovery). A leader resigns; then the log is cut there, remembering its
        old durable end (``catch_up_offset``); the replica re-fetches from the leader
        and, until it is back past that end, neither votes, stands, nor counts towards
        the HWM: so no majority can form without a record it acknowledged."""
        out = Output()
        self._repair(offset, now_ms, out)
        return out

    def on_peer_unreachable(
        self,
        peer: int,
        now_ms: int,
        order: Sequence[int] = (),
        unsettled: AbstractSet[int] = frozenset(),
    ) -> Output:
        """The driver learnt that ``peer``'s node refuses connections: its process is gone
        (a slow or cut-off node times out instead). A follower of that leader stops
        shielding it from others' pre-votes and stands (pre-vote first) instead of after
        its fetch timeout: after a short random delay, plus a fetch timeout per rank in
        ``order`` (the surviving voters as the driver ranks them, the same on every
        node): the first stands at once, the next only if that one has not won by then
        (its node may be gone too). A voter ranked ahead that is in ``unsettled`` (its
        node restarted a moment ago, is silent or refuses connections: it may not follow
        this leader, so it may never take the hint) does not count in the rank; the order
        itself is unchanged. Until it stands it refuses the pre-vote of a voter
        ranked behind it whose log is no longer than its own (``_stands_ahead_of``): two
        survivors never split the vote, even when a loaded node's stand comes late. A
        hint only: a vote and the HWM need what they always need, voters that still hear
        from the leader refuse the pre-vote (a live leader keeps its epoch), and the
        leader's next answer clears it."""
        st = self._state
        if isinstance(st, FollowerState) and st.quiet and self._leader_id == peer:
            # No fetch: nothing listens there. The stand below (or the leader's next
            # message, if the hint was wrong) follows.
            self._resume(st, self.peer_seen.get(peer), now_ms, Output(), fetch=False)
        if isinstance(st, FollowerState) and self._leader_id == peer and not st.leader_unreachable:
            logger.info("replica %s: leader %s refuses connections", self.node_id, peer)
            st.leader_unreachable = True
            st.stand_order = tuple(order)
            ahead = (
                st.stand_order[: st.stand_order.index(self.node_id)]
                if self.node_id in st.stand_order
                else ()
            )
            rank = sum(1 for v in ahead if v not in unsettled)
            jitter = self._rng.randrange(self.config.election_timeout_ms // 4 + 1)
            delay = rank * self.config.fetch_timeout_ms + jitter
            st.fetch_timeout_at = min(st.fetch_timeout_at, now_ms + delay)
        return self.tick(now_ms)

    def on_peer_change(self, peer: int, now_ms: int) -> Output:
        """The driver's view of ``peer``'s node changed: it went silent for a fetch
        timeout, restarted, or was heard again after that. What its heartbeats vouched
        for no longer holds. A follower quiesced under that leader resumes as if it had
        last heard from the leader at its last heartbeat (the fetch timeout runs from
        there); a leader stops counting that quiesced replica as following and wakes it
        (resent while its node is heard, until it fetches), and announces its epoch to it
        if it never acknowledged it."""
        out = Output()
        st = self._state
        if isinstance(st, FollowerState) and st.quiet and self._leader_id == peer:
            self._resume(st, self.peer_seen.get(peer), now_ms, out)
        elif isinstance(st, LeaderState):
            if peer in st.quiet or peer in st.wake_unacked:
                self._unquiet(st, peer, now_ms)
                st.wake_unacked.add(peer)
                self._send_wakes(st, now_ms, out)
            if peer in st.begin_unacked:
                self._send_begin_quorum_epoch(st, now_ms, out)
        return out

    def stand_first(self, at_ms: int) -> None:
        """A brand-new partition's preferred replica: it stands at ``at_ms`` as a
        candidate without a pre-vote (there is no leader to disturb yet). Only for a
        replica that never had an epoch and holds nothing; otherwise nothing happens."""
        st = self._state
        if (
            isinstance(st, UnattachedState)
            and st.election_at is not None
            and self._epoch == 0
            and self._voted_id is None
            and self.log.end_offset == 0
            and self._can_elect()
        ):
            self._state = UnattachedState(at_ms, direct_candidate=True)

    def hand_over(self, successor: int, now_ms: int) -> Output:
        """Preferred-leader rebalance (Kafka's ``auto.leader.rebalance.enable``): a leader
        resigns in favour of ``successor`` (the partition's preferred replica), ranked
        first in its EndQuorumEpoch so it stands at once, but only when that voter holds
        everything this leader has, all of it committed, and its node is heard: the
        hand-over costs one election and loses nothing. Otherwise nothing happens."""
        out = Output()
        st = self._state
        if not isinstance(st, LeaderState) or self._shutting_down or successor == self.node_id:
            return out
        row = st.progress.get(successor)
        end = self.log.end_offset
        heard = self.peer_seen.get(successor, now_ms) >= now_ms - self.config.fetch_timeout_ms
        if (
            row is None
            or successor in st.catching_up
            or successor in st.begin_unacked
            or st.forced
            or not heard
            or not row.end_offset == end == self._high_watermark
        ):
            return out
        logger.info(
            "replica %s hands epoch %s over to preferred replica %s",
            self.node_id,
            self._epoch,
            successor,
        )
        others = tuple(r for r in self._ranked_successors(st) if r != successor)
        self._become_resigned(now_ms, out, successors=(successor, *others))
        return out

    @property
    def quiesced(self) -> bool:
        """No timer runs for this replica and it sends nothing until an event: a
        quiesced follower, or a leader whose voters are all quiesced."""
        st = self._state
        if isinstance(st, FollowerState):
            return st.quiet
        return isinstance(st, LeaderState) and self._all_quiet(st) and not st.wake_unacked

    def begin_catch_up(self, now_ms: int, floor: int | None = None) -> Output:
        """The driver learnt this replica may lack records it acknowledged below
        ``floor`` (None: below a point not known yet, as when its data directory replaced
        a lost one). Persisted in the log (``mark_catch_up``). A leader resigns; the
        replica neither votes, nor stands, nor counts towards the HWM until it is durably
        past the floor; an unknown floor becomes the ``catch_up_floor`` of the first
        answer from a leader it follows (every acknowledged record lies below it)."""
        out = Output()
        self.log.mark_catch_up(CATCH_UP_UNKNOWN if floor is None else floor)
        if self.catching_up:
            logger.warning(
                "replica %s (%s, epoch %s): catching up (floor %s) before it may vote again",
                self.node_id,
                self._role.value,
                self._epoch,
                "unknown" if floor is None else floor,
            )
            st = self._state
            if isinstance(st, LeaderState):
                self._become_resigned(now_ms, out, self._ranked_successors(st))
            self._stop_standing(now_ms, out)
            self._probe_epochs_of_voters(now_ms, out)
        return out

    def _probe_epochs_of_voters(self, now_ms: int, out: Output) -> None:
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

    def _floor_source(self, leader_epoch: int) -> bool:
        """A leader of ``leader_epoch`` may set an unknown catch-up floor (see above)."""
        need = len(self.voters) - self.majority + 1
        return len(self._probe_epochs) >= need and max(self._probe_epochs.values()) <= leader_epoch

    def force_leader(self, now_ms: int, min_epoch: int = 0) -> Output:
        """Unclean leader election (operator command): lead a new epoch without votes.

        Committed data this replica lacks is lost: followers truncate to this log when
        they fetch (``truncated_below_high_watermark``) and readers see it through
        ``end_offset_for``. The HWM still needs a majority of voters to advance.
        The new epoch must never be reached by an ordinary election among voters this
        replica cannot reach (they may be partitioned, not dead), which it alone cannot
        know: the operator tool passes ``min_epoch`` = the highest epoch any replica
        reports + ``UNCLEAN_EPOCH_GAP``; ordinary elections move one epoch at a time, so
        they would need that many elections while cut off to collide.
        """
        if not self.is_voter:
            raise ValueError(f"replica {self.node_id} is an observer; only a voter can lead")
        out = Output()
        epoch = max(self._epoch + 1, self.log.last_epoch() + 1, min_epoch)
        logger.warning(
            "replica %s forced to lead epoch %s without a majority (unclean election)",
            self.node_id,
            epoch,
        )
        self._shutting_down = False
        self._set_election(epoch, None, self.node_id, out)
        self._become_leader(now_ms, out)
        if isinstance(self._state, LeaderState):
            # It leads because the majority is gone: resigning for want of one (check-quorum)
            # would undo the operator's choice, and the old majority, back with its longer
            # log, could then elect one of its own and revert this epoch under readers who
            # already saw it. The rule applies once a majority has followed.
            self._state.forced = True
        return out

    def check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        """The one fencing rule for requests the driver serves from the log (consumer
        Fetch, ListOffsets, OffsetsForLeaderEpoch): -1 skips the epoch comparison; only
        the leader serves."""
        if current_leader_epoch != UNKNOWN:
            if current_leader_epoch < self._epoch:
                return ErrorCode.FENCED_LEADER_EPOCH
            if current_leader_epoch > self._epoch:
                return ErrorCode.UNKNOWN_LEADER_EPOCH
        if self._role is not Role.LEADER:
            return ErrorCode.NOT_LEADER
        return ErrorCode.NONE

    def describe(self, now_ms: int) -> QuorumDescription:
        voters: list[ReplicaProgress] = []
        observers: list[ReplicaProgress] = []
        if isinstance(self._state, LeaderState):
            end = self.log.end_offset
            for row in self._state.progress.values():
                voters.append(_with_lag(row, end))
            voters.append(ReplicaProgress(self.node_id, self.log.durable_end_offset, now_ms, 0))
            voters.sort(key=lambda r: r.replica_id)
            observers = sorted(
                (_with_lag(r, end) for r in self._state.observers.values()),
                key=lambda r: r.replica_id,
            )
        return QuorumDescription(
            self.node_id,
            self._role.value,
            self._leader_id,
            self._epoch,
            self._high_watermark,
            voters,
            observers,
        )

    # ------------------------------------------------------------------ transitions

    def _set_election(
        self, epoch: int, leader_id: int | None, voted_id: int | None, out: Output
    ) -> None:
        """The one place epoch, leader and vote change; the driver persists the result
        before it sends anything of this step."""
        if epoch < self._epoch:
            raise AssertionError(f"epoch would go back from {self._epoch} to {epoch}")
        new = ElectionState(epoch, leader_id, voted_id)
        if new != self.election_state:
            self._epoch, self._leader_id, self._voted_id = epoch, leader_id, voted_id
            out.persist = new

    def _election_timeout(self, now_ms: int) -> int:
        jitter = self.config.jitter_ms
        return (
            now_ms
            + self.config.election_timeout_ms
            + (self._rng.randrange(jitter) if jitter else 0)
        )

    def _election_backoff(self, retries: int) -> int:
        """min(retry_backoff * rand[0, 2^retries), election.backoff.max) (Kafka's)."""
        spread = 1 << min(retries, 20)
        return min(
            self.config.retry_backoff_ms * self._rng.randrange(spread),
            self.config.election_backoff_max_ms,
        )

    def _can_elect(self) -> bool:
        return self.is_voter and not self._shutting_down and not self.catching_up

    def _may_vote(self) -> bool:
        """A replica that lost data it may have acknowledged must not help elect a
        leader that lacks it."""
        return self.is_voter and not self.catching_up

    def _become_unattached(
        self, now_ms: int, out: Output, *, epoch: int | None = None, direct_at: int | None = None
    ) -> None:
        if epoch is not None and epoch > self._epoch:
            self._set_election(epoch, None, None, out)
        was_leader = self._role is Role.LEADER
        self._role = Role.UNATTACHED
        if not self.is_voter or (self.catching_up and not self._shutting_down):
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
        self,
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
        self,
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
        if len(st.granted) >= self.majority:
            self._become_candidate(now_ms, out, retries)
            return
        self._send_vote_requests(st, pre_vote=True, now_ms=now_ms, out=out)

    def _become_candidate(self, now_ms: int, out: Output, retries: int) -> None:
        self._set_election(self._epoch + 1, None, self.node_id, out)
        self._become_candidate_in_current_epoch(now_ms, out, retries)

    def _become_candidate_in_current_epoch(self, now_ms: int, out: Output, retries: int) -> None:
        self._role = Role.CANDIDATE
        st = CandidateState(self._election_timeout(now_ms), retries, granted={self.node_id})
        self._state = st
        logger.info("replica %s is a candidate in epoch %s", self.node_id, self._epoch)
        if len(st.granted) >= self.majority:
            self._become_leader(now_ms, out)
            return
        self._send_vote_requests(st, pre_vote=False, now_ms=now_ms, out=out)

    def _become_leader(self, now_ms: int, out: Output) -> None:
        self._set_election(self._epoch, self.node_id, self.node_id, out)
        self._role = Role.LEADER
        # Raft commits earlier epochs' entries only through one of this epoch: the
        # leader-change record, written now. An empty log has no earlier entries: the
        # record waits for the epoch's first client records (a new partition's first
        # leader costs no write, file or flush until it is produced to).
        deferred = self._defers_epoch_record()
        start = (
            0
            if deferred
            else self.log.append_control(
                self._epoch, self.node_id, list(self.voters), now_ms
            ).first_offset
        )
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

    def _defers_epoch_record(self) -> bool:
        """Only an empty log may wait for its epoch's first records to write the
        leader-change record: with earlier entries there, they could be committed
        before any entry of this epoch (Raft's figure 8)."""
        return self.log.end_offset == 0

    def _become_resigned(self, now_ms: int, out: Output, successors: tuple[int, ...]) -> None:
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
        self, epoch: int, leader_id: int | None, now_ms: int, out: Output, src: int
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

    # ------------------------------------------------------------------ timers

    def _deadlines(self) -> list[int | None]:
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

    def _tick_once(self, now_ms: int, out: Output) -> None:
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
                if len(self._followed_since_check(st)) + 1 >= self.majority:
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

    def _tick_follower(self, st: FollowerState, now_ms: int, out: Output) -> None:
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
            elif not self.is_voter:
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

    def _prospective_failed(self, st: ProspectiveState, now_ms: int, out: Output) -> None:
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

    def _candidate_failed(self, st: CandidateState, now_ms: int) -> None:
        st.retries += 1
        st.backoff_until = now_ms + self._election_backoff(st.retries)
        logger.info(
            "replica %s lost the election in epoch %s; retry in %s ms",
            self.node_id,
            self._epoch,
            st.backoff_until - now_ms,
        )

    def _reset_check_quorum(self, st: LeaderState, now_ms: int, followed: bool = True) -> None:
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

    def _all_quiet(self, st: LeaderState) -> bool:
        return len(st.quiet) >= len(st.progress) and all(v in st.quiet for v in st.progress)

    def _quiet_quorum(self, st: LeaderState) -> bool:
        """This leader and its quiesced voters are a majority. Their nodes' heartbeats
        vouch for them (the driver's ``on_peer_change`` unquiets one whose node falls
        silent), so check-quorum needs no timer: a partition with a voter on a dead node
        costs nothing while the others are quiesced."""
        return 1 + sum(1 for v in st.quiet if v in st.progress) >= self.majority

    def _followed_since_check(self, st: LeaderState) -> set[int]:
        """Voters that fetched in this check-quorum period, and quiesced voters whose
        node was heard from in it."""
        since = st.check_quorum_at - self.config.check_quorum_timeout_ms
        alive = {v for v in st.quiet if v in st.progress and self.peer_seen.get(v, -1) >= since}
        return st.fetched_since_check | alive

    def _may_quiesce(self, st: LeaderState, req: FetchRequest, now_ms: int) -> bool:
        end = self.log.end_offset
        return (
            self.config.quiesce
            and req.max_wait_ms > 0
            and not req.catching_up
            and not st.forced
            and req.replica_id not in st.begin_unacked
            and req.fetch_offset == end == self._high_watermark == self.log.durable_end_offset
            and now_ms - st.last_append_ms >= self.config.quiesce_after_ms
        )

    def _unquiet(self, st: LeaderState, replica: int, now_ms: int) -> None:
        if replica not in st.quiet:
            return
        slept = self._quiet_quorum(st)
        st.quiet.discard(replica)
        if slept and not self._quiet_quorum(st):
            # Check-quorum slept while a majority was quiesced: a fresh period.
            st.fetched_since_check.clear()
            st.check_quorum_at = now_ms + self.config.check_quorum_timeout_ms

    def _wake_quiet(self, st: LeaderState, now_ms: int, out: Output) -> None:
        if st.quiet:
            for replica in list(st.quiet):
                self._unquiet(st, replica, now_ms)
                st.wake_unacked.add(replica)
            self._send_wakes(st, now_ms, out)

    def _send_wakes(self, st: LeaderState, now_ms: int, out: Output) -> None:
        """Wake each replica in ``wake_unacked`` whose node is heard (a silent one is
        woken by ``on_peer_change`` when it is heard again); resend while any is."""
        st.wake_resend_at = self._announce(
            WakeRequest, self._heard(st.wake_unacked, now_ms), now_ms, out
        )

    def _on_wake(self, req: WakeRequest, now_ms: int, out: Output) -> None:
        if req.cluster_id != self.cluster_id or self._announcement_error(req) != ErrorCode.NONE:
            return
        if self._maybe_learn(req.leader_epoch, req.leader_id, now_ms, out, req.src):
            return
        st = self._state
        if isinstance(st, FollowerState) and st.quiet and self._leader_id == req.leader_id:
            self._resume(st, now_ms, now_ms, out)

    def _resume(
        self,
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

    # ------------------------------------------------------------------ senders

    def _send_vote_requests(
        self,
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

    def _fetch_request(
        self,
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
        )

    def _send_fetch(self, st: FollowerState, now_ms: int, out: Output) -> None:
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

    def _discover_leader(self, st: UnattachedState, now_ms: int, out: Output) -> None:
        """An observer without a leader asks a random voter (any answer names one)."""
        target = self._rng.choice(self.voters)
        out.messages.append(self._fetch_request(target, 0, self.config.fetch_max_bytes, 0))
        st.discover_at = now_ms + self.config.retry_backoff_ms + self.config.request_timeout_ms
        self._probe_epochs_of_voters(now_ms, out)

    def _send_begin_quorum_epoch(self, st: LeaderState, now_ms: int, out: Output) -> None:
        """Announce the epoch to each voter in ``begin_unacked`` whose node is heard (a
        silent one is told by ``on_peer_change`` when it is heard again); resend while
        any is."""
        st.begin_resend_at = self._announce(
            BeginQuorumEpochRequest, self._heard(st.begin_unacked, now_ms), now_ms, out
        )

    def _heard(self, replicas: set[int], now_ms: int) -> list[int]:
        """Those of ``replicas`` whose node was heard within the fetch timeout (or never
        reported on yet): the ones a message may reach."""
        since = now_ms - self.config.fetch_timeout_ms
        return [r for r in sorted(replicas) if self.peer_seen.get(r, now_ms) >= since]

    def _send_end_quorum_epoch(self, st: ResignedState, now_ms: int, out: Output) -> None:
        st.end_resend_at = self._announce(
            EndQuorumEpochRequest,
            sorted(st.end_unacked),
            now_ms,
            out,
            preferred_successors=st.successors,
        )

    def _announce(
        self,
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

    def _ranked_successors(self, st: LeaderState) -> tuple[int, ...]:
        rows = sorted(st.progress.values(), key=lambda r: (-r.end_offset, r.replica_id))
        return tuple(r.replica_id for r in rows if r.replica_id not in st.catching_up)

    # ------------------------------------------------------------------ votes

    def _log_at_least_ours(self, last_epoch: int, end_offset: int) -> bool:
        return (last_epoch, end_offset) >= (self.log.last_epoch(), self.log.end_offset)

    def _stands_ahead_of(self, req: VoteRequest) -> bool:
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

    def _heard_from_leader(self, now_ms: int) -> bool:
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

    def _advertised_leader(self) -> int | None:
        """The leader we name in answers: a resigned leader names none."""
        return None if self._role is Role.RESIGNED else self._leader_id

    def _vote_grantable(self, req: VoteRequest) -> bool:
        return (
            self._may_vote()
            and self._role in (Role.UNATTACHED, Role.PROSPECTIVE)
            and self._leader_id is None
            and self._voted_id in (None, req.src)
            and self._log_at_least_ours(req.last_offset_epoch, req.last_offset)
        )

    def _answer(self, cls: type[_Answer], dst: int, error: ErrorCode, **fields: Any) -> _Answer:
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

    def _stale_or_taught(self, resp: EpochResponse, now_ms: int, out: Output) -> bool:
        """True when a response is for another cluster, or named a newer epoch or a leader
        we did not know (``_maybe_learn`` acted on it): its handler stops there."""
        return resp.cluster_id != self.cluster_id or self._maybe_learn(
            resp.leader_epoch, resp.leader_id, now_ms, out, resp.src
        )

    def _announcement_error(self, req: LeaderAnnouncement) -> ErrorCode:
        """Begin/EndQuorumEpoch from another cluster or an older epoch are refused."""
        if req.cluster_id != self.cluster_id:
            return ErrorCode.INVALID_CLUSTER_ID
        if req.leader_epoch < self._epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        return ErrorCode.NONE

    def _vote_response(self, req: VoteRequest, error: ErrorCode, granted: bool) -> VoteResponse:
        return self._answer(
            VoteResponse,
            req.src,
            error,
            vote_granted=granted,
            pre_vote=req.pre_vote,
            candidate_epoch=req.candidate_epoch,
        )

    def _on_vote_request(self, req: VoteRequest, now_ms: int, out: Output) -> VoteResponse:
        if req.cluster_id != self.cluster_id:
            return self._vote_response(req, ErrorCode.INVALID_CLUSTER_ID, False)
        if req.src not in self.voters:
            return self._vote_response(req, ErrorCode.INCONSISTENT_VOTER_SET, False)
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

    def _on_vote_response(self, resp: VoteResponse, now_ms: int, out: Output) -> None:
        if resp.error == ErrorCode.INVALID_CLUSTER_ID or self._stale_or_taught(resp, now_ms, out):
            return
        st = self._state
        if resp.pre_vote:
            if not isinstance(st, ProspectiveState) or st.retry_at is not None:
                return
            if resp.candidate_epoch != self._epoch + 1:
                return
            (st.granted if resp.vote_granted else st.rejected).add(resp.src)
            if len(st.granted) >= self.majority:
                self._become_candidate(now_ms, out, st.retries)
            elif len(st.rejected) > len(self.voters) - self.majority:
                self._prospective_failed(st, now_ms, out)
        else:
            if not isinstance(st, CandidateState) or st.backoff_until is not None:
                return
            if resp.candidate_epoch != self._epoch:
                return
            (st.granted if resp.vote_granted else st.rejected).add(resp.src)
            if len(st.granted) >= self.majority:
                self._become_leader(now_ms, out)
            elif len(st.rejected) > len(self.voters) - self.majority:
                self._candidate_failed(st, now_ms)

    # ------------------------------------------------------------------ Begin/EndQuorumEpoch

    def _on_begin_quorum_epoch(
        self, req: BeginQuorumEpochRequest, now_ms: int, out: Output
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
        self, resp: BeginQuorumEpochResponse, now_ms: int, out: Output
    ) -> None:
        if self._stale_or_taught(resp, now_ms, out):
            return
        if isinstance(self._state, LeaderState) and resp.leader_epoch == self._epoch:
            self._state.begin_unacked.discard(resp.src)

    def _end_quorum_backoff(self, successors: tuple[int, ...], now_ms: int) -> int:
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
        self, req: EndQuorumEpochRequest, now_ms: int, out: Output
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
        self, resp: EndQuorumEpochResponse, now_ms: int, out: Output
    ) -> None:
        if self._stale_or_taught(resp, now_ms, out):
            return
        if isinstance(self._state, ResignedState):
            self._state.end_unacked.discard(resp.src)
            if not self._state.end_unacked:
                self._state.end_resend_at = None

    # ------------------------------------------------------------------ fetch

    def _fetch_error(self, req: FetchRequest, error: ErrorCode) -> FetchResponse:
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

    def _on_fetch_request(self, req: FetchRequest, now_ms: int, out: Output) -> FetchResponse:
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
        if is_voter:
            # A fetch in this epoch acknowledges BeginQuorumEpoch (as Kafka's leader
            # counts it): it may be what arrives first, in the frame that carries both.
            st.begin_unacked.discard(req.replica_id)
            if req.catching_up:
                st.catching_up.add(req.replica_id)
            else:
                st.catching_up.discard(req.replica_id)
            st.fetched_since_check.add(req.replica_id)
            if len(st.fetched_since_check) + 1 >= self.majority:
                self._reset_check_quorum(st, now_ms)

        diverging: tuple[int, int] | None = None
        if req.fetch_offset > 0:
            end = self.log.end_offset_for(req.last_fetched_epoch)
            if end.epoch != req.last_fetched_epoch or end.end_offset < req.fetch_offset:
                diverging = (end.epoch, end.end_offset)

        if diverging is None:
            rows = st.progress if is_voter else st.observers
            row = rows.setdefault(req.replica_id, ReplicaProgress(req.replica_id))
            # fetch_offset is durable on the fetcher and matches our log below it.
            row.end_offset = req.fetch_offset
            row.last_fetch_ms = now_ms
            if is_voter:
                self._maybe_advance_high_watermark(st, out)

        records = b""
        if diverging is None and req.fetch_offset < self.log.end_offset:
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

    def _maybe_advance_high_watermark(self, st: LeaderState, out: Output) -> None:
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

    def _counted_offsets(self, st: LeaderState) -> list[int]:
        """What counts towards the HWM: the leader's durable end and each voter's fetch
        offset (durable there), except voters catching up; observers never count."""
        return [self.log.durable_end_offset] + [
            r.end_offset for r in st.progress.values() if r.replica_id not in st.catching_up
        ]

    def _commit_floor(self, st: LeaderState) -> int:
        """The HWM must pass this first: the leader's own epoch start (Raft commits
        earlier epochs' entries only through one of its own)."""
        return st.epoch_start_offset

    def _on_fetch_response(self, resp: FetchResponse, now_ms: int, out: Output) -> None:
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
                except ValueError:
                    logger.exception("replica %s: fetched batches do not fit", self.node_id)
                    st.fetch_retry_at = now_ms + self.config.retry_backoff_ms
                    return
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

    def _repair(self, offset: int, now_ms: int, out: Output) -> None:
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

    def _stop_standing(self, now_ms: int, out: Output) -> None:
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

    def _truncate_to_diverging(self, diverging: tuple[int, int], out: Output) -> None:
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


def _with_lag(row: ReplicaProgress, leader_end: int) -> ReplicaProgress:
    lag = leader_end - row.end_offset if row.end_offset >= 0 else UNKNOWN
    return ReplicaProgress(row.replica_id, row.end_offset, row.last_fetch_ms, lag)
