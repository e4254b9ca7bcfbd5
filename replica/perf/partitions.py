"""quorumlog perf partitions: how a cluster copes with many partitions (issues 14, 65).

One topic of N partitions (or ``--topics T`` of N each, created one after another, each
once the one before is led), replication factor = nodes, on an embedded cluster, while a
prober asks every node for the Metadata of a one-partition topic every 0.2 s (``probe``:
how promptly a node answers a small request while partitions are created); then, each
printed as it finishes: the time until every partition has a leader, the nodes' CPU and
the elections during an idle window, leadership per node, kill -9 of the node leading
the most partitions (time until every partition it led has a new leader), and a
many-producer small-batch produce figure.

Leadership is read the cheapest exact way: one Metadata request for the topic to each
node, sent to all of them before any answer is read. A partition's epoch is the highest
any node reports; it counts as led when a node says it leads it itself
(``is_local_leader``) in that epoch. No request reaches the nodes during the idle window,
but for the metrics scrapes of ``--metrics-listen`` (the cost of serving them is then in
the idle CPU). With several topics, the steps after the creates watch the first one.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..client import Client
from ..client.connection import Connection
from ..client.errors import QuorumLogError
from ..node.cluster import LocalCluster
from ..protocol import ApiKey
from ..protocol import messages as m
from .probe import MetadataProber, ProbeResult
from .util import (
    PRODUCER_MODES,
    MachineCpu,
    ProduceJob,
    Progress,
    cpu_seconds,
    emit,
    median,
    minor_faults,
    peak_rss_mb,
    run_producers,
)

TOPIC = "partitions"
# The one-partition topic the prober asks for while the others are created.
PROBE_TOPIC = "probe"
VALUE_SIZE = 100
# Threads: on the 2-core machine of issue 14 (8 producers, 100-record batches, 1 and 64
# partitions) they reported 56k / 18k records/s against 50k / 15k for one process per
# producer, using ~11 % of a core for ~560 batches/s; processes cost more CPU on cores
# the nodes share. At ~4,000 batches/s and above one GIL would bound the figure: the
# output then says so (producers' CPU near 100 %) and --producer-mode processes applies.
DEFAULT_PRODUCER_MODE = "threads"
GIL_BOUND_PCT = 80.0
# Metadata refreshes timed for each of the whole topic and one partition.
METADATA_SAMPLES = 5


class NodeDied(RuntimeError):
    """A node process exited while the benchmark needed it."""


@dataclass(slots=True)
class View:
    """The cluster's view of the topic's partitions from the nodes that answered."""

    # partition -> (node, epoch) of the node that says it leads it, in the partition's
    # highest epoch any answering node reports
    leaders: dict[int, tuple[int, int]] = field(default_factory=dict)
    # partition -> the highest leader epoch any answering node reports
    epochs: dict[int, int] = field(default_factory=dict)
    partitions: int = 0  # the topic's partition count (0: no node knows the topic yet)
    preferred: dict[int, int] = field(default_factory=dict)  # partition -> first replica
    answered: list[int] = field(default_factory=list)
    seconds: float = 0.0  # the poll's round trip

    def leaders_per_node(self, nodes: Iterable[int]) -> list[int]:
        counts = dict.fromkeys(nodes, 0)
        for node, _ in self.leaders.values():
            counts[node] = counts.get(node, 0) + 1
        return [counts[n] for n in sorted(counts)]

    def off_preferred(self) -> list[int]:
        """Partitions led by a node other than their preferred (first) replica: the
        nodes' rebalance hands them over, an election each, once more than 10% of a
        node's preferred partitions are (leader.imbalance.per.broker.percentage)."""
        return [p for p, (node, _) in self.leaders.items() if self.preferred.get(p, node) != node]

    def balanced(self, nodes: list[int], partitions: int) -> bool:
        """Every partition led and every node leading within 10% of an even share (one
        partition at least, for small topics)."""
        even = partitions / len(nodes)
        counts = self.leaders_per_node(nodes)
        return sum(counts) == partitions and all(
            abs(c - even) <= max(1.0, 0.1 * even) for c in counts
        )


def merge_views(topic: str, answers: dict[int, m.MetadataResponse]) -> View:
    """The nodes' answers (node -> its Metadata response) as one view of ``topic``."""
    view = View(answered=sorted(answers))
    for node, resp in answers.items():
        for t in resp.topics:
            if t.name != topic or t.error != 0:
                continue
            view.partitions = max(view.partitions, len(t.partitions))
            for p in t.partitions:
                if p.replicas:
                    view.preferred[p.partition] = p.replicas[0]
                if p.leader_epoch > view.epochs.get(p.partition, -1):
                    view.epochs[p.partition] = p.leader_epoch
                if p.is_local_leader:
                    claim = view.leaders.get(p.partition)
                    if claim is None or p.leader_epoch > claim[1]:
                        view.leaders[p.partition] = (node, p.leader_epoch)
    # A leader counts only in the highest epoch any node reports: a claim in an older one
    # is a leader that has not yet heard of an election.
    view.leaders = {p: c for p, c in view.leaders.items() if c[1] >= view.epochs[p]}
    return view


class ClusterView:
    """One Metadata request for the topic per node over a connection kept per node, all
    sent before any answer is read: the whole cluster's view in one round trip."""

    def __init__(self, cluster: LocalCluster, topic: str, timeout_s: float = 10.0) -> None:
        self.cluster = cluster
        self.topic = topic
        self.timeout_s = timeout_s
        self._conns: dict[int, Connection] = {}
        self.rtts: list[float] = []

    def _conn(self, node: int) -> Connection:
        conn = self._conns.get(node)
        if conn is None or conn.closed:
            conn = Connection(
                self.cluster.host,
                self.cluster.ports[node],
                client_id="perf-partitions",
                timeout_s=self.timeout_s,
            )
            self._conns[node] = conn
        return conn

    def poll(self, nodes: Iterable[int], partitions: list[int] | None = None) -> View:
        """The view of every partition, or of ``partitions`` only (a lighter load on the
        nodes, and a shorter round trip, when the poll watches a few thousand)."""
        start = time.monotonic()
        sent: dict[int, tuple[Connection, int]] = {}
        for node in nodes:
            try:
                conn = self._conn(node)
                sent[node] = (
                    conn,
                    conn.send(
                        ApiKey.METADATA,
                        m.MetadataRequest(topics=[self.topic], partitions=partitions),
                    ),
                )
            except (QuorumLogError, OSError):
                self._drop(node)
        answers: dict[int, m.MetadataResponse] = {}
        for node, (conn, correlation_id) in sent.items():
            try:
                answers[node] = conn.receive(correlation_id, m.MetadataResponse)
            except (QuorumLogError, OSError):
                self._drop(node)
        view = merge_views(self.topic, answers)
        view.seconds = time.monotonic() - start
        self.rtts.append(view.seconds)
        return view

    def _drop(self, node: int) -> None:
        conn = self._conns.pop(node, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for node in list(self._conns):
            self._drop(node)


def topic_name(i: int) -> str:
    """The name of the ``i``-th topic created (from 0)."""
    return TOPIC if i == 0 else f"{TOPIC}-{i}"


def _pause(interval_s: float, poll_s: float) -> float:
    """The sleep before the next poll: polls start ``interval_s`` apart, but the nodes get
    at least as long without one as the last one took, so that polling a slow cluster
    (many partitions, a loaded machine) never takes more than half of its time."""
    return max(interval_s - poll_s, poll_s)


def _check_alive(cluster: LocalCluster, nodes: Iterable[int]) -> None:
    for node in nodes:
        if not cluster.is_running(node):
            code = cluster.procs[node].returncode
            raise NodeDied(
                f"node {node} exited (code {code}); last lines of {cluster.log_path(node)}:\n"
                + cluster.tail(node)
            )


def _wait_all_led(
    cluster: LocalCluster,
    viewer: ClusterView,
    partitions: int,
    start: float,
    timeout_s: float,
    label: str,
) -> tuple[float | None, View]:
    """Poll every ~100 ms until every partition has a leader: (seconds since ``start``,
    or None at the timeout, and the last view of the whole topic). Once the nodes know
    the whole topic, a poll asks only for the partitions not yet seen led (thousands of
    partitions: a poll of the whole topic took ~0.5 s of every node while they elected,
    and bounded the figure's resolution); when none is left, one poll of the whole topic
    confirms that every partition is led (else the poll goes on with those that are
    not), and the figure is the time of the poll that saw the last one led."""
    progress = Progress(partitions, label, heartbeat_s=10)
    nodes = sorted(cluster.procs)
    pending: list[int] | None = None  # None: the whole topic
    try:
        while True:
            _check_alive(cluster, nodes)
            t = time.monotonic()
            view = viewer.poll(nodes, pending)
            now = time.monotonic()
            if pending is None and view.partitions == partitions:
                pending = [p for p in range(partitions) if p not in view.leaders]
            elif pending is not None:
                pending = [p for p in pending if p not in view.leaders]
            led = 0 if pending is None else partitions - len(pending)
            progress.update(led, f"{led}/{partitions} partitions led")
            if pending == []:
                whole = viewer.poll(nodes)
                pending = [p for p in range(partitions) if p not in whole.leaders]
                if not pending and whole.partitions == partitions:
                    return now - start, whole
            if now - start >= timeout_s:
                return None, viewer.poll(nodes)
            time.sleep(_pause(0.1, now - t))
    finally:
        progress.close()


def _wait_balanced(
    cluster: LocalCluster, viewer: ClusterView, partitions: int, start: float, timeout_s: float
) -> float | None:
    """Poll every ~1 s (from now, for at most ``timeout_s``) until leadership is balanced
    (``View.balanced``): seconds since ``start``, or None."""
    nodes = sorted(cluster.procs)
    until = time.monotonic() + timeout_s
    while True:
        _check_alive(cluster, nodes)
        t = time.monotonic()
        view = viewer.poll(nodes)
        now = time.monotonic()
        if view.balanced(nodes, partitions):
            return now - start
        if now >= until:
            return None
        time.sleep(min(_pause(1.0, now - t), max(0.0, until - now)))


def _pct(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}%" for v in values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="quorumlog perf partitions",
        description="Many partitions on an embedded cluster: time to all-led, idle CPU and "
        "elections, leadership per node, kill -9 failover, many-producer produce.",
    )
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=10_000, help="partitions per topic")
    ap.add_argument(
        "--topics",
        type=int,
        default=1,
        help="topics of --partitions each, created one after another, each once the one "
        "before is led (default 1); all_led_s is the last one's",
    )
    ap.add_argument("--led-timeout", type=float, default=600, help="seconds (default 600)")
    ap.add_argument(
        "--balance-timeout",
        type=float,
        default=2 * defaults.LEADER_IMBALANCE_CHECK_INTERVAL_MS / 1000 + 30,
        help="after all-led (after the create, and after the failover's victim restarts), "
        "wait this long at most for leadership within 10%% of even (the nodes' "
        "preferred-leader rebalance; default %(default)s s)",
    )
    ap.add_argument(
        "--settle-seconds",
        type=float,
        default=5,
        help="wait after all-led before the idle window (default 5)",
    )
    ap.add_argument("--idle-seconds", type=float, default=600, help="idle window (default 600)")
    ap.add_argument("--failover-timeout", type=float, default=120, help="seconds (default 120)")
    ap.add_argument("--produce-seconds", type=float, default=10)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument(
        "--producer-mode",
        choices=PRODUCER_MODES,
        default=DEFAULT_PRODUCER_MODE,
        help="producers as threads of this process or one process each (default %(default)s)",
    )
    ap.add_argument("--batch", type=int, default=100, help="records of 100 B per produce batch")
    ap.add_argument(
        "--in-flight",
        type=int,
        default=1,
        help="batches each producer has in flight, one per partition, sent together by "
        "Client.produce_many (default 1: one produce at a time)",
    )
    ap.add_argument(
        "--produce-partitions",
        type=int,
        default=64,
        help="produce round-robin over the first min(N, this) partitions (default 64)",
    )
    ap.add_argument(
        "--metrics-listen",
        action="store_true",
        help="every node serves its Prometheus metrics (serve --metrics-listen), scraped "
        "every --scrape-seconds during the idle window: the idle CPU then includes serving "
        "them; metrics_scrape_ms is a scrape's median latency",
    )
    ap.add_argument("--scrape-seconds", type=float, default=5.0)
    ap.add_argument("--skip-failover", action="store_true")
    ap.add_argument("--skip-produce", action="store_true")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    args = ap.parse_args(argv)
    if min(args.partitions, args.nodes, args.in_flight, args.topics) < 1:
        ap.error("--partitions, --topics, --nodes and --in-flight must be at least 1")

    figures: dict[str, Any] = {
        "bench": "partitions",
        "nodes": args.nodes,
        "partitions": args.partitions,
        "topics": args.topics,
        "idle_seconds": args.idle_seconds,
        "ulimit_nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "all_led_s": None,
        "balanced_s": None,
        "idle_cpu_pct": None,
        "idle_cpu_pct_max": None,
        "idle_elections": None,
        "idle_epoch_increase": None,
        "leaders_per_node": None,
        "failover_max_s": None,
        "failover_median_s": None,
        "produce_rec_per_s": None,
    }
    rc = 0
    try:
        with LocalCluster(
            args.nodes, args.data_dir, log_level="WARNING", metrics=args.metrics_listen
        ) as cluster:
            viewer = ClusterView(cluster, TOPIC)
            try:
                _Bench(args, cluster, viewer, figures).run()
            finally:
                viewer.close()
    except (NodeDied, QuorumLogError, TimeoutError, RuntimeError, OSError) as exc:
        figures["error"] = f"{type(exc).__name__}: {exc}"
        print(f"perf partitions: {figures['error']}", file=sys.stderr, flush=True)
        rc = 1
    emit(figures, [])
    return rc


@dataclass
class _Bench:
    """One run's steps and what they share: the options, the cluster under test, its
    metadata viewer, and the figures the steps fill in."""

    args: argparse.Namespace
    cluster: LocalCluster
    viewer: ClusterView
    figures: dict[str, Any]
    last_start: float = 0.0  # when the last topic's create was sent

    def say(self, line: str) -> None:
        if not self.args.json:
            print(line, flush=True)

    def run(self) -> None:
        n = self.args.partitions
        nodes = sorted(self.cluster.procs)

        # 1. create, until every partition has a leader; each further topic once the one
        # before is led, the prober asking throughout.
        long_ms = int(max(self.args.led_timeout, 30) * 1000)
        with Client(
            self.cluster.bootstrap, request_timeout_ms=long_ms, attempt_timeout_ms=long_ms
        ) as admin:
            admin.create_topic(PROBE_TOPIC, 1, self.args.nodes)
            admin.wait_for_leaders(PROBE_TOPIC, long_ms)
            prober = MetadataProber(
                [(self.cluster.host, self.cluster.ports[i]) for i in nodes], PROBE_TOPIC
            )
            try:
                all_led, view = self.create_topics(admin)
            finally:
                probed = prober.stop()
        self.report_probe(probed)
        self.figures["fds_per_node"] = [_open_fds(self.cluster.procs[i].pid) for i in nodes]
        self.figures["metadata_poll_ms"] = round(median(self.viewer.rtts) * 1000, 1)
        last = topic_name(self.args.topics - 1)
        if all_led is None:
            self.figures["all_led_timeout"] = True
            self.figures["led_at_timeout"] = len(view.leaders)
            self.say(
                f"create {n} partitions of {last} (RF {self.args.nodes}): NOT all led after "
                f"{self.args.led_timeout:.0f}s ({len(view.leaders)}/{n} led; create call "
                f"{self.figures['create_s']:.2f}s)",
            )
        else:
            self.figures["all_led_s"] = round(all_led, 3)
            self.say(
                f"create {n} partitions of {last} (RF {self.args.nodes}): all led after "
                f"{all_led:.2f}s (create call {self.figures['create_s']:.2f}s; metadata poll "
                f"{self.figures['metadata_poll_ms']} ms)",
            )
        self.say(
            "open file descriptors per node: " + ", ".join(map(str, self.figures["fds_per_node"])),
        )

        # 2. balanced leadership: the nodes' preferred-leader rebalance (every check
        # interval) hands partitions to their first replica where more than 10% of a
        # node's are led elsewhere; the idle window starts after.
        if all_led is not None:
            balanced = _wait_balanced(
                self.cluster, self.viewer, n, self.last_start, self.args.balance_timeout
            )
            self.figures["balanced_s"] = None if balanced is None else round(balanced, 3)
            self.say(
                f"leadership within 10% of even after {balanced:.2f}s"
                if balanced is not None
                else f"leadership NOT within 10% of even {self.args.balance_timeout:.0f}s "
                "after all led",
            )

        # 3. idle window: no request reaches the nodes.
        _sleep_checking(self.cluster, self.args.settle_seconds, "settle")
        before = self.viewer.poll(nodes)
        cpu0 = {i: cpu_seconds(self.cluster.procs[i].pid) for i in nodes}
        t0 = time.monotonic()
        scrapes = MetricsScrapes(self.cluster, self.args.scrape_seconds)
        _sleep_checking(self.cluster, self.args.idle_seconds, "idle", scrapes.maybe)
        cpu1 = {i: cpu_seconds(self.cluster.procs[i].pid) for i in nodes}
        wall = time.monotonic() - t0
        after = self.viewer.poll(nodes)
        cpu = [round((cpu1[i] - cpu0[i]) / wall * 100, 2) for i in nodes]
        changed = [p for p, e in after.epochs.items() if e != before.epochs.get(p, e)]
        increase = sum(e - before.epochs.get(p, e) for p, e in after.epochs.items())
        # Of those, the partitions handed to their preferred replica by the rebalance (led
        # off it when the window began, on it at the end): not churn, but still elections.
        off_before = set(before.off_preferred())
        handed = [p for p in changed if p in off_before and p not in after.off_preferred()]
        self.figures.update(
            idle_cpu_pct=cpu,
            idle_cpu_pct_max=max(cpu),
            idle_elections=len(changed),
            idle_start_off_preferred=len(off_before),
            idle_elections_handed_to_preferred=len(handed),
            idle_epoch_increase=increase,
            idle_epoch_max=max(after.epochs.values(), default=0),
            leaders_per_node=after.leaders_per_node(nodes),
            peak_rss_mb=[round(peak_rss_mb(self.cluster.procs[i].pid), 1) for i in nodes],
            **scrapes.figures(),
        )
        self.say(
            f"idle {wall:.1f}s: CPU per node {_pct(cpu)}; {len(changed)} partition(s) changed "
            f"epoch (+{increase} in all, highest epoch {self.figures['idle_epoch_max']}; "
            f"{len(handed)} of them handed to their preferred replica, of {len(off_before)} "
            "led off it when the window began); "
            f"leaders per node {self.figures['leaders_per_node']}; peak RSS per node (MB) "
            f"{self.figures['peak_rss_mb']}"
            + (
                f"; {scrapes.count} metrics scrapes, median {self.figures['metrics_scrape_ms']} "
                f"ms, max {self.figures['metrics_scrape_ms_max']} ms (the node's scan of its "
                f"replicas: median {self.figures['metrics_scan_ms']} ms)"
                if scrapes.count
                else ""
            ),
        )
        if all_led is None:
            self.say("failover and produce skipped: not every partition was led")
            return

        # 4. what a client's metadata refresh costs, every node asked: the whole topic (a
        # cold cache) against the one partition a routing refresh asks for.
        self.metadata_cost()

        # 5. kill -9 of the node leading the most partitions.
        if not self.args.skip_failover and self.args.nodes >= 3:
            self.failover()
        elif not self.args.skip_failover:
            self.say("failover skipped: it needs at least 3 nodes")

        # 6. many producers, small batches.
        if not self.args.skip_produce:
            self.produce()

    def create_topics(self, admin: Client) -> tuple[float | None, View]:
        """Create the topics one after another, each once the one before is led: (the
        last one's seconds from its create until all its partitions are led, or None at
        the timeout, and its last view). Each topic's figures go in the lists
        ``create_s_per_topic`` and ``all_led_s_per_topic``; ``create_s`` is the last's."""
        n = self.args.partitions
        nodes = sorted(self.cluster.procs)
        creates: list[float] = []
        leds: list[float | None] = []
        self.figures.update(create_s_per_topic=creates, all_led_s_per_topic=leds)
        all_led: float | None = None
        view = View()
        for i in range(self.args.topics):
            name = topic_name(i)
            viewer = self.viewer if name == TOPIC else ClusterView(self.cluster, name)
            try:
                start = self.last_start = time.monotonic()
                admin.create_topic(name, n, self.args.nodes)
                creates.append(round(time.monotonic() - start, 3))
                self.figures["create_s"] = creates[-1]
                label = "all led" if self.args.topics == 1 else f"{name}: all led"
                all_led, view = _wait_all_led(
                    self.cluster, viewer, n, start, self.args.led_timeout, label
                )
            finally:
                if viewer is not self.viewer:
                    self.viewer.rtts += viewer.rtts
                    viewer.close()
            leds.append(None if all_led is None else round(all_led, 3))
            if self.args.topics > 1:
                self.say(
                    f"topic {i + 1}/{self.args.topics} ({name}, {n} partitions): create call "
                    f"{creates[-1]:.2f}s, "
                    + ("NOT all led" if all_led is None else f"all led after {all_led:.2f}s")
                )
            if all_led is None:
                break
        if self.args.topics > 1 and all_led is not None:
            # Every topic's partitions still led once the last one is.
            led = 0
            for i in range(self.args.topics):
                viewer = ClusterView(self.cluster, topic_name(i))
                try:
                    led += len(viewer.poll(nodes).leaders)
                finally:
                    viewer.close()
            self.figures["led_total"] = led
            self.say(f"after the last create: {led}/{n * self.args.topics} partitions led")
        return all_led, view

    def report_probe(self, probed: ProbeResult) -> None:
        figures = probed.figures()
        self.figures.update(figures)
        self.say(
            f"metadata probe ({PROBE_TOPIC!r}, every node every 0.2 s while creating): "
            f"{figures['probes']} answered, p50 {figures['probe_ms_p50']} ms, p99 "
            f"{figures['probe_ms_p99']} ms, max {figures['probe_ms_max']} ms; "
            f"{figures['probes_over_300ms']} over 300 ms, {figures['probe_failures']} "
            "not answered"
        )

    def metadata_cost(self) -> None:
        # As long as the creates may wait: a loaded machine's nodes answer late.
        long_ms = int(max(self.args.led_timeout, 30) * 1000)
        with Client(
            self.cluster.bootstrap, request_timeout_ms=long_ms, attempt_timeout_ms=long_ms
        ) as client:
            whole = _median_ms(lambda: client.metadata([TOPIC]), METADATA_SAMPLES)
            one = _median_ms(lambda: client.metadata([TOPIC], partitions=[0]), METADATA_SAMPLES)
        self.figures.update(metadata_topic_ms=whole, metadata_partition_ms=one)
        self.say(
            f"metadata refresh, every node asked (median of {METADATA_SAMPLES}): whole topic "
            f"{whole} ms, one partition {one} ms"
        )

    def failover(self) -> None:
        nodes = sorted(self.cluster.procs)
        view = self.viewer.poll(nodes)
        counts = view.leaders_per_node(nodes)
        victim = nodes[counts.index(max(counts))]
        pending = {p: e for p, (node, e) in view.leaders.items() if node == victim}
        survivors = [i for i in nodes if i != victim]
        proc = self.cluster.procs[victim]
        rtts_from = len(self.viewer.rtts)
        times: list[float] = []
        progress = Progress(len(pending), "failover", heartbeat_s=10)
        total = len(pending)
        led_in: dict[int, int] = {}  # partition -> the epoch a survivor first led it in
        epochs_before = dict(pending)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        while pending and time.monotonic() - t0 < self.args.failover_timeout:
            t = time.monotonic()
            # Only the partitions still waiting: the survivors, electing for them, build
            # answers for a few thousand partitions at most, and ever fewer.
            seen = self.viewer.poll(survivors, sorted(pending))
            now = time.monotonic()
            for p in [p for p, (node, e) in seen.leaders.items() if p in pending]:
                node, epoch = seen.leaders[p]
                if node != victim and epoch > pending[p]:
                    del pending[p]
                    times.append(now - t0)
                    led_in[p] = epoch
            progress.update(total - len(pending), f"{total - len(pending)}/{total} re-led")
            time.sleep(_pause(0.02, now - t))
        progress.close()
        proc.wait(timeout=30)
        poll_ms = round(median(self.viewer.rtts[rtts_from:]) * 1000, 1)
        # One election per partition is the ideal; more (a split vote, a candidate whose
        # election timed out under load and stood again) show as epochs skipped.
        steps = [led_in[p] - epochs_before[p] for p in led_in]
        self.figures.update(
            failover_victim=victim,
            failover_partitions=total,
            failover_unled=len(pending),
            failover_poll_ms=poll_ms,
            failover_reelected=sum(1 for n in steps if n > 1),
            failover_epoch_steps_max=max(steps, default=0),
        )
        if times and not pending:
            self.figures["failover_max_s"] = round(max(times), 3)
            self.figures["failover_median_s"] = round(median(times), 3)
            self.say(
                f"kill -9 of node {victim} (led {total}): all its partitions led elsewhere after "
                f"{max(times):.3f}s, median {median(times):.3f}s (poll {poll_ms} ms); "
                f"{self.figures['failover_reelected']} took more than one election (epoch up "
                f"to +{self.figures['failover_epoch_steps_max']})",
            )
        else:
            self.figures["failover_timeout"] = True
            self.say(
                f"kill -9 of node {victim} (led {total}): {len(pending)} partition(s) still "
                f"without a new leader after {self.args.failover_timeout:.0f}s",
            )
        # Back to full strength, as perf failover does: restarted and every partition led.
        self.cluster.start_node(victim)
        self.cluster.wait_ready(120)
        t1 = time.monotonic()
        again, after = _wait_all_led(
            self.cluster,
            self.viewer,
            self.args.partitions,
            t1,
            self.args.led_timeout,
            "restart: all led",
        )
        self.figures["restart_all_led_s"] = None if again is None else round(again, 3)
        self.figures["leaders_per_node_after_restart"] = after.leaders_per_node(nodes)
        self.say(
            f"node {victim} restarted: leaders per node "
            f"{self.figures['leaders_per_node_after_restart']}"
            + ("" if again is not None else " (not every partition led)"),
        )
        if again is None:
            raise TimeoutError(f"after the restart of node {victim} not every partition is led")
        # Leadership goes back to the restarted node (its preferred partitions, by the
        # rebalance: within a check interval and the hand-overs' pace); the produce
        # figure is taken after, on the balanced cluster.
        balanced = _wait_balanced(
            self.cluster, self.viewer, self.args.partitions, t1, self.args.balance_timeout
        )
        self.figures["restart_balanced_s"] = None if balanced is None else round(balanced, 3)
        self.say(
            f"node {victim} restarted: leadership within 10% of even after {balanced:.2f}s"
            if balanced is not None
            else f"node {victim} restarted: leadership NOT within 10% of even "
            f"{self.args.balance_timeout:.0f}s after all led",
        )

    def produce(self) -> None:
        from ..storage.records import encode_batch

        nodes = sorted(self.cluster.procs)
        parts = tuple(range(min(self.args.partitions, self.args.produce_partitions)))
        view = self.viewer.poll(nodes)
        spread = View(leaders={p: view.leaders[p] for p in parts if p in view.leaders})
        payload = encode_batch([b"v" * VALUE_SIZE] * self.args.batch)
        cpu0 = {i: cpu_seconds(self.cluster.procs[i].pid) for i in nodes}
        faults0 = {i: minor_faults(self.cluster.procs[i].pid) for i in nodes}
        machine0 = MachineCpu.now()
        load = run_producers(
            ProduceJob(
                self.cluster.bootstrap,
                TOPIC,
                parts,
                payload,
                self.args.batch,
                duration_s=self.args.produce_seconds,
                in_flight=self.args.in_flight,
            ),
            self.args.producers,
            mode=self.args.producer_mode,
        )
        busy = MachineCpu.now().busy_share_since(machine0)
        used = {i: cpu_seconds(self.cluster.procs[i].pid) - cpu0[i] for i in nodes}
        cpu = [round(used[i] / load.seconds * 100, 1) for i in nodes]
        # The nodes' CPU (all of them) per record produced: the server's cost of a record.
        per_record_us = sum(used.values()) / max(load.records, 1) * 1e6
        # The producers' CPU per record, as the nodes': what a record costs the client.
        client_us = load.client_cpu_pct / 100 * load.seconds / max(load.records, 1) * 1e6
        faults = [
            round((minor_faults(self.cluster.procs[i].pid) - faults0[i]) / load.seconds)
            for i in nodes
        ]
        rate = load.rate
        self.figures.update(
            produce_rec_per_s=round(rate),
            produce_records=load.records,
            produce_seconds=round(load.seconds, 3),
            produce_partitions=len(parts),
            produce_producers=self.args.producers,
            produce_mode=load.mode,
            produce_client_cpu_pct=load.client_cpu_pct,
            produce_client_cpu_us_per_record=round(client_us, 2),
            produce_batch=self.args.batch,
            produce_in_flight=min(self.args.in_flight, len(parts)),
            produce_leaders_per_node=spread.leaders_per_node(nodes),
            produce_cpu_pct=cpu,
            produce_node_cpu_us_per_record=round(per_record_us, 2),
            produce_page_faults_per_s=faults,
            produce_machine_busy_pct=round(busy * 100, 1),
        )
        self.say(
            f"produce: {self.args.producers} producers ({load.mode}), "
            f"{self.figures['produce_in_flight']} batch(es) in flight each, {self.args.batch} x "
            f"{VALUE_SIZE} B batches, acks=quorum, over {len(parts)} partition(s) (leaders per "
            f"node {self.figures['produce_leaders_per_node']}): {rate:,.0f} records/s "
            f"({load.records:,} in {load.seconds:.2f}s; node CPU {_pct(cpu)}, "
            f"{per_record_us:.2f} us of it a record, producers' CPU "
            f"{load.client_cpu_pct:.1f}%, {client_us:.2f} us a record; page faults per node "
            f"and second {faults}; the machine's CPUs {busy:.0%} busy)",
        )
        if load.mode == "threads" and load.client_cpu_pct >= GIL_BOUND_PCT:
            self.say(
                f"  the producer threads used {load.client_cpu_pct:.0f}% of a core: one GIL may "
                "bound this figure; compare --producer-mode processes",
            )


def _median_ms(call: Callable[[], object], samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.monotonic()
        call()
        times.append(time.monotonic() - start)
    return round(median(times) * 1000, 2)


SCAN_METRIC = b"quorumlog_metrics_scan_seconds"


class MetricsScrapes:
    """Every node's metrics endpoint scraped every ``every_s`` seconds (with ``maybe``,
    from the idle window's loop), as a Prometheus server would; each scrape timed."""

    def __init__(self, cluster: LocalCluster, every_s: float) -> None:
        self.urls = list(cluster.metrics_urls.values())
        self.every_s = every_s
        self.next_at = time.monotonic()
        self.seconds: list[float] = []
        # Each scrape's scan of the replicas as the node timed it (its
        # quorumlog_metrics_scan_seconds): the work a scrape costs the node, apart from
        # the turns of its event loop the scrape waits for on a busy machine.
        self.scan_seconds: list[float] = []
        self.series = 0

    @property
    def count(self) -> int:
        return len(self.seconds)

    def maybe(self) -> None:
        if not self.urls or time.monotonic() < self.next_at:
            return
        self.next_at += self.every_s
        for url in self.urls:
            start = time.monotonic()
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = resp.read()
            self.seconds.append(time.monotonic() - start)
            lines = body.splitlines()
            self.series = sum(1 for x in lines if x and not x.startswith(b"#"))
            self.scan_seconds.extend(
                float(x.split()[-1]) for x in lines if x.startswith(SCAN_METRIC + b" ")
            )

    def figures(self) -> dict[str, Any]:
        if not self.seconds:
            return {}
        return {
            "metrics_scrapes": len(self.seconds),
            "metrics_scrape_ms": round(median(self.seconds) * 1000, 1),
            "metrics_scrape_ms_max": round(max(self.seconds) * 1000, 1),
            # To the microsecond: a scan of a few replicas takes less than 0.05 ms.
            "metrics_scan_ms": (
                round(median(self.scan_seconds) * 1000, 3) if self.scan_seconds else None
            ),
            "metrics_series": self.series,
        }


def _sleep_checking(
    cluster: LocalCluster, seconds: float, label: str, every_s: Callable[[], None] | None = None
) -> None:
    """Sleep, checking every second that no node died (no request reaches the nodes);
    ``every_s`` is called at each check."""
    if seconds <= 0:
        return
    progress = Progress(seconds, label, heartbeat_s=30)
    start = time.monotonic()
    nodes = sorted(cluster.procs)
    try:
        while (left := seconds - (time.monotonic() - start)) > 0:
            _check_alive(cluster, nodes)
            if every_s is not None:
                every_s()
            progress.update(seconds - left, f"of {seconds:.0f}s")
            time.sleep(min(1.0, left))
        progress.update(seconds)
    finally:
        progress.close()


def _open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1
