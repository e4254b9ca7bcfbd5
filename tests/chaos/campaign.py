"""One seeded fault campaign over real node processes, a real Spark stream and a Delta table.

A producer thread appends unique records with acks=quorum and logs every acknowledgement;
transactional producers (confluent-kafka through every node's Kafka listener,
``txn_producer``) commit and abort transactions over the partitions and log each outcome;
a streaming query (``format("quorumlog")``, read_committed -> DeltaSink) copies the topic
into a Delta table; the nemesis (this thread) injects faults on a schedule drawn from the
seed: kill -9 and restart, SIGSTOP/SIGCONT of a partition leader (a zombie leader),
SIGTERM and restart, and network partitions (symmetric and one-way) through the ProxyNet
between the nodes.
Mode ``unclean`` then forces an unclean election on partition 0 (the minority replica was
cut off by the proxies while records were committed and consumed; the majority is killed)
and runs a second query with ``onTruncation=fail`` that must raise LogTruncationException.

After healing: stop producing, wait until no transaction is open, read the log
read_committed, let the stream drain, stop the cluster, read every replica's files, and
hand everything to the checker.
"""

from __future__ import annotations

import logging
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorumlog.connector import LogTruncationException
from quorumlog.connector.delta import DeltaSink
from quorumlog.replica.client import Client
from quorumlog.replica.storage.log import CATCH_UP_FILE

from tests.support.cluster import local_view, read_log_dir
from tests.support.waits import retry, wait_until

from .checker import ABORTED, COMMITTED, Counts, ForcedElection, Record, Transaction, check
from .cluster import ProxiedCluster, damage_sealed_batch
from .producer import Producer
from .proxy import Mode
from .table import (
    TOPIC,
    RecordingSink,
    committed_end,
    committed_position,
    read_table,
    table_version,
)
from .txn_producer import TxnProducer, read_committed, wait_stable

log = logging.getLogger(__name__)

# The campaign polls the cluster gently: it runs on the same two cores as the nodes.
POLL_S = 0.2
FAULT_KINDS = (
    "kill",
    "pause-leader",
    "terminate",
    "isolate",
    "oneway-in",
    "oneway-out",
    "corrupt",
)
# Small segments, so a "corrupt" fault finds sealed segments to damage.
SEGMENT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Fault:
    at_s: float  # since the campaign's start
    kind: str
    target: int  # a node id; for pause-leader, the partition whose leader is paused
    hold_s: float
    mode: str = "blackhole"  # partitions: blackhole or refuse

    def describe(self) -> str:
        what = f"leader of p{self.target}" if self.kind == "pause-leader" else f"n{self.target}"
        extra = f" ({self.mode})" if self.kind in ("isolate", "oneway-in", "oneway-out") else ""
        return f"t={self.at_s:.1f}s {self.kind} {what}{extra} for {self.hold_s:.1f}s"


def make_schedule(
    seed: int,
    duration_s: float,
    nodes: int,
    partitions: int,
    kinds: Sequence[str] = FAULT_KINDS,
) -> list[Fault]:
    """The fault schedule: the same seed gives the same schedule. One fault at a time, so
    a majority of every quorum stays up (unclean elections are a separate mode)."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    t = rng.uniform(1.0, 3.0)
    for _ in range(1000):
        if t >= duration_s:
            break
        kind = rng.choice(list(kinds))
        target = rng.randrange(partitions) if kind == "pause-leader" else rng.randint(1, nodes)
        hold = rng.uniform(1.5, 4.0)
        faults.append(
            Fault(round(t, 2), kind, target, round(hold, 2), rng.choice(["blackhole", "refuse"]))
        )
        t += hold + rng.uniform(1.0, 3.0)
    return faults


@dataclass
class CampaignResult:
    seed: int
    nodes: int
    mode: str
    duration_s: float
    schedule: list[str]
    history: list[str] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    acked: int = 0
    indeterminate: int = 0
    txn_committed: int = 0
    txn_aborted: int = 0
    txn_aborted_written: int = 0  # aborted after their records reached the log
    table_rows: int = 0
    truncations_recorded: int = 0
    errors: list[str] = field(default_factory=list)  # query failures, missed detections
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.counts.anomalies() == 0 and not self.errors

    def line(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in self.counts.summary().items())
        return (
            f"chaos seed={self.seed} nodes={self.nodes} mode={self.mode} "
            f"duration={self.duration_s:g}s faults={len(self.schedule)} acked={self.acked} "
            f"indeterminate={self.indeterminate} txn_committed={self.txn_committed} "
            f"txn_aborted={self.txn_aborted} (written {self.txn_aborted_written}) "
            f"rows={self.table_rows} "
            f"truncations={self.truncations_recorded} {counts} errors={len(self.errors)} "
            f"took={self.seconds:.0f}s {'OK' if self.ok else 'FAILED'}"
        )

    def report(self) -> str:
        lines = [self.line(), f"seed {self.seed}; schedule:"]
        lines += [f"  {s}" for s in self.schedule]
        lines.append("applied:")
        lines += [f"  {s}" for s in self.history]
        for e in self.errors:
            lines.append(f"error: {e}")
        for kind, examples in self.counts.examples.items():
            for ex in examples:
                lines.append(f"{kind}: {ex}")
        return "\n".join(lines)


class Campaign:
    def __init__(
        self,
        spark: Any,
        *,
        seed: int,
        duration_s: float,
        nodes: int = 3,
        partitions: int = 2,
        mode: str = "clean",
        work_dir: Path | None = None,
        kinds: Sequence[str] = FAULT_KINDS,
        txn_producers: int = 2,
    ) -> None:
        if mode not in ("clean", "unclean"):
            raise ValueError(f"mode must be 'clean' or 'unclean', not {mode!r}")
        self.spark = spark
        self.seed = seed
        self.duration_s = duration_s
        self.nodes = nodes
        self.partitions = partitions
        self.mode = mode
        self.work_dir = work_dir
        self.txn_producers = txn_producers
        self.schedule = make_schedule(seed, duration_s, nodes, partitions, kinds)
        self.result = CampaignResult(
            seed, nodes, mode, duration_s, [f.describe() for f in self.schedule]
        )
        self._start = 0.0
        self._tables: list[str] = []

    # ---- the run --------------------------------------------------------------------
    def run(self) -> CampaignResult:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="quorumlog-chaos-", dir=self.work_dir) as tmp:
            try:
                self._run(Path(tmp))
            except Exception as exc:  # reported with the seed and the schedule
                log.exception("chaos campaign seed %d aborted", self.seed)
                self.result.errors.append(f"campaign aborted: {exc!r}")
            finally:
                self.result.seconds = time.monotonic() - started
        return self.result

    def _note(self, what: str) -> None:
        entry = f"t={time.monotonic() - self._start:.1f}s {what}"
        log.info("chaos: %s", entry)
        self.result.history.append(entry)

    def _run(self, work: Path) -> None:
        cluster = ProxiedCluster(
            self.nodes,
            work / "cluster",
            log_level="WARNING",
            node_args=["--segment-bytes", str(SEGMENT_BYTES)],
            kafka=True,
        )
        producer: Producer | None = None
        txn_producers: list[TxnProducer] = []
        queries: list[Any] = []
        resolver: Client | None = None
        try:
            cluster.start()
            cluster.create_topic(TOPIC, self.partitions, timeout_s=60)
            resolver = Client(cluster.bootstrap, request_timeout_ms=10000)
            table = str(work / "table")
            sink = self._sink(table, resolver)
            # Clean mode: a reported truncation would be a bug, so the main query fails on
            # one. Unclean mode: it resumes and reconciles the table; a second query must fail.
            policy = "resume" if self.mode == "unclean" else "fail"
            queries.append(self._query(cluster.bootstrap, policy, sink, work / "ckpt"))
            self._tables = [table]
            fail_query = None
            if self.mode == "unclean":
                fail_table = str(work / "fail_table")
                fail_sink = RecordingSink(DeltaSink(fail_table))
                fail_query = self._query(cluster.bootstrap, "fail", fail_sink, work / "ckpt_f")
                queries.append(fail_query)
                self._tables.append(fail_table)
            producer = Producer(cluster.bootstrap, self.partitions, f"s{self.seed}")
            producer.start()
            txn_producers = [
                TxnProducer(
                    cluster.kafka_bootstrap,
                    TOPIC,
                    self.partitions,
                    f"s{self.seed}",
                    i,
                    self.seed,
                    max_s=self.duration_s + 600,
                )
                for i in range(self.txn_producers)
            ]
            for t in txn_producers:
                t.start()
            self._start = time.monotonic()
            wait_until(
                lambda: committed_end(table, 0) > 0,
                120,
                "the first rows in Delta",
                interval=POLL_S,
            )
            self._nemesis(cluster)
            forced: list[ForcedElection] = []
            transactions = self._stop_producers(txn_producers)
            if self.mode == "unclean":
                # An unclean election may lose a transaction's markers and so turn a
                # committed transaction into an open or an aborted one (as in Kafka):
                # it starts once every replica holds the markers of all of them.
                self._quiesce_transactions(cluster, resolver)
                forced.append(self._unclean(cluster, resolver, table))
            self._stop_producers([producer])
            self._note("producers stopped; draining")
            if fail_query is not None:
                self._expect_truncation_failure(fail_query)
            cluster.wait_ready(120)
            logs, hwms = self._read_log(cluster)
            for p, records in logs.items():
                if records:
                    # Offset and epoch: after an unclean election the table's old position
                    # can lie past the new log end until the stream re-reads and replaces.
                    end, epoch = records[-1][0] + 1, records[-1][1]
                    wait_until(
                        lambda p=p, end=end, epoch=epoch: (
                            committed_position(table, p) == (end, epoch)
                        ),
                        120,
                        f"the stream to drain p{p} to offset {end} in epoch {epoch}",
                        interval=POLL_S,
                    )
            # ... and the sink to have recorded the commit that got there (it does so just
            # after the commit lands; stopping the query before would lose the record).
            wait_until(
                lambda: sink.committed_version >= table_version(table),
                30,
                "the sink to record the last commit",
                interval=POLL_S,
            )
            exc = queries[0].exception()
            if exc is not None:
                self.result.errors.append(f"streaming query failed: {exc}")
            queries[0].stop()
            self._wait_converged(cluster, hwms)
            cluster.stop()
            replicas = self._read_replicas(cluster)
            table_rows = read_table(table)
            self.result.table_rows = sum(len(r) for r in table_rows.values())
            self.result.truncations_recorded = sink.truncations
            if self.mode == "unclean" and sink.truncations == 0:
                self.result.errors.append("the resume query recorded no truncation of the table")
            acks: dict[int, list[Record]] = {}
            for a in producer.acks:
                acks.setdefault(a.partition, []).append((a.offset, a.epoch, a.value))
            self.result.counts = check(
                range(self.partitions),
                acks,
                logs,
                hwms,
                replicas,
                table_rows,
                sink.batches,
                forced,
                transactions,
            )
        finally:
            threads = [*txn_producers, *([producer] if producer is not None else [])]
            for t in threads:
                t.stop_event.set()
            for t in threads:
                t.join(60)
            for q in queries:
                try:
                    q.stop()
                except Exception:  # already failed or stopped
                    log.debug("stopping a query", exc_info=True)
            if resolver is not None:
                resolver.close()
            cluster.stop()

    def _stop_producers(self, producers: Sequence[Producer | TxnProducer]) -> list[Transaction]:
        """Stop these producers (a transactional one ends the transaction it is in) and
        return their transactions; the result counts what they did."""
        for t in producers:
            t.stop_event.set()
        # A transactional producer's last transaction may retry its calls (bounded).
        for t in producers:
            t.join(120)
            if t.is_alive():
                self.result.errors.append(f"{t.name} did not stop")
            if t.error is not None:
                self.result.errors.append(f"{t.name} crashed: {t.error!r}")
            if isinstance(t, Producer):
                self.result.acked = len(t.acks)
                self.result.indeterminate = t.indeterminate
        transactions = [x for t in producers if isinstance(t, TxnProducer) for x in t.transactions]
        if transactions:
            self.result.txn_committed = sum(x.outcome == COMMITTED for x in transactions)
            aborted = [x for x in transactions if x.outcome == ABORTED]
            self.result.txn_aborted = len(aborted)
            self.result.txn_aborted_written = sum(
                any(r.offset >= 0 for r in x.records) for x in aborted
            )
        return transactions

    def _quiesce_transactions(self, cluster: ProxiedCluster, client: Client) -> None:
        """Until no transaction is open and every voter holds each partition's log end."""
        wait_stable(client, TOPIC, self.partitions, 120)
        ends = {p: client.list_offsets(TOPIC, p, "latest").offset for p in range(self.partitions)}
        wait_until(
            lambda: all(
                min(v.end_offset for v in cluster.describe(TOPIC, p).voters) >= end
                for p, end in ends.items()
            ),
            60,
            "every replica to hold the transactions' markers",
            interval=POLL_S,
        )
        self._note("transactional producers stopped; every replica holds their markers")

    # ---- the stream -------------------------------------------------------------------
    def _sink(self, table: str, resolver: Client) -> RecordingSink:
        def resolve_divergence(topic: str, partition: int, position: Any) -> int:
            # KIP-320: the first offset where the new log differs from what was consumed.
            offset, epoch = position
            answer = resolver.offsets_for_leader_epoch(topic, partition, epoch)
            return min(offset, answer.end_offset) if answer.end_offset >= 0 else offset

        return RecordingSink(DeltaSink(table, resolve_divergence=resolve_divergence))

    def _query(self, bootstrap: str, on_truncation: str, sink: RecordingSink, ckpt: Path) -> Any:
        stream = (
            self.spark.readStream.format("quorumlog")
            .option("bootstrap", bootstrap)
            .option("topic", TOPIC)
            .option("startingOffsets", "earliest")
            .option("onTruncation", on_truncation)
            .option("requestTimeoutMs", "60000")
            .load()
        )
        return (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="1 second")
            .start()
        )

    def _expect_truncation_failure(self, query: Any) -> None:
        try:
            wait_until(
                lambda: query.exception() is not None or not query.isActive,
                120,
                "the fail-mode query to fail",
                interval=POLL_S,
            )
        except AssertionError:
            self.result.errors.append("onTruncation=fail: the query did not fail")
            return
        exc = query.exception()
        found = LogTruncationException.from_spark_error(exc) if exc is not None else None
        if found is None:
            self.result.errors.append(f"onTruncation=fail: not a LogTruncationException: {exc}")
        else:
            self._note(f"fail-mode query raised LogTruncationException: {found}")

    # ---- the nemesis ------------------------------------------------------------------
    def _nemesis(self, cluster: ProxiedCluster) -> None:
        rng = random.Random(self.seed + 1)  # runtime choices (e.g. one-way peers)
        for fault in self.schedule:
            delay = self._start + fault.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the schedule's own pause between faults, by design
            heal = self._inject(cluster, fault, rng)
            time.sleep(fault.hold_s)  # how long the fault lasts, by design
            heal()
            self._recover(cluster)

    def _inject(self, cluster: ProxiedCluster, f: Fault, rng: random.Random) -> Callable[[], None]:
        mode = Mode(f.mode)
        if f.kind == "kill":
            cluster.kill(f.target)
            self._note(f"kill -9 n{f.target}")
            return lambda: self._restart(cluster, f.target)
        if f.kind == "terminate":
            cluster.terminate(f.target)
            self._note(f"SIGTERM n{f.target}")
            return lambda: self._restart(cluster, f.target)
        if f.kind == "corrupt":
            # Latent corruption of one replica: a clean restart trusts the damaged sealed
            # segment; the node's scrub (or a read) must find it and repair from a healthy
            # copy, and no damaged byte may reach the stream.
            cluster.terminate(f.target)
            self._note(f"SIGTERM n{f.target}; {damage_sealed_batch(cluster, f.target, TOPIC, rng)}")
            return lambda: self._restart(cluster, f.target)
        if f.kind == "pause-leader":
            try:
                node = cluster.leader_of(TOPIC, f.target, timeout_s=1.0)
            except TimeoutError:
                node = -1
            if node < 0:
                node = 1 + f.target % self.nodes
            cluster.pause(node)
            self._note(f"SIGSTOP n{node} (leader of p{f.target})")

            def resume() -> None:
                cluster.resume(node)
                self._note(f"SIGCONT n{node}")

            return resume
        others = [n for n in cluster.ports if n != f.target]
        if f.kind == "isolate":
            cluster.isolate(f.target, mode)
            self._note(f"isolate n{f.target} ({f.mode})")
        elif f.kind == "oneway-in":
            cluster.cut([(n, f.target) for n in others], mode)
            self._note(f"cut {others} -> n{f.target} ({f.mode})")
        elif f.kind == "oneway-out":
            cut = sorted(rng.sample(others, max(1, len(others) // 2)))
            cluster.cut([(f.target, n) for n in cut], mode)
            self._note(f"cut n{f.target} -> {cut} ({f.mode})")
        else:
            raise ValueError(f"unknown fault {f.kind!r}")

        def heal() -> None:
            cluster.heal()
            self._note("heal the network")

        return heal

    def _restart(self, cluster: ProxiedCluster, node: int) -> None:
        cluster.start_node(node)
        self._note(f"restart n{node}")

    def _recover(self, cluster: ProxiedCluster) -> None:
        """After each heal, until every node answers and every partition has a leader:
        the next fault then never takes a second node of a quorum down."""
        cluster.wait_ready(120)
        for p in range(self.partitions):
            cluster.wait_for_leader(TOPIC, p, 60)
        # A restarted node serves Metadata without the topic until it has replayed the
        # metadata log up to a high watermark it learns from the metadata leader.
        wait_until(
            lambda: all(local_view(cluster, n, TOPIC, 0) is not None for n in cluster.ports),
            60,
            "every node to know the topic again",
            interval=POLL_S,
        )
        # A replica repairing damage (a "corrupt" fault) must not vote until it has caught
        # up: let it, so the next fault never meets two replicas of a quorum down.
        wait_until(
            lambda: not any(cluster.data_dir.glob(f"node-*/{TOPIC}-*/{CATCH_UP_FILE}")),
            60,
            "damaged replicas to catch up",
            interval=POLL_S,
        )

    # ---- the unclean election ---------------------------------------------------------
    def _unclean(self, cluster: ProxiedCluster, client: Client, table: str) -> ForcedElection:
        p = 0
        rng = random.Random(self.seed + 2)
        leader = cluster.wait_for_leader(TOPIC, p, 60)
        followers = [n for n in cluster.ports if n != leader]
        lagging = rng.choice(followers)
        majority = [n for n in cluster.ports if n != lagging]
        cluster.isolate(lagging)
        self._note(f"unclean: isolate n{lagging}, a follower of p{p}")
        hwm0 = client.partition_metadata(TOPIC, p, refresh=True).high_watermark
        wait_until(
            lambda: client.partition_metadata(TOPIC, p, refresh=True).high_watermark > hwm0 + 100,
            60,
            "records committed while the follower is cut off",
            interval=POLL_S,
        )
        target = client.partition_metadata(TOPIC, p, refresh=True).high_watermark
        wait_until(
            lambda: all(committed_end(t, p) >= target for t in self._tables),
            90,
            "the stream(s) to consume them",
            interval=POLL_S,
        )
        self._note(f"unclean: stream consumed p{p} to {committed_end(table, p)}; kill {majority}")
        for n in majority:
            cluster.kill(n)
        cluster.heal()
        epoch = retry(lambda: cluster.force_leader(TOPIC, p, lagging), 30, interval=POLL_S)
        self._note(f"unclean: n{lagging} leads p{p} in epoch {epoch}")
        for n in majority:
            self._restart(cluster, n)
        self._recover(cluster)
        # The forced leader alone may not serve metadata (the metadata quorum lost its
        # majority too), so ask once the cluster is back.
        answer = retry(
            lambda: client.offsets_for_leader_epoch(TOPIC, p, epoch - 1), 60, interval=POLL_S
        )
        divergence = answer.end_offset
        self._note(f"unclean: p{p} diverged at offset {divergence}")
        wait_until(
            lambda: (
                client.partition_metadata(TOPIC, p, refresh=True).high_watermark > divergence + 50
            ),
            60,
            "new records past the divergence",
            interval=POLL_S,
        )
        return ForcedElection(p, epoch, divergence)

    # ---- reading back -----------------------------------------------------------------
    def _read_log(self, cluster: ProxiedCluster) -> tuple[dict[int, list[Record]], dict[int, int]]:
        """The log as a read_committed reader (the stream) sees it, once no transaction is
        open (an abandoned one is aborted by its timeout, transaction.timeout.ms)."""
        logs: dict[int, list[Record]] = {}
        hwms: dict[int, int] = {}
        with Client(cluster.bootstrap, request_timeout_ms=30000) as client:
            try:
                wait_stable(client, TOPIC, self.partitions, 120)
            except AssertionError as exc:  # a hanging transaction: read below it only
                self.result.errors.append(str(exc))
            for p in range(self.partitions):
                hwms[p] = client.partition_metadata(TOPIC, p, refresh=True).high_watermark
                logs[p] = read_committed(client, TOPIC, p)
        return logs, hwms

    def _wait_converged(self, cluster: ProxiedCluster, hwms: dict[int, int]) -> None:
        """Until every voter of every partition has the leader's log end (bounded); a
        replica left behind shows up as ``not_converged``, not as a hang."""

        def converged() -> bool:
            for p in range(self.partitions):
                d = cluster.describe(TOPIC, p)
                ends = {v.end_offset for v in d.voters}
                if len(ends) != 1 or min(ends) < hwms[p]:
                    return False
            return True

        try:
            wait_until(converged, 60, "replicas to converge", interval=POLL_S)
        except AssertionError as exc:
            self._note(str(exc))

    def _read_replicas(self, cluster: ProxiedCluster) -> dict[int, dict[int, dict[int, Any]]]:
        out: dict[int, dict[int, dict[int, Any]]] = {}
        for p in range(self.partitions):
            for n in cluster.ports:
                contents = read_log_dir(cluster.node_dir(n) / f"{TOPIC}-{p}")
                out.setdefault(p, {})[n] = {
                    o: (None if control else (v or b"")) for o, _, v, control in contents.records
                }
        return out
