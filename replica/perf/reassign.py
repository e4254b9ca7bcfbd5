"""quorumlog perf reassign: move every replica of a filled topic to other nodes while
producers write to it.

A 4-node cluster, a topic of ``--partitions`` partitions with 2 replicas each, filled
with ``--topic-mb`` MB; the produce rate is measured alone, then during the move of every
partition to the two nodes that held none of it (so every replica is copied). From the
first measure to the last, each partition's leader is sampled every ``--sample-ms``: the
longest time any was without one is ``max_leaderless_s``, and each node is asked for its
ApiVersions as often: the longest answer is ``max_node_answer_ms`` (how long a node's
event loop was held, all its partitions waiting). Both samplers run through every measure
(alone, into three replicas, during the move, alone once moved), so each rate is taken
under the same sampling load. Figures: ``moved_bytes`` (bytes the new replicas copied),
``moved_mb_per_s`` (over the move's wall time), ``produce_rec_per_s_before`` and
``produce_rec_per_s_during`` (and ``produce_rec_per_s_during_windows``, the rate in each
5 s the move took). Beside them, the machine's limit: during the move each record reaches
three replicas (two voters and the one new replica copying, or three voters), so the
produce rate into a topic of as many partitions with three replicas
(``produce_rec_per_s_three_replicas``) is what the move could give at best, copying
nothing; ``during_vs_three_replicas`` is their ratio. ``produce_rec_per_s_after``, the
rate alone once the topic has moved, shows how far the machine itself drifted meanwhile.
``elections``: the leader epochs the move took over all partitions (each ends led by a
replica it added: one a partition at best). On a virtual machine the host may take a
share of the CPUs (steal time, from /proc/stat): ``steal_pct_before``,
``steal_pct_three_replicas``, ``steal_pct_during``, ``steal_pct_after`` and
``steal_pct_during_windows`` give it for each measure, and ``during_vs_before_given_cpu``
compares the rates during and before the move, each over the share of the CPUs it was
given.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from pathlib import Path

from .. import defaults
from ..cli.reassign import Move, move_status
from ..client.balance import even_leaders
from ..node.cluster import LocalCluster
from ..storage.records import encode_batch
from .util import (
    MachineCpu,
    ProduceJob,
    ProduceLoad,
    add_page_cache_option,
    emit,
    page_cache_args,
    run_producers,
)

TOPIC = "reassign"
THREE_REPLICAS_TOPIC = "reassign-three-replicas"
NODES = 4
#: How long the leader watch waits for the nodes' Metadata answers.
METADATA_TIMEOUT_S = 2.0


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.log")) if d.is_dir() else 0


class Sampler(threading.Thread):
    """A thread that takes a sample every ``every_s`` until ``stop``."""

    def __init__(self, every_s: float) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self.stop_event = threading.Event()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stop_event.set()
        self.join(timeout=timeout_s)


class LeaderWatch(Sampler):
    """Samples every partition's leader of ``topic`` (each node's own view, merged by the
    client) until stopped; keeps the longest stretch any partition had none (a leader
    whose process is not running counts as none)."""

    def __init__(
        self, cluster: LocalCluster, partitions: int, every_s: float, topic: str = TOPIC
    ) -> None:
        super().__init__(every_s)
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.max_leaderless_s = 0.0
        self.worst_partition = -1  # the partition of that longest stretch
        self.samples = 0
        # Samples whose Metadata failed or waited its whole timeout (no answer named every
        # leader in time), as a client looking for a leader would have.
        self.slow_samples = 0

    def run(self) -> None:
        from ..client import Client

        since: dict[int, float] = {}
        with Client(self.cluster.bootstrap) as c:
            while not self.stop_event.is_set():
                now = time.monotonic()
                try:
                    meta = c.metadata([self.topic], timeout_s=METADATA_TIMEOUT_S)
                    leaders = {p: pm.leader_id for p, pm in meta[self.topic].partitions.items()}
                except Exception:
                    leaders = {}
                if not leaders or time.monotonic() - now >= METADATA_TIMEOUT_S:
                    self.slow_samples += 1
                for p in range(self.partitions):
                    leader = leaders.get(p, -1)
                    if leader < 0 or not self.cluster.is_running(leader):
                        start = since.setdefault(p, now)
                        if now - start > self.max_leaderless_s:
                            self.max_leaderless_s, self.worst_partition = now - start, p
                    else:
                        since.pop(p, None)
                self.samples += 1
                self.stop_event.wait(self.every_s)


class NodeProbe(Sampler):
    """Asks each node in turn for its ApiVersions every ``every_s`` until stopped; keeps
    the longest answer: how long a node's event loop was held (by a deletion, a large
    copy) while every partition it hosts waited."""

    def __init__(self, cluster: LocalCluster, every_s: float) -> None:
        super().__init__(every_s)
        self.cluster = cluster
        self.max_answer_s = 0.0
        self.slowest_node = -1
        self.asked = 0

    def run(self) -> None:
        from ..client import Client

        with Client(self.cluster.bootstrap) as c:
            c.metadata()  # learns the nodes' addresses
            nodes = sorted(self.cluster.ports)
            while not self.stop_event.is_set():
                for node in nodes:
                    began = time.monotonic()
                    try:
                        c.api_versions(node)
                    except Exception:
                        pass  # no answer in the client's time: held at least that long
                    took = time.monotonic() - began
                    self.asked += 1
                    if took > self.max_answer_s:
                        self.max_answer_s, self.slowest_node = took, node
                self.stop_event.wait(self.every_s)


def _measured(job: ProduceJob, producers: int, label: str) -> tuple[ProduceLoad, float]:
    """``run_producers``, and the share of the machine's CPU time the host took meanwhile."""
    cpu0 = MachineCpu.now()
    load = run_producers(job, producers, label=label)
    return load, MachineCpu.now().steal_share_since(cpu0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf reassign", description=__doc__)
    ap.add_argument("--topic-mb", type=int, default=1024, help="data in the topic before it moves")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument(
        "--in-flight",
        type=int,
        default=1,
        help="batches each producer has in flight, one per partition (1: one produce at a "
        "time, so the rate follows the produce latency; the partitions' count: as many "
        "as acknowledged, so it follows what the machine can do)",
    )
    ap.add_argument("--record-bytes", type=int, default=1000)
    ap.add_argument("--batch-records", type=int, default=100)
    ap.add_argument("--measure-s", type=float, default=10.0, help="the produce rate alone")
    ap.add_argument(
        "--produce-mb-per-s",
        type=float,
        default=0.0,
        help="the producers' rate together, alone and during the move (0: as fast as "
        "acknowledged; new replicas on the same machine as the old ones may then never "
        "catch up)",
    )
    ap.add_argument("--sample-ms", type=int, default=100)
    ap.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="give the move up after (producers write all the while: a move that never ends "
        "would fill the disk)",
    )
    ap.add_argument(
        "--throttle",
        type=int,
        default=defaults.CATCH_UP_BYTES_PER_S,
        help="each node's --catch-up-bytes-per-second (default: the node's default, %(default)s)",
    )
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    add_page_cache_option(ap)
    args = ap.parse_args(argv)

    value = b"x" * args.record_bytes
    payload = encode_batch([value] * args.batch_records)
    parts = tuple(range(args.partitions))
    with LocalCluster(
        NODES,
        args.data_dir,
        log_level="WARNING",
        node_args=["--catch-up-bytes-per-second", str(args.throttle), *page_cache_args(args)],
    ) as cluster:
        cluster.create_topic(TOPIC, args.partitions, 2)
        client = cluster.client
        fill = args.topic_mb * 1024 * 1024 // len(payload)
        job = ProduceJob(
            cluster.bootstrap, TOPIC, parts, payload, args.batch_records, total_batches=fill
        )
        run_producers(job, args.producers, label="fill")
        pace = args.produce_mb_per_s * 1e6 / len(payload) / args.producers
        timed = ProduceJob(
            cluster.bootstrap,
            TOPIC,
            parts,
            payload,
            args.batch_records,
            duration_s=args.measure_s,
            batches_per_s=pace,
            in_flight=args.in_flight,
        )
        watch = LeaderWatch(cluster, args.partitions, args.sample_ms / 1000)
        watch.start()
        probe = NodeProbe(cluster, args.sample_ms / 1000)
        probe.start()
        before, steal_before = _measured(timed, args.producers, "produce alone")
        cluster.create_topic(THREE_REPLICAS_TOPIC, args.partitions, 3)
        ceiling, steal_ceiling = _measured(
            dataclasses.replace(timed, topic=THREE_REPLICAS_TOPIC),
            args.producers,
            "produce to 3 replicas",
        )
        client.delete_topic(THREE_REPLICAS_TOPIC)
        meta = client.metadata([TOPIC])[TOPIC].partitions
        # Each partition to the two nodes that hold none of it, ordered so every node is
        # the preferred leader of as many partitions (as a plan of ``cluster
        # rebalance`` is).
        plan = {TOPIC: [sorted(set(cluster.ports) - set(meta[p].replicas)) for p in parts]}
        even_leaders(plan, sorted(cluster.ports))
        moves = [Move(TOPIC, p, plan[TOPIC][p]) for p in parts]
        # The produce load during the move, 5 s at a time, and the host's share of each.
        windows: list[tuple[ProduceLoad, float]] = []
        cpu0 = MachineCpu.now()
        t0 = time.monotonic()
        client.reassign(TOPIC, {mv.partition: mv.replicas for mv in moves})
        done = False
        while not done and time.monotonic() - t0 < args.timeout_s:
            window = dataclasses.replace(timed, duration_s=5.0)
            windows.append(_measured(window, args.producers, "produce during the move"))
            done = all(r.done for r in move_status(client, moves))
        move_s = time.monotonic() - t0
        steal_during = MachineCpu.now().steal_share_since(cpu0)
        after, steal_after = _measured(timed, args.producers, "produce alone, moved")
        watch.stop()
        probe.stop()
        final = client.metadata([TOPIC])[TOPIC].partitions
        elections = sum(final[p].leader_epoch - meta[p].leader_epoch for p in parts)
        moved = sum(
            _dir_bytes(cluster.node_dir(n) / f"{TOPIC}-{mv.partition}")
            for mv in moves
            for n in mv.replicas
        )
    before_rate = before.rate
    during_s = sum(w.seconds for w, _ in windows)
    during_rate = sum(w.records for w, _ in windows) / during_s if during_s else 0.0
    ceiling_rate = ceiling.rate
    after_rate = after.rate
    # Each rate over the share of the machine the host left it.
    given_before = before_rate / (1 - steal_before) if steal_before < 1 else 0.0
    given_during = during_rate / (1 - steal_during) if steal_during < 1 else 0.0
    figures = {
        "bench": "reassign",
        "partitions": args.partitions,
        "topic_mb": args.topic_mb,
        "throttle_bytes_per_s": args.throttle,
        "page_cache": args.page_cache,
        "in_flight": args.in_flight,
        "moved": done,
        "moved_bytes": moved,
        "move_s": round(move_s, 1),
        "moved_mb_per_s": round(moved / 1e6 / move_s, 1) if move_s else 0.0,
        "produce_rec_per_s_before": round(before_rate),
        "produce_rec_per_s_during": round(during_rate),
        "during_vs_before": round(during_rate / before_rate, 2) if before_rate else None,
        "produce_rec_per_s_during_windows": [round(w.rate) for w, _ in windows],
        "steal_pct_during_windows": [round(100 * st, 1) for _, st in windows],
        "produce_rec_per_s_three_replicas": round(ceiling_rate),
        "during_vs_three_replicas": round(during_rate / ceiling_rate, 2) if ceiling_rate else None,
        "produce_rec_per_s_after": round(after_rate),
        "steal_pct_before": round(100 * steal_before, 1),
        "steal_pct_three_replicas": round(100 * steal_ceiling, 1),
        "steal_pct_during": round(100 * steal_during, 1),
        "steal_pct_after": round(100 * steal_after, 1),
        "during_vs_before_given_cpu": round(given_during / given_before, 2)
        if given_before
        else None,
        "elections": elections,
        "max_leaderless_s": round(watch.max_leaderless_s, 2),
        "leaderless_partition": watch.worst_partition,
        "leader_samples": watch.samples,
        "metadata_slow_samples": watch.slow_samples,
        "max_node_answer_ms": round(probe.max_answer_s * 1000),
    }
    lines = [
        f"moved {moved / 1e6:,.0f} MB ({args.partitions} partitions x 2 replicas) in "
        f"{move_s:.1f} s: {figures['moved_mb_per_s']} MB/s"
        + ("" if done else " (NOT finished: timed out)"),
        f"produce: {before_rate:,.0f} records/s alone, {during_rate:,.0f} during the move "
        f"({figures['during_vs_before']} of alone)",
        "during the move, 5 s at a time: "
        + ", ".join(f"{w.rate / 1000:.1f}k ({100 * st:.0f}%)" for w, st in windows)
        + " records/s (the host's share of the CPUs)",
        f"produce into 3 replicas a partition (as a record during the move, with no "
        f"copy): {ceiling_rate:,.0f} records/s; during the move "
        f"{figures['during_vs_three_replicas']} of it; alone once moved "
        f"{after_rate:,.0f} records/s",
        f"the host's share of the CPUs (steal): {figures['steal_pct_before']}% alone, "
        f"{figures['steal_pct_three_replicas']}% into 3 replicas, "
        f"{figures['steal_pct_during']}% during the move, {figures['steal_pct_after']}% "
        f"alone once moved; during the move over alone, each over the CPU it was "
        f"given: {figures['during_vs_before_given_cpu']}",
        f"elections: {elections} over {args.partitions} partitions (each move ends "
        "with a new leader: one election a partition at best)",
        f"longest time a partition had no leader: {watch.max_leaderless_s:.2f} s "
        f"(partition {watch.worst_partition if watch.worst_partition >= 0 else 'none'}; "
        f"{watch.samples} samples, "
        f"{watch.slow_samples} of them failed or waited the whole {METADATA_TIMEOUT_S:g} s "
        "for the nodes' Metadata)",
        f"longest a node took to answer ApiVersions: {probe.max_answer_s * 1000:.0f} ms "
        f"(node {probe.slowest_node}; asked {probe.asked} times)",
    ]
    emit(figures, [] if args.json else lines)
    return 0
