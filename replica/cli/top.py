"""``quorumlog top``: a live view of a cluster from its nodes' Prometheus endpoints
(``serve --metrics-listen``), redrawn every interval; ``--once`` prints one frame.

Rates and percentiles are over the interval between two scrapes of every node (so even
``--once`` scrapes twice, an interval apart); percentiles are read off the histograms'
buckets as Prometheus' ``histogram_quantile`` does (linear within a bucket)."""

from __future__ import annotations

import argparse
import math
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

#: One node's scrape: sample name -> [(labels, value)].
Samples = dict[str, list[tuple[dict[str, str], float]]]

FLUSH = "quorumlog_log_flush_duration_seconds"
PERSIST = "quorumlog_quorum_state_write_duration_seconds"
REQUEST = "quorumlog_request_duration_seconds"
CLEAR = "\x1b[H\x1b[2J"


@dataclass
class Scrape:
    """What one endpoint answered at ``at`` (monotonic s), or why it did not."""

    endpoint: str
    at: float
    samples: Samples = field(default_factory=dict)
    error: str | None = None

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(
            v
            for have, v in self.samples.get(name, [])
            if all(have.get(k) == x for k, x in labels.items())
        )

    def by(self, name: str, label: str) -> dict[str, float]:
        """``name``'s samples summed by the value of ``label``."""
        out: dict[str, float] = {}
        for have, v in self.samples.get(name, []):
            if label in have:
                out[have[label]] = out.get(have[label], 0.0) + v
        return out


def endpoint_url(text: str, secure: bool) -> str:
    """``HOST:PORT`` (or a whole URL) as the URL of its metrics."""
    if "://" in text:
        return text
    return f"{'https' if secure else 'http'}://{text}/metrics"


def scrape(url: str, timeout_s: float, context: ssl.SSLContext | None) -> Scrape:
    at = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as resp:
            text = resp.read().decode()
    except (OSError, ValueError) as exc:
        return Scrape(url, at, error=str(exc))
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return Scrape(url, at, samples)


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a histogram given as (upper bound, cumulative count) pairs
    (Prometheus' ``histogram_quantile``); None without observations."""
    rows = sorted(buckets)
    if not rows or rows[-1][1] <= 0:
        return None
    rank = q * rows[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in rows:
        if count >= rank:
            if math.isinf(bound):
                return lower  # above the highest finite bound: that bound, as Prometheus
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def histogram(
    cur: Scrape, prev: Scrape | None, name: str, **labels: str
) -> list[tuple[float, float]]:
    """``name``'s buckets over the interval (``cur`` less ``prev``), summed over the
    series whose labels include ``labels``."""

    def cumulative(s: Scrape | None) -> dict[float, float]:
        out: dict[float, float] = {}
        if s is None:
            return out
        for have, v in s.samples.get(name + "_bucket", []):
            if all(have.get(k) == x for k, x in labels.items()):
                le = float(have["le"])
                out[le] = out.get(le, 0.0) + v
        return out

    now, before = cumulative(cur), cumulative(prev)
    return [(le, n - before.get(le, 0.0)) for le, n in now.items()]


def _rate(cur: Scrape, prev: Scrape | None, get: Callable[[Scrape], float]) -> float:
    if prev is None or prev.error is not None or cur.at <= prev.at:
        return 0.0
    return max(0.0, get(cur) - get(prev)) / (cur.at - prev.at)


def _node_id(s: Scrape) -> str:
    return next((lab["node"] for lab, _ in s.samples.get("quorumlog_node_info", [])), "?")


def _rack(s: Scrape | None) -> str:
    """The node's rack (``serve --rack``), "-" for none or unknown."""
    labels = s.samples.get("quorumlog_node_info", []) if s is not None else []
    return next((lab.get("rack") or "-" for lab, _ in labels), "-")


def _short(url: str) -> str:
    """An endpoint's URL as its HOST:PORT."""
    return url.split("://", 1)[-1].split("/", 1)[0]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def render(cur: list[Scrape], prev: list[Scrape] | None) -> str:
    """One frame: nodes, topics, latencies (rates and percentiles over the interval)."""
    before = {s.endpoint: s for s in prev or []}
    up = [s for s in cur if s.error is None]
    lines = [f"quorumlog top: {len(up)} of {len(cur)} nodes up"]
    nodes: list[tuple[str, ...]] = []
    for s in cur:
        p = before.get(s.endpoint)
        if s.error is not None:
            # The node id it answered with last, if it did.
            node = _node_id(p) if p is not None else "?"
            nodes.append((node, _short(s.endpoint), "down", _rack(p), *("-",) * 6))
            continue
        node = _node_id(s)
        cpu = _rate(s, p, lambda x: x.value("process_cpu_seconds_total")) * 100
        nodes.append(
            (
                node,
                _short(s.endpoint),
                "up",
                _rack(s),
                f"{s.value('quorumlog_partitions_led'):.0f}",
                f"{s.value('quorumlog_partitions_hosted'):.0f}",
                f"{s.value('quorumlog_partitions_under_replicated'):.0f}",
                f"{cpu:.1f}",
                f"{s.value('process_resident_memory_bytes') / 2**20:.0f}",
                f"{s.value('quorumlog_open_connections'):.0f}",
            )
        )
    header = ("NODE", "ENDPOINT", "STATE", "RACK", "LEADS", "REPLICAS", "UNDER-REPL", "CPU%")
    lines += ["", *_table((*header, "RSS-MB", "CONNS"), nodes)]
    lines += ["", *_table(*_topics(up, before))]
    lines += ["", "latencies over the last interval (ms):", *_table(*_latencies(up, before))]
    return "\n".join(lines) + "\n"


def _topics(
    up: list[Scrape], before: dict[str, Scrape]
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    names = sorted({t for s in up for t in s.by("quorumlog_topic_partitions_hosted", "topic")})
    rows: list[tuple[str, ...]] = []
    for t in names:
        rows.append(
            (
                t,
                f"{_total(up, 'quorumlog_topic_partitions_led', t):.0f}",
                f"{_total(up, 'quorumlog_topic_partitions_under_replicated', t):.0f}",
                f"{_topic_rate(up, before, 'quorumlog_topic_records_in_total', t):.0f}",
                f"{_topic_rate(up, before, 'quorumlog_topic_records_out_total', t):.0f}",
                f"{_topic_rate(up, before, 'quorumlog_topic_bytes_in_total', t) / 1024:.1f}",
                f"{_topic_rate(up, before, 'quorumlog_topic_bytes_out_total', t) / 1024:.1f}",
                f"{_total(up, 'quorumlog_topic_follower_lag_records', t):.0f}",
                f"{_total(up, 'quorumlog_consumer_group_lag_records', t):.0f}",
            )
        )
    header = ("TOPIC", "LED", "UNDER-REPL", "REC-IN/S", "REC-OUT/S", "KB-IN/S", "KB-OUT/S")
    return (*header, "FOLLOWER-LAG", "GROUP-LAG"), rows


def _total(up: list[Scrape], name: str, topic: str) -> float:
    return sum(s.value(name, topic=topic) for s in up)


def _topic_rate(up: list[Scrape], before: dict[str, Scrape], name: str, topic: str) -> float:
    return sum(_rate(s, before.get(s.endpoint), lambda x: x.value(name, topic=topic)) for s in up)


def _latencies(
    up: list[Scrape], before: dict[str, Scrape]
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Per node: flush and quorum-state write p50/p99, and the API with the slowest p99."""
    rows: list[tuple[str, ...]] = []
    for s in up:
        p = before.get(s.endpoint)
        node = _node_id(s)
        flush = histogram(s, p, FLUSH)
        persist = histogram(s, p, PERSIST)
        slowest, worst = "-", None
        apis = {(lab["listener"], lab["api"]) for lab, _ in s.samples.get(REQUEST + "_bucket", [])}
        for listener, api in sorted(apis):
            q = quantile(0.99, histogram(s, p, REQUEST, listener=listener, api=api))
            if q is not None and (worst is None or q > worst):
                slowest, worst = f"{listener} {api}", q
        rows.append(
            (
                node,
                _ms(quantile(0.5, flush)),
                _ms(quantile(0.99, flush)),
                _ms(quantile(0.99, persist)),
                slowest,
                _ms(worst),
            )
        )
    header = ("NODE", "FLUSH-P50-MS", "FLUSH-P99-MS", "STATE-WRITE-P99-MS", "SLOWEST-API")
    return (*header, "P99-MS"), rows


def _context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_ca:
        return None
    ctx = ssl.create_default_context(cafile=args.tls_ca)
    if args.tls_cert:
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
    return ctx


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="a live view of the nodes' metrics endpoints")
    p.add_argument(
        "--bootstrap",
        "-b",
        required=True,
        help="HOST:PORT[,HOST:PORT...]: every node's --metrics-listen address (or URLs)",
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    p.add_argument(
        "--frames", type=int, default=0, help="stop after this many frames (0: until Ctrl-C)"
    )
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for a node")
    p.add_argument("--tls-ca", default=None, help="CA file: the endpoints serve https")
    p.add_argument("--tls-cert", default=None, help="client certificate (mutual TLS)")
    p.add_argument("--tls-key", default=None, help="client key (mutual TLS)")
    p.set_defaults(func=cmd_top)


def cmd_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise ValueError(f"--interval must be above 0 seconds, got {args.interval}")
    context = _context(args)
    urls = [
        endpoint_url(e.strip(), context is not None) for e in args.bootstrap.split(",") if e.strip()
    ]
    if not urls:
        raise ValueError("--bootstrap names no endpoint")
    frames = 1 if args.once else args.frames or sys.maxsize
    with ThreadPoolExecutor(max_workers=min(32, len(urls))) as pool:

        def scrape_all() -> list[Scrape]:
            return list(pool.map(lambda u: scrape(u, args.timeout, context), urls))

        prev = scrape_all()
        for _ in range(frames):
            time.sleep(args.interval)
            cur = scrape_all()
            frame = render(cur, prev)
            sys.stdout.write(frame if args.once else CLEAR + frame)
            sys.stdout.flush()
            prev = cur
    return 0
