"""One-way links from a node to its peers: a long-lived connection per peer, the SCRAM
exchange as a node principal and the directory-id exchange, then raft frames."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable
from typing import Any

from ..protocol import (
    API_VERSION,
    DEFAULT_MAX_FRAME_BYTES,
    ApiKey,
    DecodeError,
    ErrorCode,
    FrameError,
    decode_body,
    encode,
    encode_frame,
    scram,
)
from ..protocol.messages import AuthenticateRequest, AuthenticateResponse, ErrorResponse
from . import directories
from .directories import DirectoryIds
from .transport import AUTH_TIMEOUT_S, read_frame, write_buffers

log = logging.getLogger(__name__)

# A connection attempt to a peer is given up after this long (as Kafka's
# socket.connection.setup.timeout.ms, shorter: peers share a network). A peer host that
# drops packets (powered off, cut off) would otherwise hold an attempt for the kernel's
# SYN retries, about two minutes, and a healed network would wait for their next one.
CONNECT_TIMEOUT_S = 3.0
# A connection this old is dropped for a new one when the peer's node connects to this
# one (``PeerLink.heard_from``); a younger one is kept, so two nodes whose links each
# answer the other's new connection stop after one round.
RENEW_AFTER_S = 1.0


class PeerLink:
    """One-way frames to one peer over a long-lived connection. Messages sent while the
    link is down are dropped (raft retries); reconnects back off with jitter. When the
    peer's node refuses a connection (no process listens: it died), ``on_refused(peer)``
    is called once until the link is up again: the driver's hint that a dead leader
    need not be waited for (``Driver.peer_unreachable``)."""

    def __init__(
        self,
        node_id: int,
        host: str,
        port: int,
        client_id: str,
        rng: random.Random,
        *,
        ssl_context: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        server_hostname: str | None = None,
        directories: DirectoryIds | None = None,
        on_refused: Callable[[int], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self._on_refused = on_refused
        self._refused_told = False
        self._directories = directories
        self.host = host
        self.port = port
        self._client_id = client_id
        self._rng = rng
        self._ssl = ssl_context
        # The name the peer's certificate must carry: its --voters host, even when the
        # link goes through another address.
        self._server_hostname = server_hostname or host
        # (principal, secret) this node authenticates as when the peer requires it.
        self._credentials = credentials
        self._warned = False
        # Frames to send; None wakes the sender when the peer closed the connection.
        self._queue: asyncio.Queue[list[bytes | memoryview] | None] = asyncio.Queue(4096)
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.connect_timeout_s = CONNECT_TIMEOUT_S
        # Set by ``heard_from``: cuts a connection attempt or a back-off short (see there).
        self._poked = asyncio.Event()
        self._pokeable = False  # connecting, or backing off from a peer not there
        self._transport: asyncio.BaseTransport | None = None  # of the connection in use
        self._connected_at = 0.0  # the loop's time

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def heard_from(self) -> None:
        """The peer's node connected to this one (its own link): if this link is waiting
        to reconnect after finding no process listening there, or its attempt hangs (the
        peer's host dropped packets), it tries again now. The peer restarted, or the
        network came back; without this, what this node sends it (a vote, an
        announcement) is dropped for up to a back-off (0.75 s) or the kernel's next SYN,
        just when a failover right after the restart needs it. A link failing for
        another reason (TLS, auth) keeps its back-off.

        A link connected for ``RENEW_AFTER_S`` or more is dropped for a new connection:
        a peer whose host went away without closing its connections (power lost) and
        came back has no process behind the old one, which would swallow this node's
        frames until TCP's retransmissions, minutes apart by then, met a reset. If the
        old connection was fine, a new one costs the frames queued on it (raft resends)."""
        if not self.connected:
            if self._pokeable:
                self._poked.set()
        elif self._transport is not None and (
            asyncio.get_running_loop().time() - self._connected_at >= RENEW_AFTER_S
        ):
            log.info("node %d connected to this one: renewing the link to it", self.node_id)
            self._transport.abort()

    async def _pause(self, backoff: float, *, pokeable: bool) -> None:
        """A jittered back-off; cut short by ``heard_from`` if ``pokeable``."""
        self._poked.clear()
        self._pokeable = pokeable
        try:
            await asyncio.wait_for(self._poked.wait(), backoff * (0.5 + self._rng.random()))
        except TimeoutError:
            pass
        finally:
            self._pokeable = False

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """One connection attempt: raises OSError (TimeoutError after
        ``connect_timeout_s``) if it fails; None if the peer's node connected to this one
        while it hung (``heard_from``: try again at once)."""
        self._poked.clear()
        self._pokeable = True
        attempt = asyncio.ensure_future(
            asyncio.wait_for(
                asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl is not None else None,
                ),
                self.connect_timeout_s,
            )
        )
        poke = asyncio.ensure_future(self._poked.wait())
        try:
            await asyncio.wait((attempt, poke), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        finally:
            self._pokeable = False
            poke.cancel()
        if attempt.done():
            return attempt.result()
        attempt.cancel()
        (late,) = await asyncio.gather(attempt, return_exceptions=True)
        return late if isinstance(late, tuple) else None  # connected as it was given up

    def send(
        self, body: Any, payload: bytes | memoryview = b"", api_key: ApiKey = ApiKey.RAFT
    ) -> None:
        if not self.connected:
            return
        try:
            self._queue.put_nowait(
                encode_frame(int(api_key), API_VERSION, 0, self._client_id, body, payload)
            )
        except asyncio.QueueFull:
            log.warning("link to node %d is backed up; dropping a raft message", self.node_id)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                connection = await self._connect()
            except OSError as exc:
                if isinstance(exc, ConnectionRefusedError) and not self._refused_told:
                    self._refused_told = True
                    if self._on_refused is not None:
                        self._on_refused(self.node_id)
                if isinstance(exc, TimeoutError) and not self._warned:
                    self._warned = True
                    log.warning(
                        "connecting to node %d at %s:%d timed out after %.1f s",
                        self.node_id,
                        self.host,
                        self.port,
                        self.connect_timeout_s,
                    )
                if isinstance(exc, ssl.SSLError) and not self._warned:
                    self._warned = True
                    log.warning(
                        "TLS handshake with node %d at %s:%d failed: %s",
                        self.node_id,
                        self.host,
                        self.port,
                        exc,
                    )
                await self._pause(backoff, pokeable=not isinstance(exc, ssl.SSLError))
                backoff = min(backoff * 2, 0.5)
                continue
            if connection is None:
                continue  # the peer is back while the attempt hung
            reader, writer = connection
            if self._credentials is not None:
                try:
                    await asyncio.wait_for(
                        authenticate(reader, writer, *self._credentials), AUTH_TIMEOUT_S
                    )
                    if self._directories is not None:
                        await asyncio.wait_for(
                            exchange_directories(reader, writer, self._directories, self.node_id),
                            AUTH_TIMEOUT_S,
                        )
                except (OSError, TimeoutError, asyncio.IncompleteReadError, AuthError) as exc:
                    if not self._warned:
                        self._warned = True
                        log.warning(
                            "authenticating to node %d at %s:%d failed: %s",
                            self.node_id,
                            self.host,
                            self.port,
                            exc,
                        )
                    writer.close()
                    await self._pause(backoff, pokeable=False)
                    backoff = min(backoff * 2, 0.5)
                    continue
            self._warned = False
            self._refused_told = False
            backoff = 0.05
            self.connected = True
            self._transport = writer.transport
            self._connected_at = asyncio.get_running_loop().time()
            drain_reader = asyncio.create_task(self._discard(reader))
            # A closed connection is noticed at once, not at the next send: the reconnect
            # then tells whether the peer's process is gone.
            drain_reader.add_done_callback(lambda t: None if t.cancelled() else self._wake())
            try:
                while True:
                    buffers = await self._queue.get()
                    if buffers is None:
                        if drain_reader.done():
                            break
                        continue  # a wake-up meant for an earlier connection
                    write_buffers(writer, buffers)
                    if self._queue.empty() or writer.transport.get_write_buffer_size() > (4 << 20):
                        await writer.drain()
                    if drain_reader.done():
                        break
            except (ConnectionError, OSError):
                pass
            finally:
                self.connected = False
                self._transport = None
                drain_reader.cancel()
                while not self._queue.empty():
                    self._queue.get_nowait()
                writer.close()

    def _wake(self) -> None:
        try:
            self._queue.put_nowait(None)
        except asyncio.QueueFull:
            pass  # the sender is busy and sees drain_reader done after its next write

    @staticmethod
    async def _discard(reader: asyncio.StreamReader) -> None:
        # Peers never answer one-way frames; a read returning b"" means the link closed.
        try:
            while await reader.read(65536):
                pass
        except OSError:
            pass  # reset: closed too


class AuthError(Exception):
    """The peer refused our credentials, or did not prove it holds our verifier."""


async def authenticate(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, principal: str, secret: str
) -> str:
    """Client side of the SCRAM exchange on an asyncio stream; returns the principal kind."""
    client = scram.ScramClient(principal, secret)

    async def step(correlation_id: int, auth_bytes: bytes) -> AuthenticateResponse:
        return await _auth_step(reader, writer, correlation_id, scram.MECHANISM, auth_bytes)

    try:
        first = await step(1, client.first_message())
        final = await step(2, client.final_message(first.auth_bytes))
        client.verify_server_final(final.auth_bytes)
    except (scram.ScramError, DecodeError, FrameError, ValueError) as exc:
        raise AuthError(str(exc)) from exc
    return final.principal_kind


def _send_auth(
    writer: asyncio.StreamWriter, correlation_id: int, mechanism: str, auth_bytes: bytes
) -> None:
    body, _ = encode(AuthenticateRequest(mechanism=mechanism, auth_bytes=auth_bytes))
    write_buffers(
        writer, encode_frame(int(ApiKey.AUTHENTICATE), API_VERSION, correlation_id, "", body)
    )


async def _auth_step(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    correlation_id: int,
    mechanism: str,
    auth_bytes: bytes,
) -> AuthenticateResponse:
    _send_auth(writer, correlation_id, mechanism, auth_bytes)
    await writer.drain()
    frame = await read_frame(reader, DEFAULT_MAX_FRAME_BYTES)
    if frame.api_key == ApiKey.ERROR:
        err = decode_body(ErrorResponse, frame.body)
        raise AuthError(f"{ErrorCode(err.error).name}: {err.error_message}")
    resp = decode_body(AuthenticateResponse, frame.body)
    if resp.error != ErrorCode.NONE:
        raise AuthError(f"{ErrorCode(resp.error).name}: {resp.error_message}")
    return resp


async def exchange_directories(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    dirs: DirectoryIds,
    peer: int,
) -> None:
    """Client side of the data-directory exchange (see ``directories``), right after
    authenticating as a node: learn whether this node's directory replaced a lost one
    (marked durably before the acknowledgement), and record the peer's id."""
    try:
        resp = await _auth_step(
            reader,
            writer,
            3,
            directories.DIRECTORY_MECHANISM,
            directories.encode_statement(dirs.own, dirs.remembered(peer)),
        )
        theirs, remembered = directories.decode_statement(resp.auth_bytes)
    except (DecodeError, FrameError, ValueError) as exc:
        raise AuthError(f"directory exchange: {exc}") from exc
    dirs.check_own(peer, remembered)
    dirs.learn(peer, theirs)  # it answered only once its own mark (if any) was durable
    _send_auth(writer, 4, directories.DIRECTORY_ACK_MECHANISM, b"")
    await writer.drain()
