"""quorumlog perf kafka: a librdkafka producer (confluent-kafka; 100 B values, acks=all,
its default batching) and then a librdkafka consumer against the nodes' Kafka listener,
3 replicas with fsync. Needs confluent-kafka (the project's dev extra)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..node.cluster import LocalCluster
from .perfutil import Progress, emit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf kafka")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)
    try:
        import confluent_kafka
    except ImportError:
        raise SystemExit(
            "quorumlog perf kafka needs confluent-kafka: pip install 'quorumlog[dev]'"
        ) from None
    topic = "perf-kafka"
    data_dir = Path(args.data_dir) if args.data_dir is not None else None
    with LocalCluster(args.nodes, data_dir, log_level="WARNING", kafka=True) as cluster:
        cluster.create_topic(topic, args.partitions)
        for p in range(args.partitions):
            cluster.wait_for_leader(topic, p, 60)
        produced, produce_s = _produce(confluent_kafka, cluster.kafka_bootstrap, topic, args)
        consumed, consume_s = _consume(confluent_kafka, cluster.kafka_bootstrap, topic, args)
    figures: dict[str, Any] = {
        "bench": "kafka",
        "nodes": args.nodes,
        "partitions": args.partitions,
        "records": args.records,
        "value_size": args.value_size,
        "produce_rec_per_s": round(produced / produce_s),
        "consume_rec_per_s": round(consumed / consume_s),
        "consumed": consumed,
    }
    lines = (
        []
        if args.json
        else [
            f"records               {args.records:,}  ({args.partitions} partitions, "
            f"{args.value_size} B values, {args.nodes} replicas, fsync on)",
            f"librdkafka producer   {figures['produce_rec_per_s']:,} records/s (acks=all)",
            f"librdkafka consumer   {figures['consume_rec_per_s']:,} records/s",
        ]
    )
    emit(figures, lines)
    return 0


def _produce(ck: Any, bootstrap: str, topic: str, args: argparse.Namespace) -> tuple[int, float]:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    value = b"v" * args.value_size
    state = {"acked": 0, "failed": 0}

    def delivered(err: Any, msg: Any) -> None:
        state["failed" if err is not None else "acked"] += 1

    progress = Progress(args.records, "produce")
    start = time.monotonic()
    for i in range(args.records):
        while True:
            try:
                producer.produce(topic, value, partition=i % args.partitions, on_delivery=delivered)
                break
            except BufferError:  # its queue is full: let deliveries drain it
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
            progress.update(state["acked"])
    left = producer.flush(120)
    elapsed = time.monotonic() - start
    progress.close()
    if left or state["failed"]:
        raise SystemExit(
            f"quorumlog perf kafka: {state['failed']} records failed, {left} undelivered"
        )
    return state["acked"], elapsed


def _consume(ck: Any, bootstrap: str, topic: str, args: argparse.Namespace) -> tuple[int, float]:
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "perf", "enable.auto.commit": False}
    )
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(args.partitions)])
    got = 0
    progress = Progress(args.records, "consume")
    start = time.monotonic()
    deadline = start + 300
    try:
        while got < args.records and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is None:
                    got += 1
            progress.update(got)
    finally:
        consumer.close()
    elapsed = time.monotonic() - start
    progress.close()
    if got < args.records:
        raise SystemExit(f"quorumlog perf kafka: consumed {got} of {args.records} in 300 s")
    return got, elapsed
