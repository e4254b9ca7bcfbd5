"""Shared bits of the perf commands: a progress bar on a terminal, RSS, percentiles."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: float, label: str) -> None:
        self.total = total
        self.label = label
        self.enabled = sys.stderr.isatty()
        self.start = time.monotonic()
        self._last = 0.0

    def update(self, done: float) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and done < self.total):
            return
        self._last = now
        frac = min(1.0, done / self.total) if self.total else 1.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% {now - self.start:6.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def peak_rss_mb(pid: int) -> float:
    """Peak resident set size (VmHWM) of a live process, in MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def emit(figures: dict[str, Any], lines: list[str]) -> None:
    for line in lines:
        print(line)
    print(json.dumps(figures, sort_keys=True))
