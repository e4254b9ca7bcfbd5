"""What the listener's coordinators (groups, transactions) share about the internal
topics they keep their state in: creating one on first use, reading a partition of it
as its new leader, and appending to it durably.

A coordinator's partition is read once this node leads it and an entry of its epoch is
committed (so everything before is committed too), up to the high watermark, fenced by
that epoch; its own writes then keep its cache current.

Both topics are compacted (``cleanup.policy=compact``, as Kafka creates them): every
record has a key, and the latest record of a key is the state (a null value deletes
it), so the cleaner leaves about one record per key and a new coordinator reads that
much. Their segments are small (``defaults.INTERNAL_TOPIC_SEGMENT_BYTES``: the cleaner
never cleans the active segment).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from .. import defaults
from ..kafka.errors import KafkaError
from ..node.api import Api
from ..node.topic_configs import CLEANUP_POLICY, SEGMENT_BYTES
from ..protocol import ErrorCode
from ..protocol import messages as m
from ..storage import batches_to_table
from ..storage.records import BatchHeader, iter_batches

log = logging.getLogger(__name__)

#: The configs the internal topics are created with.
INTERNAL_TOPIC_CONFIGS = {
    CLEANUP_POLICY: "compact",
    SEGMENT_BYTES: str(defaults.INTERNAL_TOPIC_SEGMENT_BYTES),
}
#: Bytes per read while loading a partition.
LOAD_READ_BYTES = 1 << 20
#: How long a request waits for its coordinator's partition to load before it is answered
#: COORDINATOR_LOAD_IN_PROGRESS (the client retries).
LOAD_WAIT_S = 5.0


class PartitionState(Protocol):
    """A coordinator's cache of one partition it leads, as of ``epoch``: ``task`` reads
    it in; ``stale`` once a write's outcome is unknown (read it again before next use)."""

    epoch: int
    stale: bool
    task: asyncio.Task[bool] | None

    @property
    def ready(self) -> bool: ...


S = TypeVar("S", bound=PartitionState)


async def loaded_state(
    api: Api,
    key: tuple[str, int],
    states: dict[int, S],
    new: Callable[[int, int], S],
    load: Callable[[S, int, int], Coroutine[Any, Any, bool]],
    unload: Callable[[bool], None],
) -> tuple[S | None, KafkaError]:
    """The coordinator's loaded state of partition ``key`` (in ``states``), if this node
    leads it, else the error to answer: a state of an older epoch or a stale one is
    dropped (``unload(moved)``: ``moved`` unless it was only stale) and a new one (``new(partition, epoch)``) read in by
    ``load(state, log start, high watermark)``, waited for at most LOAD_WAIT_S."""
    topic, p = key
    driver = api.driver.get(key)
    if driver is None or not driver.core.is_leader:
        unload(True)
        return None, KafkaError.NOT_COORDINATOR
    core = driver.core
    state = states.get(p)
    if state is not None and (state.epoch != core.epoch or state.stale):
        unload(state.epoch != core.epoch)
        state = None
    if state is None:
        if not core.leader_committed:
            # A new leader: what earlier leaders wrote is known committed only once an
            # entry of this epoch is.
            return None, KafkaError.COORDINATOR_LOAD_IN_PROGRESS
        state = states[p] = new(p, core.epoch)
        state.task = asyncio.create_task(load(state, driver.log.start_offset, core.high_watermark))
    assert state.task is not None
    if not state.task.done():
        try:
            await asyncio.wait_for(asyncio.shield(state.task), LOAD_WAIT_S)
        except TimeoutError:
            return None, KafkaError.COORDINATOR_LOAD_IN_PROGRESS
    if not state.ready:
        if states.get(p) is state:
            del states[p]
        return None, KafkaError.COORDINATOR_LOAD_IN_PROGRESS
    return state, KafkaError.NONE


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
            name=self.name,
            partitions=self.partitions(),
            replication_factor=0,
            configs=[m.TopicConfig(name=k, value=v) for k, v in INTERNAL_TOPIC_CONFIGS.items()],
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
