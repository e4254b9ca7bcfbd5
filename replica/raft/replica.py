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

from ..constants import UNKNOWN
from ..protocol.errors import ErrorCode
from ..storage.records import TxnMarker
from .announce import AnnounceRole
from .config import QuorumConfig
from .disk import DiskRole
from .election import ElectionRole
from .follower import FollowerRole
from .leader import LeaderRole
from .liveness import LivenessRole
from .log import CATCH_UP_UNKNOWN, AppendInfo, ReplicaLog
from .membership import MembershipRole, VoterChangeError
from .messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    Message,
    VoteRequest,
    VoteResponse,
    WakeRequest,
)
from .output import UNCLEAN_EPOCH_GAP, NotLeaderError, Output, QuorumDescription, _with_lag
from .state import (
    ElectionState,
    FollowerState,
    LeaderState,
    ReplicaProgress,
    Role,
    RoleState,
    UnattachedState,
)

__all__ = [
    "UNCLEAN_EPOCH_GAP",
    "NotLeaderError",
    "Output",
    "QuorumDescription",
    "RaftReplica",
    "VoterChangeError",
]

logger = logging.getLogger(__name__)


class RaftReplica(
    ElectionRole,
    AnnounceRole,
    LivenessRole,
    LeaderRole,
    FollowerRole,
    DiskRole,
    MembershipRole,
):
    """One replica of one partition's quorum.

    ``voters`` is the voter set it is created with; the latest voter-set record in its
    log replaces it (``MembershipRole.voters``). A node not in it is an observer
    (fetches, never votes, never counts towards the HWM). ``persisted`` is the quorum-state file's content or
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
        self._base_voters: tuple[int, ...] = tuple(sorted(set(voters)))
        self.cluster_id = cluster_id
        self.log = log
        self._rng = rng
        self._shutting_down = False
        # Whether this node, on its view of the partition's moves, hosts this replica:
        # said in its fetches (``FetchRequest.assigned``); the driver sets it.
        self.assigned = True
        # The log could not be written or made durable in time: no candidacy until a
        # write succeeds (``on_disk_fault``).
        self._disk_fault = False
        self._disk_retry_at = 0
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
        if self._disk_fault:
            times.append(self._disk_retry_at)
        return min(times) if times else None

    def tick(self, now_ms: int) -> Output:
        out = Output()
        if self._disk_fault and now_ms >= self._disk_retry_at:
            self._disk_retry(now_ms, out)
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
        if isinstance(self._state, LeaderState):
            self._resign_if_removed(self._state, now_ms, out)
        return out

    def append(
        self, records: bytes | Sequence[TxnMarker], now_ms: int, *, timestamp_ms: int = -1
    ) -> tuple[AppendInfo, int, Output]:
        """Append client batches as leader; returns (offsets, leader epoch, output).
        The records are committed once ``high_watermark > info.last_offset``. Given
        transaction markers instead, they are appended (``ReplicaLog.append_markers``)
        with record timestamp ``timestamp_ms``."""
        if self._role is not Role.LEADER or self._shutting_down:
            leader = None if self._role is Role.LEADER else self._advertised_leader()
            raise NotLeaderError(leader, self._epoch)
        st = self._state
        assert isinstance(st, LeaderState)
        if st.control_pending:
            # Raises DiskError (the driver then calls ``on_disk_fault``), still pending.
            self.log.append_control(self._epoch, self.node_id, list(self.voters), now_ms)
            st.control_pending = False
        if isinstance(records, bytes):
            info = self.log.append_as_leader(records, self._epoch)
        else:
            info = self.log.append_markers(records, self._epoch, timestamp_ms)
        out = Output(fetch_wakeup=True)
        st.last_append_ms = now_ms
        self._wake_quiet(st, now_ms, out)
        return info, self._epoch, out

    def on_log_flushed(self, now_ms: int) -> Output:
        """The driver fsync'd the log: the leader's own durable offset counts now."""
        out = Output()
        if isinstance(self._state, LeaderState):
            self._maybe_advance_high_watermark(self._state, out)
            self._resign_if_removed(self._state, now_ms, out)
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
            own = ReplicaProgress(self.node_id, self.log.durable_end_offset, now_ms, 0)
            observers = [_with_lag(r, end) for r in self._state.observers.values()]
            # A leader that removed itself leads on, as an observer, until that commits.
            (voters if self.is_voter else observers).append(own)
            voters.sort(key=lambda r: r.replica_id)
            observers.sort(key=lambda r: r.replica_id)
        return QuorumDescription(
            self.node_id,
            self._role.value,
            self._leader_id,
            self._epoch,
            self._high_watermark,
            voters,
            observers,
        )
