"""quorumlog perf failover: time from kill -9 (or SIGTERM) of a partition leader until the
next acknowledged produce, with the shipped default timeouts."""

from __future__ import annotations

import argparse
import signal
import time

from ..client import Client
from ..node.cluster import LocalCluster
from .util import Progress, emit, median


def trial(cluster: LocalCluster, topic: str, graceful: bool, payload: bytes) -> float:
    """Seconds from the signal to the leader of ``topic``/0 until a produce is
    acknowledged; the node is then restarted and the cluster waited for (the next trial
    comes as soon as it is back)."""
    client = cluster.client
    leader = cluster.wait_for_leader(topic, 0)
    client.produce(topic, 0, payload)
    proc = cluster.procs[leader]
    with Client(cluster.bootstrap, request_timeout_ms=30000, retry_backoff_ms=10) as c:
        c.metadata([topic])
        # The clock starts at the signal; the producer keeps going as an application would.
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        c.produce(topic, 0, payload)
        elapsed = time.monotonic() - t0
    proc.wait(timeout=30)
    cluster.start_node(leader)
    cluster.wait_ready(60)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf failover")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from ..storage.records import encode_batch

    payload = encode_batch([b"failover"])
    kill: list[float] = []
    term: list[float] = []
    with LocalCluster(args.nodes, args.data_dir, log_level="WARNING") as cluster:
        cluster.create_topic("failover", 1)
        progress = Progress(args.trials * 2, "failover")
        for i in range(args.trials):
            kill.append(trial(cluster, "failover", False, payload))
            progress.update(2 * i + 1)
            term.append(trial(cluster, "failover", True, payload))
            progress.update(2 * i + 2)
        progress.close()
    figures = {
        "bench": "failover",
        "trials": args.trials,
        "kill9_median_ms": round(median(kill) * 1000, 1),
        "kill9_max_ms": round(max(kill) * 1000, 1),
        "sigterm_median_ms": round(median(term) * 1000, 1),
        "sigterm_max_ms": round(max(term) * 1000, 1),
    }
    lines = (
        []
        if args.json
        else [
            f"kill -9 of the leader -> next acknowledged produce: median {figures['kill9_median_ms']} ms "
            f"(max {figures['kill9_max_ms']} ms) over {args.trials} trials",
            f"SIGTERM of the leader -> next acknowledged produce: median {figures['sigterm_median_ms']} ms "
            f"(max {figures['sigterm_max_ms']} ms)",
        ]
    )
    emit(figures, lines)
    return 0
