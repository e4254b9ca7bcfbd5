"""quorumlog perf kafka: a librdkafka producer (confluent-kafka; 100 B values, acks=all,
its default batching) and then a librdkafka consumer against the nodes' Kafka listener,
3 replicas with fsync. Needs confluent-kafka (the project's dev extra).

The producer (``--producer-api batch``, the default) hands librdkafka keyless records a
thousand at a time (``produce_batch``) and its default partitioner places them (sticky for
keyless records, as Kafka's own), with delivery reports for errors only: a Python
``produce`` call and delivery callback per record cost this client ~5 us of CPU a record,
which on a small machine shared with the nodes bounds the figure before the nodes do.
``--producer-api record`` is that per-record loop, partitions in turn (every partition
gets every Nth record: the smallest batches). ``--keyed`` is the loop most Kafka users
write: ``produce(topic, value, key)`` per record, a distinct key each, librdkafka's default
partitioner and batching (``--partitions 64 --keyed``: the shape of issue 64, where a
backlog of small requests once held the listener to 24k records/s). Besides records/s, it
prints the nodes' CPU per million records of each phase (the server's cost, whatever the
client), the producer process's own CPU per million (this process: the loop and
librdkafka's threads; on a machine whose cores it shares with the nodes, the rate is at
most the cores over the two together), how busy the machine's CPUs were while it
produced, and the listener's answer time per Produce request while the producer ran
(mean and p99, from the nodes' request histograms: from a request's read to its
answer).

``--compression lz4|zstd`` has the producer compress with that codec (librdkafka's
``compression.type``) into a topic of the same ``compression.type``, so the nodes store
its batches compressed (Arrow IPC buffer compression); ``disk_bytes_per_record`` is the
topic's segment bytes per record per replica. ``--payload json`` makes the values
JSON-like events (compressible as real ones are) instead of one repeated byte.

The consumer runs with ``fetch.queue.backoff.ms`` = 10 (librdkafka's default is 1000):
librdkafka stops fetching a partition for that long once its prefetch queue holds
``queued.min.messages``, and a consumer faster than its application loop then idles in
1-second steps (librdkafka's documentation names this knob for it). The figure with the
default is printed too. ``--producer-config`` / ``--consumer-config KEY=VALUE`` add or
override client settings."""

from __future__ import annotations

import argparse
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..node.cluster import LocalCluster
from .util import MachineCpu, Progress, cpu_seconds, emit, librdkafka_loop

#: librdkafka's fetch back-off when a partition's prefetch queue is full (its default,
#: 1000 ms, stalls a consumer that reads faster than its queue thresholds assume).
CONSUMER_DEFAULTS = {"fetch.queue.backoff.ms": 10}


def _config(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"quorumlog perf kafka: {flag} takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf kafka")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    ap.add_argument(
        "--producer-api",
        choices=("batch", "record"),
        default="batch",
        help="batch: produce_batch of 1,000 keyless records, librdkafka's partitioner, "
        "error-only delivery reports; record: one produce call and callback per record, "
        "partitions in turn",
    )
    ap.add_argument(
        "--keyed",
        action="store_true",
        help="one produce(topic, value, key) call per record, a distinct key each, "
        "librdkafka's default partitioner (error-only delivery reports)",
    )
    ap.add_argument(
        "--compression",
        choices=("none", "lz4", "zstd"),
        default="none",
        help="the producer's compression.type and the topic's (how its batches are stored)",
    )
    ap.add_argument(
        "--payload",
        choices=("fixed", "json"),
        default="fixed",
        help="fixed: value-size copies of one byte; json: JSON-like events of about "
        "value-size bytes",
    )
    ap.add_argument(
        "--producer-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka producer setting (repeatable)",
    )
    ap.add_argument(
        "--consumer-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka consumer setting (repeatable)",
    )
    args = ap.parse_args(argv)
    producer_config = _config(args.producer_config, "--producer-config")
    consumer_config = {**CONSUMER_DEFAULTS, **_config(args.consumer_config, "--consumer-config")}
    try:
        import confluent_kafka
    except ImportError:
        raise SystemExit(
            "quorumlog perf kafka needs confluent-kafka: pip install 'quorumlog[dev]'"
        ) from None
    topic = "perf-kafka"
    data_dir = Path(args.data_dir) if args.data_dir is not None else None
    if args.compression != "none":
        producer_config = {"compression.type": args.compression, **producer_config}
    producer_api = "keyed" if args.keyed else args.producer_api
    with LocalCluster(
        args.nodes, data_dir, log_level="WARNING", kafka=True, metrics=True
    ) as cluster:
        if args.compression == "none":
            cluster.create_topic(topic, args.partitions)
        else:
            configs = {"compression.type": args.compression}
            cluster.client.create_topic(topic, args.partitions, configs=configs)
        for p in range(args.partitions):
            cluster.wait_for_leader(topic, p, 60)
        pids = [proc.pid for proc in cluster.procs.values()]
        boot = cluster.kafka_bootstrap
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        answers0 = produce_answers(cluster)
        client0, machine0 = time.process_time(), MachineCpu.now()
        produced, produce_s = _produce(confluent_kafka, boot, topic, args, producer_config)
        client_cpu = time.process_time() - client0
        busy = MachineCpu.now().busy_share_since(machine0)
        answered = produce_answers(cluster) - answers0
        cpu1 = sum(cpu_seconds(pid) for pid in pids)
        consumed, consume_s = _consume(confluent_kafka, boot, topic, args, consumer_config)
        cpu2 = sum(cpu_seconds(pid) for pid in pids)
        default_consumer = {k: v for k, v in consumer_config.items() if k not in CONSUMER_DEFAULTS}
        consumed_default, consume_default_s = _consume(
            confluent_kafka, boot, topic, args, default_consumer, group="perf-defaults"
        )
        disk_bytes = sum(
            f.stat().st_size
            for node in cluster.procs
            for f in cluster.node_dir(node).glob(f"{topic}-*/*.log")
        )
    figures: dict[str, Any] = {
        "bench": "kafka",
        "nodes": args.nodes,
        "partitions": args.partitions,
        "records": args.records,
        "value_size": args.value_size,
        "producer_api": producer_api,
        "compression": args.compression,
        "payload": args.payload,
        "disk_bytes_per_record": round(disk_bytes / len(pids) / produced, 1),
        "produce_rec_per_s": round(produced / produce_s),
        "consume_rec_per_s": round(consumed / consume_s),
        "consume_default_backoff_rec_per_s": round(consumed_default / consume_default_s),
        "consumed": consumed,
        "node_cpu_s_per_m_produced": round((cpu1 - cpu0) / produced * 1e6, 2),
        "client_cpu_s_per_m_produced": round(client_cpu / produced * 1e6, 2),
        "produce_machine_busy_pct": round(busy * 100, 1),
        "produce_requests": answered.count,
        "records_per_produce_request": round(produced / max(answered.count, 1), 1),
        "produce_answer_ms_mean": round(answered.mean_s() * 1000, 2),
        "produce_answer_ms_p99": round(answered.quantile_s(0.99) * 1000, 1),
        "node_cpu_s_per_m_consumed": round((cpu2 - cpu1) / consumed * 1e6, 2),
        "producer_config": producer_config,
        "consumer_config": consumer_config,
    }
    lines = (
        []
        if args.json
        else [
            f"records               {args.records:,}  ({args.partitions} partitions, "
            f"{args.value_size} B values, {args.nodes} replicas, fsync on)",
            f"librdkafka producer   {figures['produce_rec_per_s']:,} records/s (acks=all, "
            f"{producer_api} API), nodes' CPU {figures['node_cpu_s_per_m_produced']} s per "
            f"million, the producer's {figures['client_cpu_s_per_m_produced']} s (the "
            f"machine's CPUs {figures['produce_machine_busy_pct']}% busy)",
            f"  listener's answer   {figures['produce_requests']:,} Produce requests "
            f"({figures['records_per_produce_request']} records each), answered in "
            f"{figures['produce_answer_ms_mean']} ms mean, "
            f"p99 <= {figures['produce_answer_ms_p99']} ms",
            f"on disk               {figures['disk_bytes_per_record']} bytes per record "
            f"per replica (compression {args.compression}, {args.payload} payload)",
            f"librdkafka consumer   {figures['consume_rec_per_s']:,} records/s, "
            f"nodes' CPU {figures['node_cpu_s_per_m_consumed']} s per million "
            f"({_settings(consumer_config)})",
            f"  with librdkafka's default fetch.queue.backoff.ms (1000): "
            f"{figures['consume_default_backoff_rec_per_s']:,} records/s",
        ]
    )
    emit(figures, lines)
    return 0


def _settings(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items()) or "librdkafka's defaults"


#: Records per ``produce_batch`` call of the batch producer.
PRODUCE_CHUNK = 1_000


def _produce(
    ck: Any, bootstrap: str, topic: str, args: argparse.Namespace, config: dict[str, str]
) -> tuple[int, float]:
    """Every record acknowledged (acks=all) or the run fails. ``batch``: keyless records
    handed over ``PRODUCE_CHUNK`` at a time (``produce_batch``) to librdkafka's default
    partitioner (sticky for keyless records, as Kafka's), failures reported (delivery
    reports for errors only); ``record``: one ``produce`` call and one delivery callback
    per record, partitions in turn (each partition gets every Nth record, the smallest
    batches); ``--keyed``: ``librdkafka_loop`` (``produce(topic, value, key)`` per record,
    a distinct key each, no callback with it), failures reported by the producer's own
    error-only delivery reports."""
    settings: dict[str, Any] = {"bootstrap.servers": bootstrap, "acks": "all"}
    state = {"acked": 0, "failed": 0, "queued": 0}

    def delivered(err: Any, msg: Any) -> None:
        state["failed" if err is not None else "acked"] += 1

    if args.producer_api == "batch" or args.keyed:
        settings["delivery.report.only.error"] = True
    if args.keyed:  # the users' loop passes no callback with each record
        settings["on_delivery"] = delivered
    producer = ck.Producer({**settings, **config})
    values = _values(args.payload, args.value_size)
    progress = Progress(args.records, "produce")
    keys = [b"%016d" % i for i in range(args.records)] if args.keyed else []
    start = time.monotonic()
    if args.keyed:
        librdkafka_loop(
            producer, topic, args.records, values, keys, progress, "quorumlog perf kafka"
        )
    elif args.producer_api == "batch":
        full = ck.KafkaError._QUEUE_FULL
        _produce_batches(producer, topic, values, args.records, delivered, full, state, progress)
    else:
        for i in range(args.records):
            while True:
                try:
                    producer.produce(
                        topic,
                        values[i % len(values)],
                        partition=i % args.partitions,
                        on_delivery=delivered,
                    )
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
    if args.producer_api == "batch" or args.keyed:
        # None failed, none left: every one acknowledged.
        state["acked"] = args.records if args.keyed else state["queued"]
    return state["acked"], elapsed


@dataclass(frozen=True, slots=True)
class Answered:
    """The Kafka listeners' Produce answers (summed over the nodes): how many, their total
    time, and how many took at most each bucket's bound (cumulative, as Prometheus)."""

    count: int
    sum_s: float
    buckets: tuple[tuple[float, int], ...]

    def __sub__(self, before: Answered) -> Answered:
        then = dict(before.buckets)
        return Answered(
            self.count - before.count,
            self.sum_s - before.sum_s,
            tuple((le, n - then.get(le, 0)) for le, n in self.buckets),
        )

    def mean_s(self) -> float:
        return self.sum_s / self.count if self.count else 0.0

    def quantile_s(self, q: float) -> float:
        """The least bucket bound at or under which a ``q`` share of answers came."""
        for le, n in self.buckets:
            if self.count and n >= q * self.count:
                return le
        return float("inf") if self.count else 0.0


_SERIES = "quorumlog_request_duration_seconds_"


def produce_answers(cluster: LocalCluster) -> Answered:
    """Every node's Kafka Produce answers so far (its metrics endpoint)."""
    count, total, buckets = 0, 0.0, dict[float, int]()
    for url in cluster.metrics_urls.values():
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if not line.startswith(_SERIES) or 'listener="kafka"' not in line:
                continue
            if 'api="Produce"' not in line:
                continue
            kind, value = line[len(_SERIES) :].split("{")[0], float(line.split()[-1])
            if kind == "count":
                count += int(value)
            elif kind == "sum":
                total += value
            elif kind == "bucket":
                le = float(line.split('le="')[1].split('"')[0])
                buckets[le] = buckets.get(le, 0) + int(value)
    return Answered(count, total, tuple(sorted(buckets.items())))


#: Distinct values a run cycles through (made before the clock starts).
VALUE_POOL = 1_000


def _values(payload: str, size: int) -> list[bytes]:
    """The values a run produces, in turn: one repeated byte, or JSON-like events of
    about ``size`` bytes (ids, names and numbers varying as in real events)."""
    if payload == "fixed":
        return [b"v" * size]
    out = []
    for i in range(VALUE_POOL):
        event = (
            f'{{"id":{1_000_000 + i},"user":"user-{i % 97}","event":"page_view",'
            f'"page":"/products/{i % 31}","ts":{1_700_000_000_000 + i * 7},"ok":true}}'
        )
        out.append(event.encode().ljust(size, b" ")[: max(size, len(event))])
    return out


def _produce_batches(
    producer: Any,
    topic: str,
    values: list[bytes],
    records: int,
    delivered: Any,
    queue_full: int,
    state: dict[str, int],
    progress: Progress,
) -> None:
    """``records`` keyless records through ``produce_batch``; the part of a chunk its full
    queue refused (marked ``_error`` QUEUE_FULL) goes again once deliveries drained it."""
    deadline = time.monotonic() + 300
    while state["queued"] < records:
        first = state["queued"]
        chunk: list[dict[str, Any]] = [
            {"value": values[(first + i) % len(values)]}
            for i in range(min(PRODUCE_CHUNK, records - first))
        ]
        state["queued"] += producer.produce_batch(topic, chunk, on_delivery=delivered)
        refused = [m["_error"] for m in chunk if "_error" in m]
        other = [err for err in refused if err.code() != queue_full]
        if other:
            raise SystemExit(f"quorumlog perf kafka: produce_batch refused: {other[0]}")
        producer.poll(0.05 if refused else 0)
        progress.update(state["queued"])
        if time.monotonic() > deadline:
            raise SystemExit(
                f"quorumlog perf kafka: {state['queued']} of {records} queued in 300 s"
            )


def _consume(
    ck: Any,
    bootstrap: str,
    topic: str,
    args: argparse.Namespace,
    config: dict[str, Any],
    *,
    group: str = "perf",
) -> tuple[int, float]:
    base = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    consumer = ck.Consumer({**base, **config})
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
