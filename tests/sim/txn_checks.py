"""The transactions' invariants, checked against the committed histories of the main
partition and of the coordinator's log (``coordinator.TXN_KEY``):

* ``txn-marker-undecided``: a marker committed in the main partition has a decision of
  its outcome (a Prepare* of that producer id and epoch) committed in the coordinator's
  log, and so has every batch it ends: a Prepare* of the batch's own transaction (the
  producer id and start time the coordinator recorded when it began);
* ``txn-decision-reversed``: a decision once known durable (acknowledged to the
  coordinator that wrote it, or read by a coordinator loading the log) is never followed
  by a decision of the other outcome for the same transaction in the coordinator's log,
  and no batch of a transaction ends with the outcome opposite its decision;
* ``txn-undecided``: once faults stop, every transactional batch committed in the main
  partition is ended by a committed marker within the transaction timeout, a failover
  (``liveness_bound_ms``) and a second: the last stable offset passes every transaction
  begun before the heal;
* read_committed fetches (``check_read_committed``): ``consumer-above-lso``: nothing is
  served at or above the last stable offset; ``txn-uncommitted-visible``: what a reader
  sees, after dropping the aborted transactions it is told of, holds no transactional
  record whose commit marker is not in the committed history; ``txn-committed-hidden``:
  nor does it miss one whose commit marker is; ``lso-monotonic``: the last stable offset
  the leaders report never goes back.

(A decision written but never known durable, because its write's answer was lost, may
be followed by the other: a coordinator that read the log below it aborts the
transaction, and nothing acted on the first. Kafka's coordinator does the same.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.replica.kafka.txn import TxnMetadata, TxnState, decode_txn_record
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage.transactions import committed_batches

from .coordinator import TXN_KEY
from .memlog import COMMIT, CONTROL, TXN, MemLog, decode_sim_batches, marker_of
from .violation import Violation

if TYPE_CHECKING:
    from .cluster import SimNode, Simulation


@dataclass(eq=False)
class SimTxn:
    """One transaction as its producer began it: the id and start time its coordinator
    recorded (Ongoing), which every later state of it keeps."""

    producer_id: int
    epoch: int
    started_ms: int


class TxnChecks:
    """What the checks know: the coordinator's log as committed, its decisions, and the
    main partition's transactional batches not yet ended."""

    def __init__(self, sim: Simulation, timeout_ms: int) -> None:
        self.sim = sim
        self.timeout_ms = timeout_ms
        self.payloads: dict[int, tuple[bytes, bytes]] = {}  # a state record's bytes by id
        # The coordinator's log as committed (its highest high watermark's prefix).
        self.state_committed = 0
        # Decisions committed there: (producer id, start) -> outcomes; and by epoch.
        self.decisions: dict[tuple[int, int], set[bool]] = {}
        self.decided_epochs: set[tuple[int, int, bool]] = set()
        # Decisions known durable (acknowledged, or loaded): (producer id, start) -> outcome.
        self.known: dict[tuple[int, int], bool] = {}
        # Transactional batches committed in the main partition and not yet ended by a
        # committed marker, by producer id: (base offset, first record id, when).
        self.open: dict[int, list[tuple[int, int, int]]] = {}
        self.txn_of: dict[int, SimTxn] = {}  # a batch's first record id -> its transaction
        self.max_lso = (-1, -1)
        self.bound_ms = timeout_ms + sim.p.liveness_bound_ms + 1000

    def stat(self, name: str, n: int = 1) -> None:
        self.sim.stats[name] = self.sim.stats.get(name, 0) + n

    def known_durable(self, meta: TxnMetadata) -> None:
        if meta.state.preparing:
            self.known.setdefault(
                (meta.producer_id, meta.started_ms), meta.state == TxnState.PREPARE_COMMIT
            )

    def check_state(self, node: SimNode) -> None:
        """The coordinator's log as committed grows: its decisions are checked."""
        p = node.driver.get(TXN_KEY) if node.driver is not None else None
        if p is None or p.core.high_watermark <= self.state_committed:
            return
        log = node.extra_logs[TXN_KEY]
        for offset in range(self.state_committed, p.core.high_watermark):
            payload = self.payloads.get(log.entries[offset][1])
            decoded = decode_txn_record(*payload) if payload is not None else None
            if decoded is None or decoded[1] is None or not decoded[1].state.preparing:
                continue
            meta = decoded[1]
            commit = meta.state == TxnState.PREPARE_COMMIT
            txn = (meta.producer_id, meta.started_ms)
            known = self.known.get(txn)
            if known is not None and known != commit and not self.sim.unclean:
                raise Violation(
                    "txn-decision-reversed",
                    f"{meta.transactional_id}: a {_outcome(commit)} decision of producer "
                    f"{meta.producer_id} epoch {meta.producer_epoch} (transaction begun at "
                    f"{meta.started_ms}) committed at {offset} after its {_outcome(known)} "
                    "was known durable",
                )
            self.decisions.setdefault(txn, set()).add(commit)
            self.decided_epochs.add((meta.producer_id, meta.producer_epoch, commit))
        self.state_committed = p.core.high_watermark

    def key_committed(self, log: MemLog, offset: int) -> None:
        """A transactional record of the main partition is committed at ``offset``."""
        _, uid, base, flags = log.entries[offset]
        if base != offset:
            return
        producer = log.producer_of[base][0]
        if not flags & CONTROL:
            self.open.setdefault(producer[0], []).append((base, uid, self.sim.now))
            return
        pid, epoch, commit = producer[0], producer[1], bool(flags & COMMIT)
        if self.sim.unclean:
            self.open.pop(pid, None)
            return
        if (pid, epoch, commit) not in self.decided_epochs:
            raise Violation(
                "txn-marker-undecided",
                f"a {_outcome(commit)} marker of producer {pid} epoch {epoch} committed at "
                f"{offset} with no such decision in the coordinator's log",
            )
        for batch, first, _ in self.open.pop(pid, []):
            txn = self.txn_of[first]
            outcomes = self.decisions.get((pid, txn.started_ms), set())
            if commit in outcomes:
                continue
            raise Violation(
                "txn-decision-reversed" if outcomes else "txn-marker-undecided",
                f"a {_outcome(commit)} marker of producer {pid} epoch {epoch} at {offset} "
                f"ends its batch at {batch} (epoch {txn.epoch}, transaction begun at "
                f"{txn.started_ms}), whose transaction is "
                + (f"decided {_outcome(not commit)}" if outcomes else "not decided"),
            )

    def check_undecided(self, final: bool = False) -> None:
        healed = self.sim.healed_at
        if healed is None or self.sim.unclean:
            return
        now = self.sim.now
        for pid, batches in self.open.items():
            for base, first, at in batches:
                late = now - max(at, healed) > self.bound_ms
                if late or (final and first < self.sim.heal_uid):
                    raise Violation(
                        "txn-undecided",
                        f"producer {pid}'s transactional batch at {base}, committed at "
                        f"t={at}, has no marker by t={now} (faults stopped at t={healed}, "
                        f"transaction timeout {self.timeout_ms} ms)",
                    )

    def settled(self) -> bool:
        """Every transactional batch sent before the heal is ended by a marker."""
        heal_uid = self.sim.heal_uid
        return self.sim.unclean or not any(
            first < heal_uid for batches in self.open.values() for _, first, _ in batches
        )

    def check_read_committed(self, node: SimNode, resp: m.FetchResponse) -> None:
        """What a read_committed fetch was served, against the committed history."""
        sim = self.sim
        epoch, lso = resp.leader_epoch, resp.last_stable_offset
        if not sim.unclean:
            if epoch >= self.max_lso[0] and lso < self.max_lso[1]:
                raise Violation(
                    "lso-monotonic",
                    f"node {node.id} reported LSO {lso} in epoch {epoch}; "
                    f"{self.max_lso[1]} was reported in epoch {self.max_lso[0]}",
                )
            if epoch >= self.max_lso[0]:
                self.max_lso = (epoch, lso)
        batches = list(decode_sim_batches(resp.records))
        headers = [_SimHeader(b.base, b.flags, b.producer[0]) for b in batches]
        aborted = [(a.producer_id, a.first_offset) for a in resp.aborted_transactions]
        seen = {h.base_offset for h in committed_batches(headers, aborted)}
        if resp.records:
            self.stat("read_committed_fetched")
        if any(
            h.is_transactional and not h.is_control and h.base_offset not in seen for h in headers
        ):
            self.stat("aborted_dropped")
        for batch in batches:
            base, flags, producer = batch.base, batch.flags, batch.producer
            if batch.next_offset > lso:
                raise Violation(
                    "consumer-above-lso",
                    f"node {node.id} served offsets {base}-{batch.next_offset - 1} to a "
                    f"read_committed fetch with LSO {lso}",
                )
            if not flags & TXN or flags & CONTROL or sim.unclean:
                continue
            outcome = self.txn_outcome(producer[0], batch.next_offset)
            if base in seen and outcome is not True:
                raise Violation(
                    "txn-uncommitted-visible",
                    f"node {node.id} let a read_committed fetch see producer {producer[0]}'s "
                    f"batch at {base}, whose transaction is "
                    f"{'aborted' if outcome is False else 'not committed'}",
                )
            if base not in seen and outcome is True:
                raise Violation(
                    "txn-committed-hidden",
                    f"a read_committed fetch from node {node.id} dropped producer "
                    f"{producer[0]}'s batch at {base} of a committed transaction",
                )

    def txn_outcome(self, producer_id: int, after: int) -> bool | None:
        """The outcome of the first marker of ``producer_id`` at or after ``after`` in
        the committed history (None: none there yet)."""
        for _, uid in self.sim.committed[after:]:
            marker = marker_of(uid)
            if marker is not None and marker[0] == producer_id:
                return marker[1]
        return None


def _outcome(commit: bool) -> str:
    return "commit" if commit else "abort"


@dataclass(frozen=True)
class _SimHeader:
    """A simulated batch as ``storage.transactions`` reads headers."""

    base_offset: int
    flags: int
    producer_id: int

    @property
    def is_control(self) -> bool:
        return bool(self.flags & CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.flags & TXN)

    @property
    def marker(self) -> bool | None:
        if self.flags & (CONTROL | TXN) != CONTROL | TXN:
            return None
        return bool(self.flags & COMMIT)
