"""A blocking connection to one node: framed requests, pipelined responses in order.

Every request (and the connection's establishment: connect, TLS handshake, SCRAM) is
bounded as a whole by the connection's timeout, not per socket call, so a node that
stops answering (SIGSTOP, a stalled VM) costs one timeout. A connection whose request
failed mid-way (timeout, reset, bad frame) is closed, never reused: a late answer on it
cannot be taken for the answer to a later request.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any, TypeVar

from ..protocol import (
    API_VERSION,
    DEFAULT_MAX_FRAME_BYTES,
    PREFIX,
    ApiKey,
    DecodeError,
    ErrorCode,
    FrameError,
    decode_body,
    decode_frame,
    encode,
    encode_frame,
    frame_length,
    scram,
)
from ..protocol.messages import AuthenticateRequest, AuthenticateResponse, ErrorResponse
from .errors import (
    AuthenticationError,
    InvalidRequestError,
    QuorumLogError,
    SecurityError,
    TlsError,
    error_for,
)

T = TypeVar("T")


class ConnectionLost(QuorumLogError):
    """The node closed the connection or could not be reached."""

    error_code = ErrorCode.NETWORK_EXCEPTION


class AttemptTimedOut(ConnectionLost):
    """The node did not answer (or let us connect) within the attempt's timeout; the
    connection was closed. A request that timed out may still have been applied."""

    error_code = ErrorCode.REQUEST_TIMED_OUT


class Connection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str,
        timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        defer: bool = False,
    ) -> None:
        """Connects at once, within ``timeout_s`` in all; with ``defer`` the caller calls
        ``establish`` (so that it can ``abort`` an establishment from another thread)."""
        self.host = host
        self.port = port
        self.client_id = client_id
        self._next_id = 1
        self._answered = False
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._ssl_context = ssl_context
        self._credentials = credentials
        self.tls = ssl_context is not None
        self._sock: socket.socket | None = None
        self.closed = False
        if not defer:
            self.establish(timeout_s)

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            self.close()
            raise AttemptTimedOut(
                f"no answer from {self.host}:{self.port} within {self._timeout_s * 1000:.0f} ms"
            )
        return left

    def establish(self, timeout_s: float) -> None:
        """Connect, TLS handshake and SCRAM, all within ``timeout_s``."""
        host, port = self.host, self.port
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        try:
            sock = socket.create_connection((host, port), timeout=self._remaining())
        except TimeoutError as exc:
            raise AttemptTimedOut(
                f"cannot connect to {host}:{port} within {timeout_s * 1000:.0f} ms"
            ) from exc
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl_context is not None:
            sock = self._ssl_context.wrap_socket(
                sock, server_hostname=host, do_handshake_on_connect=False
            )
        self._sock = sock
        if self.closed:  # aborted from another thread before the socket was published
            sock.close()
            raise ConnectionLost(f"connection to {host}:{port} was aborted")
        if isinstance(sock, ssl.SSLSocket):
            try:
                sock.settimeout(self._remaining())
                sock.do_handshake()
            except TimeoutError as exc:
                self.close()
                raise AttemptTimedOut(
                    f"TLS handshake with {host}:{port} not done within {timeout_s * 1000:.0f} ms"
                ) from exc
            except OSError as exc:
                aborted = self.closed
                self.close()
                if aborted:
                    raise ConnectionLost(f"connection to {host}:{port} was aborted") from exc
                if isinstance(exc, ssl.SSLError):
                    raise TlsError(
                        f"TLS handshake with {host}:{port} failed: {_ssl_reason(exc)}"
                    ) from exc
                raise TlsError(
                    f"TLS handshake with {host}:{port} failed: {exc} (is it a TLS listener?)"
                ) from exc
        if self._credentials is not None:
            self._authenticate(*self._credentials)

    def _authenticate(self, principal: str, secret: str) -> None:
        """SCRAM-SHA-256, once, before any other request. The error never says whether the
        principal or the secret was wrong (the node does not tell either)."""
        client = scram.ScramClient(principal, secret)
        failed = f"authentication to {self.host}:{self.port} as principal {principal!r} failed"
        try:
            first = self._exchange(
                ApiKey.AUTHENTICATE,
                AuthenticateRequest(mechanism=scram.MECHANISM, auth_bytes=client.first_message()),
                AuthenticateResponse,
            )
            if first.error:
                raise error_for(first.error, first.error_message)
            final = self._exchange(
                ApiKey.AUTHENTICATE,
                AuthenticateRequest(
                    mechanism=scram.MECHANISM, auth_bytes=client.final_message(first.auth_bytes)
                ),
                AuthenticateResponse,
            )
            if final.error:
                raise error_for(final.error, final.error_message)
            client.verify_server_final(final.auth_bytes)
        except SecurityError as exc:
            self.close()
            raise type(exc)(f"{failed}: {exc}", exc.error_code) from None
        except scram.ScramError as exc:
            self.close()
            raise AuthenticationError(f"{failed}: {exc}") from None
        except ConnectionLost:
            raise
        except QuorumLogError as exc:
            self.close()
            raise AuthenticationError(f"{failed}: {exc}") from exc

    def set_timeout(self, timeout_s: float) -> None:
        """The time each later request (send and answer) may take in all."""
        self._timeout_s = max(0.001, timeout_s)

    def _live_sock(self) -> socket.socket:
        if self._sock is None or self.closed:
            raise ConnectionLost(f"connection to {self.host}:{self.port} is closed")
        return self._sock

    def send(self, api_key: ApiKey, request: Any) -> int:
        """Send one request; it and its answer (``receive``) get the connection's timeout."""
        self._deadline = time.monotonic() + self._timeout_s
        return self._send(api_key, request)

    def _send(self, api_key: ApiKey, request: Any) -> int:
        sock = self._live_sock()
        correlation_id = self._next_id
        self._next_id += 1
        body, payload = encode(request)
        buffers = encode_frame(
            int(api_key), API_VERSION, correlation_id, self.client_id, body, payload
        )
        try:
            # sendall's timeout bounds the whole send (Python >= 3.5).
            sock.settimeout(self._remaining())
            if len(buffers) == 1:
                sock.sendall(buffers[0])
            elif self.tls:
                # SSL sockets have no sendmsg: one joined write is the fewest TLS records.
                sock.sendall(b"".join(buffers))
            else:
                self._sendmsg(sock, buffers)
        except TimeoutError as exc:
            self.close()
            raise AttemptTimedOut(
                f"send to {self.host}:{self.port} not done within {self._timeout_s * 1000:.0f} ms"
            ) from exc
        except ssl.SSLError as exc:
            self.close()
            raise TlsError(f"TLS with {self.host}:{self.port} failed: {_ssl_reason(exc)}") from exc
        except OSError as exc:
            self.close()
            raise ConnectionLost(f"send to {self.host}:{self.port} failed: {exc}") from exc
        return correlation_id

    def _sendmsg(self, sock: socket.socket, buffers: list[bytes | memoryview]) -> None:
        total = sum(len(b) for b in buffers)
        sent = sock.sendmsg(buffers)
        if sent < total:
            # Rare partial send: fall back to sending the remainder in one piece.
            rest = b"".join(bytes(b) for b in buffers)[sent:]
            sock.settimeout(self._remaining())
            sock.sendall(rest)

    def _read_exact(self, n: int) -> bytes:
        sock = self._live_sock()
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                # A socket timeout bounds one recv; the deadline bounds the whole answer.
                sock.settimeout(self._remaining())
                k = sock.recv_into(view[got:], n - got)
            except TimeoutError as exc:
                self.close()
                raise AttemptTimedOut(
                    f"no answer from {self.host}:{self.port} within {self._timeout_s * 1000:.0f} ms"
                ) from exc
            except OSError as exc:
                aborted = self.closed
                self.close()
                if isinstance(exc, ssl.SSLError) and not aborted:
                    raise TlsError(
                        f"TLS with {self.host}:{self.port} failed: {_ssl_reason(exc)}"
                    ) from exc
                raise ConnectionLost(f"read from {self.host}:{self.port} failed: {exc}") from exc
            if k == 0:
                aborted = self.closed
                self.close()
                if aborted:
                    raise ConnectionLost(f"connection to {self.host}:{self.port} was aborted")
                if self.tls and not self._answered:
                    raise TlsError(
                        f"{self.host}:{self.port} closed the TLS connection before answering: "
                        "it may require a client certificate (mutual TLS) or have rejected ours"
                    )
                hint = (
                    ""
                    if self._answered or self.tls
                    else " (if it is a TLS listener, connect with TLS)"
                )
                raise ConnectionLost(f"{self.host}:{self.port} closed the connection{hint}")
            got += k
        return bytes(buf)

    def receive(self, correlation_id: int, response_cls: type[T]) -> T:
        prefix = self._read_exact(PREFIX.size)
        if not self.tls and prefix[0] == 0x15 and prefix[1] == 0x03:
            self.close()
            raise TlsError(
                f"{self.host}:{self.port} answered with a TLS alert: it is a TLS listener; "
                "connect with TLS (a CA file)"
            )
        self._answered = True
        try:
            total, meta_len = frame_length(prefix, DEFAULT_MAX_FRAME_BYTES)
            frame = decode_frame(self._read_exact(total - 4), meta_len)
        except FrameError as exc:
            self.close()
            raise ConnectionLost(f"bad frame from {self.host}:{self.port}: {exc}") from exc
        if frame.correlation_id != correlation_id:
            self.close()
            raise ConnectionLost(
                f"{self.host}:{self.port} answered correlation id {frame.correlation_id}, "
                f"expected {correlation_id}"
            )
        try:
            if frame.api_key == ApiKey.ERROR:
                err = decode_body(ErrorResponse, frame.body)
                raise error_for(err.error, err.error_message)
            return decode_body(response_cls, frame.body, frame.payload)
        except DecodeError as exc:
            raise InvalidRequestError(
                f"malformed response from {self.host}:{self.port}: {exc}"
            ) from exc

    def request(self, api_key: ApiKey, request: Any, response_cls: type[T]) -> T:
        """Send and read the answer, both within the connection's timeout."""
        self._deadline = time.monotonic() + self._timeout_s
        return self._exchange(api_key, request, response_cls)

    def _exchange(self, api_key: ApiKey, request: Any, response_cls: type[T]) -> T:
        answered = False
        try:
            result = self.receive(self._send(api_key, request), response_cls)
            answered = True
            return result
        except QuorumLogError as exc:
            # An error answer leaves the stream in step; anything else mid-way does not.
            answered = not isinstance(exc, ConnectionLost) and not self.closed
            raise
        finally:
            if not answered:
                self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._sock is not None:
                try:
                    self._sock.close()
                except OSError:
                    pass

    def abort(self) -> None:
        """Close from another thread: shutdown wakes a thread blocked reading this socket
        (or still establishing it)."""
        self.closed = True  # first: an establishment that has no socket yet sees it
        sock = self._sock
        if sock is not None:
            try:
                # socket.socket's own shutdown: SSLSocket.shutdown would drop its TLS state
                # under the thread still using it.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass


def _ssl_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    return exc.reason or str(exc)
