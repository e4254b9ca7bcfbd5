"""Asyncio transport: a server whose connections answer requests in order while several are
in flight (pipelining with a bound, for back-pressure), and one-way links to peers."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from ..protocol import (
    API_VERSION,
    DEFAULT_MAX_FRAME_BYTES,
    PREFIX,
    ApiKey,
    ErrorCode,
    Frame,
    FrameError,
    decode_frame,
    encode,
    encode_frame,
    frame_length,
)
from ..protocol.messages import ErrorResponse

log = logging.getLogger(__name__)

# A handler gets a frame and returns (api key, response message) or None for one-way frames.
Handler = Callable[[Frame], Awaitable[tuple[int, Any] | None]]
OneWay = Callable[[Frame], None]

MAX_IN_FLIGHT = 32


async def read_frame(reader: asyncio.StreamReader, max_frame_bytes: int) -> Frame:
    prefix = await reader.readexactly(PREFIX.size)
    total, meta_len = frame_length(prefix, max_frame_bytes)
    rest = await reader.readexactly(total - 4)
    return decode_frame(rest, meta_len)


def error_frame(correlation_id: int, code: ErrorCode, message: str) -> list[bytes | memoryview]:
    body, _ = encode(ErrorResponse(int(code), message))
    return encode_frame(int(ApiKey.ERROR), API_VERSION, correlation_id, "", body)


class Server:
    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        one_way: OneWay,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.host = host
        self.port = port
        self._handler = handler
        self._one_way = one_way
        self._max_frame = max_frame_bytes
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=1 << 20)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        peer = writer.get_extra_info("peername")
        pending: asyncio.Queue[tuple[int, asyncio.Task[tuple[int, Any] | None]] | None] = (
            asyncio.Queue(MAX_IN_FLIGHT)
        )
        responder = asyncio.create_task(self._respond(pending, writer, peer))
        try:
            while True:
                try:
                    frame = await read_frame(reader, self._max_frame)
                except FrameError as exc:
                    # The stream cannot be re-synchronised after a bad prefix: answer, then close.
                    log.warning("closing connection from %s: %s", peer, exc)
                    writer.writelines(error_frame(0, exc.error_code, str(exc)))
                    break
                if frame.api_key == ApiKey.RAFT:
                    try:
                        self._one_way(frame)
                    except Exception:
                        log.exception("dropping bad raft message from %s", peer)
                    continue
                await pending.put((frame.correlation_id, asyncio.create_task(self._handler(frame))))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection from %s failed", peer)
        finally:
            try:
                await asyncio.wait_for(pending.put(None), 5)
                await asyncio.wait_for(responder, 30)
            except (TimeoutError, asyncio.CancelledError):
                responder.cancel()
            writer.close()
            self._conns.discard(task)

    async def _respond(
        self,
        pending: asyncio.Queue[tuple[int, asyncio.Task[tuple[int, Any] | None]] | None],
        writer: asyncio.StreamWriter,
        peer: object,
    ) -> None:
        while True:
            item = await pending.get()
            if item is None:
                return
            correlation_id, task = item
            try:
                result = await task
            except asyncio.CancelledError:
                return
            except Exception as exc:
                log.exception("request from %s failed", peer)
                buffers = error_frame(
                    correlation_id, ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
                )
            else:
                if result is None:
                    continue
                api_key, response = result
                body, payload = encode(response)
                buffers = encode_frame(api_key, API_VERSION, correlation_id, "", body, payload)
            try:
                writer.writelines(buffers)
                await writer.drain()
            except (ConnectionError, RuntimeError):
                return


class PeerLink:
    """One-way frames to one peer over a long-lived connection. Messages sent while the
    link is down are dropped (raft retries); reconnects back off with jitter."""

    def __init__(
        self, node_id: int, host: str, port: int, client_id: str, rng: random.Random
    ) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self._client_id = client_id
        self._rng = rng
        self._queue: asyncio.Queue[list[bytes | memoryview]] = asyncio.Queue(4096)
        self._task: asyncio.Task[None] | None = None
        self.connected = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def send(self, body: Any, payload: bytes | memoryview = b"") -> None:
        if not self.connected:
            return
        try:
            self._queue.put_nowait(
                encode_frame(int(ApiKey.RAFT), API_VERSION, 0, self._client_id, body, payload)
            )
        except asyncio.QueueFull:
            log.warning("link to node %d is backed up; dropping a raft message", self.node_id)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, 0.5)
                continue
            backoff = 0.05
            self.connected = True
            drain_reader = asyncio.create_task(self._discard(reader))
            try:
                while True:
                    buffers = await self._queue.get()
                    writer.writelines(buffers)
                    if self._queue.empty() or writer.transport.get_write_buffer_size() > (4 << 20):
                        await writer.drain()
                    if drain_reader.done():
                        break
            except (ConnectionError, OSError):
                pass
            finally:
                self.connected = False
                drain_reader.cancel()
                while not self._queue.empty():
                    self._queue.get_nowait()
                writer.close()

    @staticmethod
    async def _discard(reader: asyncio.StreamReader) -> None:
        # Peers never answer one-way frames; a read returning b"" means the link closed.
        while await reader.read(65536):
            pass
