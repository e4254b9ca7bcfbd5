"""A Metadata prober: how promptly the nodes answer a small request while they work.

Every ``interval_s`` each node is asked for the Metadata of one small topic, on a
connection of its own, and the answer is timed from its request. It runs in a process of
its own, one thread per node: the benchmark's own work (decoding and merging Metadata
answers of thousands of partitions) would otherwise hold the GIL while an answer waits
to be read, and the time measured would be the benchmark's, not the node's. A request
that gets no answer within ``timeout_s`` counts as a failure (and the connection is
made anew).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..client.connection import Connection
from ..client.errors import QuorumLogError
from ..protocol import ApiKey
from ..protocol import messages as m
from .util import median, percentile

#: Kafka clients refresh Metadata every so often; the issue's probe asked every 0.2 s.
INTERVAL_S = 0.2
#: An answer slower than this is a stall a client notices (issue 65's bound).
SLOW_MS = 300.0


@dataclass(frozen=True)
class ProbeResult:
    """Every answer's time (ms, over every node) and the requests not answered."""

    times_ms: list[float]
    failures: int

    def figures(self) -> dict[str, Any]:
        t = self.times_ms
        return {
            "probes": len(t),
            "probe_failures": self.failures,
            "probe_ms_p50": round(median(t), 1) if t else None,
            "probe_ms_p99": round(percentile(t, 99), 1) if t else None,
            "probe_ms_max": round(max(t), 1) if t else None,
            "probes_over_300ms": sum(1 for x in t if x > SLOW_MS),
        }


def _probe_node(
    host: str,
    port: int,
    topic: str,
    interval_s: float,
    timeout_s: float,
    stop: Any,
    times: list[float],
    failures: list[int],
    started: threading.Event,
) -> None:
    conn: Connection | None = None
    next_at = time.monotonic()
    while not stop.is_set():
        if times or failures:
            started.set()
        start = time.monotonic()
        try:
            if conn is None or conn.closed:
                conn = Connection(host, port, client_id="perf-probe", timeout_s=timeout_s)
                start = time.monotonic()  # the connect is not the answer's time
            conn.request(ApiKey.METADATA, m.MetadataRequest(topics=[topic]), m.MetadataResponse)
            times.append((time.monotonic() - start) * 1000)
        except (QuorumLogError, OSError):
            failures.append(1)
            if conn is not None:
                conn.close()
            conn = None
        next_at += interval_s
        # A slow answer does not bunch the next requests up: they keep their pace.
        next_at = max(next_at, time.monotonic())
        stop.wait(next_at - time.monotonic())
    if conn is not None:
        conn.close()


def _run(
    addresses: list[tuple[str, int]],
    topic: str,
    interval_s: float,
    timeout_s: float,
    stop: Any,
    out: Any,
) -> None:
    times: list[list[float]] = [[] for _ in addresses]
    failures: list[list[int]] = [[] for _ in addresses]
    started = [threading.Event() for _ in addresses]
    threads = [
        threading.Thread(
            target=_probe_node,
            args=(host, port, topic, interval_s, timeout_s, stop, times[i], failures[i], s),
            daemon=True,
        )
        for i, ((host, port), s) in enumerate(zip(addresses, started, strict=True))
    ]
    for t in threads:
        t.start()
    for s in started:  # every node asked once: the benchmark may begin
        s.wait(timeout_s)
    out.send("started")
    for t in threads:
        t.join()
    out.send(([x for ts in times for x in ts], sum(len(f) for f in failures)))
    out.close()


class MetadataProber:
    """Started, it probes every node until ``stop``, which returns what it measured."""

    def __init__(
        self,
        addresses: list[tuple[str, int]],
        topic: str,
        *,
        interval_s: float = INTERVAL_S,
        timeout_s: float = 10.0,
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_run,
            args=(addresses, topic, interval_s, timeout_s, self._stop, send),
            name="perf-probe",
            daemon=True,
        )
        self._proc.start()
        send.close()
        self.timeout_s = timeout_s
        # The process starts (an interpreter, its imports) and asks every node once
        # before the caller goes on, so the probes cover all of what follows.
        if not self._recv.poll(timeout_s + 60) or self._recv.recv() != "started":
            self._proc.kill()
            raise RuntimeError("the Metadata prober did not start")

    def stop(self) -> ProbeResult:
        self._stop.set()
        try:
            if not self._recv.poll(self.timeout_s + 30):
                raise RuntimeError("the Metadata prober did not report")
            times, failures = self._recv.recv()
        finally:
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
            self._recv.close()
        return ProbeResult(times, failures)
