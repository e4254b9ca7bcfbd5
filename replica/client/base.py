"""The client's plumbing: connections to the nodes, attempts on them, and the one retry loop.

Timeouts as Kafka's clients: a call may take ``request_timeout_ms`` in all, made of attempts
that each take at most ``attempt_timeout_ms``, connecting included (see ``client``). A node
that outlives an attempt is suspected until it answers again, for one attempt timeout at
most; ``_addresses`` puts suspects last. Retries back off with one formula (``backoff_s``).
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..protocol import ApiKey, ErrorCode
from .connection import AttemptTimedOut, Connection, ConnectionLost
from .errors import LeaderNotAvailableError, QuorumLogError, RequestTimeoutError, error_for
from .security import ClientSecurity

log = logging.getLogger(__name__)

T = TypeVar("T")

# A node's own wait inside an attempt (long poll, quorum wait) ends at this share of the
# attempt, so its answer arrives before the attempt gives up on it.
_SERVER_WAIT_SHARE = 0.8


def _server_wait_ms(attempt_s: float) -> int:
    """How long a node may wait inside an attempt of ``attempt_s`` seconds."""
    return int(attempt_s * 1000 * _SERVER_WAIT_SHARE)


class ClientBase:
    """Connections, attempts and retries; ``Client`` sets this state up (``Client.__init__``)
    and the role classes (metadata, routing, admin, produce, reads) build on it."""

    _bootstrap: list[tuple[str, int]]
    security: ClientSecurity | None
    _ssl_context: ssl.SSLContext | None
    client_id: str
    request_timeout_ms: int
    attempt_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    # node id -> address, as the Metadata answers so far named them (shared by clones).
    _nodes: dict[int, tuple[str, int]]
    _conns: dict[tuple[str, int], Connection]
    # node address -> until when it is suspected of hanging (an attempt to it timed
    # out): leader-routed attempts wait for another leader or for it to answer again.
    _suspects: dict[tuple[str, int], float]
    _pool: ThreadPoolExecutor | None

    def close(self) -> None:
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _request(
        self, addr: tuple[str, int], api: ApiKey, req: Any, resp_cls: type[T], timeout_s: float
    ) -> T:
        """One attempt on ``addr``'s connection (opened first if needed), all of it within
        ``timeout_s``. A failed connection is dropped; a silent node becomes a suspect."""
        conn = self._connection(addr, timeout_s)
        try:
            resp = conn.request(api, req, resp_cls)
        except Exception as exc:
            self._settle(addr, conn, [exc])
            raise
        self._settle(addr, conn, [resp])
        return resp

    def _pipelined(
        self,
        batches: dict[tuple[str, int], list[Any]],
        api: ApiKey,
        resp_cls: type[T],
        timeout_s: float,
    ) -> dict[tuple[str, int], list[T | Exception]]:
        """Requests to several nodes, all sent before any answer is read: each node's on
        its connection, then read in order (a node answers a connection's requests in the
        order they came), within ``timeout_s`` of that connection's last send. An error
        answer stands for its request alone; a lost or silent connection is closed, and
        every request of it not answered by then gets that error (it may have been
        applied)."""
        out, sent = self._pipeline_send(batches, api, timeout_s)
        return self._pipeline_receive(sent, resp_cls, out)

    def _pipeline_send(
        self, batches: dict[tuple[str, int], list[Any]], api: ApiKey, timeout_s: float
    ) -> tuple[
        dict[tuple[str, int], list[Any]], dict[tuple[str, int], tuple[Connection, list[int]]]
    ]:
        """``_pipelined``'s sends: the errors of nodes whose requests could not be sent,
        and each other node's connection and the correlation ids to read."""
        out: dict[tuple[str, int], list[Any]] = {}
        sent: dict[tuple[str, int], tuple[Connection, list[int]]] = {}
        for addr, reqs in batches.items():
            ids: list[int] = []
            try:
                conn = self._connection(addr, timeout_s)
            except Exception as exc:
                out[addr] = [exc] * len(reqs)
                continue
            try:
                for req in reqs:
                    ids.append(conn.send(api, req))
            except Exception as exc:
                conn.close()  # the answers of those sent must not be read as later ones
                out[addr] = [exc] * len(reqs)
                self._settle(addr, conn, out[addr])
                continue
            except BaseException:
                conn.close()
                raise
            sent[addr] = (conn, ids)
        return out, sent

    def _pipeline_receive(
        self,
        sent: dict[tuple[str, int], tuple[Connection, list[int]]],
        resp_cls: type[T],
        out: dict[tuple[str, int], list[T | Exception]],
    ) -> dict[tuple[str, int], list[T | Exception]]:
        """``_pipelined``'s reads: each node's answers, in order, added to ``out``."""
        for addr, (conn, ids) in sent.items():
            answers: list[T | Exception] = []
            try:
                for cid in ids:
                    try:
                        answers.append(conn.receive(cid, resp_cls))
                    except QuorumLogError as exc:
                        if isinstance(exc, ConnectionLost) or conn.closed:
                            raise
                        answers.append(exc)  # an error answer: the stream is in step
            except Exception as exc:
                conn.close()
                answers.extend([exc] * (len(ids) - len(answers)))
            except BaseException:
                conn.close()
                raise
            self._settle(addr, conn, answers)
            out[addr] = answers
        return out

    def _connection(self, addr: tuple[str, int], timeout_s: float) -> Connection:
        """``addr``'s connection, opened first if needed (within ``timeout_s``), with
        ``timeout_s`` per request."""
        conn = self._conns.get(addr)
        if conn is None or conn.closed:
            conn = Connection(
                addr[0],
                addr[1],
                client_id=self.client_id,
                timeout_s=timeout_s,
                ssl_context=self._ssl_context,
                credentials=(self.security.credentials() if self.security is not None else None),
                defer=True,
            )
            # Published before connecting, so metadata() can abort a hung establishment.
            self._conns[addr] = conn
            try:
                conn.establish(timeout_s)
            except Exception as exc:
                self._settle(addr, conn, [exc])
                raise
        conn.set_timeout(timeout_s)
        return conn

    def _settle(self, addr: tuple[str, int], conn: Connection, answers: list[Any]) -> None:
        """After an exchange on ``addr``'s connection: a failed connection is dropped, a
        node that did not answer in time is suspected until it does, and one that
        answered is no longer suspected."""
        if conn.closed and self._conns.get(addr) is conn:
            self._conns.pop(addr, None)
        if any(isinstance(a, AttemptTimedOut) for a in answers):
            self._suspects[addr] = time.monotonic() + self.attempt_timeout_ms / 1000
            log.info("%s:%d did not answer in time; suspected until it does", *addr)
        elif any(not isinstance(a, BaseException) for a in answers):
            self._suspects.pop(addr, None)

    def _suspected(self, addr: tuple[str, int]) -> bool:
        until = self._suspects.get(addr)
        return until is not None and until > time.monotonic()

    def _addresses(self) -> list[tuple[str, int]]:
        """Known nodes then the bootstrap, suspected ones last."""
        seen: list[tuple[str, int]] = []
        for addr in [*self._nodes.values(), *self._bootstrap]:
            if addr not in seen:
                seen.append(addr)
        return sorted(seen, key=self._suspected)

    def _deadline(self, timeout_ms: int | None = None) -> float:
        return (
            time.monotonic()
            + (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        )

    def _attempt_s(self, deadline: float) -> float:
        """One attempt's time: the attempt timeout, or what is left of the call if less."""
        return max(0.05, min(self.attempt_timeout_ms / 1000, deadline - time.monotonic()))

    def backoff_s(self, attempt: int, *, waiting_for_leader: bool = False) -> float:
        """The back-off before retry number ``attempt`` (0 first), for every retry of this
        client and of the connector's readers: exponential from ``retry_backoff_ms`` up to
        32 times that and at most ``retry_backoff_max_ms`` (a short back-off stays short
        while a leader is elected), with +-20 % jitter so that clients that failed together
        do not retry together (Kafka's KIP-580). ``waiting_for_leader`` (no leader yet, or
        the one known did not answer in time): the back-off stays at its second step, so a
        call that already spent attempts (a timed-out one costs 1.5 s) notices the new
        leader within ~0.2 s of its election, not up to a second later; each retry is a
        metadata request about one partition."""
        if waiting_for_leader:
            attempt = min(attempt, 1)
        term = min(self.retry_backoff_ms * float(2 ** min(attempt, 5)), self.retry_backoff_max_ms)
        return max(self.retry_backoff_ms, term * random.uniform(0.8, 1.2)) / 1000

    def _backoff(self, deadline: float, attempt: int, *, waiting_for_leader: bool = False) -> None:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            pause = self.backoff_s(attempt, waiting_for_leader=waiting_for_leader)
            time.sleep(min(pause, remaining))

    def _retrying(
        self,
        what: str,
        timeout_ms: int,
        attempt: Callable[[float], T],
        retriable: tuple[type[Exception], ...],
    ) -> T:
        """The one retry loop: ``attempt(call deadline)`` until it returns, raises a
        non-retriable error, or the call's ``timeout_ms`` is spent (RequestTimeoutError
        naming the last failure)."""
        deadline = time.monotonic() + timeout_ms / 1000
        attempts = 0
        while True:
            attempts += 1
            try:
                return attempt(deadline)
            except retriable as exc:
                last: Exception = exc
                log.debug("%s: attempt %d failed: %s", what, attempts, exc)
            if time.monotonic() >= deadline:
                raise RequestTimeoutError(
                    f"{what} did not succeed within {timeout_ms} ms ({attempts} attempts; "
                    f"last: {last})"
                )
            self._backoff(
                deadline, attempts - 1, waiting_for_leader=isinstance(last, LeaderNotAvailableError)
            )

    @staticmethod
    def _check(resp: Any) -> None:
        if resp.error != ErrorCode.NONE:
            raise error_for(resp.error, resp.error_message)
