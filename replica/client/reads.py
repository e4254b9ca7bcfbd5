"""Reads: fenced fetch (KIP-320), list offsets, and offsets for a leader epoch."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..protocol import ApiKey
from ..protocol import messages as m
from ..storage.types import EpochEndOffset, OffsetAndEpoch
from .base import _server_wait_ms
from .routing import RequestRouting


@dataclass(frozen=True, slots=True)
class FetchResult:
    topic: str
    partition: int
    leader_epoch: int
    high_watermark: int
    log_start_offset: int
    records: bytes
    # read_committed: the aborted transactions (producer id, first offset) the leader
    # named for these records; None for a read_uncommitted fetch.
    aborted: list[tuple[int, int]] | None = None
    last_stable_offset: int = -1

    def to_arrow(self, start_offset: int | None = None, end_offset: int | None = None) -> Any:
        """The user records as a pyarrow Table (key, value, timestamp, headers, offset,
        leaderEpoch): control batches removed, and for a read_committed fetch the
        records of aborted transactions (their offsets are gaps), rows outside
        [start, end) sliced off."""
        import pyarrow.compute as pc

        from ..storage.records import batches_to_table

        table = batches_to_table(self.records, aborted=self.aborted)
        if start_offset is None and end_offset is None:
            return table
        offsets = table.column("offset")
        mask = None
        if start_offset is not None:
            mask = pc.greater_equal(offsets, start_offset)
        if end_offset is not None:
            upper = pc.less(offsets, end_offset)
            mask = upper if mask is None else pc.and_(mask, upper)
        return table.filter(mask)

    def last_offset_and_epoch(self) -> OffsetAndEpoch | None:
        """Offset and epoch of the last record held (control records included)."""
        from ..storage.records import iter_batches

        last: OffsetAndEpoch | None = None
        for b in iter_batches(self.records):
            last = OffsetAndEpoch(b.last_offset, b.leader_epoch)
        return last


#: A consumer's isolation level, by Kafka's names.
ISOLATION_LEVELS = {"read_uncommitted": m.READ_UNCOMMITTED, "read_committed": m.READ_COMMITTED}


def isolation_level(name: str) -> int:
    try:
        return ISOLATION_LEVELS[name]
    except KeyError:
        raise ValueError(
            f"isolation must be one of {sorted(ISOLATION_LEVELS)}, got {name!r}"
        ) from None


class ReadCalls(RequestRouting):
    """Requests that read a partition, from its leader."""

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        current_leader_epoch: int | None = None,
        max_bytes: int = defaults.FETCH_MAX_BYTES,
        max_wait_ms: int = 0,
        isolation: str = "read_uncommitted",
    ) -> FetchResult:
        """Records from ``offset``. A long poll (``max_wait_ms``) is sent as polls that each
        fit in an attempt, until records come or ``max_wait_ms`` has passed, so a hung
        leader is noticed within an attempt timeout however long the poll.
        ``isolation``: ``read_committed`` reads below the last stable offset only (no
        open transaction's records) and drops aborted transactions' records."""
        level = isolation_level(isolation)
        now = time.monotonic()
        wait_until = now + max(0, max_wait_ms) / 1000
        call_deadline = now + max(self.request_timeout_ms, max_wait_ms + 5000) / 1000

        def request(epoch: int, attempt_s: float) -> m.FetchRequest:
            left_ms = int((wait_until - time.monotonic()) * 1000)
            poll_ms = max(0, min(left_ms, _server_wait_ms(attempt_s)))
            return m.FetchRequest(
                topic=topic,
                partition=partition,
                current_leader_epoch=epoch,
                fetch_offset=offset,
                max_wait_ms=poll_ms,
                min_bytes=1,
                max_bytes=max_bytes,
                isolation_level=level,
            )

        while True:
            resp = self._fenced_call(
                topic,
                partition,
                ApiKey.FETCH,
                request,
                m.FetchResponse,
                current_leader_epoch,
                timeout_ms=max(1, int((call_deadline - time.monotonic()) * 1000)),
            )
            now = time.monotonic()
            if resp.records or now >= wait_until or now >= call_deadline:
                break
        return FetchResult(
            topic,
            partition,
            resp.leader_epoch,
            resp.high_watermark,
            resp.log_start_offset,
            resp.records,
            [(a.producer_id, a.first_offset) for a in resp.aborted_transactions]
            if level == m.READ_COMMITTED
            else None,
            resp.last_stable_offset,
        )

    def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: str | int,
        current_leader_epoch: int | None = None,
        *,
        isolation: str = "read_uncommitted",
    ) -> OffsetAndEpoch:
        """``latest`` is the high watermark, or with ``isolation="read_committed"`` the
        last stable offset (below any open transaction)."""
        level = isolation_level(isolation)
        if spec == "latest":
            ts = m.LATEST_TIMESTAMP
        elif spec == "earliest":
            ts = m.EARLIEST_TIMESTAMP
        elif isinstance(spec, int) and spec >= 0:
            ts = spec
        else:
            raise ValueError(
                f"list_offsets spec must be 'earliest', 'latest' or a timestamp in ms, got {spec!r}"
            )
        resp = self._fenced_call(
            topic,
            partition,
            ApiKey.LIST_OFFSETS,
            lambda epoch, _: m.ListOffsetsRequest(
                topic=topic,
                partition=partition,
                current_leader_epoch=epoch,
                timestamp=ts,
                isolation_level=level,
            ),
            m.ListOffsetsResponse,
            current_leader_epoch,
        )
        return OffsetAndEpoch(resp.offset, resp.leader_epoch)

    def offsets_for_leader_epoch(
        self, topic: str, partition: int, leader_epoch: int, current_leader_epoch: int | None = None
    ) -> EpochEndOffset:
        resp = self._fenced_call(
            topic,
            partition,
            ApiKey.OFFSETS_FOR_LEADER_EPOCH,
            lambda epoch, _: m.OffsetsForLeaderEpochRequest(
                topic=topic,
                partition=partition,
                current_leader_epoch=epoch,
                leader_epoch=leader_epoch,
            ),
            m.OffsetsForLeaderEpochResponse,
            current_leader_epoch,
        )
        return EpochEndOffset(resp.leader_epoch, resp.end_offset)
