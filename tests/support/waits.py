"""Bounded waits: poll a condition with a deadline (never a bare sleep as synchronisation),
retry a call through transient cluster errors, wait for a node to log a line."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from quorumlog.replica.client.errors import QuorumLogError
from quorumlog.replica.node.cluster import LocalCluster

T = TypeVar("T")

# What a cluster says while it is electing, restarting or unreachable for a moment (the
# client's errors, and socket errors from a direct connection; TimeoutError is an OSError).
TRANSIENT = (QuorumLogError, OSError)


def wait_until(
    cond: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    interval: float = 0.02,
    state: Callable[[], object] | None = None,
) -> T:
    """Poll ``cond`` until it returns a truthy value, and return that value. A transient
    error from ``cond`` counts as "not yet" and is shown if the wait times out, which it
    does with an AssertionError after ``timeout`` seconds (bounded in polls too), with
    what ``state()`` returns then, if given (what the condition looked at)."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    for _ in range(int(timeout / interval) + 100):
        try:
            value = cond()
            if value:
                return value
        except TRANSIENT as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    shown = "" if state is None else f"; state: {state()!r}"
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_exc}){shown}"
    )


def retry(fn: Callable[[], T], timeout: float = 30.0, *, interval: float = 0.1) -> T:
    """Call ``fn`` until it does not raise a transient cluster error (a leader is being
    elected, a node restarts...); after ``timeout`` seconds the last error is raised."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 100):
        try:
            return fn()
        except TRANSIENT:
            if time.monotonic() >= deadline:
                raise
        time.sleep(interval)
    return fn()  # the poll budget ran out before the deadline (a slow clock): one last go


def log_text(cluster: LocalCluster, node: int) -> str:
    return cluster.log_path(node).read_text(errors="replace")


def wait_for_log(
    cluster: LocalCluster, text: str, timeout: float = 10.0, *, nodes: Iterable[int] | None = None
) -> str:
    """Until one of ``nodes`` (default: every node started) has logged ``text``; returns
    the log text of ``nodes``, joined."""
    which = list(cluster.procs if nodes is None else nodes)

    def logged() -> str | None:
        logs = "\n".join(log_text(cluster, n) for n in which)
        return logs if text in logs else None

    return wait_until(logged, timeout, f"node(s) {which} to log {text!r}", interval=0.05)
