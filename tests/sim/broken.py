"""Cores and drivers with one rule broken on purpose: the simulator must catch each
(its teeth)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from quorumlog.replica.constants import UNKNOWN
from quorumlog.replica.driver import Driver, PartitionDriver, Ready
from quorumlog.replica.driver.partition import Produced
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.txn import TxnMetadata, TxnState
from quorumlog.replica.protocol import ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import CATCH_UP_UNKNOWN, RaftReplica, VoteRequest
from quorumlog.replica.raft.replica import Output
from quorumlog.replica.raft.state import FollowerState, LeaderState, Role
from quorumlog.replica.storage.producers import ProducerStateTable
from quorumlog.replica.storage.transactions import AbortedTxn, TransactionIndex

from .compaction import SimCleaner
from .coordinator import PendingMarker, SimCoordinator
from .memlog import GONE, MemLog


class TwoVotesPerEpoch(RaftReplica):
    """Grants a vote to any candidate with a good enough log, even after voting."""

    def _vote_grantable(self, req: VoteRequest) -> bool:
        return (
            self.is_voter
            and self._role in (Role.UNATTACHED, Role.PROSPECTIVE)
            and self._leader_id is None
            and self._log_at_least_ours(req.last_offset_epoch, req.last_offset)
        )


class HwmCountsObservers(RaftReplica):
    """Counts observers' fetch offsets as if they were voters."""

    def _counted_offsets(self, st: LeaderState) -> list[int]:
        return super()._counted_offsets(st) + [r.end_offset for r in st.observers.values()]


class AddsUnassigned(RaftReplica):
    """Adds a replica whose node does not host it yet on its view of the move (its
    fetches say ``assigned=False``)."""

    def _check_voter_change(
        self, new: tuple[int, ...], now_ms: int, asked_ms: int = UNKNOWN
    ) -> Any:
        if isinstance(self._state, LeaderState):
            self._state.unassigned.clear()
        return super()._check_voter_change(new, now_ms, asked_ms)


class CountsNewVotersAtOnce(AddsUnassigned):
    """Also counts a voter the latest change added before it holds that change: the
    rule that keeps a copy its node deletes uncounted when a leader added it anyway."""

    def counts(self, row: Any) -> bool:
        st = self._state
        return not (isinstance(st, LeaderState) and row.replica_id in st.catching_up)


class HwmCountsUnflushed(RaftReplica):
    """The leader counts its own log end, flushed or not."""

    def _counted_offsets(self, st: LeaderState) -> list[int]:
        return [self.log.end_offset] + super()._counted_offsets(st)[1:]


class HwmIgnoresEpochStart(RaftReplica):
    """Commits previous epochs' entries before one of its own epoch is replicated."""

    def _commit_floor(self, st: LeaderState) -> int:
        return -1


class DefersEpochRecordOnAnyLog(RaftReplica):
    """Writes its leader-change record only with its first client records even when
    earlier epochs' entries are in the log, counting its epoch from offset 0: those
    entries commit on a count of replicas alone."""

    def _defers_epoch_record(self) -> bool:
        return True


class VotesWhileCatchingUp(RaftReplica):
    """Grants votes after losing data to corruption, before it has caught back up."""

    def _may_vote(self) -> bool:
        return self.is_voter


class VotesWithUnknownFloor(RaftReplica):
    """Grants votes while its data directory replaced a lost one (floor unknown)."""

    def _may_vote(self) -> bool:
        if self.log.catch_up_offset == CATCH_UP_UNKNOWN:
            return self.is_voter
        return super()._may_vote()


class NeverWakes(RaftReplica):
    """Quiesces idle followers but never wakes them when records arrive."""

    def _send_wakes(self, st: LeaderState, now_ms: int, out: Output) -> None:
        st.wake_resend_at = None


class IgnoresPeerChanges(RaftReplica):
    """A quiesced follower keeps trusting its leader after the leader's node went
    silent or restarted."""

    def on_peer_change(self, peer: int, now_ms: int) -> Output:
        return Output()


class ChecksQuorumNever(RaftReplica):
    """Counts its quorum as quiesced always: check-quorum never runs, and a leader cut
    off from its voters goes on leading."""

    def _quiet_quorum(self, st: LeaderState) -> bool:
        return True


BROKEN = {
    "two-votes-per-epoch": TwoVotesPerEpoch,
    "hwm-counts-observers": HwmCountsObservers,
    "hwm-counts-unflushed": HwmCountsUnflushed,
    "hwm-ignores-epoch-start": HwmIgnoresEpochStart,
    "votes-while-catching-up": VotesWhileCatchingUp,
    "votes-with-unknown-floor": VotesWithUnknownFloor,
    "never-wakes": NeverWakes,
    "ignores-peer-changes": IgnoresPeerChanges,
    "checks-quorum-never": ChecksQuorumNever,
}


# ---------------------------------------------------------------------- broken drivers
# Each breaks one driver rule of replica.driver; the simulator runs them as it runs the
# real driver (Simulation(driver_class=...)).


class _AcksBeforeCommit(PartitionDriver):
    def produce(self, token: int, req: m.ProduceRequest, now: int, ready: Ready) -> None:
        super().produce(token, dataclasses.replace(req, acks=m.ACKS_LEADER), now, ready)


class _MixesUpMergedAnswers(PartitionDriver):
    """Answers each of the produce requests appended together with the offsets of the
    one before it (the first with the last's)."""

    def produce_together(self, items: Sequence[Produced], now: int, ready: Ready) -> None:
        tokens = [token for token, _, _ in items]
        mixed = tokens[-1:] + tokens[:-1]
        super().produce_together(
            [(token, req, span) for token, (_, req, span) in zip(mixed, items, strict=True)],
            now,
            ready,
        )


class _SendsBeforeFlush(PartitionDriver):
    def run(self, out: Output, now: int, ready: Ready) -> None:
        out.flush_log = False
        super().run(out, now, ready)


class _ServesAboveHwm(PartitionDriver):
    def _serve(self, req: m.FetchRequest, now: int, ready: Ready) -> m.FetchResponse | None:
        resp = super()._serve(req, now, ready)
        if resp is None and req.fetch_offset < self.log.end_offset:  # fenced, not committed
            data = self.log.read(req.fetch_offset, req.max_bytes)
            return self._fetched(ErrorCode.NONE, "", data)
        return resp


class _SendsBeforePersist(PartitionDriver):
    """Hands out a new election state one step late, after the messages it governs."""

    late: Any = None

    def run(self, out: Output, now: int, ready: Ready) -> None:
        if self.late is not None and out.persist is None:
            out.persist = self.late
        self.late, out.persist = out.persist, None
        super().run(out, now, ready)


class _AddsOnStaleCatchUp(PartitionDriver):
    """Counts a replica's catch-up from before its move was asked for: a copy its node
    deleted after its removal, while the leader kept its row."""

    @property
    def target_since(self) -> int:
        return UNKNOWN

    @target_since.setter
    def target_since(self, value: int) -> None:
        pass


class _CopiesToAllAtOnce(PartitionDriver):
    """A move's new replicas all copy at once, and each is added once caught up, before
    any voter leaves: the voters outnumber the target by as many as it adds."""

    def waits_turn(self, replica: int, now: int) -> bool:
        return False

    def next_voters(self, now: int) -> tuple[int, ...] | None:
        core, target = self.core, self.target
        if target is None or not core.is_leader or core.voter_change_pending:
            return None
        current = set(core.voters)
        adding = sorted(set(target) - current)
        for voter in adding:
            if self.fetched_at.get(voter, UNKNOWN) < self.target_since:
                continue
            step = tuple(sorted(current | {voter}))
            if core.voter_change_problem(step, now, asked_ms=self.target_since) is None:
                return step
        if adding:
            return None
        for voter in sorted(current - set(target), key=lambda v: (v == core.node_id, v)):
            step = tuple(sorted(current - {voter}))
            if core.voter_change_problem(step, now) is None:
                return step
        return None


def _driver(partition: type[PartitionDriver]) -> type[Driver]:
    return type(partition.__name__.lstrip("_"), (Driver,), {"partition_class": partition})


class TellsNewsOneTickOnly(Driver):
    """Hands a peer's change to the partitions its first telling step can tell (the step
    that notices it, or a tick), and drops the rest."""

    def _tell_news(self, now: int, ready: Ready) -> None:
        super()._tell_news(now, ready)
        self._news.clear()
        self._news_at = None


AcksBeforeCommit = _driver(_AcksBeforeCommit)
MixesUpMergedAnswers = _driver(_MixesUpMergedAnswers)
SendsBeforeFlush = _driver(_SendsBeforeFlush)
ServesAboveHwm = _driver(_ServesAboveHwm)
SendsBeforePersist = _driver(_SendsBeforePersist)
AddsOnStaleCatchUp = _driver(_AddsOnStaleCatchUp)
CopiesToAllAtOnce = _driver(_CopiesToAllAtOnce)

BROKEN_DRIVERS = {
    "acks-before-commit": AcksBeforeCommit,
    "mixes-up-merged-answers": MixesUpMergedAnswers,
    "sends-before-flush": SendsBeforeFlush,
    "serves-above-hwm": ServesAboveHwm,
    "sends-before-persist": SendsBeforePersist,
    "tells-news-one-tick-only": TellsNewsOneTickOnly,
    "adds-on-stale-catch-up": AddsOnStaleCatchUp,
    "copies-to-all-at-once": CopiesToAllAtOnce,
}


# ---------------------------------------------------------------------- broken logs
# The simulator's in-memory log checks idempotent producers with the product's
# ProducerStateTable; this one forgets what it saw, so a retry is appended again.


class _ForgetfulProducerState(ProducerStateTable):
    def check(self, producer_id: int, producer_epoch: int, first: int, last: int) -> None:
        return None


class ForgetsProducers(MemLog):
    table_class = _ForgetfulProducerState


class _TrustingProducerState(ProducerStateTable):
    """Kafka's rule since KIP-360: a producer it holds nothing of is accepted at any
    sequence, so a batch can go in ahead of the one before it, lost with a deposed
    leader's tail."""

    def check(self, producer_id: int, producer_epoch: int, first: int, last: int) -> None:
        if self.last_batch(producer_id) is None:
            return
        super().check(producer_id, producer_epoch, first, last)


class TrustsUnknownProducers(MemLog):
    table_class = _TrustingProducerState


class KeepsDueTimer(RaftReplica):
    """Reports a follower timer that its tick never acts on (half a fetch timeout after
    the leader was last heard): once due, it stays due."""

    def _deadlines(self) -> list[int | None]:
        times = super()._deadlines()
        st = self._state
        if isinstance(st, FollowerState):
            times.append(st.last_contact_ms + self.config.fetch_timeout_ms // 2)
        return times


class KeepsLeadingOnDiskFaults(RaftReplica):
    """Notes a full, failing or slow disk but keeps leading: every producer waits on it."""

    def on_disk_fault(self, now_ms: int, reason: str) -> Output:
        self._note_disk_fault(reason, now_ms)
        return Output()


class TwoVoterChangesInFlight(RaftReplica):
    """Takes every voter-set change as committed: its leader appends the next change
    while the one before is still uncommitted (two changes in flight)."""

    @property
    def voter_change_pending(self) -> bool:
        return False


# The simulator's in-memory log keeps transactions with the product's TransactionIndex;
# these get a rule of it wrong.


class _EndsAtTheMarker(TransactionIndex):
    """Takes a transaction as decided once its marker is in the log, committed or not:
    a marker a deposed leader held alone can be lost, and the transaction aborted."""

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        self._ended_markers.clear()
        self._ended_firsts.clear()
        return super().first_unstable_offset(high_watermark)


class EndsTransactionsAtTheMarker(MemLog):
    txn_class = _EndsAtTheMarker


class _ForgetsAborts(TransactionIndex):
    """Keeps no aborted-transaction index: readers are never told what to drop."""

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        return []


class ForgetsAborts(MemLog):
    txn_class = _ForgetsAborts


class CopiesGapsIntoTheNextEpoch(MemLog):
    """A follower copying a cleaned leader's gap followed by a new epoch's batch starts
    that epoch at the gap: its epoch cache then answers end_offset_for of the epoch
    before with an end below records it holds."""

    def _copy_gap(self, base: int, epoch: int) -> None:
        start = self.end_offset
        super()._copy_gap(base, epoch)
        if epoch > self.last_epoch():
            self.epochs.append((epoch, start))


# ---------------------------------------------------------------------- broken coordinators
# The simulated transaction coordinator executes replica.kafka.txn's rules as the
# product's coordinator does; each of these gets one step of it wrong.


class AbortsFoundCommits(SimCoordinator):
    """Recovering, aborts a PrepareCommit it finds in the log (with the epoch bumped, as
    it ends an ongoing transaction) instead of finishing it."""

    def recover_decision(self, meta: TxnMetadata) -> None:
        if meta.state != TxnState.PREPARE_COMMIT:
            return super().recover_decision(meta)
        self.busy.add(meta.transactional_id)
        self.abort_ongoing(meta, self.release(meta.transactional_id))


class MarksBeforeDecisionDurable(SimCoordinator):
    """Sends a decision's marker as it writes the decision, before it is durable: a
    crash may lose the decision that the marker carried out."""

    def decide(self, prepare: TxnMetadata, done: Callable[..., None]) -> None:
        self.finish(prepare, lambda: None)
        self.write(prepare, lambda ok: None if ok else done(KafkaError.NOT_COORDINATOR))
        done(KafkaError.NONE, keep_busy=True)


class NeverExpires(SimCoordinator):
    """Never aborts a transaction open past its timeout: one whose producer died stays
    open until that producer comes back, if it ever does."""

    def expire(self) -> None:
        return None


class TrustsLostMarkers(SimCoordinator):
    """Takes a marker whose answer never came (its leader died, or the answer was lost)
    as written, and completes the transaction."""

    def marker_lost(self, pending: PendingMarker) -> None:
        self.marker_written(pending)


# ---------------------------------------------------------------------- broken cleaners
# The simulated cleaner runs storage.compaction's rules as the storage cleaner does;
# each of these gets one of them wrong.


class KeepsFirstOfEachKey(SimCleaner):
    """Keeps the first record of each key instead of the last (the rules run over the
    records in reverse)."""

    def survivors(self, *columns: pa.Array, **kwargs: Any) -> list[bool]:
        back = pa.array(range(len(columns[0]) - 1, -1, -1), pa.int64())
        rev = [c.take(back) for c in columns]
        kwargs = {k: v.take(back) if isinstance(v, pa.Array) else v for k, v in kwargs.items()}
        return super().survivors(*rev, **kwargs)[::-1]


class DropsTombstonesOverPinnedValues(SimCleaner):
    """The rule before the simulator found it wrong: pinned records are kept, but an
    expired tombstone goes though a pinned older value of its key stays (that value is
    then the key's latest again)."""

    def survivors(self, *columns: pa.Array, **kwargs: Any) -> list[bool]:
        pinned = kwargs["pinned"].to_pylist()
        kwargs["pinned"] = pa.array([False] * len(pinned))
        kept = super().survivors(*columns, **kwargs)
        return [k or bool(p) for k, p in zip(kept, pinned, strict=True)]


class CleansPastTheHighWatermark(SimCleaner):
    """Takes the log's end for the high watermark (and no transaction as undecided):
    records not committed, which a new leader may truncate, shadow older ones."""

    def cleanable_end(
        self,
        log: MemLog,
        bases: list[int],
        max_stamps: list[int],
        high_watermark: int,
        last_stable_offset: int | None,
        now_ms: int,
        lag_ms: int,
    ) -> int:
        return super().cleanable_end(log, bases, max_stamps, log.end_offset, None, now_ms, lag_ms)


class RenumbersOffsets(SimCleaner):
    """Closes the gaps: the kept records below the cleanable end move down to
    consecutive offsets (each its own batch), the offsets freed left as gaps."""

    def apply(self, log: MemLog, end: int, dropped: Sequence[int]) -> None:
        super().apply(log, end, dropped)
        kept = [e for e in log.entries[:end] if e[2] != GONE]
        log.entries[:end] = [(e[0], e[1], i, e[3]) for i, e in enumerate(kept)]
        log.entries[len(kept) : end] = [(e[0], 0, GONE, 0) for e in log.entries[len(kept) : end]]
        log.producer_of = {b: p for b, p in log.producer_of.items() if b >= end}
