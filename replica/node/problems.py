"""What a node's connections did wrong, counted and logged in proportion: every bad frame
is counted, a connection's problems are logged once, the node's log is rate-limited."""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


class LogBudget:
    """A node-wide bound on bad-input log lines (a token bucket): a flood of bad connections
    costs a few lines a second, and the next line that gets out says how many were held."""

    def __init__(self, per_s: float = 5.0, burst: int = 100) -> None:
        self._per_s = per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()
        self.suppressed = 0

    def log(self, level: int, message: str, *args: object, exc_info: bool = False) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._per_s)
        self._at = now
        if self._tokens < 1:
            self.suppressed += 1
            return
        self._tokens -= 1
        if self.suppressed:
            message += " (%d similar lines suppressed before this one)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        log.log(level, message, *args, exc_info=exc_info)


@dataclass
class WireStats:
    """Node-wide counts of bad input, over every connection since start."""

    bad_frames: int = 0  # frames that do not decode (the framing, or a raft message)
    refused_raft: int = 0  # raft frames not applied: no node identity, or a forged sender
    denied_requests: int = 0  # requests authorization refused
    failed_requests: int = 0  # requests whose handler raised

    def describe(self) -> str:
        return (
            f"{self.refused_raft} refused raft messages, {self.bad_frames} bad frames, "
            f"{self.denied_requests} denied requests, {self.failed_requests} failed requests"
        )


# Categories of bad input, as counted per connection and in WireStats.
BAD, REFUSED, DENIED, FAILED = "bad frames", "refused raft messages", "denied", "failed"
_STAT_FIELD = {
    BAD: "bad_frames",
    REFUSED: "refused_raft",
    DENIED: "denied_requests",
    FAILED: "failed_requests",
}


class ConnectionProblems:
    """Bad input on one connection, logged in proportion: the first problem of each kind at
    once (one line, no traceback unless the node itself failed), the rest only counted, and
    one summary line when the connection closes if anything went unlogged."""

    def __init__(self, peer: object, stats: WireStats, budget: LogBudget) -> None:
        self.peer = peer
        self.counts: collections.Counter[str] = collections.Counter()
        self._stats = stats
        self._budget = budget
        self._logged: set[str] = set()

    def note(
        self, category: str, key: str, message: str, *args: object, exc_info: bool = False
    ) -> None:
        self.counts[category] += 1
        field_name = _STAT_FIELD[category]
        setattr(self._stats, field_name, getattr(self._stats, field_name) + 1)
        if key not in self._logged:
            self._logged.add(key)
            self._budget.log(logging.WARNING, message, *args, exc_info=exc_info)

    def close(self) -> None:
        total = sum(self.counts.values())
        if total > len(self._logged):
            parts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
            self._budget.log(
                logging.WARNING,
                "connection from %s closed after %d problems: %s (node totals: %s)",
                self.peer,
                total,
                parts,
                self._stats.describe(),
            )


def short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."
