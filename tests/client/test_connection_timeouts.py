"""Establishing a connection (TCP, TLS handshake, SCRAM) is bounded by the attempt's
timeout as a whole, and a hung establishment can be aborted from another thread. A node
that stopped answering looks like a listener that never reads: the kernel completes the
TCP handshake and nothing more. That costs one timeout and a retriable error
(``AttemptTimedOut``), never a security error that would stop the retries."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest
from quorumlog.replica.client import Client, RequestTimeoutError
from quorumlog.replica.client.connection import AttemptTimedOut, Connection, ConnectionLost

from tests.support.waits import wait_until


def _raised_within(fn: Callable[[], object], wait_s: float = 30) -> BaseException:
    """What ``fn`` raised, run in a thread given ``wait_s`` (far beyond the timeouts under
    test, which are what must end it: the silent node never does). How long it took is
    not judged: a loaded machine stretches it."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # the outcome under test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait_s)
    assert not thread.is_alive(), f"still waiting on the silent node after {wait_s} s"
    assert raised, "it returned, from a node that never answers"
    return raised[0]


@pytest.fixture
def silent() -> Iterator[tuple[str, int]]:
    """A loopback listener that never accepts nor reads (what a SIGSTOPped node is)."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        host, port = server.getsockname()[:2]
        yield host, port
    finally:
        server.close()


def _tls_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the handshake never gets as far as a certificate
    return ctx


def test_tls_handshake_with_a_silent_node_times_out_retriably(silent: tuple[str, int]) -> None:
    raised = _raised_within(
        lambda: Connection(*silent, client_id="t", timeout_s=0.3, ssl_context=_tls_context())
    )
    assert isinstance(raised, AttemptTimedOut) and "TLS handshake" in str(raised)


def test_scram_with_a_silent_node_times_out_retriably(silent: tuple[str, int]) -> None:
    raised = _raised_within(
        lambda: Connection(*silent, client_id="t", timeout_s=0.3, credentials=("alice", "secret"))
    )
    assert isinstance(raised, AttemptTimedOut), raised


def test_abort_wakes_a_hung_tls_handshake(silent: tuple[str, int]) -> None:
    conn = Connection(*silent, client_id="t", timeout_s=30, ssl_context=_tls_context(), defer=True)
    failure: list[BaseException] = []

    def establish() -> None:
        try:
            conn.establish(30)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=establish, daemon=True)
    thread.start()
    # connected, in the handshake
    wait_until(lambda: conn._sock is not None, 5, "the connection's socket", interval=0.01)
    conn.abort()
    thread.join(15)  # well inside its 30 s timeout: only the abort can have ended it
    assert not thread.is_alive()
    assert isinstance(failure[0], ConnectionLost) and "aborted" in str(failure[0])


def test_client_call_against_a_silent_node_is_bounded_by_its_timeout(
    silent: tuple[str, int],
) -> None:
    """Each attempt is cut at the attempt timeout; the call ends at its own deadline."""
    host, port = silent
    with Client(f"{host}:{port}", request_timeout_ms=1000, attempt_timeout_ms=200) as c:
        raised = _raised_within(lambda: c.describe_quorum("t", 0))
        assert isinstance(raised, RequestTimeoutError), raised
