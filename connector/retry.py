"""The connector's one retry policy: back off with the client's one formula
(``Client.backoff_s``) until requestTimeoutMs passes without progress."""

from __future__ import annotations

import time

from ..replica.client import Client


class Backoff:
    """Retries of one piece of work (a planning lookup, a task's fetches). The time budget,
    ``timeout_ms``, starts at the first failure and ``progress()`` renews it, so a long read
    that keeps moving is never cut off while one that stalls stops after ``timeout_ms``."""

    def __init__(self, client: Client, timeout_ms: int) -> None:
        self.client = client
        self.timeout_ms = timeout_ms
        self.attempt = 0  # failures since the last progress
        self._deadline: float | None = None

    def wait(self, give_up: Exception) -> None:
        """Sleep before the next retry; once the budget is spent raise ``give_up`` (the
        caller's error naming what kept failing) instead."""
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.timeout_ms / 1000
        if now >= self._deadline:
            raise give_up
        time.sleep(min(self.client.backoff_s(self.attempt), max(0.0, self._deadline - now)))
        self.attempt += 1

    def progress(self) -> None:
        self._deadline = None
        self.attempt = 0
