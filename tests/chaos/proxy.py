"""A loopback TCP proxy per directed node pair, so a test can partition real node processes.

Node ``src`` reaches peer ``dst`` for raft traffic through the proxy of ``(src, dst)``
(``quorumlog serve --peer-address``). Each proxy forwards, refuses or blackholes:

* ``pass``: bytes flow both ways.
* ``refuse``: open connections are closed and new ones closed at once (a reset link).
* ``blackhole``: connections stay open but every byte is dropped (packets lost, no RST);
  when the pair heals, those connections are closed (their byte streams have holes, as a
  real TCP connection would time out), and the node reconnects.

All proxies run on one asyncio loop in a daemon thread; mode changes are applied on that
loop and waited for, so when ``set_mode`` returns the fault is in effect.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Pair = tuple[int, int]  # (src node, dst node)
_CHUNK = 1 << 16


class Mode(enum.Enum):
    PASS = "pass"
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"


@dataclass(eq=False)
class _Conn:
    writers: list[asyncio.StreamWriter]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    poisoned: bool = False

    def close(self) -> None:
        for w in self.writers:
            w.close()
        for t in self.tasks:
            t.cancel()


@dataclass(eq=False)
class _Link:
    pair: Pair
    target: tuple[str, int]
    mode: Mode = Mode.PASS
    port: int = 0
    server: asyncio.Server | None = None
    conns: set[_Conn] = field(default_factory=set)


class ProxyNet:
    """One proxy per directed pair of ``nodes`` (node id -> the node's real port)."""

    def __init__(self, nodes: dict[int, int], host: str = "127.0.0.1") -> None:
        self.host = host
        self._links = {
            (s, d): _Link((s, d), (host, port))
            for s in nodes
            for d, port in nodes.items()
            if s != d
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> ProxyNet:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="chaos-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start_servers(), loop).result(timeout_s)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout_s)
            if not loop.is_running():
                loop.close()

    def port(self, src: int, dst: int) -> int:
        return self._links[(src, dst)].port

    # ---- faults -------------------------------------------------------------------
    def set_mode(self, pairs: Iterable[Pair], mode: Mode, timeout_s: float = 10.0) -> None:
        if self._loop is None:
            raise RuntimeError("the proxy net is not running")
        chosen = [self._links[p] for p in pairs]
        asyncio.run_coroutine_threadsafe(self._apply(chosen, mode), self._loop).result(timeout_s)

    def heal(self) -> None:
        self.set_mode(self._links, Mode.PASS)

    def modes(self) -> dict[Pair, Mode]:
        return {p: link.mode for p, link in self._links.items()}

    # ---- the loop's side ----------------------------------------------------------
    async def _start_servers(self) -> None:
        for link in self._links.values():
            link.server = await asyncio.start_server(
                lambda r, w, link=link: self._accept(link, r, w), self.host, 0
            )
            link.port = link.server.sockets[0].getsockname()[1]

    async def _close_all(self) -> None:
        for link in self._links.values():
            if link.server is not None:
                link.server.close()
            for conn in list(link.conns):
                conn.close()
            link.conns.clear()

    async def _apply(self, links: list[_Link], mode: Mode) -> None:
        for link in links:
            link.mode = mode
            for conn in list(link.conns):
                if mode is Mode.REFUSE or (mode is Mode.PASS and conn.poisoned):
                    conn.close()
                    link.conns.discard(conn)
                elif mode is Mode.BLACKHOLE:
                    conn.poisoned = True

    async def _accept(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if link.mode is Mode.REFUSE:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*link.target)
        except OSError:
            writer.close()  # the peer is down: the node sees a failed connect, as without us
            return
        conn = _Conn([writer, up_writer], poisoned=link.mode is Mode.BLACKHOLE)
        if link.mode is Mode.REFUSE:  # changed while we connected
            conn.close()
            return
        link.conns.add(conn)
        conn.tasks = [
            asyncio.create_task(self._pump(conn, reader, up_writer)),
            asyncio.create_task(self._pump(conn, up_reader, writer)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        conn.close()
        link.conns.discard(conn)

    @staticmethod
    async def _pump(
        conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if conn.poisoned:
                    continue  # blackholed: the bytes are lost
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()
