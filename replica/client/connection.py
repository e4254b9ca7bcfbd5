"""A blocking connection to one node: framed requests, pipelined responses in order."""

from __future__ import annotations

import socket
import ssl
from typing import Any, TypeVar

from ..protocol import (
    API_VERSION,
    DEFAULT_MAX_FRAME_BYTES,
    PREFIX,
    ApiKey,
    DecodeError,
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
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._next_id = 1
        self._answered = False
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout_s)
        self.tls = ssl_context is not None
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except ssl.SSLError as exc:
                sock.close()
                raise TlsError(
                    f"TLS handshake with {host}:{port} failed: {_ssl_reason(exc)}"
                ) from exc
            except OSError as exc:
                sock.close()
                raise TlsError(
                    f"TLS handshake with {host}:{port} failed: {exc} (is it a TLS listener?)"
                ) from exc
        self._sock = sock
        self.closed = False
        if credentials is not None:
            self._authenticate(*credentials)

    def _authenticate(self, principal: str, secret: str) -> None:
        """SCRAM-SHA-256, once, before any other request. The error never says whether the
        principal or the secret was wrong (the node does not tell either)."""
        client = scram.ScramClient(principal, secret)
        failed = f"authentication to {self.host}:{self.port} as principal {principal!r} failed"
        try:
            first = self.request(
                ApiKey.AUTHENTICATE,
                AuthenticateRequest(scram.MECHANISM, client.first_message()),
                AuthenticateResponse,
            )
            if first.error:
                raise error_for(first.error, first.error_message)
            final = self.request(
                ApiKey.AUTHENTICATE,
                AuthenticateRequest(scram.MECHANISM, client.final_message(first.auth_bytes)),
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
        self._sock.settimeout(max(0.001, timeout_s))

    def send(self, api_key: ApiKey, request: Any) -> int:
        correlation_id = self._next_id
        self._next_id += 1
        body, payload = encode(request)
        buffers = encode_frame(
            int(api_key), API_VERSION, correlation_id, self.client_id, body, payload
        )
        try:
            if len(buffers) == 1:
                self._sock.sendall(buffers[0])
            elif self.tls:
                # SSL sockets have no sendmsg: one joined write is the fewest TLS records.
                self._sock.sendall(b"".join(buffers))
            else:
                self._sendmsg(buffers)
        except ssl.SSLError as exc:
            self.close()
            raise TlsError(f"TLS with {self.host}:{self.port} failed: {_ssl_reason(exc)}") from exc
        except OSError as exc:
            self.close()
            raise ConnectionLost(f"send to {self.host}:{self.port} failed: {exc}") from exc
        return correlation_id

    def _sendmsg(self, buffers: list[bytes | memoryview]) -> None:
        total = sum(len(b) for b in buffers)
        sent = self._sock.sendmsg(buffers)
        if sent < total:
            # Rare partial send: fall back to sending the remainder in one piece.
            rest = b"".join(bytes(b) for b in buffers)[sent:]
            self._sock.sendall(rest)

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self._sock.recv_into(view[got:], n - got)
            except TimeoutError as exc:
                self.close()
                raise ConnectionLost(f"no answer from {self.host}:{self.port} in time") from exc
            except ssl.SSLError as exc:
                self.close()
                raise TlsError(
                    f"TLS with {self.host}:{self.port} failed: {_ssl_reason(exc)}"
                ) from exc
            except OSError as exc:
                self.close()
                raise ConnectionLost(f"read from {self.host}:{self.port} failed: {exc}") from exc
            if k == 0:
                self.close()
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
        return self.receive(self.send(api_key, request), response_cls)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._sock.close()
            except OSError:
                pass

    def abort(self) -> None:
        """Close from another thread: shutdown wakes a thread blocked reading this socket."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close()


def _ssl_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    return exc.reason or str(exc)
