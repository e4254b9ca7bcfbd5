"""A blocking connection to one node: framed requests, pipelined responses in order."""

from __future__ import annotations

import socket
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
)
from ..protocol.messages import ErrorResponse
from .errors import InvalidRequestError, QuorumLogError, error_for

T = TypeVar("T")


class ConnectionLost(QuorumLogError):
    """The node closed the connection or could not be reached."""


class Connection:
    def __init__(self, host: str, port: int, *, client_id: str, timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._next_id = 1
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}") from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(timeout_s)
        self.closed = False

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
            self._sock.sendall(buffers[0]) if len(buffers) == 1 else self._sendmsg(buffers)
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
            except OSError as exc:
                self.close()
                raise ConnectionLost(f"read from {self.host}:{self.port} failed: {exc}") from exc
            if k == 0:
                self.close()
                raise ConnectionLost(f"{self.host}:{self.port} closed the connection")
            got += k
        return bytes(buf)

    def receive(self, correlation_id: int, response_cls: type[T]) -> T:
        prefix = self._read_exact(PREFIX.size)
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
