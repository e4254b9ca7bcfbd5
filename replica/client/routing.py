"""Requests routed by the metadata cache: to a partition's leader (retried through leader
changes, hung and restarted nodes), to any node, or to the metadata controller.

Leader routing refreshes the cache on NOT_LEADER / FENCED / UNKNOWN epoch, on connection
loss and on a timed-out attempt. When a caller passes its own ``current_leader_epoch``,
fencing errors are raised to it instead of retried (KIP-320).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from ..protocol import ApiKey, ErrorCode
from ..protocol import messages as m
from .connection import ConnectionLost
from .errors import (
    BootstrapUnreachableError,
    FencedLeaderEpochError,
    LeaderNotAvailableError,
    NotLeaderError,
    OffsetNotAvailableError,
    RequestTimeoutError,
    UnknownLeaderEpochError,
)
from .metadata import MetadataCache, PartitionMetadata

T = TypeVar("T")
# What a leader-routed request answers: every such answer says how it went.
R = TypeVar("R", bound=m.Response)

_REFRESH_ERRORS = (
    NotLeaderError,
    LeaderNotAvailableError,
    FencedLeaderEpochError,
    UnknownLeaderEpochError,
    ConnectionLost,
)


class RequestRouting(MetadataCache):
    """Where a request goes and how it is retried there."""

    def _admin(
        self,
        api: ApiKey,
        req: Any,
        resp_cls: type[T],
        *,
        controller: bool = False,
        attempts: list[float] | None = None,
    ) -> T:
        """A request any node answers (or, ``controller``, the metadata leader): each
        attempt tries the known nodes in turn, each within the attempt timeout. Each
        attempt's start is appended to ``attempts``, so a caller can tell a retry."""

        def attempt(deadline: float) -> T:
            if attempts is not None:
                attempts.append(time.monotonic())
            if controller and self._controller_id < 0:
                try:
                    self.refresh_nodes(timeout_s=self._attempt_s(deadline))
                except BootstrapUnreachableError:
                    pass  # the nodes below are tried anyway; a clear error if none answers
            targets = self._addresses()
            if controller and self._controller_id in self._nodes:
                targets = [self._nodes[self._controller_id]]
            last: Exception = LeaderNotAvailableError("no node to ask")
            for addr in targets:
                try:
                    resp = self._request(addr, api, req, resp_cls, self._attempt_s(deadline))
                    self._check(resp)
                    return resp
                except _REFRESH_ERRORS as exc:
                    last = exc
                    self._controller_id = m.UNKNOWN
            if not self._nodes and isinstance(last, ConnectionLost):
                # Never reached any node: the bootstrap is wrong or down; say so now.
                raise BootstrapUnreachableError(
                    "no quorumlog node reachable at bootstrap "
                    + ",".join(f"{h}:{p}" for h, p in self._bootstrap)
                    + f" ({last})"
                )
            raise last

        return self._retrying(api.name, self.request_timeout_ms, attempt, _REFRESH_ERRORS)

    def _leader_call(
        self,
        topic: str,
        partition: int,
        api: ApiKey,
        make_request: Callable[[PartitionMetadata, float], Any],
        resp_cls: type[R],
        *,
        fenced_to_caller: bool,
        timeout_ms: int | None = None,
        also_retriable: tuple[type[Exception], ...] = (),
    ) -> R:
        """``make_request(partition metadata, attempt seconds)`` sent to the partition's
        leader, retried (metadata refreshed first) on the errors a leader change or a hung
        or restarted node gives, and ``also_retriable``, within the call's timeout."""
        refresh = False

        def attempt(deadline: float) -> R:
            nonlocal refresh
            pm = self.partition_metadata(
                topic, partition, refresh=refresh, timeout_s=self._attempt_s(deadline)
            )
            refresh = True  # whatever fails next, the retry asks who leads now
            if pm.leader_id < 0 or pm.leader_id not in self._nodes:
                raise LeaderNotAvailableError(f"{topic}/{partition} has no leader yet")
            addr = self._nodes[pm.leader_id]
            if self._suspected(addr):
                raise LeaderNotAvailableError(
                    f"leader {pm.leader_id} of {topic}/{partition} (epoch {pm.leader_epoch}) "
                    "did not answer in time; waiting for a new leader or for it to answer"
                )
            attempt_s = self._attempt_s(deadline)
            resp = self._request(addr, api, make_request(pm, attempt_s), resp_cls, attempt_s)
            if resp.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                # A node that just restarted may not host the partition yet; a topic
                # that does not exist at all fails at the metadata refresh instead.
                raise LeaderNotAvailableError(
                    f"node {pm.leader_id} does not host {topic}/{partition} yet"
                )
            if resp.error == ErrorCode.NOT_LEADER and self._moved(pm, resp):
                refresh = False  # the retry goes where the answer says, without metadata
            self._check(resp)
            return resp

        retriable: tuple[type[Exception], ...] = (
            NotLeaderError,
            LeaderNotAvailableError,
            OffsetNotAvailableError,  # a new leader that does not know its HWM yet
            ConnectionLost,
            BootstrapUnreachableError,
            RequestTimeoutError,  # the node's own wait (quorum) ran out: Kafka retries it
        )
        if not fenced_to_caller:
            retriable += (FencedLeaderEpochError, UnknownLeaderEpochError)
        retriable += also_retriable
        return self._retrying(
            f"{api.name} on {topic}/{partition}",
            timeout_ms if timeout_ms is not None else self.request_timeout_ms,
            attempt,
            retriable,
        )

    def _moved(self, pm: PartitionMetadata, resp: Any) -> bool:
        """A NOT_LEADER answer that names the partition's leader in a later epoch than
        ``pm`` (as Kafka's KIP-951): that leader goes in the cache, and True. A client
        retrying on it needs no metadata, which a topic of thousands of partitions makes
        costly for every node asked, at the very moment leadership moves."""
        leader = getattr(resp, "leader_id", m.UNKNOWN)
        epoch = getattr(resp, "leader_epoch", m.UNKNOWN)
        if leader < 0 or epoch <= pm.leader_epoch or leader not in self._nodes:
            return False
        self._leaders[(pm.topic, pm.partition)] = replace(pm, leader_id=leader, leader_epoch=epoch)
        return True

    def _fenced_call(
        self,
        topic: str,
        partition: int,
        api: ApiKey,
        make_request: Callable[[int, float], Any],
        resp_cls: type[R],
        current_leader_epoch: int | None,
        timeout_ms: int | None = None,
    ) -> R:
        """A ``_leader_call`` whose request names the leader epoch the caller knows (KIP-320):
        ``make_request(epoch, attempt seconds)`` is given ``current_leader_epoch``, or
        UNKNOWN if the caller names none. A named epoch the leader fences or does not know
        is the caller's to handle, so those errors are raised, not retried."""
        epoch = m.UNKNOWN if current_leader_epoch is None else current_leader_epoch
        return self._leader_call(
            topic,
            partition,
            api,
            lambda pm, attempt_s: make_request(epoch, attempt_s),
            resp_cls,
            fenced_to_caller=current_leader_epoch is not None,
            timeout_ms=timeout_ms,
        )
