"""Calls to the nodes' Kafka coordinators (transactions, groups), in Kafka envelopes.

The transaction coordinator and the group coordinator speak Kafka's messages; the native
client sends those to them whole, over its native connections, in a
``KafkaEnvelopeRequest`` (as Kafka's Envelope, KIP-590), which the node answers as its Kafka
listener would, for the principal the connection authenticated as. A key (transactional id
or group) belongs to one partition of its internal topic (``kafka.coordinators``); the
leader of that partition coordinates it, so a call goes where the client's partition
metadata says that leader is, and is retried where it moved (NOT_COORDINATOR and its kin)
within the call's timeout, as the client's other leader-routed calls are.

The internal topic is created on first use by the metadata leader when a FindCoordinator
reaches it; a client that finds no such topic sends one FindCoordinator to each node it
knows, then asks again.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

from ..kafka.codec import decode_response, encode_request
from ..kafka.coordinators import TXN_KEY_TYPE, TXN_STATE_TOPIC, partition_for
from ..kafka.messages import FIND_COORDINATOR
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from ..kafka.txn import group_of
from ..protocol import messages as m
from ..protocol.errors import ErrorCode
from .errors import (
    ConcurrentTransactionsError,
    CoordinatorNotAvailableError,
    LeaderNotAvailableError,
    QuorumLogError,
    UnknownTopicError,
    error_for,
)
from .routing import RequestRouting

log = logging.getLogger(__name__)

#: A coordinator's answer that asks the client to try again (it moved, is loading its
#: partition, or still ends the id's previous transaction).
_RETRIABLE = (CoordinatorNotAvailableError, ConcurrentTransactionsError, LeaderNotAvailableError)

_correlation = itertools.count(1)


def kafka_error(code: int, what: str) -> QuorumLogError | None:
    """A coordinator's Kafka error code as the client's exception (None: no error)."""
    return None if code == 0 else error_for(code, what)


class CoordinatorCalls(RequestRouting):
    """Kafka requests to the coordinator of a key, in envelopes."""

    # internal topic -> its partition count (fixed once created)
    _internal_counts: dict[str, int]

    def coordinator_call(
        self,
        topic: str,
        key: str,
        key_type: int,
        api: KafkaApi,
        version: int,
        body: Message,
        error_of: Callable[[Message], int],
        *,
        timeout_ms: int | None = None,
    ) -> Message:
        """``body`` (a request of ``api`` at ``version``) to the coordinator of ``key``
        (the leader of its partition of internal ``topic``); its answer. ``error_of``
        reads the answer's error code: a retriable one (the coordinator moved or is
        busy) is retried within ``timeout_ms`` (default the request timeout); any other
        is the caller's to read in the answer."""
        timeout_ms = timeout_ms if timeout_ms is not None else self.request_timeout_ms

        def attempt(deadline: float) -> Message:
            count = self._internal_partitions(topic, key, key_type, deadline)
            p = partition_for(group_of(key) if key_type == TXN_KEY_TYPE else key, count)
            payload = encode_request(api, version, next(_correlation), body, self.client_id)
            resp = self._leader_call(
                topic,
                p,
                m.ApiKey.KAFKA_ENVELOPE,
                lambda pm, attempt_s: m.KafkaEnvelopeRequest(request=payload),
                m.KafkaEnvelopeResponse,
                fenced_to_caller=False,
                timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)),
            )
            _, answer = decode_response(api, version, resp.response)
            code = error_of(answer)
            if code in _COORDINATOR_MOVED:
                self._leaders.pop((topic, p), None)  # ask who leads it now
            error = kafka_error(code, f"{api.name} for {key!r} on {topic}/{p}")
            if isinstance(error, _RETRIABLE):
                raise error
            return answer

        return self._retrying(f"{api.name} for {key!r}", timeout_ms, attempt, _RETRIABLE)

    def txn_group_commit(
        self,
        group: str,
        batch: int,
        members: list[m.TxnGroupMember],
        *,
        commit: bool,
        timeout_ms: int | None = None,
    ) -> int:
        """Decide ``batch`` of transaction group ``group`` (``TxnGroupCommitRequest``):
        commit (or abort) its ``members``' open transactions at once; returns the group's
        fence after it (the last batch committed; -1: none). With no members and no
        commit, only asks the fence. A member no longer its producer's (fenced, or aborted
        by its timeout) fails the commit: every member aborts, and the error is raised."""
        timeout_ms = timeout_ms if timeout_ms is not None else self.request_timeout_ms
        count = self.coordinator_partitions(
            TXN_STATE_TOPIC, group, TXN_KEY_TYPE, timeout_ms=timeout_ms
        )
        req = m.TxnGroupCommitRequest(group=group, batch=batch, commit=commit, members=members)
        resp = self._leader_call(
            TXN_STATE_TOPIC,
            partition_for(group, count),
            m.ApiKey.TXN_GROUP_COMMIT,
            lambda pm, attempt_s: req,
            m.TxnGroupCommitResponse,
            fenced_to_caller=False,
            timeout_ms=timeout_ms,
            also_retriable=_RETRIABLE,
        )
        return resp.committed_batch

    def coordinator_partitions(
        self, topic: str, key: str, key_type: int, *, timeout_ms: int | None = None
    ) -> int:
        """How many partitions internal ``topic`` has, once it exists (asking the nodes
        to create it for ``key`` if it does not)."""
        return self._retrying(
            f"{topic} for {key!r}",
            timeout_ms if timeout_ms is not None else self.request_timeout_ms,
            lambda deadline: self._internal_partitions(topic, key, key_type, deadline),
            (LeaderNotAvailableError,),
        )

    def _internal_partitions(self, topic: str, key: str, key_type: int, deadline: float) -> int:
        """How many partitions internal ``topic`` has; if it does not exist yet, a
        FindCoordinator to each known node (the metadata leader creates it) and
        LeaderNotAvailableError, to be retried."""
        count = self._internal_counts.get(topic)
        if count is not None:
            return count
        try:
            found = self.metadata([topic], timeout_s=self._attempt_s(deadline))[topic]
            self._internal_counts[topic] = len(found.partitions)
            return len(found.partitions)
        except UnknownTopicError:
            pass
        body = FIND_COORDINATOR.default_request(1)
        body.update(key=key, key_type=key_type)
        payload = encode_request(FIND_COORDINATOR, 1, next(_correlation), body, self.client_id)
        for addr in self._addresses():
            try:
                self._request(
                    addr,
                    m.ApiKey.KAFKA_ENVELOPE,
                    m.KafkaEnvelopeRequest(request=payload),
                    m.KafkaEnvelopeResponse,
                    self._attempt_s(deadline),
                )
            except QuorumLogError as exc:
                log.debug("FindCoordinator to %s:%d: %s", *addr, exc)
        raise LeaderNotAvailableError(f"{topic} is being created")


_COORDINATOR_MOVED = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
