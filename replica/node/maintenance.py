"""Background upkeep of the hosted logs: retention, and a scrub of sealed segments that
finds latent damage before a read does."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..driver import Driver, PartitionKey, Ready
from ..storage import LogConfig
from .metadata import METADATA_TOPIC
from .partitions import Files, PartitionManager

log = logging.getLogger(__name__)

RETENTION_EVERY_S = 5.0
#: Replicas the scrub looks at per run (about one a second) at most: 10,000 go round in
#: ~40 s, and the sealed bytes verified per second stay ``scrub_bytes_per_second``.
SCRUB_VISITS = 256


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
        # This round's replicas still to look at, the next one last.
        self._scrub_round: list[tuple[PartitionKey, Files]] = []

    def run(self) -> bool:
        """Do what is due; True when the scrub ran (about once a second)."""
        t = time.monotonic()
        if t >= self._retention_at:
            self._retention_at = t + RETENTION_EVERY_S
            self.apply_retention()
            self.partitions.drop_removed()
        if t >= self._scrub_at + 1:
            self.scrub()
            return True
        return False

    def apply_retention(self) -> None:
        # Each replica runs with its topic's retention (the node's unless the topic sets
        # its own): with none anywhere, nothing to look at.
        if not self.partitions.any_retention:
            return
        for key, f in self.partitions:
            p = self.driver.get(key)
            if key[0] != METADATA_TOPIC and p is not None:
                # Never delete what is not yet committed: followers may still need it.
                f.log.apply_retention(int(time.time() * 1000), max_offset=p.core.high_watermark)

    def scrub(self) -> int:
        """Verify sealed segments, ``scrub_bytes_per_second`` for the whole node: replicas
        take turns, at most SCRUB_VISITS of them per run, so a node hosting thousands of
        idle replicas pays for a few hundred looks a second, not one per replica; a damaged
        batch is repaired at once. Returns how many replicas it looked at."""
        t = time.monotonic()
        budget = int(self.scrub_bytes_per_second * min(t - self._scrub_at, 5.0))
        self._scrub_at = t
        if budget <= 0:
            return 0
        looked = 0
        while looked < SCRUB_VISITS:
            if not self._scrub_round:
                # A new round: every replica hosted now, taken from the end.
                self._scrub_round = list(self.partitions)[::-1]
                if not self._scrub_round:
                    break
            key, f = self._scrub_round[-1]
            looked += 1
            if self.partitions.files.get(key) is not f:
                self._scrub_round.pop()  # closed since the round began
                continue
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
                break  # this replica continues next time
            self._scrub_round.pop()
            if budget <= 0:
                break
        return looked
