"""Transactions in the simulation (``transactions`` seeds): transactional producers, a
transaction coordinator on whichever node leads its log (``coordinator``), the faults
aimed at them, and their invariants (``txn_checks``).

**Producers** (KIP-98, with KIP-360's epoch bump): InitProducerId, then transactions of
a few batches (each sent once, after AddPartitions; one left without a good answer
dooms the transaction), each ended by EndTxn (commit, or now and then abort). A doomed
transaction is ended by InitProducerId naming the epoch it has, which aborts it with
the epoch bumped, fencing the batch whose outcome is unknown. A fenced producer starts
over as a new instance of its transactional id.

**Faults**, on the transactions' own random stream, before the heal: a producer killed
mid-transaction (it sends nothing more; half come back under their transactional id,
the others never do and a new id takes their place); the coordinator's node crashed
right after its decision is durable (before its marker is sent, or just after), or
right after the decision is appended, before it is durable; the main partition's leader
crashed right after a marker reached it. Every fault of the main mix (crashes, cuts,
loss, clock jumps, full and slow disks) reaches the coordinator's log and its markers
too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.txn import TxnMetadata, TxnState
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import Role

from .coordinator import (
    TXN_KEY,
    CoordinatorClass,
    CoordRequest,
    Later,
    PendingMarker,
    SimCoordinator,
)
from .memlog import marker_record_id, transactional_batch
from .txn_checks import SimTxn, TxnChecks

if TYPE_CHECKING:
    from .cluster import SimNode, Simulation

#: Transaction timeouts a seed runs with: shorter ones expire some transactions whose
#: producers are alive (failovers take longer), and fence them.
TIMEOUTS_MS = (1500, 3000)
#: A producer's batch left unanswered this long has an unknown outcome.
RETRY_AFTER_MS = 3500
#: A producer asks its coordinator again after this long without an answer (a retry of
#: a request still under way is answered CONCURRENT_TRANSACTIONS).
ASK_AGAIN_MS = 1000
#: Injected transaction faults: one armed every so often during the fault phase.
FAULT_EVERY_MS = (1000, 3000)
RETRIABLE = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.CONCURRENT_TRANSACTIONS,
)


@dataclass(eq=False)
class SimTxnProducer:
    """A transactional producer (KIP-98, with KIP-360's epoch bump): InitProducerId,
    then transactions of a few batches (each sent once, after AddPartitions; one left
    without a good answer dooms the transaction), each ended by EndTxn. A doomed
    transaction is ended by InitProducerId naming the epoch it has, which aborts it with
    the epoch bumped, fencing the batch whose outcome is unknown."""

    tid: str
    producer_id: int = -1
    epoch: int = -1
    next_sequence: int = 0
    phase: str = "init"  # init, idle, adding, sending, ending, dead
    expected: tuple[int, int] = (-1, -1)  # the (id, epoch) its InitProducerId names
    batches_left: int = 0
    commit: bool = True
    txn: SimTxn | None = None
    in_flight: tuple[int, int] | None = None  # a batch's (token, sent at)
    asking: tuple[int, int] | None = None  # a coordinator request's (token, sent at)
    doomed: bool = False
    restart_at: int | None = None
    incarnation: int = 0


class SimTxns(TxnChecks):
    """The transactions of one run: producers, each node's coordinator, the faults
    aimed at them (and, inherited, their invariants)."""

    def __init__(
        self, sim: Simulation, coordinator_class: CoordinatorClass = SimCoordinator
    ) -> None:
        super().__init__(sim, sim.txn_rng.choice(TIMEOUTS_MS))
        self.rng = sim.txn_rng
        self.coordinator_class = coordinator_class
        self.producers = [SimTxnProducer("t7"), SimTxnProducer("t8")]
        self.next_tid = 9
        self.next_pid = 7
        self.tokens = 0  # of producers' requests to coordinators, and of markers' sends
        self.coordinators: dict[int, SimCoordinator] = {}
        self.armed: str | None = None  # a fault waiting for its moment
        # The run goes on past the main liveness check until the transactions settle.
        self.extra_ms = self.bound_ms + sim.p.liveness_bound_ms

    def later(self, delay: int, name: str, detail: str, fn: Callable[[], None]) -> None:
        self.sim.push_later(self.sim.now + delay, Later(name, detail, fn))

    def new_token(self) -> int:
        self.tokens += 1
        return self.tokens

    def new_producer_id(self) -> int:
        self.next_pid += 1
        return 10_000 + self.next_pid

    def start(self) -> None:
        self.later(self.rng.randint(*FAULT_EVERY_MS), "txn-fault", "", self.inject_fault)

    # ------------------------------------------------------------------ coordinators

    def coordinator_nodes(self) -> list[SimNode]:
        out = []
        for node in self.sim.nodes.values():
            p = node.driver.get(TXN_KEY) if node.driver is not None else None
            if p is not None and p.core.role is Role.LEADER:
                out.append(node)
        return out

    def tend_coordinators(self) -> None:
        """As the product's ticker: a node that newly leads the coordinator's partition
        (an entry of its epoch committed) reads it; one that no longer does forgets."""
        for node in self.sim.nodes.values():
            p = node.driver.get(TXN_KEY) if node.driver is not None else None
            c = self.coordinators.get(node.id)
            if p is None or not p.core.is_leader:
                if c is not None:
                    del self.coordinators[node.id]
                continue
            if (
                c is not None
                and c.epoch == p.core.epoch
                and c.incarnation == node.incarnation
                and not c.stale
            ):
                c.tick()
                continue
            if not p.core.leader_committed:
                continue
            c = self.coordinator_class(
                self, node, p.core.epoch, self.sim.now + self.rng.randint(20, 200)
            )
            self.coordinators[node.id] = c
            self.stat("coordinator_loads")
            c.load(node.extra_logs[TXN_KEY], p.core.high_watermark)

    def to_coordinator(self, t: SimTxnProducer, req: CoordRequest) -> None:
        leaders = self.coordinator_nodes()
        nodes = [n for n in self.sim.nodes.values() if n.driver is not None]
        if not nodes:
            return
        node = self.rng.choice(leaders if leaders and self.rng.random() < 0.9 else nodes)
        token = self.new_token()
        t.asking = (token, self.sim.now)
        inc = t.incarnation

        def reply(error: KafkaError, meta: TxnMetadata | None) -> None:
            if error in RETRIABLE:
                return self.coordinator_answered(t, inc, token, req, error, meta)
            # A round trip's delay where the answer moves the producer on.
            back = self.rng.randint(*self.sim.p.delay_ms)
            self.later(
                back,
                "txn-answer",
                f"{t.tid} {req.kind} {error.name}",
                lambda: self.coordinator_answered(t, inc, token, req, error, meta),
            )

        c = self.coordinators.get(node.id)
        if c is None:
            return reply(KafkaError.NOT_COORDINATOR, None)
        c.handle(req, reply)

    def to_partition_leader(
        self, c: SimCoordinator, pending: PendingMarker, req: m.WriteTxnMarkerRequest
    ) -> None:
        """A marker, from the coordinator's node to the main partition's leader as it
        knows it (now and then a node that is not), over the simulated network."""
        sim = self.sim
        nodes = [n for n in sim.nodes.values() if n.driver is not None]
        leaders = [n for n in nodes if n.core is not None and n.core.role is Role.LEADER]
        if not nodes:
            return
        target = self.rng.choice(leaders if leaders and self.rng.random() < 0.9 else nodes)
        src, token = c.node_id, pending.token
        if src != target.id and ((src, target.id) in sim.blocked or self.rng.random() < sim.loss):
            return  # lost: sent again after a silence

        def arrive() -> None:
            if target.driver is None:
                return
            sim.submit(target, req, ("txn-marker", (c, pending, token, src)))
            if self.armed == "leader" and sim.now < sim.p.fault_ms:
                self.armed = None
                self.crash(target, "partition leader crashed holding a marker")

        if src == target.id:
            arrive()
        else:
            delay = self.rng.randint(*sim.p.delay_ms)
            self.later(delay, "txn-marker", f"to node {target.id}", arrive)

    def before_marker(self, c: SimCoordinator, pending: PendingMarker) -> bool:
        """The armed fault of a coordinator killed between its decision and its marker:
        before it is sent (False) or just after."""
        if self.armed != "decided" or self.sim.now >= self.sim.p.fault_ms:
            return True
        self.armed = None
        node = self.sim.nodes[c.node_id]
        if self.rng.random() < 0.5:
            self.crash(node, "coordinator crashed after its decision, before its marker")
            return False
        self.crash(
            node,
            "coordinator crashed after its decision and marker sent",
            delay=self.rng.randint(1, 10),
        )
        return True

    def on_write(self, c: SimCoordinator, meta: TxnMetadata) -> None:
        if meta.state.preparing and self.armed == "deciding" and self.sim.now < self.sim.p.fault_ms:
            self.armed = None
            self.crash(
                self.sim.nodes[c.node_id], "coordinator crashed before its decision is durable"
            )

    def on_durable(self, c: SimCoordinator, meta: TxnMetadata) -> None:
        if meta.state.preparing:
            commit = meta.state == TxnState.PREPARE_COMMIT
            self.stat("txn_commits" if commit else "txn_aborts")

    def crash(self, node: SimNode, why: str, delay: int = 0) -> None:
        """Crash ``node`` once the step under way is done (unflushed data lost)."""
        sim = self.sim
        inc = node.incarnation

        def crash() -> None:
            if node.alive and node.incarnation == inc:
                self.stat("txn_crashes")
                sim.crash(node, why, self.rng.randint(100, 3000))

        self.later(delay, "txn-crash", f"node {node.id}", crash)

    def inject_fault(self) -> None:
        sim = self.sim
        if sim.now >= sim.p.fault_ms:
            return
        self.later(self.rng.randint(*FAULT_EVERY_MS), "txn-fault", "", self.inject_fault)
        r = self.rng.random()
        if r < 0.35:
            busy = [t for t in self.producers if t.phase in ("adding", "sending", "ending")]
            if busy:
                self.kill_producer(self.rng.choice(busy))
        elif r < 0.65:
            self.armed = "decided"
        elif r < 0.85:
            self.armed = "deciding"
        else:
            self.armed = "leader"

    def kill_producer(self, t: SimTxnProducer) -> None:
        sim = self.sim
        self.stat("producer_kills")
        t.phase, t.incarnation = "dead", t.incarnation + 1
        t.asking = t.in_flight = None
        if self.rng.random() < 0.5:
            t.restart_at = sim.now + self.rng.randint(500, 4000)
            sim.fault(f"producer {t.tid} killed mid-transaction; back at {t.restart_at}")
        else:
            new = SimTxnProducer(f"t{self.next_tid}")
            self.next_tid += 1
            self.producers[self.producers.index(t)] = new
            sim.fault(f"producer {t.tid} killed mid-transaction for good; {new.tid} instead")

    # ------------------------------------------------------------------ producers

    def step(self) -> None:
        self.tend_coordinators()
        self.check_undecided()
        if self.sim.now < self.sim.paused_until:
            return
        for t in list(self.producers):
            self.producer_step(t)

    def producer_step(self, t: SimTxnProducer) -> None:
        sim = self.sim
        now = sim.now
        if t.phase == "dead":
            if t.restart_at is None or now < t.restart_at:
                return
            t.restart_at, t.phase, t.expected, t.doomed = None, "init", (-1, -1), False
        if t.asking is not None:
            if now - t.asking[1] < ASK_AGAIN_MS:
                return
            t.asking = None  # no answer: asked again
        if t.in_flight is not None:
            if now - t.in_flight[1] < RETRY_AFTER_MS:
                return
            t.in_flight, t.doomed = None, True  # its outcome is unknown
        if t.phase == "init":
            return self.to_coordinator(t, CoordRequest("init", t.tid, *t.expected))
        if t.phase == "idle":
            t.phase, t.batches_left = "adding", self.rng.randint(1, 3)
            t.commit = self.rng.random() < 0.7
        if t.phase == "adding":
            return self.to_coordinator(t, CoordRequest("add", t.tid, t.producer_id, t.epoch))
        if t.phase == "sending" and t.doomed:
            # KIP-360: InitProducerId naming its epoch aborts the transaction, bumped.
            t.phase, t.expected = "init", (t.producer_id, t.epoch)
            return self.to_coordinator(t, CoordRequest("init", t.tid, *t.expected))
        if t.phase == "sending" and t.batches_left == 0:
            t.phase = "ending"
        if t.phase == "ending":
            return self.to_coordinator(
                t, CoordRequest("end", t.tid, t.producer_id, t.epoch, t.commit)
            )
        node = self.target()
        if node is None:
            return
        ids = [sim.next_uid + i for i in range(self.rng.randint(1, 3))]
        sim.next_uid += len(ids)
        assert t.txn is not None
        self.txn_of[ids[0]] = t.txn
        records = transactional_batch(ids, (t.producer_id, t.epoch, t.next_sequence))
        t.next_sequence += len(ids)
        t.in_flight = (sim.next_token, now)
        t.batches_left -= 1
        sim.submit(
            node,
            sim.produce_request(records),
            ("txn-batch", (t, t.incarnation, ids, sim.next_token)),
        )

    def go_on(self, t: SimTxnProducer) -> None:
        """A producer takes its next step as soon as an answer lets it (an error it
        retries waits for its next round)."""
        if t.phase != "dead":
            self.producer_step(t)

    def target(self) -> SimNode | None:
        alive = [n for n in self.sim.nodes.values() if n.driver is not None]
        leaders = [n for n in alive if n.core and n.core.role is Role.LEADER]
        if not alive or (not leaders and self.rng.random() < 0.9):
            return None
        return self.rng.choice(leaders if leaders and self.rng.random() < 0.9 else alive)

    def coordinator_answered(
        self,
        t: SimTxnProducer,
        inc: int,
        token: int,
        req: CoordRequest,
        error: KafkaError,
        meta: TxnMetadata | None,
    ) -> None:
        if t.incarnation != inc or t.asking is None or t.asking[0] != token:
            return  # given up on, or its producer died
        t.asking = None
        if error in RETRIABLE:
            return  # asked again at its next step
        if error != KafkaError.NONE:
            # Fenced (its transaction aborted by the timeout, or another incarnation of
            # its id initialised): a new producer instance of the id.
            self.stat("txn_fenced")
            t.phase, t.expected, t.doomed, t.txn = "init", (-1, -1), False, None
            return
        assert meta is not None
        if req.kind == "init":
            t.producer_id, t.epoch, t.next_sequence = meta.producer_id, meta.producer_epoch, 0
            t.phase, t.expected, t.doomed, t.txn = "idle", (-1, -1), False, None
        elif req.kind == "add":
            t.phase = "sending"
            t.txn = SimTxn(meta.producer_id, meta.producer_epoch, meta.started_ms)
        else:
            t.phase, t.txn = "idle", None
        self.go_on(t)

    def answered(self, node: SimNode, kind: str, resp: Any, what: Any) -> None:
        if kind == "txn-state":
            c, meta, then = what
            c.written(meta, resp, then)
        elif kind == "txn-batch":
            t, inc, ids, token = what
            if resp.error == 0:
                self.sim.acknowledged(resp, ids)
            if t.incarnation != inc or t.in_flight is None or t.in_flight[0] != token:
                return
            t.in_flight = None
            if resp.error != 0:
                t.doomed = True
            self.go_on(t)
        else:
            c, pending, token, src = what
            if resp.error == 0:
                mark = marker_record_id(
                    pending.meta.producer_id, pending.meta.state == TxnState.PREPARE_COMMIT
                )
                self.sim.acknowledged(resp, [mark])
            if src != node.id and (node.id, src) in self.sim.blocked:
                return  # the answer is lost: retried after a silence
            self.later(
                0 if src == node.id else self.rng.randint(*self.sim.p.delay_ms),
                "txn-marker-answer",
                f"{pending.meta.producer_id} error {resp.error}",
                lambda: c.marker_answered(pending, token, resp.error),
            )

    # ------------------------------------------------------------------ invariants
