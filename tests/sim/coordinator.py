"""The transaction coordinator of the simulation: ``replica.kafka.txn``'s rules executed
as ``kafka_listener.txn_coordinator`` executes them (their state in a log of its own,
each step durable before it is acted on), on one node for one leader epoch of that log.

**Its log.** The state records go to a partition of their own (``TXN_KEY``, the
simulation's ``__transaction_state``) that every node's driver runs beside the main
one: appended with acks=quorum through the driver, replicated by raft, lost with a crash
where not durable. A record's bytes are the product's encoding (``encode_txn_key`` /
``encode_txn_value``), kept beside the log under the record's id (a simulated record is
an id). The coordinator is the node that leads that partition once an entry of its
epoch is committed; it reads the partition up to its high watermark
(``decode_txn_record``, the last record of an id wins), and after a load delay serves
and finishes every PrepareCommit / PrepareAbort it found (markers again, then Complete).
A write refused or unanswered in its epoch makes it stale: it is read again.

**Every step is durable before it is acted on**, as in the product: InitProducerId,
AddPartitions and EndTxn each write the state the pure rule returns and answer once it
is acknowledged; EndTxn's decision (Prepare*) is answered, then its marker is written
(``WriteTxnMarkerRequest`` through the driver of whichever node leads the main
partition, over the simulated network), retried after an error or a silence (its
outcome unknown, as a new coordinator would) until it is written or moot
(INVALID_PRODUCER_EPOCH), then Complete. An ongoing transaction past its timeout, or
one whose producer initialises again, is aborted with the epoch bumped
(``begin_abort_on_timeout``). Operations on one id run one at a time (the product's
lock): a request that finds its id busy is answered CONCURRENT_TRANSACTIONS.

The simulation runs one data partition (``KEY``): a transaction spanning two (one
committed never partly visible) is left to the product's tests (``tests/kafka``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.txn import (
    Decision,
    TxnMetadata,
    TxnState,
    add_partitions,
    begin_abort_on_timeout,
    complete,
    decode_txn_record,
    encode_txn_key,
    encode_txn_value,
    end_txn,
    expired,
    init_producer_id,
)
from quorumlog.replica.protocol import ErrorCode
from quorumlog.replica.protocol import messages as m

from .memlog import MemLog, client_batch

if TYPE_CHECKING:
    from .cluster import SimNode
    from .txn import SimTxns

KEY = ("sim", 0)
TXN_KEY = ("__transaction_state", 0)
#: A request left unanswered this long is given up and sent again (the node may have
#: died with it): past the produce timeout a leader answers in.
RETRY_AFTER_MS = 3500
PRODUCE_TIMEOUT_MS = 3000
#: The product's marker back-off (``txn_markers``): doubling to the maximum.
MARKER_BACKOFF_MS = (20, 1000)


class Later:
    """A scheduled step of the transactions' simulation (a ``COORD`` event)."""

    __slots__ = ("detail", "fn", "name")

    def __init__(self, name: str, detail: str, fn: Callable[[], None]) -> None:
        self.name, self.detail, self.fn = name, detail, fn

    def __repr__(self) -> str:
        return f"{self.name} {self.detail}"


@dataclass(frozen=True)
class CoordRequest:
    """InitProducerId (``init``), AddPartitionsToTxn (``add``) or EndTxn (``end``)."""

    kind: str
    tid: str
    producer_id: int
    producer_epoch: int
    commit: bool = False


@dataclass(eq=False)
class PendingMarker:
    """A decision's marker not yet written: its latest send and the back-off."""

    meta: TxnMetadata
    then: Callable[[], None]
    token: int | None = None
    sent_at: int = 0
    backoff_ms: int = MARKER_BACKOFF_MS[0]
    retry_at: int | None = None


class SimCoordinator:
    """The transaction coordinator of one node, for one leader epoch of ``TXN_KEY``:
    the ids' states as read from the log and written since, and the work under way."""

    def __init__(self, owner: SimTxns, node: SimNode, epoch: int, ready_at: int) -> None:
        self.owner, self.sim = owner, owner.sim
        self.node_id, self.incarnation, self.epoch = node.id, node.incarnation, epoch
        self.ready_at = ready_at
        self.txns: dict[str, TxnMetadata] = {}
        self.busy: set[str] = set()
        self.markers: dict[str, PendingMarker] = {}
        self.stale = False
        self.recovered = False

    # ------------------------------------------------------------------ state

    def current(self) -> bool:
        """This node still leads the coordinator's partition in the epoch it loaded."""
        node = self.sim.nodes[self.node_id]
        p = node.driver.get(TXN_KEY) if node.driver is not None else None
        return (
            p is not None
            and node.incarnation == self.incarnation
            and p.core.is_leader
            and p.core.epoch == self.epoch
            and self.owner.coordinators.get(self.node_id) is self
        )

    def now(self) -> int:
        """The product's wall clock (``_now_ms``): the simulation's time, one for every
        coordinator (a start time identifies a transaction in the checks)."""
        return self.sim.now

    def load(self, log: MemLog, upto: int) -> None:
        for offset in range(upto):
            payload = self.owner.payloads.get(log.entries[offset][1])
            if payload is None:
                continue  # a leader-change record
            decoded = decode_txn_record(*payload)
            if decoded is not None and decoded[1] is not None:
                self.txns[decoded[0]] = decoded[1]
        for meta in self.txns.values():
            self.owner.known_durable(meta)

    def recover(self) -> None:
        """Finish every decision found in the log (markers again, then Complete)."""
        self.recovered = True
        for meta in sorted(self.txns.values(), key=lambda t: t.transactional_id):
            if meta.state.preparing:
                self.owner.stat("txn_recovered")
                self.recover_decision(meta)

    def recover_decision(self, meta: TxnMetadata) -> None:
        self.busy.add(meta.transactional_id)
        self.finish(meta, lambda: None)

    def write(self, meta: TxnMetadata, then: Callable[[bool], None]) -> None:
        """Append ``meta`` as its id's new state, acks=quorum; ``then(True)`` once it is
        acknowledged in this coordinator's epoch (and in the cache), else ``then(False)``
        (the coordinator is stale: read again before its next use)."""
        node = self.sim.nodes[self.node_id]
        uid = self.sim.next_uid
        self.sim.next_uid += 1
        self.owner.payloads[uid] = (
            encode_txn_key(meta.transactional_id),
            encode_txn_value(meta),
        )
        req = m.ProduceRequest(
            topic=TXN_KEY[0],
            partition=TXN_KEY[1],
            acks=m.ACKS_QUORUM,
            timeout_ms=PRODUCE_TIMEOUT_MS,
            records=client_batch([uid]),
        )
        self.owner.on_write(self, meta)
        self.sim.submit(node, req, ("txn-state", (self, meta, then)), key=TXN_KEY)

    def written(
        self, meta: TxnMetadata, resp: m.ProduceResponse, then: Callable[[bool], None]
    ) -> None:
        if resp.error == 0 and resp.leader_epoch == self.epoch and self.current():
            self.txns[meta.transactional_id] = meta
            self.owner.known_durable(meta)
            self.owner.on_durable(self, meta)
            then(True)
        else:
            self.stale = True
            then(False)

    # ------------------------------------------------------------------ requests

    def handle(
        self, req: CoordRequest, reply: Callable[[KafkaError, TxnMetadata | None], None]
    ) -> None:
        if not self.current() or self.stale:
            return reply(KafkaError.NOT_COORDINATOR, None)
        if self.sim.now < self.ready_at or not self.recovered:
            return reply(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, None)
        tid = req.tid
        if tid in self.busy:
            return reply(KafkaError.CONCURRENT_TRANSACTIONS, None)
        self.busy.add(tid)

        def done(error: KafkaError, keep_busy: bool = False) -> None:
            if not keep_busy:
                self.busy.discard(tid)
            reply(error, self.txns.get(tid))

        if req.kind == "init":
            self.init(req, done)
        elif req.kind == "add":
            meta = self.txns.get(tid)
            now = self.now()
            self.apply(
                add_partitions(meta, req.producer_id, req.producer_epoch, frozenset({KEY}), now),
                done,
            )
        else:
            decision = end_txn(
                self.txns.get(tid), req.producer_id, req.producer_epoch, req.commit, self.now()
            )
            if decision.error != KafkaError.NONE or decision.write is None:
                return done(decision.error)
            self.decide(decision.write, done)

    def apply(self, decision: Decision, done: Callable[..., None]) -> None:
        if decision.error != KafkaError.NONE or decision.write is None:
            return done(decision.error)
        self.write(
            decision.write, lambda ok: done(KafkaError.NONE if ok else KafkaError.NOT_COORDINATOR)
        )

    def init(self, req: CoordRequest, done: Callable[..., None]) -> None:
        meta = self.txns.get(req.tid)
        expected = (req.producer_id, req.producer_epoch)

        def then() -> None:
            after = self.txns.get(req.tid)
            named = expected
            if expected[0] >= 0 and after is not None and after is not meta:
                named = (expected[0], after.producer_epoch)  # the abort bumped it once
            decision = init_producer_id(
                after,
                req.tid,
                self.owner.timeout_ms,
                named,
                self.owner.new_producer_id(),
                self.now(),
            )
            self.apply(decision, done)

        if meta is not None and meta.state == TxnState.ONGOING:
            self.abort_ongoing(meta, lambda ok: then() if ok else done(KafkaError.NOT_COORDINATOR))
        else:
            then()

    def decide(self, prepare: TxnMetadata, done: Callable[..., None]) -> None:
        """EndTxn: the decision durable, then answered; its marker follows (the id
        stays busy until the marker is written)."""

        def decided(ok: bool) -> None:
            if not ok:
                return done(KafkaError.NOT_COORDINATOR)
            done(KafkaError.NONE, keep_busy=True)
            self.finish(prepare, lambda: None)

        self.write(prepare, decided)

    def abort_ongoing(self, meta: TxnMetadata, then: Callable[[bool], None]) -> None:
        """Abort ``meta``'s ongoing transaction with the epoch bumped: decision, markers,
        Complete."""
        prepare = begin_abort_on_timeout(meta, self.now())
        self.write(
            prepare, lambda ok: self.finish(prepare, lambda: then(True)) if ok else then(False)
        )

    def finish(self, prepare: TxnMetadata, then: Callable[[], None]) -> None:
        """Carry out a durable decision: its marker, then Complete (a new coordinator
        does the same from the log if this one stops first)."""

        def completed() -> None:
            done = complete(prepare, self.now())
            self.txns[prepare.transactional_id] = done

            def written(ok: bool) -> None:
                self.busy.discard(prepare.transactional_id)
                then()

            self.write(done, written)

        if KEY not in prepare.partitions:
            return completed()
        pending = PendingMarker(prepare, completed)
        self.markers[prepare.transactional_id] = pending
        self.send_marker(pending)

    # ------------------------------------------------------------------ markers

    def send_marker(self, pending: PendingMarker) -> None:
        if not self.owner.before_marker(self, pending):
            return
        meta = pending.meta
        req = m.WriteTxnMarkerRequest(
            topic=KEY[0],
            partition=KEY[1],
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            commit=meta.state == TxnState.PREPARE_COMMIT,
            coordinator_epoch=self.epoch,
            timeout_ms=PRODUCE_TIMEOUT_MS,
            timestamp_ms=self.now(),
        )
        pending.token = self.owner.new_token()
        pending.sent_at, pending.retry_at = self.sim.now, None
        self.owner.to_partition_leader(self, pending, req)

    def marker_answered(self, pending: PendingMarker, token: int, error: int | None) -> None:
        """``error`` None: the answer was lost (or never came): its outcome unknown."""
        if not self.current() or pending.token != token:
            return
        if self.markers.get(pending.meta.transactional_id) is not pending:
            return
        if error in (ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_EPOCH):
            self.marker_written(pending)
        elif error is None:
            self.marker_lost(pending)
        else:
            self.marker_refused(pending)

    def marker_written(self, pending: PendingMarker) -> None:
        del self.markers[pending.meta.transactional_id]
        pending.then()

    def marker_lost(self, pending: PendingMarker) -> None:
        """Its outcome unknown: sent again, as a new coordinator would."""
        self.marker_refused(pending)

    def marker_refused(self, pending: PendingMarker) -> None:
        """Not written: sent again after a back-off."""
        self.owner.stat("marker_retries")
        pending.token = None
        pending.retry_at = self.sim.now + pending.backoff_ms
        pending.backoff_ms = min(MARKER_BACKOFF_MS[1], pending.backoff_ms * 2)

    # ------------------------------------------------------------------ timers

    def tick(self) -> None:
        now = self.sim.now
        if not self.recovered:
            if now >= self.ready_at:
                self.recover()
            return
        for pending in list(self.markers.values()):
            if pending.token is not None and now - pending.sent_at >= RETRY_AFTER_MS:
                self.marker_answered(pending, pending.token, None)
            if pending.retry_at is not None and now >= pending.retry_at:
                self.send_marker(pending)
        self.expire()

    def expire(self) -> None:
        for tid, meta in sorted(self.txns.items()):
            if tid in self.busy or not expired(meta, self.now()):
                continue
            self.owner.stat("txn_timeouts")
            self.busy.add(tid)
            self.abort_ongoing(meta, self.release(tid))

    def release(self, tid: str) -> Callable[[bool], None]:
        return lambda ok: self.busy.discard(tid)


CoordinatorClass = type[SimCoordinator]
