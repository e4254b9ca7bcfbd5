"""The transaction coordinator's markers (Kafka's TransactionMarkerChannelManager): a
transaction decided (PrepareCommit / PrepareAbort written) ends with a marker on every
partition it wrote, appended by each partition's leader and held by a quorum there.

Markers for partitions this node leads are handed to its own api; the others go, one
request per node, to the leader as this node knows it (the preferred replica where this
node hosts no replica), then to whichever leader a refusal names. A marker is retried
until it is written or moot, for as long as this node still coordinates the
transaction: a new coordinator finishes the same decision from the transaction-state
topic, so a marker is never given up while it matters.

A marker is moot when the partition's producer state is past its epoch (a later
marker of the same producer is there: INVALID_PRODUCER_EPOCH) or the topic is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from ..node.api import Api
from ..node.topic_changes import TopicChanges
from ..protocol import ApiKey, ErrorCode
from ..protocol import messages as m

log = logging.getLogger(__name__)

#: Back-off between rounds of markers not yet written: doubling to the maximum.
RETRY_BACKOFF_MS = 20
RETRY_BACKOFF_MAX_MS = 1000
#: How long a leader may take to make a marker durable on a quorum.
MARKER_TIMEOUT_MS = 10_000

Partition = tuple[str, int]


class MarkerWriter:
    def __init__(self, api: Api, changes: TopicChanges) -> None:
        self.api = api
        self.changes = changes

    async def write(
        self,
        partitions: Iterable[Partition],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        still_coordinating: Callable[[], bool],
    ) -> bool:
        """Write the markers; False if this node stopped coordinating first."""
        timestamp_ms = int(time.time() * 1000)
        targets: dict[Partition, int | None] = dict.fromkeys(partitions)
        backoff_ms = RETRY_BACKOFF_MS
        while targets:
            if not still_coordinating():
                return False
            by_node: dict[int, list[Partition]] = {}
            for tp, hint in list(targets.items()):
                node = hint if hint is not None else self._leader_guess(tp)
                if node is None:
                    del targets[tp]  # the topic is gone: nothing to end there
                    continue
                by_node.setdefault(node, []).append(tp)
            rounds = await asyncio.gather(
                *(
                    self._send(
                        node,
                        tps,
                        producer_id,
                        producer_epoch,
                        commit,
                        coordinator_epoch,
                        timestamp_ms,
                    )
                    for node, tps in by_node.items()
                )
            )
            for answers in rounds:
                for tp, (code, leader) in answers.items():
                    if code in (ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_EPOCH):
                        targets.pop(tp, None)
                    else:
                        targets[tp] = leader if leader is not None and leader >= 0 else None
            if targets:
                await asyncio.sleep(backoff_ms / 1000)
                backoff_ms = min(RETRY_BACKOFF_MAX_MS, backoff_ms * 2)
        return True

    def _leader_guess(self, tp: Partition) -> int | None:
        """This node's view of the partition's leader (its preferred replica where it
        hosts none); None if the topic or partition no longer exists."""
        topic = self.api.controller.state.topics.get(tp[0])
        if topic is None or not 0 <= tp[1] < len(topic.replicas):
            return None
        replicas = topic.replicas[tp[1]]
        info = self.api.partition_info(tp[0], tp[1], replicas)
        if info.leader_id >= 0:
            return info.leader_id
        return replicas[0] if replicas else None

    async def _send(
        self,
        node: int,
        tps: list[Partition],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        timestamp_ms: int,
    ) -> dict[Partition, tuple[ErrorCode, int | None]]:
        """Each marker's outcome and the leader its refusal names (None: unknown)."""
        req = m.WriteTxnMarkersRequest(
            markers=[
                m.WriteTxnMarkerRequest(
                    topic=t,
                    partition=p,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    commit=commit,
                    coordinator_epoch=coordinator_epoch,
                    timeout_ms=MARKER_TIMEOUT_MS,
                    timestamp_ms=timestamp_ms,
                )
                for t, p in tps
            ]
        )
        try:
            if node == self.api.config.node_id:
                resp = await self.api.write_txn_markers(req)
            else:
                resp = await self.changes.ask_node(
                    node, ApiKey.WRITE_TXN_MARKERS, req, m.WriteTxnMarkersResponse
                )
        except Exception as exc:  # unreachable, or not answering: tried again later
            log.info("transaction markers to node %d: %s", node, exc or type(exc).__name__)
            return {tp: (ErrorCode.NOT_LEADER, None) for tp in tps}
        if resp.error or len(resp.answers) != len(tps):
            log.info("transaction markers to node %d refused: %s", node, resp.error_message)
            return {tp: (ErrorCode(resp.error or ErrorCode.NOT_LEADER), None) for tp in tps}
        out: dict[Partition, tuple[ErrorCode, int | None]] = {}
        for tp, answer in zip(tps, resp.answers, strict=True):
            code = _code(answer.error)
            if code == ErrorCode.NONE:
                out[tp] = (code, node)
            elif code in (ErrorCode.NOT_LEADER, ErrorCode.FENCED_LEADER_EPOCH):
                hint = answer.leader_id if answer.leader_id != node else None
                out[tp] = (code, hint)
            else:
                if code != ErrorCode.INVALID_PRODUCER_EPOCH:
                    log.info("marker for %s/%d at node %d: %s", *tp, node, answer.error_message)
                out[tp] = (code, None)
        return out


def _code(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
