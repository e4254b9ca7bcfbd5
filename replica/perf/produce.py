"""quorumlog perf produce: committed records/s with acks=quorum, fsync on, 3 replicas;
single-record latency at low load; elections seen during the run; peak RSS per node.

``--nodes N`` is the embedded cluster's size: with ``--partitions`` at least N, every node
leads some, so the figure shows how the log scales with nodes on one machine (each node
is one process, about one core at most)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..client import Client
from ..node.cluster import LocalCluster
from .util import ProduceJob, emit, peak_rss_mb, percentile, run_producers


def _epochs(client: Client, topic: str) -> dict[int, int]:
    meta = client.metadata([topic])[topic]
    return {p: pm.leader_epoch for p, pm in meta.partitions.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf produce")
    ap.add_argument(
        "--nodes",
        type=int,
        default=3,
        help="the embedded cluster's size (the topic has min(3, N) replicas)",
    )
    ap.add_argument(
        "--partitions", type=int, default=1, help="at least --nodes for every node to lead"
    )
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument(
        "--duration", type=float, default=0, help="run for this many seconds instead of --records"
    )
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--batch-records", type=int, default=10_000)
    ap.add_argument("--producers", type=int, default=2, help="concurrent producer connections")
    ap.add_argument("--latency-samples", type=int, default=500)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    ap.add_argument(
        "--tls",
        action="store_true",
        help="also run over TLS with SCRAM authentication and a producer principal, and "
        "print it beside the plaintext run",
    )
    args = ap.parse_args(argv)
    if not args.tls:
        figures, lines = _bench(args, secure=False)
        emit(figures, lines)
        return 0
    plain, plain_lines = _bench(args, secure=False)
    secure, secure_lines = _bench(args, secure=True)
    ratio = secure["records_per_s"] / max(1, plain["records_per_s"])
    both: dict[str, Any] = {"bench": "produce-tls", "plaintext": plain, "tls_auth": secure}
    both["tls_over_plaintext"] = round(ratio, 3)
    lines = (
        []
        if args.json
        else [
            "plaintext:",
            *("  " + line for line in plain_lines),
            "TLS + SCRAM authentication (producer principal):",
            *("  " + line for line in secure_lines),
            f"TLS+auth throughput / plaintext: {ratio:.2f}",
        ]
    )
    emit(both, lines)
    return 0


def _bench(args: argparse.Namespace, *, secure: bool) -> tuple[dict[str, Any], list[str]]:
    from ..storage.records import encode_batch

    topic = "perf"
    principal = "perf-producer"
    data_dir = None
    if args.data_dir is not None:
        data_dir = Path(args.data_dir) / ("tls-auth" if secure else "plaintext")
    with LocalCluster(
        args.nodes,
        data_dir,
        log_level="WARNING",
        secure=secure,
        principals={principal: ("producer", [topic])},
    ) as cluster:
        cluster.create_topic(topic, args.partitions)
        client = cluster.client
        producer_security = cluster.client_security(principal)
        epochs_before = _epochs(client, topic)
        meta = client.metadata([topic])[topic].partitions
        replication_factor = len(meta[0].replicas)
        leading = len({pm.replicas[0] for pm in meta.values()})
        payload = encode_batch([b"v" * args.value_size] * args.batch_records)
        load = run_producers(
            ProduceJob(
                cluster.bootstrap,
                topic,
                tuple(range(args.partitions)),
                payload,
                args.batch_records,
                duration_s=args.duration,
                total_batches=0 if args.duration else max(1, args.records // args.batch_records),
                security=producer_security,
            ),
            args.producers,
        )
        records, elapsed = load.records, load.seconds
        rss = {n: peak_rss_mb(p.pid) for n, p in cluster.procs.items()}
        epochs_after = _epochs(client, topic)
        elections = sum(
            epochs_after[p] - epochs_before.get(p, epochs_after[p]) for p in epochs_after
        )

        # Latency: one record per request, one at a time, at low load.
        one = encode_batch([b"l" * args.value_size])
        lat: list[float] = []
        for _ in range(args.latency_samples):
            t0 = time.perf_counter()
            client.produce(topic, 0, one)
            lat.append((time.perf_counter() - t0) * 1000)

    rate = records / elapsed
    figures: dict[str, Any] = {
        "bench": "produce",
        "tls_auth": secure,
        "nodes": args.nodes,
        "partitions": args.partitions,
        "replication_factor": replication_factor,
        "nodes_leading": leading,
        "records": records,
        "value_size": args.value_size,
        "seconds": round(elapsed, 3),
        "records_per_s": round(rate),
        "mb_per_s": round(rate * args.value_size / 1e6, 1),
        "latency_p50_ms": round(percentile(lat, 50), 3),
        "latency_p99_ms": round(percentile(lat, 99), 3),
        "elections": elections,
        "peak_rss_mb": {str(k): round(v, 1) for k, v in rss.items()},
    }
    lines = (
        []
        if args.json
        else [
            f"committed {records} records of {args.value_size} B in {elapsed:.2f}s with acks=quorum "
            f"({args.nodes} nodes, {leading} of them leading, {replication_factor} replicas, fsync "
            f"on): {rate:,.0f} records/s, {rate * args.value_size / 1e6:.1f} MB/s",
            f"single-record latency: p50 {figures['latency_p50_ms']} ms, p99 {figures['latency_p99_ms']} ms",
            f"leader elections during the run: {elections}",
            "peak RSS per node (MB): " + ", ".join(f"{k}: {v:.0f}" for k, v in rss.items()),
        ]
    )
    return figures, lines
