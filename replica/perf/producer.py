"""quorumlog perf producer: the native Python producer against librdkafka's, in one run,
into the same 3 nodes (acks=quorum / acks=all, fsync on, 100 B values, each client's
default batching).

Phases, each into a topic of its own, each timed from the first send to the end of the
final flush (every record acknowledged, or the run fails):

* ``native``: one thread calls ``Producer.send(topic, value, partition=0)`` per record;
* ``native_keyed``: ``send(topic, value, key=key)`` with a distinct key per record over
  ``--keyed-partitions`` partitions (murmur2, the default partitioner);
* ``native_many``: ``send_many(topic, values, partition=0)`` with lists of
  ``--many-chunk`` values;
* ``librdkafka``: confluent-kafka's ``produce(topic, value, partition=0)`` per record into
  the nodes' Kafka listener (acks=all, errors-only delivery reports, ``poll(0)`` every
  1,000 records), the loop the native one is judged against;
* ``librdkafka_keyed``: the same with a key per record over the keyed topic's partition
  count (``partitioner=murmur2_random``), for reference.

Besides records/s, each phase's client CPU (this process: the caller and the client's own
threads) and the nodes' CPU per million records (on a machine whose cores the client and
the nodes share, their sum bounds the rate), the keyed librdkafka rate over the keyed
native one (``librdkafka_keyed_vs_native_keyed``), and the machine's limit beside them:
how fast it writes new pages into its page cache (``page_cache_write_mb_per_s``; each
replica's append is such a copy, and on a virtual machine whose host takes back freed
memory it can be a fraction of the rate into reused pages). Each phase starts once every
replica has the last phase's records. Needs confluent-kafka (the project's dev extra)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..client import Client
from ..client.producer import Producer
from ..node.cluster import LocalCluster
from .util import (
    Progress,
    add_page_cache_option,
    cpu_seconds,
    emit,
    librdkafka_loop,
    page_cache_args,
    page_cache_write_mb_per_s,
)

#: Each phase's flush must end within this (the run fails otherwise).
FLUSH_TIMEOUT_S = 300.0
#: How long a phase's slowest replicas may take to catch up before the next phase.
SETTLE_TIMEOUT_S = 60.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quorumlog perf producer")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--records", type=int, default=1_000_000, help="records per phase")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--keyed-partitions", type=int, default=64)
    ap.add_argument("--many-chunk", type=int, default=10_000, help="values per send_many call")
    ap.add_argument("--data-dir", default=None)
    add_page_cache_option(ap)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    ap.add_argument(
        "--skip-librdkafka", action="store_true", help="the native phases only (no baseline)"
    )
    args = ap.parse_args(argv)
    ck: Any = None
    if not args.skip_librdkafka:
        try:
            import confluent_kafka as ck
        except ImportError:
            raise SystemExit(
                "quorumlog perf producer needs confluent-kafka: pip install 'quorumlog[dev]' "
                "(or --skip-librdkafka)"
            ) from None
    value = b"v" * args.value_size
    keys = [b"%016d" % i for i in range(args.records)]
    data_dir = Path(args.data_dir) if args.data_dir is not None else None
    # records, seconds, the client's CPU seconds, the nodes'
    phases: dict[str, tuple[int, float, float, float]] = {}
    with LocalCluster(
        args.nodes,
        data_dir,
        log_level="WARNING",
        kafka=ck is not None,
        node_args=page_cache_args(args),
    ) as c:
        topics = {"native": 1, "native_keyed": args.keyed_partitions, "native_many": 1}
        if ck is not None:
            topics |= {"librdkafka": 1, "librdkafka_keyed": args.keyed_partitions}
        for topic, partitions in topics.items():
            c.create_topic(topic, partitions)
            for p in range(partitions):
                c.wait_for_leader(topic, p, 60)
        nodes = [proc.pid for proc in c.procs.values()]

        def phase(name: str, run: Callable[[], tuple[int, float, float]]) -> None:
            # The nodes' CPU over the phase beside the client's: together they are what
            # a record costs this machine.
            cpu0 = sum(cpu_seconds(pid) for pid in nodes)
            phases[name] = (*run(), sum(cpu_seconds(pid) for pid in nodes) - cpu0)

        with Client(c.bootstrap) as client:
            # Each native phase next to the librdkafka one it is compared with; each on
            # a quiet cluster (acks=quorum answers before the slowest replica has the
            # records: it catches up after the phase, not during the next one).
            phase(
                "native",
                lambda: _native(
                    client, "native", args, lambda p, t: _per_record(p, t, value, args.records)
                ),
            )
            _settle(client, "native", 1)
            if ck is not None:
                phase(
                    "librdkafka",
                    lambda: _librdkafka(ck, c.kafka_bootstrap, "librdkafka", value, args, None),
                )
                _settle(client, "librdkafka", 1)
            phase(
                "native_keyed",
                lambda: _native(
                    client, "native_keyed", args, lambda p, t: _keyed(p, t, value, keys)
                ),
            )
            _settle(client, "native_keyed", args.keyed_partitions)
            if ck is not None:
                phase(
                    "librdkafka_keyed",
                    lambda: _librdkafka(
                        ck, c.kafka_bootstrap, "librdkafka_keyed", value, args, keys
                    ),
                )
                _settle(client, "librdkafka_keyed", args.keyed_partitions)
            phase(
                "native_many",
                lambda: _native(client, "native_many", args, lambda p, t: _many(p, t, value, args)),
            )
        # The machine's limit beside the figures (measured last, so that the pages it
        # frees are not the ones the phases write into).
        page_cache = page_cache_write_mb_per_s(c.data_dir)
    figures: dict[str, Any] = {
        "bench": "producer",
        "nodes": args.nodes,
        "records": args.records,
        "value_size": args.value_size,
        "keyed_partitions": args.keyed_partitions,
        "many_chunk": args.many_chunk,
        "page_cache": args.page_cache,
        "page_cache_write_mb_per_s": round(page_cache),
    }
    for name, (records, seconds, cpu, node_cpu) in phases.items():
        figures[f"{name}_rec_per_s"] = round(records / seconds)
        figures[f"{name}_cpu_s_per_m"] = round(cpu / records * 1e6, 2)
        figures[f"{name}_node_cpu_s_per_m"] = round(node_cpu / records * 1e6, 2)
    if "librdkafka" in phases:
        figures["native_vs_librdkafka"] = round(
            figures["native_rec_per_s"] / figures["librdkafka_rec_per_s"], 3
        )
        figures["librdkafka_keyed_vs_native_keyed"] = round(
            figures["librdkafka_keyed_rec_per_s"] / figures["native_keyed_rec_per_s"], 3
        )
    lines = [] if args.json else _lines(figures, args)
    emit(figures, lines)
    return 0


def _lines(figures: dict[str, Any], args: argparse.Namespace) -> list[str]:
    labels = {
        "native": "native send, partition=0",
        "native_keyed": f"native send, keyed, {args.keyed_partitions} partitions",
        "native_many": f"native send_many, {args.many_chunk:,} values a call",
        "librdkafka": "librdkafka produce, partition=0",
        "librdkafka_keyed": f"librdkafka produce, keyed, {args.keyed_partitions} partitions",
    }
    out = [
        f"records a phase       {args.records:,} ({args.value_size} B values, {args.nodes} "
        f"replicas, acks=quorum, fsync on, page cache: {args.page_cache})"
    ]
    for name, label in labels.items():
        if f"{name}_rec_per_s" in figures:
            out.append(
                f"{label:<44} {figures[f'{name}_rec_per_s']:>11,} records/s, "
                f"CPU per million: client {figures[f'{name}_cpu_s_per_m']} s, "
                f"nodes {figures[f'{name}_node_cpu_s_per_m']} s"
            )
    if "native_vs_librdkafka" in figures:
        out.append(f"native / librdkafka (per-record loop): {figures['native_vs_librdkafka']}")
        out.append(
            f"librdkafka keyed / native keyed: {figures['librdkafka_keyed_vs_native_keyed']}"
        )
    out.append(
        f"the machine writes new pages into its page cache at "
        f"{figures['page_cache_write_mb_per_s']:,} MB/s (every replica of a record, "
        f"{args.nodes} here, copies it so)"
    )
    return out


def _native(
    client: Client,
    topic: str,
    args: argparse.Namespace,
    loop: Callable[[Producer, str], None],
) -> tuple[int, float, float]:
    """One phase with a new Producer of default settings: warmed up (metadata, producer
    id, connections), then ``loop`` and the flush that acknowledges every record."""
    producer = Producer(client)
    try:
        producer.send(topic, b"warm-up", partition=0)
        producer.flush(60)
        cpu0 = time.process_time()
        start = time.monotonic()
        loop(producer, topic)
        results = producer.flush(FLUSH_TIMEOUT_S)
        elapsed = time.monotonic() - start
        cpu = time.process_time() - cpu0
    finally:
        producer.close(60)
    acked = sum(r.last_offset - r.base_offset + 1 for r in results)
    if acked != args.records:
        raise SystemExit(f"quorumlog perf producer: {topic}: {acked} of {args.records} acked")
    return acked, elapsed, cpu


def _settle(client: Client, topic: str, partitions: int) -> None:
    """Wait (at most SETTLE_TIMEOUT_S) until every replica of ``topic`` has every record
    its leader has."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    for p in range(partitions):
        while time.monotonic() < deadline:
            quorum = client.describe_quorum(topic, p)
            if all(v.end_offset >= quorum.high_watermark for v in quorum.voters):
                break
            time.sleep(0.05)


def _per_record(producer: Producer, topic: str, value: bytes, records: int) -> None:
    send = producer.send
    progress = Progress(records, topic)
    for i in range(records):
        send(topic, value, partition=0)
        if not i % 100_000:
            progress.update(i)
    progress.close()


def _keyed(producer: Producer, topic: str, value: bytes, keys: list[bytes]) -> None:
    send = producer.send
    progress = Progress(len(keys), topic)
    for i, key in enumerate(keys):
        send(topic, value, key=key)
        if not i % 100_000:
            progress.update(i)
    progress.close()


def _many(producer: Producer, topic: str, value: bytes, args: argparse.Namespace) -> None:
    progress = Progress(args.records, topic)
    chunk = [value] * args.many_chunk
    done = 0
    while done < args.records:
        n = min(args.many_chunk, args.records - done)
        producer.send_many(topic, chunk if n == len(chunk) else chunk[:n], partition=0)
        done += n
        progress.update(done)
    progress.close()


def _librdkafka(
    ck: Any,
    bootstrap: str,
    topic: str,
    value: bytes,
    args: argparse.Namespace,
    keys: list[bytes] | None,
) -> tuple[int, float, float]:
    """librdkafka's per-record loop: acks=all, its default batching, delivery reports for
    errors only; keyed (``partitioner=murmur2_random``) when ``keys`` are given."""
    failed: list[Any] = []
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "partitioner": "murmur2_random",
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: failed.append(err),
        }
    )
    producer.produce(topic, b"warm-up", partition=0)
    if producer.flush(60):
        raise SystemExit(f"quorumlog perf producer: {topic}: the warm-up record was not acked")
    progress = Progress(args.records, topic)
    cpu0 = time.process_time()
    start = time.monotonic()
    librdkafka_loop(
        producer, topic, args.records, [value], keys, progress, f"quorumlog perf producer: {topic}"
    )
    left = producer.flush(FLUSH_TIMEOUT_S)
    elapsed = time.monotonic() - start
    cpu = time.process_time() - cpu0
    progress.close()
    if left or failed:
        raise SystemExit(
            f"quorumlog perf producer: {topic}: {len(failed)} records failed, {left} undelivered"
        )
    return args.records, elapsed, cpu
