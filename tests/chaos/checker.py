"""Jepsen's anomaly kinds for a log, computed from what the campaign recorded.

Inputs (all per partition):

* ``acks``: every acknowledged record (offset, epoch, value) the producer was told about;
* ``log``: the final committed log, read from the leader up to the high watermark;
* ``replicas``: every replica's log files, read after the cluster stopped;
* ``table``: the final Delta table's rows;
* ``batches``: the stream's micro-batches in commit order (what it consumed, when).

Anomalies (every count must be zero unless said otherwise):

* ``lost``: an acknowledged record missing from the log or from the table;
* ``duplicate``: one (partition, offset) twice in the table, or one value at two offsets of
  the table that the log holds once;
* ``inconsistent``: one offset, two different records among the replicas' files (committed
  prefix), the log and the acknowledgements;
* ``nonmonotonic``: a batch starting below where the previous one ended without a
  truncation recorded in that commit, offsets not strictly increasing, or epochs going back;
* ``skip``: a record of the log the stream jumped over (absent from the batch that covered
  its offset and never delivered later);
* ``stale``: a table row whose record is not the log's at that offset (the stream read a
  zombie's or an uncommitted record and the table kept it).

Transactions (KIP-98; ``transactions``: what each transactional producer was told, and
``log`` is read read_committed once no transaction is open):

* ``txn_lost``: a record of a committed transaction (commit_transaction() returned)
  missing from the log or from the table;
* ``txn_duplicate``: a record of a transaction twice in the log or in the table;
* ``txn_aborted_visible``: a record of an aborted transaction in the log or the table;
* ``txn_partial``: a transaction of unknown outcome partly in the log or the table (all
  of it or none of it is allowed).

Not anomalies, counted apart: ``lost_unclean`` (acknowledged records at or past the
divergence offset of a forced unclean election, written in an older epoch),
``txn_unknown`` (transactions whose commit raised a fatal or timeout error: either
outcome is allowed), ``txn_lost_unclean`` (like ``lost_unclean``, for committed
transactions' records), ``log_duplicates`` (a value twice in the log: the client retries
a produce whose answer was lost, documented in ``Client.produce`` — no idempotent
producer yet) and
``not_converged`` (two replicas' files holding different records at one offset past the
committed prefix: an uncommitted tail not yet truncated when the cluster stopped).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

Record = tuple[int, int, bytes]  # offset, epoch, value


@dataclass(frozen=True)
class ConsumedBatch:
    batch_id: int
    partition: int
    records: tuple[Record, ...]  # as the micro-batch held them
    truncated: bool  # the sink recorded a truncation of this partition in this commit


# The kinds above, each named once: anomalies, then the kinds counted apart.
ANOMALIES = (
    "lost",
    "duplicate",
    "inconsistent",
    "nonmonotonic",
    "skip",
    "stale",
    "txn_lost",
    "txn_duplicate",
    "txn_aborted_visible",
    "txn_partial",
)
COUNTED_APART = (
    "lost_unclean",
    "log_duplicates",
    "not_converged",
    "txn_unknown",
    "txn_lost_unclean",
)

# What a transactional producer learnt of a transaction's outcome.
COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"


@dataclass(frozen=True)
class TxnRecord:
    partition: int
    value: bytes
    # From the delivery report (-1: none came, or librdkafka did not say: the epoch only
    # tells an unclean election's losses apart, and an unknown one counts as older).
    offset: int = -1
    epoch: int = -1


@dataclass(frozen=True)
class Transaction:
    """One transaction of a transactional producer. ``outcome``: ``committed`` when
    commit_transaction() returned; ``aborted`` when abort_transaction() returned, or
    commit_transaction() was never called (the producer gave up first: only an abort,
    by the transaction's timeout or the next producer epoch, can end it); ``unknown``
    when commit_transaction() raised and no abort_transaction() returned after it."""

    producer: int
    number: int
    outcome: str
    records: tuple[TxnRecord, ...]

    def describe(self) -> str:
        return f"txn {self.producer}/{self.number} ({self.outcome}, {len(self.records)} records)"


@dataclass
class Counts:
    """How many of each kind ``check`` found (``counts["lost"]``), and a few examples."""

    found: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(ANOMALIES + COUNTED_APART, 0)
    )
    examples: dict[str, list[str]] = field(default_factory=dict)

    def __getitem__(self, kind: str) -> int:
        return self.found[kind]

    def add(self, kind: str, example: str, n: int = 1) -> None:
        self.found[kind] += n  # a KeyError for a kind not named above
        shown = self.examples.setdefault(kind, [])
        if len(shown) < 5:
            shown.append(example)

    def anomalies(self) -> int:
        return sum(self.found[k] for k in ANOMALIES)

    def summary(self) -> dict[str, int]:
        return dict(self.found)


@dataclass(frozen=True)
class ForcedElection:
    """A forced unclean election: records at or past ``divergence`` written in an epoch
    below ``epoch`` may be gone."""

    partition: int
    epoch: int
    divergence: int


def check(
    partitions: Sequence[int],
    acks: Mapping[int, Sequence[Record]],
    log: Mapping[int, Sequence[Record]],
    high_watermarks: Mapping[int, int],
    replicas: Mapping[int, Mapping[int, Mapping[int, bytes | None]]],
    table: Mapping[int, Sequence[Record]],
    batches: Sequence[ConsumedBatch],
    forced: Sequence[ForcedElection] = (),
    transactions: Sequence[Transaction] = (),
) -> Counts:
    """``replicas[p][node]`` maps offset -> value (None for a control record)."""
    c = Counts()
    for p in partitions:
        _check_partition(c, p, acks.get(p, ()), log.get(p, ()), high_watermarks.get(p, 0),
                         replicas.get(p, {}), table.get(p, ()),
                         [b for b in batches if b.partition == p],
                         [f for f in forced if f.partition == p])  # fmt: skip
    _check_transactions(c, transactions, log, table, forced)
    return c


def _check_transactions(
    c: Counts,
    transactions: Sequence[Transaction],
    log: Mapping[int, Sequence[Record]],
    table: Mapping[int, Sequence[Record]],
    forced: Sequence[ForcedElection],
) -> None:
    def lost_to_unclean(r: TxnRecord) -> bool:
        return any(
            r.partition == f.partition and r.offset >= f.divergence and r.epoch < f.epoch
            for f in forced
        )

    places = {
        name: Counter((p, v) for p, rows in where.items() for _, _, v in rows)
        for name, where in (("log", log), ("table", table))
    }
    for t in transactions:
        if t.outcome == UNKNOWN:
            c.add("txn_unknown", t.describe())
        for name, seen in places.items():
            counts = [seen[(r.partition, r.value)] for r in t.records]
            for r, n in zip(t.records, counts, strict=True):
                if n > 1:
                    c.add("txn_duplicate", f"{t.describe()}: {r.value!r} {n} times in the {name}")
            missing = [r for r, n in zip(t.records, counts, strict=True) if n == 0]
            if t.outcome == COMMITTED:
                for r in missing:
                    kind = "txn_lost_unclean" if lost_to_unclean(r) else "txn_lost"
                    c.add(kind, f"{t.describe()}: p{r.partition} {r.value!r} not in the {name}")
            elif t.outcome == ABORTED:
                for r, n in zip(t.records, counts, strict=True):
                    if n:
                        c.add(
                            "txn_aborted_visible",
                            f"{t.describe()}: p{r.partition} {r.value!r} in the {name}",
                        )
            elif missing and len(missing) < len(t.records):
                kind = "txn_lost_unclean" if all(map(lost_to_unclean, missing)) else "txn_partial"
                c.add(kind, f"{t.describe()}: {len(missing)} missing from the {name}")


def _check_partition(
    c: Counts,
    p: int,
    acks: Sequence[Record],
    log: Sequence[Record],
    hwm: int,
    replicas: Mapping[int, Mapping[int, bytes | None]],
    table: Sequence[Record],
    batches: Sequence[ConsumedBatch],
    forced: Sequence[ForcedElection],
) -> None:
    log_at = {o: (e, v) for o, e, v in log}
    log_values = Counter(v for _, _, v in log)
    table_keys = Counter(o for o, _, _ in table)
    table_values = Counter(v for _, _, v in table)
    table_at = {o: (e, v) for o, e, v in table}

    def lost_to_unclean(offset: int, epoch: int) -> bool:
        return any(offset >= f.divergence and epoch < f.epoch for f in forced)

    # lost writes
    for o, e, v in acks:
        where = [name for name, values in (("log", log_values), ("table", table_values))
                 if v not in values]  # fmt: skip
        if not where:
            continue
        if lost_to_unclean(o, e):
            c.add("lost_unclean", f"p{p}@{o} e{e} {v!r}")
        else:
            c.add("lost", f"p{p}@{o} e{e} {v!r} missing from {'+'.join(where)}")

    # duplicates
    for o, n in table_keys.items():
        if n > 1:
            c.add("duplicate", f"p{p}@{o} {n} rows in the table")
    for v, n in table_values.items():
        if n > 1 and log_values[v] <= 1:
            c.add("duplicate", f"p{p} {v!r} {n} times in the table, {log_values[v]} in the log")
    for v, n in log_values.items():
        if n > 1:
            c.add("log_duplicates", f"p{p} {v!r} {n} times in the log")

    # inconsistent offsets: replicas' committed prefix, the log, the acknowledgements
    seen: dict[int, set[bytes | None]] = {}
    for o, (_, v) in log_at.items():
        seen.setdefault(o, set()).add(v)
    for files in replicas.values():
        for o, v in files.items():
            if o < hwm:
                seen.setdefault(o, set()).add(v)
    for o, e, v in acks:
        if not lost_to_unclean(o, e):
            seen.setdefault(o, set()).add(v)
    for o, values in sorted(seen.items()):
        if len(values) > 1:
            c.add("inconsistent", f"p{p}@{o}: {sorted(map(repr, values))}")
    nodes = sorted(replicas)
    for n in nodes[1:]:
        a, b = replicas[nodes[0]], replicas[n]
        # Past the high watermark a replica may be shorter (e.g. a leader-change record
        # appended while the cluster shut down); two different records at one offset are not.
        differ = [o for o in set(a) & set(b) if o >= hwm and a[o] != b[o]]
        if differ:
            c.add("not_converged", f"p{p} nodes {nodes[0]},{n} differ at {min(differ)}+")

    # stale reads: the table holds a record that is not the log's at that offset
    for o, e, v in table:
        if log_at.get(o) != (e, v):
            c.add("stale", f"p{p}@{o}: table e{e} {v!r}, log {log_at.get(o)!r}")

    # consumption order: monotonic, no skips
    next_offset: int | None = None
    last_epoch = -1
    skipped: dict[int, str] = {}
    for b in batches:
        offsets = [o for o, _, _ in b.records]
        if not offsets:
            continue
        if any(x >= y for x, y in zip(offsets, offsets[1:], strict=False)):
            c.add("nonmonotonic", f"p{p} batch {b.batch_id}: offsets out of order")
        epochs = [e for _, e, _ in b.records]
        if b.truncated:
            last_epoch = -1
        elif next_offset is not None and offsets[0] < next_offset:
            c.add("nonmonotonic", f"p{p} batch {b.batch_id} starts at {offsets[0]} < {next_offset}")
        if any(x > y for x, y in zip([last_epoch, *epochs], epochs, strict=False)):
            c.add("nonmonotonic", f"p{p} batch {b.batch_id}: leader epoch went back")
        start = offsets[0] if next_offset is None or b.truncated else next_offset
        held = set(offsets)
        for o in range(start, offsets[-1] + 1):
            # a log record the batch's range covered but did not hold, and never in the table
            if o in log_at and o not in held and table_at.get(o) != log_at[o]:
                skipped.setdefault(o, f"p{p}@{o} skipped by batch {b.batch_id}")
        next_offset = offsets[-1] + 1
        last_epoch = epochs[-1]
    for o in log_at:
        if o not in table_at:
            skipped.setdefault(o, f"p{p}@{o} in the log, never in the table")
    for _, example in sorted(skipped.items()):
        c.add("skip", example)
