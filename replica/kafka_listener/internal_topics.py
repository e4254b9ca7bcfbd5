"""What the listener's coordinators (groups, transactions) share about the internal
topics they keep their state in: creating one on first use, reading a partition of it
as its new leader, and appending to it durably.

A coordinator's partition is read once this node leads it and an entry of its epoch is
committed (so everything before is committed too), up to the high watermark, fenced by
that epoch; its own writes then keep its cache current.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pyarrow as pa

from ..node.api import Api
from ..protocol import ErrorCode
from ..protocol import messages as m
from ..storage import batches_to_table
from ..storage.records import BatchHeader, iter_batches

log = logging.getLogger(__name__)

#: Bytes per read while loading a partition.
LOAD_READ_BYTES = 1 << 20


class InternalTopic:
    """Creates ``name`` (one attempt at a time, on the metadata leader only) with
    ``partitions()`` partitions and replication factor min(3, nodes)."""

    def __init__(self, api: Api, name: str, partitions: Callable[[], int]) -> None:
        self.api = api
        self.name = name
        self.partitions = partitions
        self._creating: asyncio.Task[None] | None = None

    def count(self) -> int | None:
        """Its partition count, or None while it does not exist."""
        topic = self.api.controller.state.topics.get(self.name)
        return len(topic.replicas) if topic is not None else None

    async def create(self) -> None:
        if self._creating is None or self._creating.done():
            self._creating = asyncio.create_task(self._create())
        await asyncio.shield(self._creating)

    async def _create(self) -> None:
        req = m.CreateTopicRequest(
            name=self.name, partitions=self.partitions(), replication_factor=0
        )
        resp = await self.api.controller.create_topic(req, internal=True)
        if resp.error not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            log.warning("could not create %s: %s", self.name, resp.error_message)

    async def close(self) -> None:
        if self._creating is not None:
            self._creating.cancel()
            await asyncio.gather(self._creating, return_exceptions=True)


def loaded(task: asyncio.Task[bool] | None) -> bool:
    """A coordinator's partition read by ``task`` is in its cache: the read ended, and
    was not cut short."""
    return task is not None and task.done() and not task.cancelled() and task.result()


async def read_partition(
    api: Api,
    key: tuple[str, int],
    epoch: int,
    start: int,
    upto: int,
    on_batch: Callable[[BatchHeader, pa.Table | None], None],
) -> bool:
    """Read partition ``key`` from ``start`` to ``upto`` as leader of ``epoch``, handing
    ``on_batch`` each batch header and its rows (offset, key, value; None for a control
    batch). False if the read stopped (leadership moved, damage)."""
    offset = start
    while offset < upto:
        req = m.FetchRequest(
            topic=key[0],
            partition=key[1],
            current_leader_epoch=epoch,
            fetch_offset=offset,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=LOAD_READ_BYTES,
        )
        resp = await api.submit(key, req)
        if resp.error or not resp.records:
            log.info("%s/%d: loading stopped at %d: %s", *key, offset, resp)
            return False
        records = resp.records
        rows = batches_to_table(records)
        row = 0
        for header in iter_batches(records):
            if header.base_offset >= upto:
                break
            if header.is_control:
                on_batch(header, None)
            else:
                on_batch(header, rows.slice(row, header.record_count))
                row += header.record_count
            offset = header.next_offset
    return True


async def append(
    api: Api, key: tuple[str, int], records: bytes, timeout_ms: int
) -> m.ProduceResponse:
    """Append ``records`` to an internal partition, answered once a quorum holds them."""
    req = m.ProduceRequest(
        topic=key[0], partition=key[1], acks=m.ACKS_QUORUM, timeout_ms=timeout_ms, records=records
    )
    resp: m.ProduceResponse = await api.submit(key, req)
    return resp


#: Answers that say this node no longer leads the partition.
MOVED = frozenset(
    {
        ErrorCode.NOT_LEADER,
        ErrorCode.NOT_FOLLOWER,
        ErrorCode.NOT_QUORUM_LEADER,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
)
