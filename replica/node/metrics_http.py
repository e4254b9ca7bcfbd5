"""The HTTP side of ``serve --metrics-listen``: GET /metrics on the node's event loop.

Served on the loop, not in prometheus-client's thread server, because a scrape reads the
node's replicas (``NodeMetrics.refresh``), which only the loop may touch. The exposition
itself is prometheus-client's; this is one request per connection, HTTP/1.1, closed
after the answer (what Prometheus' scrapers expect), over the node's TLS when it has one."""

from __future__ import annotations

import asyncio
import logging
import ssl

from .metrics import NodeMetrics

log = logging.getLogger(__name__)

#: A scraper sends its request at once: a connection silent this long is closed.
REQUEST_TIMEOUT_S = 10.0
#: The request line and headers together; a scraper's are a few hundred bytes.
MAX_REQUEST_BYTES = 16 << 10
PATHS = ("/metrics", "/")


class MetricsServer:
    def __init__(
        self,
        metrics: NodeMetrics,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, ssl=self.ssl_context, limit=MAX_REQUEST_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            status, body, content_type = await self._answer(head)
            writer.write(
                (
                    f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode("latin-1")
                + (b"" if head.startswith(b"HEAD ") else body)
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a silent, cut or oversized request: closed without an answer
        except (ConnectionError, ssl.SSLError) as exc:
            log.debug("metrics connection failed: %s", exc)
        finally:
            writer.close()
            self._conns.discard(task)

    async def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        line, *headers = head.decode("latin-1").split("\r\n")
        parts = line.split(" ")
        if len(parts) != 3:
            return "400 Bad Request", b"malformed request line\n", "text/plain"
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", b"GET /metrics\n", "text/plain"
        if target.split("?", 1)[0] not in PATHS:
            return "404 Not Found", b"metrics are at /metrics\n", "text/plain"
        accept = ""
        for header in headers:
            name, _, text = header.partition(":")
            if name.strip().lower() == "accept":
                accept = text.strip()
        body, content_type = await self.metrics.exposition(accept)
        return "200 OK", body, content_type
