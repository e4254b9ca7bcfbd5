"""One partition replica under the driver rules: its raft core, its log, and the client
requests waiting on it (acks=quorum produces, long-poll fetches of replicas and
consumers). Pure: the executor is handed what to persist, flush and send (``Ready``)."""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..constants import UNKNOWN, or_unknown
from ..protocol import ErrorCode
from ..protocol import messages as m
from ..raft import (
    CorruptDataError,
    FetchRequest,
    FetchResponse,
    Message,
    NotLeaderError,
    Output,
    RaftReplica,
    Role,
)
from ..raft.log import ReplicaLog
from ..storage.errors import DiskError, StorageError
from ..storage.producers import (
    DuplicateSequence,
    InvalidProducerEpoch,
    OutOfOrderSequence,
    ProducerStateError,
    UnknownProducerId,
)
from ..storage.records import TxnMarker
from .errors import error_response
from .ready import PartitionKey, Ready

log = logging.getLogger(__name__)

_PRODUCER_ERRORS: dict[type[ProducerStateError], ErrorCode] = {
    OutOfOrderSequence: ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    InvalidProducerEpoch: ErrorCode.INVALID_PRODUCER_EPOCH,
    UnknownProducerId: ErrorCode.UNKNOWN_PRODUCER_ID,
}
#: Refusals that say "the batches before this one are not in the log".
_GAPS = (OutOfOrderSequence, UnknownProducerId)


class ServedLog(ReplicaLog, Protocol):
    """The log a driver serves clients from: the core's log plus a timestamp lookup,
    and what it may append together."""

    def plain_span(self, records: bytes) -> int | None:
        """The offsets a client's ``records`` span appended, when they are plain batches
        (no producer fields, no flags), which may be appended with other such batches;
        None for any other records (appended alone, or refused, by the append)."""
        ...

    def offset_for_timestamp(self, timestamp_ms: int, max_offset: int) -> tuple[int, int]:
        """(first offset below ``max_offset`` whose record timestamp is >= the given one,
        that record's timestamp), or (max_offset, -1) if none."""
        ...


@dataclass(frozen=True, slots=True)
class Limits:
    """What the driver needs to know of the node's configuration."""

    max_fetch_bytes: int  # the most one consumer Fetch answer may carry (a frame's room)
    produce_timeout_ms: int  # acks=quorum wait when the request names none
    # Bytes per second this node's leaders send observers (0: unthrottled).
    catch_up_bytes_per_s: int = 0


#: An observer's fetch asks for at least this much under the throttle.
OBSERVER_FETCH_MIN_BYTES = 64 << 10


class Throttle:
    """Paces answers that carry records to observers at ``bytes_per_s`` over every
    partition of a node: each such answer goes out once those before it have had their
    time (``delay``). Time is the driver's ``now`` (ms). What it paces is an observer's
    backlog only: the bytes producers appended to the partition since that observer's
    previous answer travel free (``PartitionDriver._pace``), so a new replica keeps pace
    with the writes and closes its gap at the throttle's rate, however fast they come
    (a throttle below the write rate would otherwise never let a move end)."""

    def __init__(self, bytes_per_s: int) -> None:
        self.bytes_per_s = bytes_per_s
        self.free_at = 0.0  # when the answers sent so far have had their time

    def delay(self, nbytes: int, now: int) -> int:
        """How long (ms) to hold an answer of ``nbytes`` before sending it."""
        start = max(float(now), self.free_at)
        self.free_at = start + nbytes * 1000 / self.bytes_per_s
        return int(start - now)


@dataclass(slots=True)
class _Held:
    """Messages that wait until the log is durable up to ``needs`` (flush before send)."""

    needs: int
    messages: list[Message]


@dataclass(slots=True)
class _ParkedFetch:
    """A replica's fetch whose empty answer is held (long-poll) until ``deadline_ms``."""

    request: FetchRequest
    deadline_ms: int


#: A produce request appended with others (``PartitionDriver.produce_together``): its
#: token, itself, and the offsets its batches span.
Produced = tuple[int, m.ProduceRequest, int]
# One request of an append: a produce (or a transaction marker), the offsets it spans.
_Item = tuple[int, m.ProduceRequest | m.WriteTxnMarkerRequest, int]


@dataclass(slots=True)
class _Waiter:
    """An acks=quorum produce: answered once the HWM passes ``last`` in ``epoch``.
    ``written_in`` is the leader epoch of the records (older than ``epoch`` for the
    retry of a batch a previous leader appended)."""

    token: int
    first: int
    last: int
    epoch: int
    deadline_ms: int
    written_in: int


@dataclass(slots=True)
class _ConsumerWait:
    """A consumer fetch with nothing to serve yet: answered on progress or expiry."""

    token: int
    request: m.FetchRequest
    deadline_ms: int


class PartitionDriver:
    def __init__(
        self,
        key: PartitionKey,
        core: RaftReplica,
        log_: ServedLog,
        limits: Limits,
        ticks_from_ms: int = 0,
    ) -> None:
        self.key = key
        self.core = core
        self.log = log_
        self.limits = limits
        # A new partition's non-preferred replicas hold their timers until then, so the
        # preferred replica stands first and leadership spreads as assignments do.
        self.ticks_from_ms = ticks_from_ms
        self.held: deque[_Held] = deque()
        self.flushing = False
        # When the flush now running was asked for, and the log end it covers.
        self.flush_asked: tuple[int, int] | None = None
        self.slow_check_at = 0
        self.parked: list[_ParkedFetch] = []
        # The HWM last sent to each replica: an empty answer may be parked only if it
        # tells that replica nothing new.
        self.sent_hwm: dict[int, int] = {}
        # acks=quorum produces waiting for the HWM, in offset order (the log's order of
        # appends), so each HWM advance looks only at those it answers; and a bound no
        # later than the earliest of their deadlines (exact after each expiry sweep): a
        # backlog of thousands of waiters costs a request nothing more.
        self.waiters: deque[_Waiter] = deque()
        self.waiters_due: int | None = None
        self.consumers: list[_ConsumerWait] = []
        self.closed = False
        # The node's catch-up throttle (None: unthrottled), and the answers to observers
        # it holds: (send at, answer).
        self.throttle: Throttle | None = None
        self.paced: dict[int, tuple[int, FetchResponse]] = {}  # replica -> (at, answer)
        # Bytes producers appended here while this replica leads, and their count at each
        # observer's last answer: what it appended since then is not paced.
        self.appended_bytes = 0
        self.pace_marks: dict[int, int] = {}
        self._role: tuple[Role | None, int | None, int] = (None, None, -1)
        self.assignment: list[int] = []  # the replicas in the assignment's order
        # The voters a reassignment moves this partition to (None: none asked); its leader
        # changes the voter set towards it one voter at a time (``Driver.set_target``).
        self.target: tuple[int, ...] | None = None
        # When ``target`` was set: a replica it adds must have caught up since, on a fetch
        # that arrived since (a parked fetch handled again reports the time it is handled).
        self.target_since = UNKNOWN
        self.fetched_at: dict[int, int] = {}  # replica -> when its latest fetch arrived
        self.copier: int | None = None  # the new replica that copies now (``copying``)
        # A reassignment changed the assignment and its preferred replica has not led
        # since (``Driver._settle_leader``).
        self.settle_leader = False
        # The voters this node's peer counts were last taken from (``Driver._sync_peers``).
        self.counted_voters: tuple[int, ...] = ()
        # The (leader, epoch) this replica was last told refuses connections
        # (``Driver._hint_refused``): told once for each.
        self.hinted: tuple[int, int] | None = None

    @property
    def preferred(self) -> int | None:
        """The first replica of the assignment (the preferred leader)."""
        return self.assignment[0] if self.assignment else None

    @property
    def name(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"

    @property
    def moving(self) -> bool:
        """A reassignment is asked for and the voter set is not its target yet."""
        return self.target is not None and self.core.voters != self.target

    def step_voters(self, now: int, ready: Ready) -> None:
        """A leader's step towards ``target``: its epoch's record first if it was
        deferred (a change waits for an entry of its epoch to commit), then the next
        voter change it may make. A disk that cannot take the record moves leadership
        away, as for a produce."""
        try:
            self.run(self.core.write_epoch_record(now), now, ready)
            step = self.next_voters(now)
            if step is not None:
                self.run(self.core.change_voters(step, now, asked_ms=self.target_since), now, ready)
        except DiskError as exc:
            self.run(self.core.on_disk_fault(now, str(exc)), now, ready)

    def next_voters(self, now: int) -> tuple[int, ...] | None:
        """The next single-voter step towards ``target`` its leader may take now (None:
        none). While the voters outnumber the target, remove one not in it (itself
        last: it leads until that commits); else add the target replica that copies
        (``copying``) once it has caught up; else, with every one added, remove. So a
        partition never has more than one voter beyond its target's count, and one new
        replica copies at a time: with 1 leading, [1, 2] -> [3, 4] goes [1, 2, 3],
        [1, 3], [1, 3, 4], [3, 4]."""
        core, target = self.core, self.target
        if target is None or not core.is_leader or core.voter_change_pending:
            return None
        current = set(core.voters)
        if len(current) <= len(target) and set(target) - current:
            voter = self.copying(now)
            if voter is None:
                return None  # no new replica fetches
            step = tuple(sorted(current | {voter}))
            if core.voter_change_problem(step, now, asked_ms=self.target_since) is None:
                return step
            return None  # still catching up
        for voter in sorted(current - set(target), key=lambda v: (v == core.node_id, v)):
            step = tuple(sorted(current - {voter}))
            if core.voter_change_problem(step, now) is None:
                return step
        return None

    def copying(self, now: int) -> int | None:
        """The one new replica of a move that copies the partition now (its leader's
        view; None: none may), chosen among the target replicas to add that fetched
        within a fetch timeout, and since the move was asked for: the one chosen before
        while it still fetches, else the first of them. The others' fetches get no
        records (``waits_turn``): every record reaches one replica more than the
        voters, not one more per new replica, and the throttle's bytes go to one copy
        that then joins, not to many that all join late. None while the voters
        outnumber the target (a removal comes first)."""
        core, target = self.core, self.target
        if target is None or not core.is_leader or len(core.voters) > len(target):
            self.copier = None
            return None
        since = max(self.target_since, now - core.config.fetch_timeout_ms)
        live = [
            r
            for r in sorted(set(target) - set(core.voters))
            if self.fetched_at.get(r, UNKNOWN) >= since
        ]
        if self.copier not in live:
            self.copier = live[0] if live else None
        return self.copier

    def waits_turn(self, replica: int, now: int) -> bool:
        """A new replica of a move that may not copy yet (``copying``): its fetches are
        held as long-polls and answered with no records."""
        target = self.target
        if target is None or replica in self.core.voters or replica not in target:
            return False
        return self.core.is_leader and self.copying(now) != replica

    # ------------------------------------------------------------------ the rules
    def run(self, out: Output, now: int, ready: Ready) -> None:
        """Execute one core output under the driver rules."""
        if self.closed:
            return
        if out.persist is not None:
            ready.persist.append((self.key, out.persist))  # before any send of this output
        lg = self.log
        if out.truncated_to is not None or out.repaired_at is not None:
            self._drop_stale_held()
        if out.flush_log and lg.durable_end_offset < lg.end_offset:
            self.held.append(_Held(lg.end_offset, out.messages))  # flush before send
            self._want_flush(ready, now)
        elif self.held:
            self.held.append(_Held(self.held[-1].needs, out.messages))  # keep the order
        else:
            self._emit(out.messages, now, ready)
        if self.core.is_leader and lg.durable_end_offset < lg.end_offset:
            # A leader's own appends count towards the HWM only once durable: group
            # commit them (one flush for everything appended meanwhile).
            self._want_flush(ready, now)
        if out.truncated_to is not None:
            ready.truncated.append((self.key, out.truncated_to, out.truncated_below_high_watermark))
            if out.truncated_below_high_watermark:
                log.warning(
                    "%s: committed records were truncated (unclean leader election)", self.name
                )
        if out.repaired_at is not None:
            ready.repaired.append((self.key, out.repaired_at))
        if out.high_watermark is not None:
            ready.committed.append(self.key)
            self._answer_waiters(ready)
        if out.high_watermark is not None or out.fetch_wakeup:
            self._wake(now, ready, force=False)
        self._observe_role(now, ready)

    def _emit(self, messages: list[Message], now: int, ready: Ready) -> None:
        for msg in messages:
            if isinstance(msg, FetchResponse):
                self.sent_hwm[msg.dst] = msg.high_watermark
            if msg.dst == self.core.node_id:
                self.run(self.core.handle(msg, now), now, ready)
            else:
                ready.send.append((self.key, msg))

    def _drop_stale_held(self) -> None:
        """Messages held for log data a truncation removed describe a log that is gone
        (a fetch offset no longer held here must never reach the leader): drop them;
        the core sends fresh ones."""
        end = self.log.end_offset
        self.held = deque(h for h in self.held if h.needs <= end)

    def _want_flush(self, ready: Ready, now: int) -> None:
        if not self.flushing:
            self.flushing = True
            self.flush_asked = (now, self.log.end_offset)
            ready.flush.append(self.key)

    def flushed(self, now: int, ready: Ready) -> None:
        """The flush this driver asked for completed."""
        self.flushing = False
        self.flush_asked = None
        if self.closed:
            return
        durable = self.log.durable_end_offset
        while self.held and self.held[0].needs <= durable:
            self._emit(self.held.popleft().messages, now, ready)
        self.run(self.core.on_log_flushed(now), now, ready)
        if self.held:
            self._want_flush(ready, now)  # appended while that flush ran

    def _observe_role(self, now: int, ready: Ready) -> None:
        core = self.core
        role = (core.role, core.leader_id, core.epoch)
        if role == self._role:
            return
        was_leader = self._role[0] is Role.LEADER
        if core.is_leader and (self._role[0], self._role[2]) != (Role.LEADER, core.epoch):
            log.info("%s: leader in epoch %d", self.name, core.epoch)
        elif core.leader_id != self._role[1] and core.leader_id is not None:
            log.info("%s: follows node %d in epoch %d", self.name, core.leader_id, core.epoch)
        self._role = role
        if was_leader and not core.is_leader:
            # Their records may be truncated by the next leader: fail them.
            self._fail_waiters(NotLeaderError(core.leader_id, core.epoch), ready)
            # Answers held under the throttle speak as the leader this replica no longer
            # is (their records read then): the observers fetch again from the next one.
            self.paced.clear()
            self._wake(now, ready, force=True)
        elif self.consumers:
            self._wake_consumers(now, ready, force=False)

    # ------------------------------------------------------------------ replica fetches
    def on_raft(self, msg: Message, now: int, ready: Ready) -> None:
        msg = self._capped(msg)
        handled, waits = msg, False
        if isinstance(msg, FetchRequest):
            self.fetched_at[msg.replica_id] = now
            if self.parked:
                # A replica's new fetch supersedes one of its fetches parked here: handled
                # again later, the old one would report the replica as it was then (a
                # copy since deleted, say) as of that later time.
                self.parked = [p for p in self.parked if p.request.replica_id != msg.replica_id]
            waits = self.waits_turn(msg.replica_id, now)
            handled = _no_records(msg) if waits else msg
        out = self.core.handle(handled, now)
        if self.ticks_from_ms and self.core.epoch > 0:
            self.ticks_from_ms = 0  # someone stood: the new partition's hold is over
        if isinstance(msg, FetchRequest):
            resp = _answer_to(out, msg)
            if (
                msg.max_wait_ms > 0
                and resp is not None
                and resp.is_empty()
                and (waits or self.sent_hwm.get(msg.replica_id) == resp.high_watermark)
            ):
                # Long-poll: nothing new for this replica; hold the answer.
                out.messages.remove(resp)
                self.parked.append(_ParkedFetch(msg, now + msg.max_wait_ms))
            self._pace(out, msg, now)
        self.run(out, now, ready)

    def _pace(self, out: Output, req: FetchRequest, now: int) -> None:
        """An answer with records to an observer (a replica catching up to join) waits
        its turn under the node's throttle, for the part of it that is backlog: the bytes
        producers appended since that observer's previous answer are not counted, and an
        answer of nothing else goes at once. A fetch the observer sent again while its
        answer waited (its request timed out) takes that answer's turn: one answer per
        observer waits at a time, and the throttle counts it once."""
        if self.throttle is None or req.replica_id in self.core.voters:
            if self.pace_marks:
                self.pace_marks.pop(req.replica_id, None)  # a voter now, never paced
            return
        resp = _answer_to(out, req)
        if resp is None or not resp.records:
            return
        waiting = self.paced.get(req.replica_id)
        if waiting:
            at = waiting[0]
        else:
            grown = self._appended_since_answer(req.replica_id)
            self.pace_marks[req.replica_id] = self.appended_bytes
            backlog = len(resp.records) - grown
            at = now + self.throttle.delay(backlog, now) if backlog > 0 else now
        if at > now:
            out.messages.remove(resp)
            self.paced[req.replica_id] = (at, resp)
        else:
            self.paced.pop(req.replica_id, None)

    def _send_paced(self, now: int, ready: Ready) -> None:
        for replica, (at, resp) in list(self.paced.items()):
            if at <= now:
                del self.paced[replica]
                self._emit([resp], now, ready)

    def _appended_since_answer(self, replica: int) -> int:
        """Bytes producers appended here since ``replica``'s previous paced answer (not
        paced: they travel free)."""
        return self.appended_bytes - self.pace_marks.get(replica, self.appended_bytes)

    def _capped(self, msg: Message) -> Message:
        """An observer's fetch asks for at most a tenth of a second of the throttle's
        bytes of backlog (at least one batch is answered anyway), so no answer waits long,
        plus what producers appended since its previous answer, which is not paced: with
        writes near that size a fetch would otherwise carry little but them, and the
        observer never close its gap."""
        if (
            self.throttle is None
            or not isinstance(msg, FetchRequest)
            or msg.replica_id in self.core.voters
        ):
            return msg
        grown = self._appended_since_answer(msg.replica_id)
        room = max(OBSERVER_FETCH_MIN_BYTES, self.throttle.bytes_per_s // 10) + grown
        if msg.max_bytes <= room:
            return msg
        return dataclasses.replace(msg, max_bytes=room)

    def _wake(self, now: int, ready: Ready, *, force: bool) -> None:
        if self.parked:
            self._wake_replicas(now, ready, force=force)
        if self.consumers:
            self._wake_consumers(now, ready, force=force)

    def _wake_replicas(self, now: int, ready: Ready, *, force: bool) -> None:
        parked, self.parked = self.parked, []
        for p in parked:
            waits = self.waits_turn(p.request.replica_id, now)
            if waits and now < p.deadline_ms and not force:
                self.parked.append(p)  # a new replica waiting its turn to copy
                continue
            # Re-handling is idempotent.
            out = self.core.handle(_no_records(p.request) if waits else p.request, now)
            self._pace(out, p.request, now)
            resp = _answer_to(out, p.request)
            if resp is not None and resp.is_empty():
                out.messages.remove(resp)
                if (
                    resp.high_watermark == self.sent_hwm.get(p.request.replica_id)
                    and now < p.deadline_ms
                    and not force
                ):
                    self.parked.append(p)  # still nothing new: keep it parked
                else:
                    self._emit([resp], now, ready)  # new HWM, expiry or forced
            self.run(out, now, ready)

    # ------------------------------------------------------------------ client requests
    def produce(
        self, token: int, req: m.ProduceRequest | m.WriteTxnMarkerRequest, now: int, ready: Ready
    ) -> None:
        """A client's batches, or a transaction coordinator's marker (appended and
        answered alike: a marker always as acks=quorum)."""
        if isinstance(req, m.WriteTxnMarkerRequest):
            marker = TxnMarker(
                req.producer_id, req.producer_epoch, req.commit, req.coordinator_epoch
            )
            self._append([(token, req, 0)], [marker], req.timestamp_ms, now, ready)
        else:
            self._append([(token, req, 0)], req.records, -1, now, ready)

    def produce_together(self, items: Sequence[Produced], now: int, ready: Ready) -> None:
        """Plain client batches of several produce requests (each with the offsets its
        batches span: ``storage.plain_span``), appended as one: one write, one flush and
        one wake of the followers for all, in the order given. Each request is answered
        on its own (its offsets, its acks, its timeout), as if appended alone right after
        the one before. Refused as a whole (a damaged batch among them: nothing is
        written), each is appended alone, for its own verdict."""
        if len(items) == 1:
            token, req, _ = items[0]
            self.produce(token, req, now, ready)
            return
        records = b"".join(req.records for _, req, _ in items)
        if not self._append(items, records, -1, now, ready, alone_if_refused=True):
            for token, req, _ in items:
                self.produce(token, req, now, ready)

    def _append(
        self,
        items: Sequence[_Item],
        records: bytes | list[TxnMarker],
        timestamp_ms: int,
        now: int,
        ready: Ready,
        *,
        alone_if_refused: bool = False,
    ) -> bool:
        """Append ``records``, the batches of ``items`` (one request's, or several plain
        ones' joined, each spanning its count of offsets), and answer each item: at once,
        or once committed. False, with nothing written or answered, when the batches are
        refused and ``alone_if_refused``."""
        tokens = [token for token, _, _ in items]
        try:
            info, epoch, out = self.core.append(records, now, timestamp_ms=timestamp_ms)
            first, last, written_in = info.first_offset, info.last_offset, epoch
            if isinstance(records, bytes):
                self.appended_bytes += len(records)
        except NotLeaderError as exc:
            self._answer_all(tokens, _produce_error(ErrorCode.NOT_LEADER, str(exc), exc), ready)
            return True
        except DuplicateSequence as exc:
            # A retry of a batch already in the log: answered as that batch is, with its
            # offsets, once they are committed (Kafka's DUPLICATE_SEQUENCE_NUMBER).
            first, last = exc.original.first_offset, exc.original.last_offset
            epoch, written_in, out = self.core.epoch, self.log.epoch_at(first), Output()
        except ProducerStateError as exc:
            code, text = _PRODUCER_ERRORS[type(exc)], str(exc)
            if isinstance(exc, _GAPS) and not self._epoch_committed():
                # The batches it lacks may sit in an earlier leader's uncommitted tail,
                # which a later leader could still commit: a client that took the gap as
                # final (librdkafka renumbers under a new epoch) would write them twice.
                code = ErrorCode.NOT_ENOUGH_REPLICAS
                text = f"{text}; not final until this leader's epoch commits (retry)"
            self._answer_all(tokens, _produce_error(code, text), ready)
            return True
        except CorruptDataError as exc:
            # The producer state could not be read past damage: resign, repair, and let
            # the client retry on the next leader (as a damaged read does).
            self.on_corruption(exc.offset, now, ready)
            text = f"damaged data at offset {exc.offset}"
            self._answer_all(tokens, _produce_error(ErrorCode.NOT_LEADER, text), ready)
            return True
        except DiskError as exc:
            # Not the client's fault: hand leadership to a replica that can write, and
            # send the client there (NOT_LEADER is retried by every client).
            self.run(self.core.on_disk_fault(now, str(exc)), now, ready)
            text = f"this replica cannot write its log ({exc}); leadership moves"
            self._answer_all(tokens, _produce_error(ErrorCode.NOT_LEADER, text), ready)
            return True
        except (StorageError, ValueError) as exc:
            if alone_if_refused:
                return False
            err = _produce_error(ErrorCode.CORRUPT_MESSAGE, f"rejected batch: {exc}")
            self._answer_all(tokens, err, ready)
            return True
        for token, req, span in items:
            # One item: the whole append (or the batch a retry repeats); several: each
            # its span of it, in turn.
            end = last if len(items) == 1 else first + span - 1
            if not isinstance(req, m.ProduceRequest) or req.acks == m.ACKS_QUORUM:
                timeout = req.timeout_ms if req.timeout_ms > 0 else self.limits.produce_timeout_ms
                self._wait(_Waiter(token, first, end, epoch, now + timeout, written_in))
            else:
                ready.answers.append((token, self._produced(first, end, written_in)))
            first = end + 1
        self._answer_waiters(ready)  # a duplicate may be committed already
        self.run(out, now, ready)
        return True

    @staticmethod
    def _answer_all(tokens: list[int], answer: Any, ready: Ready) -> None:
        ready.answers.extend((token, answer) for token in tokens)

    def _epoch_committed(self) -> bool:
        """An entry of this leader's own epoch is committed: no earlier leader's
        uncommitted entries can be committed any more, so what its log lacks is final.
        Stricter than ``RaftReplica.leader_committed``, which counts the leader of an
        empty log as committed: a minority may still hold an uncommitted tail then."""
        start = self.core.epoch_start_offset
        return start is not None and self.core.high_watermark > start

    def _produced(self, first: int, last: int, epoch: int) -> m.ProduceResponse:
        return m.ProduceResponse(
            error=0,
            error_message="",
            base_offset=first,
            last_offset=last,
            leader_epoch=epoch,
            leader_id=self.core.node_id,
        )

    def _wait(self, w: _Waiter) -> None:
        """``w`` waits in offset order: after every other, but for the retry of a batch
        already appended (placed by its offsets)."""
        waiters = self.waiters
        if waiters and waiters[-1].last > w.last:
            at = len(waiters)
            while at and waiters[at - 1].last > w.last:
                at -= 1
            waiters.insert(at, w)
        else:
            waiters.append(w)
        if self.waiters_due is None or w.deadline_ms < self.waiters_due:
            self.waiters_due = w.deadline_ms

    def _answer_waiters(self, ready: Ready) -> None:
        """Those the HWM has passed, from the front: the rest wait for a later one."""
        if not self.core.is_leader:
            return
        hwm, epoch, waiters = self.core.high_watermark, self.core.epoch, self.waiters
        while waiters and waiters[0].last < hwm:
            w = waiters.popleft()
            if w.epoch == epoch:
                ready.answers.append((w.token, self._produced(w.first, w.last, w.written_in)))
            else:  # appended while this replica led an earlier epoch
                exc = NotLeaderError(self.core.leader_id, epoch)
                text = f"offsets {w.first}-{w.last} were appended in epoch {w.epoch}: {exc}"
                ready.answers.append((w.token, _produce_error(ErrorCode.NOT_LEADER, text, exc)))
        if not waiters:
            self.waiters_due = None

    def _fail_waiters(self, exc: NotLeaderError, ready: Ready) -> None:
        for w in self.waiters:
            text = f"leadership moved before offsets {w.first}-{w.last} were committed: {exc}"
            ready.answers.append((w.token, _produce_error(ErrorCode.NOT_LEADER, text, exc)))
        self.waiters.clear()
        self.waiters_due = None

    def fetch(self, token: int, req: m.FetchRequest, now: int, ready: Ready) -> None:
        """A consumer fetch (the one place consumers are served): fenced by
        ``check_leader_epoch``, never above the HWM, long-polled while nothing is new."""
        resp = self._serve(req, now, ready)
        if resp is not None:
            ready.answers.append((token, resp))
        elif req.max_wait_ms > 0:
            self.consumers.append(_ConsumerWait(token, req, now + req.max_wait_ms))
        else:
            ready.answers.append((token, self._nothing_new()))

    def hwm_unknown(self) -> str | None:
        """Why this leader cannot yet answer where the committed log ends, or None if it
        can: until an entry of its epoch commits, its HWM may be below its predecessor's
        (0 after a restart). Consumer Fetch and ListOffsets are then answered with
        OFFSET_NOT_AVAILABLE, as Kafka's leader does (KIP-207), and clients retry, rather
        than reading a stale HWM as the end of the log."""
        core = self.core
        if not core.is_leader or core.leader_committed:
            return None
        return (
            f"leader {core.node_id} of epoch {core.epoch} has not yet committed an entry of "
            f"its epoch; its high watermark ({core.high_watermark}) may be behind"
        )

    def _nothing_new(self) -> m.FetchResponse:
        """The answer to a consumer fetch that found nothing to serve."""
        unknown = self.hwm_unknown()
        if unknown is not None:
            return self._fetched(ErrorCode.OFFSET_NOT_AVAILABLE, unknown)
        return self._fetched(ErrorCode.NONE, "")

    def _serve(self, req: m.FetchRequest, now: int, ready: Ready) -> m.FetchResponse | None:
        """The answer to a consumer fetch, or None while there is nothing to serve yet."""
        core, lg = self.core, self.log
        code = core.check_leader_epoch(req.current_leader_epoch)
        if code != ErrorCode.NONE:
            return self._fetched(code, f"leader epoch {req.current_leader_epoch} vs {core.epoch}")
        if not lg.start_offset <= req.fetch_offset <= lg.end_offset:
            return self._fetched(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {req.fetch_offset} is outside [{lg.start_offset}, {lg.end_offset}]",
            )
        if self.hwm_unknown() is not None:
            return None
        committed = req.isolation_level == m.READ_COMMITTED
        try:
            # read_committed reads below the last stable offset only (KIP-98).
            limit = self.last_stable_offset() if committed else core.high_watermark
            if req.fetch_offset >= limit:
                return None
            # At least one whole batch even above max_bytes (KIP-74), never more than a
            # frame can carry: any single batch fits that.
            max_bytes = min(max(1, req.max_bytes), self.limits.max_fetch_bytes)
            data = lg.read(req.fetch_offset, max_bytes, max_offset=limit)
            aborted = []
            if committed:
                aborted = [
                    m.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in lg.transactions().aborted_between(req.fetch_offset, limit)
                ]
        except CorruptDataError as exc:
            # Never serve damaged bytes: resign, repair, send the client elsewhere.
            self.on_corruption(exc.offset, now, ready)
            return self._fetched(ErrorCode.NOT_LEADER, f"damaged data at offset {exc.offset}")
        except StorageError as exc:
            return self._fetched(ErrorCode.OFFSET_OUT_OF_RANGE, str(exc))
        return self._fetched(ErrorCode.NONE, "", data, aborted)

    def last_stable_offset(self) -> int:
        """The first offset of a transaction not decided below the high watermark, else
        the high watermark: what read_committed readers read below (``CorruptDataError``
        if the log's headers cannot be read to find it). Asked only once the leader's
        epoch has committed, when its high watermark only grows."""
        hwm = self.core.high_watermark
        first = self.log.transactions().first_unstable_offset(hwm)
        return hwm if first is None else min(first, hwm)

    def _fetched(
        self,
        code: ErrorCode,
        text: str,
        records: bytes = b"",
        aborted: list[m.AbortedTransaction] | None = None,
    ) -> m.FetchResponse:
        core = self.core
        lso = UNKNOWN
        if code == ErrorCode.NONE and core.is_leader:
            try:
                lso = self.last_stable_offset()
            except StorageError:
                lso = UNKNOWN
        return m.FetchResponse(
            error=int(code),
            error_message=text,
            leader_id=or_unknown(core.leader_id),
            leader_epoch=core.epoch,
            high_watermark=core.high_watermark,
            log_start_offset=self.log.start_offset,
            records=records,
            last_stable_offset=lso,
            aborted_transactions=aborted or [],
        )

    def _wake_consumers(self, now: int, ready: Ready, *, force: bool) -> None:
        waiting, self.consumers = self.consumers, []
        for w in waiting:
            resp = self._serve(w.request, now, ready)
            if resp is None and now < w.deadline_ms and not force:
                self.consumers.append(w)
            else:
                ready.answers.append((w.token, resp or self._nothing_new()))

    # ------------------------------------------------------------------ lifecycle
    def tick(self, now: int, ready: Ready) -> None:
        deadline = self.core.next_deadline_ms()
        if deadline is not None and deadline <= now and now >= self.ticks_from_ms:
            self.run(self.core.tick(now), now, ready)
        slow = self._slow_flush_at()
        if slow is not None and now >= slow and self.flush_asked is not None:
            asked, target = self.flush_asked
            # Looked at again a retry back-off later while it leads (a follower may
            # reach the target meanwhile).
            self.slow_check_at = now + self.core.config.retry_backoff_ms
            self.run(self.core.on_slow_flush(now, target, now - asked), now, ready)
        if self.parked and min(p.deadline_ms for p in self.parked) <= now:
            self._wake_replicas(now, ready, force=False)
        if self.paced:
            self._send_paced(now, ready)
        if self.consumers and min(w.deadline_ms for w in self.consumers) <= now:
            self._wake_consumers(now, ready, force=False)
        if self.waiters_due is not None and self.waiters_due <= now:
            still: deque[_Waiter] = deque()
            for w in self.waiters:
                if w.deadline_ms <= now:
                    text = f"offsets {w.first}-{w.last} not committed by a quorum in time"
                    ready.answers.append(
                        (w.token, _produce_error(ErrorCode.REQUEST_TIMED_OUT, text))
                    )
                else:
                    still.append(w)
            self.waiters = still
            self.waiters_due = min((w.deadline_ms for w in still), default=None)

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has something to do (the core's timers, held waits)."""
        core = self.core.next_deadline_ms()
        if core is not None:
            core = max(core, self.ticks_from_ms)
        slow = self._slow_flush_at()
        if slow is not None:
            core = slow if core is None else min(core, slow)
        if not (self.parked or self.consumers or self.waiters or self.paced):
            return core  # the common case: nothing held, no list to build
        times = [p.deadline_ms for p in self.parked]
        times += [at for at, _ in self.paced.values()]
        times += [w.deadline_ms for w in self.consumers]
        if self.waiters_due is not None:
            times.append(self.waiters_due)
        if core is not None:
            times.append(core)
        return min(times)

    def _slow_flush_at(self) -> int | None:
        """When a leader's running flush counts as slow (a fetch timeout after it was
        asked for): see ``RaftReplica.on_slow_flush``."""
        if self.flush_asked is None or not self.core.is_leader:
            return None
        return max(self.flush_asked[0] + self.core.config.fetch_timeout_ms, self.slow_check_at)

    def on_corruption(self, offset: int, now: int, ready: Ready) -> None:
        self.run(self.core.on_corruption(offset, now), now, ready)

    def close(self, ready: Ready) -> None:
        """The replica leaves this node: every request waiting on it is answered."""
        if self.closed:
            return
        self._fail_waiters(NotLeaderError(None, self.core.epoch), ready)
        for w in self.consumers:
            resp = self._fetched(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "partition was closed")
            ready.answers.append((w.token, resp))
        self.consumers = []
        self.parked = []
        self.held.clear()
        self.closed = True


def _answer_to(out: Output, req: FetchRequest) -> FetchResponse | None:
    for msg in out.messages:
        if isinstance(msg, FetchResponse) and msg.dst == req.replica_id:
            return msg
    return None


def _no_records(req: FetchRequest) -> FetchRequest:
    """``req`` asking for no records: the fetch of a new replica waiting its turn to copy
    (``waits_turn``), which the core answers without reading the log."""
    return dataclasses.replace(req, max_bytes=0)


def _produce_error(code: ErrorCode, text: str, exc: NotLeaderError | None = None) -> Any:
    resp = error_response(m.ProduceRequest, code, text)
    if exc is not None and exc.leader_id is not None:  # where the client should go
        resp = dataclasses.replace(resp, leader_id=exc.leader_id, leader_epoch=exc.epoch)
    return resp
