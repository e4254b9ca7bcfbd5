"""quorumlog perf transactions: librdkafka's transactional loop against the same loop
with idempotence only, on a topic of ``--partitions`` partitions, 3 replicas with fsync,
through the nodes' Kafka listener. Needs confluent-kafka (the project's dev extra).

Both loops hand librdkafka 100 B keyed records a thousand at a time (``produce_batch``,
keys spread over every partition) for ``--seconds``; every ``--commit-ms`` the
transactional loop commits its transaction (``commit_transaction``: flush, EndTxn, the
coordinator's markers on every partition written) and begins the next, where the
idempotent loop flushes, so both wait for every record acknowledged at the same points.
``transactional_vs_idempotent`` is their ratio of records per second.

Meanwhile a read_committed consumer reads the topic; each record carries its
transaction's number, and the time from the ``commit_transaction`` call to the first
record of that transaction the consumer sees is the commit's visibility latency (p50,
p99): what a consume-transform-produce pipeline adds per hop."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from ..node.cluster import LocalCluster
from .util import cpu_seconds, emit, percentile

#: Records per ``produce_batch`` call.
CHUNK = 1_000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf transactions")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0, help="each loop runs this long")
    ap.add_argument("--commit-ms", type=int, default=100, help="a commit every this many ms")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)
    try:
        import confluent_kafka
    except ImportError:
        raise SystemExit(
            "quorumlog perf transactions needs confluent-kafka: pip install 'quorumlog[dev]'"
        ) from None
    data_dir = Path(args.data_dir) if args.data_dir is not None else None
    with LocalCluster(args.nodes, data_dir, log_level="WARNING", kafka=True) as cluster:
        for topic in ("perf-idempotent", "perf-transactional"):
            cluster.create_topic(topic, args.partitions)
            for p in range(args.partitions):
                cluster.wait_for_leader(topic, p, 60)
        pids = [proc.pid for proc in cluster.procs.values()]
        boot = cluster.kafka_bootstrap
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        idem = _loop(confluent_kafka, boot, "perf-idempotent", args, transactional=False)
        cpu1 = sum(cpu_seconds(pid) for pid in pids)
        seen: dict[int, float] = {}
        stop = threading.Event()
        reader = threading.Thread(
            target=_read_committed,
            args=(confluent_kafka, boot, "perf-transactional", seen, stop),
            daemon=True,
        )
        reader.start()
        txn = _loop(confluent_kafka, boot, "perf-transactional", args, transactional=True)
        cpu2 = sum(cpu_seconds(pid) for pid in pids)
        deadline = time.monotonic() + 30
        last = max(txn["commits"], default=-1)
        while last not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        reader.join(10)
    latencies = [(seen[n] - began) * 1000 for n, began in txn["commits"].items() if n in seen]
    figures: dict[str, Any] = {
        "bench": "transactions",
        "nodes": args.nodes,
        "partitions": args.partitions,
        "seconds": args.seconds,
        "commit_ms": args.commit_ms,
        "value_size": args.value_size,
        "idempotent_records": idem["records"],
        "transactional_records": txn["records"],
        "idempotent_rec_per_s": round(idem["records"] / idem["elapsed"]),
        "transactional_rec_per_s": round(txn["records"] / txn["elapsed"]),
        "transactional_vs_idempotent": round(
            (txn["records"] / txn["elapsed"]) / (idem["records"] / idem["elapsed"]), 3
        ),
        "transactions": len(txn["commits"]),
        "idempotent_flush_ms_p50": round(percentile(idem["flush_ms"], 50), 1),
        "flush_ms_p50": round(percentile(txn["flush_ms"], 50), 1),
        "commit_ms_p50": round(percentile(txn["commit_ms"], 50), 1),
        "commit_ms_p99": round(percentile(txn["commit_ms"], 99), 1),
        "commit_to_visible_ms_p50": round(percentile(latencies, 50), 1),
        "commit_to_visible_ms_p99": round(percentile(latencies, 99), 1),
        "commits_seen": len(latencies),
        "node_cpu_s_per_m_idempotent": round((cpu1 - cpu0) / max(1, idem["records"]) * 1e6, 2),
        "node_cpu_s_per_m_transactional": round((cpu2 - cpu1) / max(1, txn["records"]) * 1e6, 2),
    }
    lines = (
        []
        if args.json
        else [
            f"loops                 {args.seconds:g} s each, {args.partitions} partitions, "
            f"{args.value_size} B keyed records, a commit (or flush) every {args.commit_ms} ms",
            f"idempotent            {figures['idempotent_rec_per_s']:,} records/s, nodes' CPU "
            f"{figures['node_cpu_s_per_m_idempotent']} s per million",
            f"transactional         {figures['transactional_rec_per_s']:,} records/s, nodes' CPU "
            f"{figures['node_cpu_s_per_m_transactional']} s per million "
            f"({figures['transactions']} transactions)",
            f"  vs idempotent       {figures['transactional_vs_idempotent']}",
            f"flush                 p50 {figures['flush_ms_p50']} ms (idempotent loop: "
            f"{figures['idempotent_flush_ms_p50']} ms)",
            f"commit_transaction    p50 {figures['commit_ms_p50']} ms, "
            f"p99 {figures['commit_ms_p99']} ms (after the flush: EndTxn and its markers)",
            f"commit -> read_committed consumer sees it  p50 "
            f"{figures['commit_to_visible_ms_p50']} ms, p99 "
            f"{figures['commit_to_visible_ms_p99']} ms ({len(latencies)} commits seen)",
        ]
    )
    emit(figures, lines)
    return 0


def _loop(
    ck: Any, bootstrap: str, topic: str, args: argparse.Namespace, *, transactional: bool
) -> dict[str, Any]:
    """Records produced for ``args.seconds``, a commit (or a flush) every ``commit_ms``."""
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "delivery.report.only.error": True,
    }
    if transactional:
        settings["transactional.id"] = f"perf-{time.monotonic_ns()}"
    producer = ck.Producer(settings)
    if transactional:
        producer.init_transactions(30)
    pad = b"x" * max(0, args.value_size - 12)
    records, number = 0, 0
    commits: dict[int, float] = {}
    commit_ms: list[float] = []
    flush_ms: list[float] = []
    start = time.monotonic()
    end = start + args.seconds
    while time.monotonic() < end:
        if transactional:
            producer.begin_transaction()
        turn_end = min(end, time.monotonic() + args.commit_ms / 1000)
        head = number.to_bytes(8, "big")
        while time.monotonic() < turn_end:
            batch = [{"value": head + pad, "key": str(records + i).encode()} for i in range(CHUNK)]
            producer.produce_batch(topic, batch)
            records += CHUNK
            producer.poll(0)
        began = time.monotonic()
        producer.flush(60)
        flushed = time.monotonic()
        if transactional:
            commits[number] = flushed
            producer.commit_transaction(60)
        flush_ms.append((flushed - began) * 1000)
        commit_ms.append((time.monotonic() - flushed) * 1000)
        number += 1
    elapsed = time.monotonic() - start
    producer.flush(60)
    return {
        "records": records,
        "elapsed": elapsed,
        "commits": commits,
        "commit_ms": commit_ms,
        "flush_ms": flush_ms,
    }


def _read_committed(
    ck: Any, bootstrap: str, topic: str, seen: dict[int, float], stop: threading.Event
) -> None:
    """When each transaction's first record reached a read_committed consumer."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"perf-reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        consumer.subscribe([topic])
        while not stop.is_set():
            for msg in consumer.consume(10_000, 0.05):
                if msg.error() is None:
                    number = int.from_bytes(msg.value()[:8], "big")
                    seen.setdefault(number, time.monotonic())
    finally:
        consumer.close()
