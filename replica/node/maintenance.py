"""Background upkeep of the hosted logs: retention, and a scrub of sealed segments that
finds latent damage before a read does."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..driver import Driver, Ready
from ..storage import LogConfig
from .metadata import METADATA_TOPIC
from .partitions import PartitionManager

log = logging.getLogger(__name__)

RETENTION_EVERY_S = 5.0


class Maintenance:
    def __init__(
        self,
        log_config: LogConfig,
        scrub_bytes_per_second: int,
        driver: Driver,
        partitions: PartitionManager,
        execute: Callable[[Ready], None],
        now_ms: Callable[[], int],
    ) -> None:
        self.log_config = log_config
        self.scrub_bytes_per_second = scrub_bytes_per_second
        self.driver = driver
        self.partitions = partitions
        self.execute = execute
        self.now_ms = now_ms
        self._retention_at = 0.0
        self._scrub_at = time.monotonic()
        self._scrub_next = 0

    def run(self) -> bool:
        """Do what is due; True when the scrub ran (about once a second)."""
        t = time.monotonic()
        if t >= self._retention_at:
            self._retention_at = t + RETENTION_EVERY_S
            self.apply_retention()
        if t >= self._scrub_at + 1:
            self.scrub()
            return True
        return False

    def apply_retention(self) -> None:
        if self.log_config.retention_bytes is None and self.log_config.retention_ms is None:
            return
        for key, f in self.partitions:
            p = self.driver.get(key)
            if key[0] != METADATA_TOPIC and p is not None:
                # Never delete what is not yet committed: followers may still need it.
                f.log.apply_retention(int(time.time() * 1000), max_offset=p.core.high_watermark)

    def scrub(self) -> None:
        """Verify sealed segments, ``scrub_bytes_per_second`` for the whole node: replicas
        take turns; a damaged batch is repaired at once."""
        t = time.monotonic()
        budget = int(self.scrub_bytes_per_second * min(t - self._scrub_at, 5.0))
        self._scrub_at = t
        hosted = list(self.partitions)
        if budget <= 0 or not hosted:
            return
        for _ in range(len(hosted)):
            key, f = hosted[self._scrub_next % len(hosted)]
            lg = f.log
            before, passes = lg.scrubbed_bytes, lg.scrub_passes
            found = lg.scrub(budget)
            budget -= lg.scrubbed_bytes - before
            if found is not None:
                # Cut first, then say so: whoever reads the line finds the log cut and marked.
                self.execute(self.driver.on_corruption(key, found.offset, self.now_ms()))
                log.error(
                    "%s/%d: corrupt batch at offset %d in %s (position %d), found by the "
                    "scrub: %s; the log was cut there and re-fetches from the leader",
                    *key,
                    found.offset,
                    found.path,
                    found.position,
                    found.reason,
                )
            elif lg.scrub_passes == passes and budget <= 0:
                return  # this replica continues next time
            self._scrub_next += 1
            if budget <= 0:
                return
