"""One seeded fault campaign over real node processes, a real Spark stream and a Delta table.

A producer thread appends unique records with acks=quorum and logs every acknowledgement;
a streaming query (``format("quorumlog")`` -> DeltaSink) copies the topic into a Delta
table; the nemesis (this thread) injects faults on a schedule drawn from the seed: kill -9
and restart, SIGSTOP/SIGCONT of a partition leader (a zombie leader), SIGTERM and restart,
and network partitions (symmetric and one-way) through the ProxyNet between the nodes.
Mode ``unclean`` then forces an unclean election on partition 0 (the minority replica was
cut off by the proxies while records were committed and consumed; the majority is killed)
and runs a second query with ``onTruncation=fail`` that must raise LogTruncationException.

After healing: stop producing, let the stream drain, read the log, stop the cluster, read
every replica's files, and hand everything to the checker.
"""

from __future__ import annotations

import logging
import random
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorumlog.connector import LogTruncationException
from quorumlog.connector.delta import DeltaSink, read_committed_positions
from quorumlog.replica.client import Client, QuorumLogError
from quorumlog.replica.storage import HEADER_SIZE, encode_batch, iter_batches
from quorumlog.replica.storage.log import CATCH_UP_FILE

from tests.support.cluster import local_view, read_all, read_log_dir
from tests.support.waits import retry, wait_until

from .checker import ConsumedBatch, Counts, ForcedElection, Record, check
from .cluster import ProxiedCluster
from .proxy import Mode

log = logging.getLogger(__name__)

# The campaign polls the cluster gently: it runs on the same two cores as the nodes.
POLL_S = 0.2
TOPIC = "chaos"
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


@dataclass(frozen=True)
class Ack:
    partition: int
    offset: int
    epoch: int
    value: bytes


class Producer(threading.Thread):
    """Appends unique records (acks=quorum) round-robin over the partitions; logs every
    acknowledgement. A failed produce is indeterminate (it may have been appended) and
    its values are never sent again."""

    def __init__(self, bootstrap: str, partitions: int, tag: str, batch: int = 5) -> None:
        super().__init__(daemon=True, name="chaos-producer")
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.tag = tag
        self.batch = batch
        self.stop_event = threading.Event()
        self.acks: list[Ack] = []
        self.indeterminate = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.bootstrap, request_timeout_ms=4000, retry_backoff_ms=50) as client:
                for seq in range(10_000_000):
                    if self.stop_event.is_set():
                        return
                    for p in range(self.partitions):
                        values = [f"{self.tag}-p{p}-{seq}-{i}".encode() for i in range(self.batch)]
                        try:
                            res = client.produce(TOPIC, p, encode_batch(values), timeout_ms=4000)
                        except (QuorumLogError, OSError):
                            self.indeterminate += len(values)
                            continue
                        for i, v in enumerate(values):
                            self.acks.append(Ack(p, res.base_offset + i, res.leader_epoch, v))
                    self.stop_event.wait(0.02)
        except BaseException as exc:  # surfaced by the campaign
            self.error = exc


class RecordingSink:
    """DeltaSink plus a record of what every committed micro-batch held (the consumption
    history the checker needs). Runs on the Spark driver, in this process."""

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.batches: list[ConsumedBatch] = []
        self.truncations = 0
        self.committed_version = -1  # the newest Delta version this sink recorded
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        df = df.persist()
        try:
            data = df.select("partition", "offset", "leaderEpoch", "value").toArrow()
            result = self.sink.write_batch(df, batch_id)
            # Recorded before anything else can fail: once the commit has landed the
            # campaign may stop the query, and Spark then fails the unpersist below.
            if result is not None:
                self._record(batch_id, data, result)
        finally:
            df.unpersist()

    def _record(self, batch_id: int, data: Any, result: Any) -> None:
        truncated = {t.partition for t in result.truncations}
        rows: dict[int, list[Record]] = {}
        for p, o, e, v in zip(
            data.column("partition").to_pylist(),
            data.column("offset").to_pylist(),
            data.column("leaderEpoch").to_pylist(),
            data.column("value").to_pylist(),
            strict=True,
        ):
            rows.setdefault(p, []).append((o, e, v))
        with self._lock:
            self.truncations += len(truncated)
            for p, recs in sorted(rows.items()):
                self.batches.append(ConsumedBatch(batch_id, p, tuple(recs), p in truncated))
            self.committed_version = max(self.committed_version, result.version)


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
            f"indeterminate={self.indeterminate} rows={self.table_rows} "
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
        )
        producer: Producer | None = None
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
            self._start = time.monotonic()
            wait_until(
                lambda: _committed_end(table, 0) > 0,
                120,
                "the first rows in Delta",
                interval=POLL_S,
            )
            self._nemesis(cluster)
            forced: list[ForcedElection] = []
            if self.mode == "unclean":
                forced.append(self._unclean(cluster, resolver, table))
            producer.stop_event.set()
            producer.join(30)
            if producer.error is not None:
                self.result.errors.append(f"producer crashed: {producer.error!r}")
            self.result.acked = len(producer.acks)
            self.result.indeterminate = producer.indeterminate
            self._note("producer stopped; draining")
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
                            _committed_position(table, p) == (end, epoch)
                        ),
                        120,
                        f"the stream to drain p{p} to offset {end} in epoch {epoch}",
                        interval=POLL_S,
                    )
            # ... and the sink to have recorded the commit that got there (it does so just
            # after the commit lands; stopping the query before would lose the record).
            wait_until(
                lambda: sink.committed_version >= _table_version(table),
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
            table_rows = _read_table(table)
            self.result.table_rows = sum(len(r) for r in table_rows.values())
            self.result.truncations_recorded = sink.truncations
            if self.mode == "unclean" and sink.truncations == 0:
                self.result.errors.append("the resume query recorded no truncation of the table")
            acks: dict[int, list[Record]] = {}
            for a in producer.acks:
                acks.setdefault(a.partition, []).append((a.offset, a.epoch, a.value))
            self.result.counts = check(
                range(self.partitions), acks, logs, hwms, replicas, table_rows, sink.batches, forced
            )
        finally:
            if producer is not None:
                producer.stop_event.set()
                producer.join(30)
            for q in queries:
                try:
                    q.stop()
                except Exception:  # already failed or stopped
                    log.debug("stopping a query", exc_info=True)
            if resolver is not None:
                resolver.close()
            cluster.stop()

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
            self._note(f"SIGTERM n{f.target}; {_damage_sealed_batch(cluster, f.target, rng)}")
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
            lambda: all(_committed_end(t, p) >= target for t in self._tables),
            90,
            "the stream(s) to consume them",
            interval=POLL_S,
        )
        self._note(f"unclean: stream consumed p{p} to {_committed_end(table, p)}; kill {majority}")
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
        logs: dict[int, list[Record]] = {}
        hwms: dict[int, int] = {}
        with Client(cluster.bootstrap, request_timeout_ms=30000) as client:
            for p in range(self.partitions):
                hwms[p] = client.partition_metadata(TOPIC, p, refresh=True).high_watermark
                logs[p] = [(o, e, v or b"") for o, e, v in read_all(client, TOPIC, p)]
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


def _damage_sealed_batch(cluster: ProxiedCluster, node: int, rng: random.Random) -> str:
    """Flip one payload byte of a random batch in a random sealed segment of one of the
    (stopped) node's partition replicas; says what it did."""
    dirs = sorted(cluster.node_dir(node).glob(f"{TOPIC}-*"))
    rng.shuffle(dirs)
    for d in dirs:
        sealed = sorted(p for p in d.iterdir() if p.suffix == ".log")[:-1]
        if not sealed:
            continue
        seg = rng.choice(sealed)
        batches = list(iter_batches(seg.read_bytes()))
        if not batches:
            continue
        batch = rng.choice(batches)
        at = batch.position + HEADER_SIZE + rng.randrange(batch.payload_length)
        with open(seg, "r+b") as fh:
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ 0xFF]))
        return f"damaged the batch at offset {batch.base_offset} in {d.name}/{seg.name}"
    return "no sealed segment to damage yet"


def _committed_position(table: str, partition: int) -> tuple[int, int]:
    """(end offset, epoch of the last row) the table's last commit records; (-1, -1) if none."""
    try:
        pos = read_committed_positions(table).get(TOPIC, {}).get(partition)
    except Exception:  # no table yet
        return (-1, -1)
    return (pos[0], pos[1]) if pos is not None else (-1, -1)


def _table_version(table: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(table).version())


def _committed_end(table: str, partition: int) -> int:
    return _committed_position(table, partition)[0]


def _read_table(table: str) -> dict[int, list[Record]]:
    from deltalake import DeltaTable

    t = DeltaTable(table).to_pyarrow_table(columns=["partition", "offset", "leaderEpoch", "value"])
    out: dict[int, list[Record]] = {}
    for p, o, e, v in zip(
        t.column("partition").to_pylist(),
        t.column("offset").to_pylist(),
        t.column("leaderEpoch").to_pylist(),
        t.column("value").to_pylist(),
        strict=True,
    ):
        out.setdefault(p, []).append((o, e, v or b""))
    for rows in out.values():
        rows.sort()
    return out
