"""Every crash point of a transaction group's batch (the Spark sink's exactly-once commit),
enumerated against the coordinator's pure rules (``kafka.txn``).

The model runs what the coordinator and a Spark query do for one batch, step by step: each
task asks the group's fence, initialises its member (an open transaction of an earlier
attempt is aborted first, with the epoch bumped: record, markers, Complete), adds its
partition, writes its rows; the driver decides (``group_commit``: one record batch); the
markers; the Complete records. Records reach the coordinator's partition as whole batches
(``durable``); the cache and everything after a crash point are lost. After a crash the
next coordinator loads the durable records and finishes every Prepare* it finds, open
transactions time out (aborted with the epoch bumped, as the coordinator's timer does),
and the restarted query replays the batch from its start. Two crashes in a row too.

Invariant, after the batch and the one after it ran: read_committed readers see every row
of both batches exactly once, and nothing else. A coordinator that wrote the members'
decisions one batch each (``atomic=False``) is caught duplicating a batch: the teeth."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.txn import (
    TxnMetadata,
    TxnState,
    add_partitions,
    begin_abort_on_timeout,
    complete,
    group_commit,
    init_producer_id,
)

GROUP = "spark-sink/q"
TASKS = (0, 1)
ROWS = 2
TIMEOUT_MS = 60_000

Record = tuple[str, TxnMetadata | int]  # ("txn", meta) or ("fence", batch)


@dataclass
class Row:
    value: tuple[int, int, int]  # batch, task, index
    producer: tuple[int, int]  # id, epoch
    state: str = "open"  # open, commit, abort


@dataclass
class Model:
    atomic: bool = True
    expire: bool = True  # a crash outlasts the open transactions' timeout
    durable: list[list[Record]] = field(default_factory=list)
    txns: dict[str, TxnMetadata] = field(default_factory=dict)
    fence: int = -1
    rows: list[Row] = field(default_factory=list)
    next_pid: Iterator[int] = field(default_factory=lambda: itertools.count(100))

    # ---- the coordinator's partition
    def write(self, *records: Record) -> None:
        """Records appended as one batch (all or none), then into the cache."""
        self.durable.append(list(records))
        self._apply(records)

    def _apply(self, records: list[Record] | tuple[Record, ...]) -> None:
        for kind, value in records:
            if kind == "fence":
                assert isinstance(value, int)
                self.fence = value
            else:
                assert isinstance(value, TxnMetadata)
                self.txns[value.transactional_id] = value

    def crash_and_recover(self) -> None:
        """A new coordinator: the durable records only; it finishes every decision, and
        (``expire``) the open transactions of the dead query time out before it
        restarts (else its tasks' initialisations abort them)."""
        self.txns, self.fence = {}, -1
        for batch in self.durable:
            self._apply(batch)
        for meta in list(self.txns.values()):
            if meta.state.preparing:
                self.finish(meta)
        for meta in list(self.txns.values()):
            if self.expire and meta.state == TxnState.ONGOING:
                aborted = begin_abort_on_timeout(meta, 0)
                self.write(("txn", aborted))
                self.finish(aborted)

    # ---- the partitions
    def markers(self, meta: TxnMetadata) -> None:
        """The decision's marker on the member's partition: it ends the producer's open
        transaction written with an epoch up to the marker's."""
        assert meta.state.preparing
        outcome = "commit" if meta.state == TxnState.PREPARE_COMMIT else "abort"
        for row in self.rows:
            pid, epoch = row.producer
            if pid == meta.producer_id and epoch <= meta.producer_epoch and row.state == "open":
                row.state = outcome

    def finish(self, meta: TxnMetadata) -> None:
        self.markers(meta)
        self.write(("txn", complete(meta, 0)))

    def committed(self) -> Counter[tuple[int, int, int]]:
        return Counter(r.value for r in self.rows if r.state == "commit")


def batch_steps(model: Model, batch: int) -> list[Callable[[], None]]:
    """One run of ``batch``, as steps a crash may fall between (each task's, then the
    driver's); the steps read what earlier ones left in ``state``."""
    state: dict[str, object] = {"members": {}, "skip": set()}
    members: dict[int, TxnMetadata] = state["members"]  # type: ignore[assignment]
    skip: set[int] = state["skip"]  # type: ignore[assignment]
    steps: list[Callable[[], None]] = []

    for task in TASKS:
        tid = f"{GROUP}#{task}"

        def ask_fence(task: int = task) -> None:
            if batch <= model.fence:
                skip.add(task)  # a replay of a committed batch writes nothing

        def abort_earlier(tid: str = tid, task: int = task) -> None:
            meta = model.txns.get(tid)
            if task in skip or meta is None or meta.state != TxnState.ONGOING:
                return
            aborted = begin_abort_on_timeout(meta, 0)
            model.write(("txn", aborted))
            model.finish(aborted)

        def init(tid: str = tid, task: int = task) -> None:
            if task in skip:
                return
            d = init_producer_id(
                model.txns.get(tid), tid, TIMEOUT_MS, (-1, -1), next(model.next_pid), 0
            )
            assert d.error == KafkaError.NONE and d.write is not None
            model.write(("txn", d.write))

        def add_and_write(tid: str = tid, task: int = task) -> None:
            if task in skip:
                return
            meta = model.txns[tid]
            d = add_partitions(
                meta, meta.producer_id, meta.producer_epoch, frozenset({("out", task)}), 0
            )
            assert d.error == KafkaError.NONE
            if d.write is not None:
                model.write(("txn", d.write))
            meta = model.txns[tid]
            members[task] = meta
            for i in range(ROWS):
                model.rows.append(Row((batch, task, i), (meta.producer_id, meta.producer_epoch)))

        steps += [ask_fence, abort_earlier, init, add_and_write]

    def decide() -> None:
        named = [
            (model.txns.get(m.transactional_id), m.producer_id, m.producer_epoch)
            for m in members.values()
        ]
        d = group_commit(model.fence, batch, named, True, 0)
        assert d.error == KafkaError.NONE
        records: list[Record] = [("txn", w) for w in d.writes]
        if d.fence_moves:
            records.append(("fence", d.fence))
        if model.atomic:
            model.write(*records)
        else:  # broken: one batch per record, the fence last
            for record in records:
                model.write(record)
        state["decided"] = d.writes

    def finish_all() -> None:
        for meta in state.get("decided", ()):  # type: ignore[attr-defined]
            if model.txns.get(meta.transactional_id) == meta:
                model.finish(meta)

    return [*steps, decide, finish_all]


def _expected() -> Counter[tuple[int, int, int]]:
    return Counter((b, t, i) for b in (0, 1) for t in TASKS for i in range(ROWS))


def run(model: Model, crashes: list[int]) -> Counter[tuple[int, int, int]]:
    """Batches 0 and 1; batch 0's runs crash at the given step numbers in turn (a step
    number past its run's end: no crash), then it runs through; then batch 1."""
    for crash_at in crashes:
        steps = batch_steps(model, 0)
        if crash_at >= len(steps):
            break
        for step in steps[:crash_at]:
            step()
        # A step half done is a step not done or done: the steps above write whole
        # batches, and the model's crash point falls between them.
        model.crash_and_recover()
    return _run_through(model)


def _run_through(model: Model) -> Counter[tuple[int, int, int]]:
    """Batch 0 (again) and batch 1 without a crash; what read_committed readers see."""
    for batch in (0, 1):
        for step in batch_steps(model, batch):
            step()
    return model.committed()


def _crash_points() -> int:
    return len(batch_steps(Model(), 0)) + 1


@pytest.mark.parametrize("expire", [True, False])
def test_every_crash_point_leaves_each_row_once(expire: bool) -> None:
    n = _crash_points()
    cases = [[k] for k in range(n)] + [[a, b] for a in range(n) for b in range(n)]
    for crashes in cases:
        got = run(Model(expire=expire), crashes)
        assert got == _expected(), f"crashes at steps {crashes}: {sorted(got.items())}"


def test_a_decision_split_over_batches_duplicates_a_batch() -> None:
    """Teeth: the members' PrepareCommits written one batch each (the fence last): a
    crash between two leaves one member committed and the fence where it was; the replay
    commits that member's rows again."""
    n = _crash_points()
    broken = [
        k
        for k in range(n)
        for model in [Model(atomic=False)]
        if _split_decision(model, k) != _expected()
    ]
    assert broken, "no crash point caught the non-atomic decision"


def _split_decision(model: Model, k: int) -> Counter[tuple[int, int, int]]:
    # Crash inside the decision: after its first record of the batch is written.
    steps = batch_steps(model, 0)
    for step in steps[:k]:
        step()
    decide = steps[len(TASKS) * 4]
    if k == len(TASKS) * 4:
        # write only the first record of the decision, then crash
        written = len(model.durable)
        decide()
        del model.durable[written + 1 :]
    model.crash_and_recover()
    return _run_through(model)


@pytest.mark.parametrize("atomic", [True, False])
def test_the_model_commits_without_crashes(atomic: bool) -> None:
    assert run(Model(atomic=atomic), []) == _expected()
