"""The node's log cleaner (Kafka's LogCleaner thread): compacts the replicas of topics
whose ``cleanup.policy`` names ``compact``, one log at a time, each replica on its own
(a leader's and its followers' cleans are independent; a reader sees the same latest
values from any of them).

``run`` (the event loop, about once a second) picks the dirtiest compacted log that is
due (``Log.dirty_state``: ``min.cleanable.dirty.ratio`` reached, or
``max.compaction.lag.ms`` passed), its cleanable end taken from the driver (the high
watermark, the last stable offset), and starts a job:

1. on the loop, the producer state's part (``Log.clean_inputs``);
2. in the cleaner's own thread, never the loop, the rewrite (``Log.prepare_clean``),
   throttled to ``bytes_per_second`` of segment bytes read and written (0: unthrottled),
   at most ``defaults.CLEANER_MAX_DIRTY_BYTES`` of the backlog per round;
3. back on the loop, the log's owner, the swap (``Log.swap_clean``), unless the replica
   was closed meanwhile (the plan's files are deleted then).

The rewrite reads only sealed segments below the cleanable end, which the loop's
appends never touch; retention or a truncation that removes them meanwhile makes the
swap drop the plan. The flush thread and the swap take turns on the log's flush lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .. import defaults
from ..driver import Driver, PartitionKey
from ..storage import StorageError
from ..storage.cleaner import CleanPlan, CleanStats, discard_plan
from .partitions import Files, PartitionManager

log = logging.getLogger(__name__)

__all__ = ["LogCleaner"]

#: How often ``run`` looks for a log to clean (it costs a look at every compacted replica,
#: none at the others: ``PartitionManager.compacted``).
CHECK_EVERY_S = 1.0


class LogCleaner:
    def __init__(self, driver: Driver, partitions: PartitionManager, bytes_per_second: int) -> None:
        self.driver = driver
        self.partitions = partitions
        self.bytes_per_second = bytes_per_second
        self.max_dirty_bytes = defaults.CLEANER_MAX_DIRTY_BYTES
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-cleaner")
        self._job: asyncio.Task[None] | None = None
        self._stopped = threading.Event()
        self._allowed_at = 0.0  # the throttle's clock (monotonic s)
        self._checked_at = 0.0
        #: Counters (``stats``).
        self.cleans = 0
        self.dropped = 0
        self.bytes_read = 0
        self.bytes_written = 0
        #: Replicas its checks looked at (compacted ones only).
        self.examined = 0

    @property
    def running(self) -> bool:
        return self._job is not None

    def stats(self) -> dict[str, int]:
        return {
            "cleans": self.cleans,
            "dropped": self.dropped,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
        }

    def run(self) -> None:
        """Start a clean of the dirtiest due log, if none is running (event loop)."""
        t = time.monotonic()
        if self._job is not None or self._stopped.is_set() or t < self._checked_at + CHECK_EVERY_S:
            return
        self._checked_at = t
        now = time.time_ns() // 1_000_000
        picked = self._dirtiest(now)
        if picked is not None:
            key, files, end = picked
            end = files.log.capped_end(end, self.max_dirty_bytes)
            self._job = asyncio.get_running_loop().create_task(self._clean(key, files, end, now))

    def _dirtiest(self, now: int) -> tuple[PartitionKey, Files, int] | None:
        best: tuple[float, PartitionKey, Files, int] | None = None
        for key, files in self.partitions.compacted():
            self.examined += 1
            lg = files.log
            if not lg.config.compacted:
                continue
            p = self.driver.get(key)
            if p is None:
                continue
            try:
                state = lg.dirty_state(p.core.high_watermark, p.last_stable_offset(), now)
            except StorageError:
                continue  # closed meanwhile, or damage a read reports
            if state.due and (best is None or state.ratio > best[0]):
                best = (state.ratio, key, files, state.cleanable_end)
        return None if best is None else best[1:]

    async def _clean(self, key: PartitionKey, files: Files, end: int, now: int) -> None:
        lg = files.log
        loop = asyncio.get_running_loop()
        try:
            aborted, pinned = lg.clean_inputs()
            plan: CleanPlan | None = await loop.run_in_executor(
                self._pool,
                lambda: lg.prepare_clean(
                    end, now, aborted=aborted, pinned=pinned, throttle=self._throttle
                ),
            )
            if plan is None:
                return
            if self._stopped.is_set() or not self._still_open(key, files):
                discard_plan(plan)
                self.dropped += 1
                return
            stats: CleanStats | None = lg.swap_clean(plan)
            if stats is None:
                self.dropped += 1
                return
            self.cleans += 1
            self.bytes_read += stats.bytes_read
            self.bytes_written += stats.bytes_written
        except StorageError as exc:
            log.warning("%s/%d: clean failed: %s", *key, exc)
        except Exception:
            log.exception("%s/%d: clean failed", *key)
        finally:
            self._job = None

    def _still_open(self, key: PartitionKey, files: Files) -> bool:
        return self.partitions.files.get(key) is files

    def _throttle(self, nbytes: int) -> None:
        """The cleaner thread's pace: ``bytes_per_second`` of bytes read and written."""
        if self._stopped.is_set():
            raise StorageError("the log cleaner is stopping")
        rate = self.bytes_per_second
        if rate <= 0:
            return
        t = time.monotonic()
        self._allowed_at = max(self._allowed_at, t) + nbytes / rate
        delay = self._allowed_at - t
        if delay > 0 and self._stopped.wait(min(delay, 5.0)):
            raise StorageError("the log cleaner is stopping")

    async def stop(self) -> None:
        """Stop: a running rewrite gives up (its files are deleted), no swap follows."""
        self._stopped.set()
        job = self._job
        if job is not None:
            await asyncio.gather(job, return_exceptions=True)
        self._pool.shutdown(wait=True)
