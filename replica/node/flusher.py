"""One log-flush job at a time for the whole node (group commit across partitions).

The driver names partitions to flush in ``Ready.flush`` (at most one flush at a time per
partition). They join a pending set; when no job is running, one job takes the whole set
to a worker thread, where ``storage.flush_logs`` makes every named log durable (one
syncfs of the data filesystem when several are dirty), and then, back on the event loop,
``driver.flushed(key, now)`` is executed for each. Keys named while a job runs go in the
next job, which starts as soon as that one ends. Per log nothing changes: when
``flushed`` is handed out, everything the log had appended before the job started is
durable (the driver reads ``durable_end_offset``). A log whose flush fails gets no
``flushed`` (it stops acknowledging, as before) and does not affect the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .. import defaults
from ..driver import PartitionKey, Ready
from ..storage import GroupFlush, Log, flush_logs
from ..storage.errors import DiskError

log = logging.getLogger(__name__)

__all__ = ["Flusher"]

RETRY_FULL_S = defaults.DISK_RETRY_MS / 1000


class _Driver(Protocol):
    def get(self, key: PartitionKey) -> Any: ...

    def flushed(self, key: PartitionKey, now: int) -> Ready: ...


class Flusher:
    def __init__(
        self,
        driver: _Driver,
        execute: Callable[[Ready], None],
        now_ms: Callable[[], int],
        *,
        syncfs_min: int = defaults.SYNCFS_MIN_DIRTY_LOGS,
        flush: Callable[..., GroupFlush] = flush_logs,
        on_disk_full: Callable[[BaseException], None] | None = None,
        on_failure: Callable[[PartitionKey, BaseException], None] | None = None,
    ) -> None:
        self._driver = driver
        self._execute = execute
        self._now_ms = now_ms
        self._syncfs_min = syncfs_min
        self._flush = flush
        self._on_disk_full = on_disk_full
        self._on_failure = on_failure
        # key -> (the driver's partition object when asked, its log): a partition closed
        # and reopened meanwhile is a different object and gets no ``flushed``.
        self._pending: dict[PartitionKey, tuple[object, Log]] = {}
        self._job: asyncio.Task[None] | None = None
        self.jobs = 0
        self.flushed_logs = 0
        self.syncfs_calls = 0
        self.failures = 0

    @property
    def running(self) -> bool:
        return self._job is not None

    def request(self, key: PartitionKey, partition: object, lg: Log) -> None:
        """Flush ``lg`` in the next job (this one if none is running)."""
        self._pending[key] = (partition, lg)
        if self._job is None:
            self._job = asyncio.get_running_loop().create_task(self._run())

    async def wait_idle(self) -> None:
        """Until no job is running and nothing is pending (tests, shutdown)."""
        while self._job is not None:
            await asyncio.shield(self._job)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                items = list(batch.items())
                logs: Sequence[Log] = [lg for _key, (_p, lg) in items]
                self.jobs += 1
                try:
                    result = await loop.run_in_executor(None, self._job_body, logs)
                except Exception:
                    # A bug, not a storage failure: these logs get no ``flushed``.
                    log.critical("flush job of %d logs failed", len(logs), exc_info=True)
                    self.failures += len(logs)
                    continue
                self.syncfs_calls += result.syncfs_calls
                now = self._now_ms()
                for (key, (partition, _lg)), outcome in zip(items, result.outcomes, strict=True):
                    if self._driver.get(key) is not partition:
                        continue  # closed (or reopened) meanwhile
                    if isinstance(outcome, DiskError) and self._on_disk_full is not None:
                        # A full disk refused a checkpoint or index (nothing claimed
                        # durable): try again once it may have room.
                        self.failures += 1
                        self._on_disk_full(outcome)
                        loop.call_later(RETRY_FULL_S, self.request, key, partition, _lg)
                        continue
                    if isinstance(outcome, Exception):
                        self.failures += 1
                        # No acknowledgement without durability: the replica stops advancing
                        # (and the node stops: see Node.fail_stop).
                        if self._on_failure is not None:
                            self._on_failure(key, outcome)
                        else:
                            log.critical("%s/%d: log flush failed", *key, exc_info=outcome)
                        continue
                    self.flushed_logs += 1
                    try:
                        self._execute(self._driver.flushed(key, now))
                    except Exception:
                        log.exception("%s/%d: handling a completed flush failed", *key)
        finally:
            self._job = None

    def _job_body(self, logs: Sequence[Log]) -> GroupFlush:
        return self._flush(logs, syncfs_min=self._syncfs_min)
