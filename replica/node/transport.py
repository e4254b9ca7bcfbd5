"""Asyncio transport: a server whose connections answer requests in order while several are
in flight (pipelining with a bound, for back-pressure), and one-way links to peers."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from .. import defaults
from ..protocol import (
    API_VERSION,
    DEFAULT_MAX_FRAME_BYTES,
    PREFIX,
    ApiKey,
    DecodeError,
    ErrorCode,
    Frame,
    FrameError,
    decode_body,
    decode_frame,
    encode,
    encode_frame,
    frame_length,
    scram,
)
from ..protocol.messages import RAFT_KEYS, AuthenticateRequest, AuthenticateResponse, ErrorResponse
from . import eager
from .directories import (
    DIRECTORY_ACK_MECHANISM,
    DIRECTORY_MECHANISM,
    DirectoryIds,
    decode_statement,
    encode_statement,
)
from .problems import BAD, DENIED, FAILED, REFUSED, ConnectionProblems, LogBudget, WireStats, short
from .security import NODE_ONLY, AuthConfig, ForgedSender, Principal, authorize

log = logging.getLogger(__name__)

# A peer's raft frames are applied back to back while they are in the buffer, which keeps
# a busy node's steps together (one journal write, one frame per peer for all of them),
# but for at most this long before the event loop's other work gets a turn: a burst
# from one peer (thousands of partitions' messages when a node restarts) held a node for
# most of a second at a time, and with other work for over a fetch timeout: its other
# peers took it for silent.
RAFT_TURN_S = 0.05

# A handler gets a frame and returns (api key, response message) or None for one-way frames.
Handler = Callable[[Frame], Awaitable[tuple[int, Any] | None]]
# A raft frame and the node id its connection authenticated as. Raises DecodeError for a
# malformed frame, ForgedSender for a message that claims another sender.
OneWay = Callable[[Frame, int], None]

MAX_IN_FLIGHT = defaults.CONNECTION_MAX_IN_FLIGHT
# A client gets this long to finish the SCRAM exchange after connecting.
AUTH_TIMEOUT_S = 10.0
# A connection yields to the event loop after this many frames read without waiting.
YIELD_EVERY_FRAMES = 64


# An oversized frame whose meta is at most this long is read past and answered.
MAX_SKIPPED_META_BYTES = 64 << 10
# A connection's reader stops reading from its socket past this many unread bytes.
READ_LIMIT = 1 << 20

#: The principal (None: not authenticated) and the peer address of the connection whose
#: request a handler task is answering (a Kafka envelope is authorized with it).
REQUEST_PRINCIPAL: contextvars.ContextVar[tuple[Principal | None, str]] = contextvars.ContextVar(
    "request_principal", default=(None, "")
)


async def start_server(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
) -> asyncio.Server:
    """``asyncio.start_server``, each connection read through a ``FrameReader``."""
    loop = asyncio.get_running_loop()

    def connection() -> asyncio.StreamReaderProtocol:
        return asyncio.StreamReaderProtocol(FrameReader(READ_LIMIT, loop), serve, loop=loop)

    return await loop.create_server(connection, host, port, ssl=ssl_context)


class FrameReader(asyncio.StreamReader):
    """A StreamReader for frames that keeps what the socket gives as it comes (one
    bytes object per read) instead of copying it into one growing buffer, and hands out
    ``readexactly(n)`` as one slice or join of those: every byte is copied once after
    the socket's own read, not three times (into the buffer, into a slice of it, into
    bytes), and not at all when one read holds exactly the bytes asked for. Only the
    methods a connection uses are its own (``readexactly``, ``read``, ``at_eof``);
    everything else reads the base class's empty buffer."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self._chunks: deque[bytes] = deque()
        self._size = 0  # unread bytes in _chunks
        self._head = 0  # bytes of _chunks[0] already read

    def feed_data(self, data: bytes) -> None:
        assert not self._eof, "feed_data after feed_eof"
        if not data:
            return
        self._chunks.append(bytes(data))  # (a bytes object already: no copy)
        self._size += len(data)
        self._wakeup_waiter()
        if self._transport is not None and not self._paused and self._size > 2 * self._limit:
            try:
                self._transport.pause_reading()
            except NotImplementedError:
                self._transport = None
            else:
                self._paused = True

    def _maybe_resume_transport(self) -> None:
        if self._paused and self._size <= self._limit:
            self._paused = False
            self._transport.resume_reading()

    def at_eof(self) -> bool:
        return self._eof and not self._size

    async def readexactly(self, n: int) -> bytes:
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        while self._size < n:
            if self._eof:
                raise asyncio.IncompleteReadError(self._take(self._size), n)
            await self._wait_for_data("readexactly")
        data = self._take(n)
        self._maybe_resume_transport()
        return data

    async def read(self, n: int = -1) -> bytes:
        if self._exception is not None:
            raise self._exception
        if n < 0:
            raise ValueError("a FrameReader reads at most n bytes")
        if n == 0:
            return b""
        if not self._size and not self._eof:
            await self._wait_for_data("read")
        data = self._take(min(n, self._size))
        self._maybe_resume_transport()
        return data

    def _take(self, n: int) -> bytes:
        """The next ``n`` unread bytes (at most ``_size``)."""
        chunks = self._chunks
        parts: list[bytes] = []
        left = n
        while left:
            first = chunks[0]
            head = self._head
            room = len(first) - head
            if room <= left:
                parts.append(first if head == 0 else first[head:])
                chunks.popleft()
                self._head = 0
                left -= room
            else:
                parts.append(first[head : head + left])
                self._head = head + left
                left = 0
        self._size -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)


class OversizedFrame(FrameError):
    """A frame over the limit that was read past (its payload discarded unread), so the
    stream is still in sync: answer MESSAGE_TOO_LARGE and keep the connection."""

    def __init__(self, message: str, frame: Frame) -> None:
        super().__init__(message, ErrorCode.MESSAGE_TOO_LARGE)
        self.frame = frame


async def read_frame(
    reader: asyncio.StreamReader, max_frame_bytes: int, *, skip_oversized: bool = False
) -> Frame:
    prefix = await reader.readexactly(PREFIX.size)
    try:
        total, meta_len = frame_length(prefix, max_frame_bytes)
    except FrameError as exc:
        if not skip_oversized or exc.error_code != ErrorCode.MESSAGE_TOO_LARGE:
            raise
        total, meta_len = PREFIX.unpack(prefix)
        if meta_len > min(MAX_SKIPPED_META_BYTES, total - 4):
            raise
        # A too-large produce (e.g. one record batch over every limit) is answered rather
        # than met with a reset the client would take for a network fault and retry.
        frame = decode_frame(await reader.readexactly(meta_len), meta_len)
        left = total - 4 - meta_len
        while left > 0:
            chunk = await reader.read(min(left, 1 << 20))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", left) from None
            left -= len(chunk)
        raise OversizedFrame(str(exc), frame) from None
    rest = await reader.readexactly(total - 4)
    return decode_frame(rest, meta_len)


def write_buffers(writer: asyncio.StreamWriter, buffers: list[bytes | memoryview]) -> None:
    """Queue a frame's buffers on ``writer`` without joining them: Python 3.11's
    ``writelines`` copies them into one bytes object (a whole record batch), ``write``
    sends each from where it is and copies only what the socket does not take at once."""
    for buf in buffers:
        writer.write(buf)


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


def error_frame(correlation_id: int, code: ErrorCode, message: str) -> list[bytes | memoryview]:
    body, _ = encode(ErrorResponse(error=int(code), error_message=message))
    return encode_frame(int(ApiKey.ERROR), API_VERSION, correlation_id, "", body)


def _auth_frame(correlation_id: int, response: AuthenticateResponse) -> list[bytes | memoryview]:
    body, _ = encode(response)
    return encode_frame(int(ApiKey.AUTHENTICATE), API_VERSION, correlation_id, "", body)


async def cancel_answers(pending: asyncio.Queue[Any], responder: asyncio.Task[None]) -> None:
    """End a connection's answering: cancel its responder (and the request it awaits) and
    every request still queued for it (a task, a (correlation id, task) pair or None)."""
    responder.cancel()
    while not pending.empty():
        item = pending.get_nowait()
        task = item[1] if isinstance(item, tuple) else item
        if task is not None:
            task.cancel()
    await asyncio.gather(responder, return_exceptions=True)


class _Queued:
    """How many of a connection's requests are queued for its responder, not written yet."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def _answer_buffers(
    correlation_id: int,
    handled: asyncio.Future[tuple[int, Any] | None],
    peer: object,
    problems: ConnectionProblems,
) -> list[Any] | None:
    """The frame answering a request whose handling is done (it failed: an error frame;
    None: a one-way request, nothing)."""
    exc = handled.exception()
    if exc is not None:
        problems.note(FAILED, "failed", "request from %s failed", peer, exc_info=exc)
        return error_frame(
            correlation_id, ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
        )
    result = handled.result()
    if result is None:
        return None
    api_key, response = result
    body, payload = encode(response)
    return encode_frame(api_key, API_VERSION, correlation_id, "", body, payload)


async def _denied(code: ErrorCode, message: str) -> tuple[int, Any]:
    return int(ApiKey.ERROR), ErrorResponse(error=int(code), error_message=message)


async def _ready(api_key: int, response: Any) -> tuple[int, Any]:
    return api_key, response


class Server:
    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        one_way: OneWay,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        auth: AuthConfig | None = None,
        node_auth: AuthConfig | None = None,
        directories: DirectoryIds | None = None,
    ) -> None:
        """``auth``: every connection authenticates first (secure cluster). ``node_auth``
        (plaintext cluster): a connection may authenticate first as one of these node
        principals; the others stay anonymous clients. Either way, raft frames are applied
        only from a connection authenticated as a node, and only if they claim that node.
        ``directories``: a node connection may then exchange data-directory ids (see
        ``directories``); that step runs before any later frame of the connection."""
        self.host = host
        self.port = port
        self._handler = handler
        self._one_way = one_way
        self._max_frame = max_frame_bytes
        self._ssl = ssl_context
        self._auth = auth
        self._node_auth = node_auth if auth is None else None
        self.directories = directories  # set by the node once its data dir is checked
        # Called with a node's id when a connection authenticates as that node.
        self.on_node: Callable[[int], None] | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.stats = WireStats()
        self._budget = LogBudget()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def start(self) -> None:
        self._server = await start_server(self._serve, self.host, self.port, self._ssl)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _authenticate_in_time(
        self,
        auth: AuthConfig,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: object,
        first: Frame | None,
    ) -> Principal | None:
        try:
            return await asyncio.wait_for(
                self._authenticate(auth, reader, writer, peer, first), AUTH_TIMEOUT_S
            )
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, FrameError):
            self._budget.log(
                logging.WARNING, "connection from %s closed before authenticating", peer
            )
        except asyncio.CancelledError:
            pass
        except Exception:
            self._budget.log(logging.ERROR, "authentication of %s failed", peer, exc_info=True)
        return None

    def _authenticated(self, principal: Principal) -> None:
        if principal.kind == "node" and principal.node_id is not None and self.on_node is not None:
            self.on_node(principal.node_id)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        peer = writer.get_extra_info("peername")
        principal: Principal | None = None
        if self._auth is not None:
            principal = await self._authenticate_in_time(self._auth, reader, writer, peer, None)
            if principal is None:
                await self._close(writer)
                self._conns.discard(task)
                return
            self._authenticated(principal)
        problems = ConnectionProblems(peer, self.stats, self._budget)
        peer_host = f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""
        # This connection's task has a context of its own; its handler tasks copy it.
        REQUEST_PRINCIPAL.set((principal, peer_host))
        pending: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, Any] | None]] | None] = (
            asyncio.Queue(MAX_IN_FLIGHT)
        )
        queued = _Queued()
        responder = asyncio.create_task(self._respond(pending, writer, peer, problems, queued))

        async def respond_to(correlation_id: int, handling: asyncio.Future[Any]) -> None:
            """A request's answer, written now if it is ready and none is queued before
            it (a Metadata answer in the turn its request was read), else queued."""
            if handling.done() and queued.n == 0:
                if handling.cancelled():
                    return
                buffers = _answer_buffers(correlation_id, handling, peer, problems)
                if buffers is not None:
                    try:
                        write_buffers(writer, buffers)
                        await writer.drain()
                    except RuntimeError as exc:  # the transport closed under the write
                        raise ConnectionError(str(exc)) from exc
                return
            queued.n += 1
            await pending.put((correlation_id, handling))

        async def deny(correlation_id: int, code: ErrorCode, message: str) -> None:
            await respond_to(correlation_id, eager.start(_denied(code, message)))

        frames = 0
        raft_busy_s = 0.0  # time applying raft frames since this connection last yielded
        stated_directory: str | None = None  # the directory id the peer node stated
        stopping = False
        try:
            while True:
                try:
                    frame = await read_frame(reader, self._max_frame, skip_oversized=True)
                except OversizedFrame as exc:
                    log.info("answered an oversized frame from %s: %s", peer, exc)
                    if exc.frame.api_key not in RAFT_KEYS:
                        await deny(exc.frame.correlation_id, ErrorCode.MESSAGE_TOO_LARGE, str(exc))
                    continue
                except FrameError as exc:
                    # The stream cannot be re-synchronised after a bad prefix: answer, then close.
                    problems.note(BAD, "frame", "closing connection from %s: %s", peer, exc)
                    write_buffers(writer, error_frame(0, exc.error_code, str(exc)))
                    break
                frames += 1
                if frames % YIELD_EVERY_FRAMES == 0:
                    # Frames already buffered are read without suspending: let the ticks and
                    # the other connections run during a long pipelined burst.
                    await asyncio.sleep(0)
                if frame.api_key == ApiKey.AUTHENTICATE:
                    if frames == 1 and self._node_auth is not None:
                        principal = await self._authenticate_in_time(
                            self._node_auth, reader, writer, peer, frame
                        )
                        if principal is None:
                            break
                        self._authenticated(principal)
                        REQUEST_PRINCIPAL.set((principal, peer_host))
                        continue
                    handled, stated_directory, reply = self._directory_step(
                        frame, principal, stated_directory
                    )
                    if handled:
                        if reply is not None:
                            answer = _ready(int(ApiKey.AUTHENTICATE), reply)
                            await respond_to(frame.correlation_id, eager.start(answer))
                        continue
                    await deny(
                        frame.correlation_id,
                        ErrorCode.ILLEGAL_SASL_STATE,
                        "already authenticated"
                        if principal is not None
                        else "authentication is not enabled on this listener"
                        if self._node_auth is None
                        else "authentication must be the first request",
                    )
                    continue
                if frame.api_key in NODE_ONLY and (principal is None or principal.kind != "node"):
                    await deny(
                        frame.correlation_id,
                        ErrorCode.AUTHORIZATION_FAILED,
                        f"{_api_name(frame.api_key)}: only a node principal may call it",
                    )
                    continue
                if self._auth is not None and principal is not None:
                    why = authorize(principal, frame)
                    if why is not None:
                        api = _api_name(frame.api_key)
                        is_raft = frame.api_key in RAFT_KEYS
                        problems.note(
                            REFUSED if is_raft else DENIED,
                            f"denied {api}",
                            "denied %s to principal %r (%s) from %s: %s",
                            api,
                            principal.name,
                            principal.kind,
                            peer,
                            why,
                        )
                        if is_raft:
                            continue
                        await deny(
                            frame.correlation_id, ErrorCode.AUTHORIZATION_FAILED, f"{api}: {why}"
                        )
                        continue
                if frame.api_key in RAFT_KEYS:
                    began = time.monotonic()
                    self._raft(frame, principal, peer, problems)
                    raft_busy_s += time.monotonic() - began
                    if raft_busy_s >= RAFT_TURN_S:
                        # The next frames may be in the buffer already: the loop's other
                        # work (the tick and its heartbeats, other peers) runs first.
                        raft_busy_s = 0.0
                        await asyncio.sleep(0)
                    continue
                await respond_to(frame.correlation_id, eager.start(self._handler(frame)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # The node stops (``close``): nobody answers what is in flight any more (its
            # ticks end), so cancel it rather than wait for it.
            stopping = True
        except Exception:
            self._budget.log(logging.ERROR, "connection from %s failed", peer, exc_info=True)
        finally:
            if stopping:
                await cancel_answers(pending, responder)
            else:
                # The client closed its side: what it asked is still answered.
                try:
                    await asyncio.wait_for(pending.put(None), 5)
                    await asyncio.wait_for(responder, 30)
                except (TimeoutError, asyncio.CancelledError):
                    await cancel_answers(pending, responder)
            problems.close()
            writer.close()
            self._conns.discard(task)

    def _directory_step(
        self, frame: Frame, principal: Principal | None, stated: str | None
    ) -> tuple[bool, str | None, AuthenticateResponse | None]:
        """The data-directory exchange of a node connection (see ``directories``):
        (handled, the directory id the peer stated, the answer to send or None)."""
        dirs = self.directories
        if dirs is None or principal is None or principal.kind != "node":
            return False, stated, None
        node = principal.node_id
        if node is None:
            return False, stated, None
        try:
            req = decode_body(AuthenticateRequest, frame.body, b"")
        except DecodeError:
            return False, stated, None
        if req.mechanism == DIRECTORY_MECHANISM and stated is None:
            try:
                own, remembered = decode_statement(req.auth_bytes)
            except (ValueError, UnicodeDecodeError) as exc:
                code = int(ErrorCode.ILLEGAL_SASL_STATE)
                return (
                    True,
                    stated,
                    AuthenticateResponse(error=code, error_message=str(exc), auth_bytes=b""),
                )
            # Durably marked (if replaced) before the answer and before any raft frame.
            dirs.check_own(node, remembered)
            return (
                True,
                own,
                AuthenticateResponse(
                    error=0,
                    error_message="",
                    auth_bytes=encode_statement(dirs.own, dirs.remembered(node)),
                    principal_kind=principal.kind,
                ),
            )
        if req.mechanism == DIRECTORY_ACK_MECHANISM and stated is not None:
            # The peer sends this only once any replacement mark of its own is durable.
            dirs.learn(node, stated)
            return True, stated, None
        return False, stated, None

    def _raft(
        self, frame: Frame, principal: Principal | None, peer: object, problems: ConnectionProblems
    ) -> None:
        """Apply a raft frame only as the node this connection proved to be."""
        sender = principal.node_id if principal is not None and principal.kind == "node" else None
        if sender is None:
            problems.note(
                REFUSED,
                "unauthenticated",
                "refused raft traffic from %s: the connection did not authenticate as a node%s",
                peer,
                ""
                if principal is None
                else f" (node principal {principal.name!r} has no node id: give it one in the "
                "auth config)",
            )
            return
        try:
            self._one_way(frame, sender)
        except ForgedSender as exc:
            problems.note(
                REFUSED,
                "forged",
                "refused raft message from %s, authenticated as node %d: %s",
                peer,
                sender,
                exc,
            )
        except DecodeError as exc:
            problems.note(
                BAD, "raft", "bad raft frame from %s (node %d): %s", peer, sender, short(exc)
            )
        except Exception as exc:
            # Not a decoding problem: the node failed on a message it decoded. Show where once.
            problems.note(
                BAD,
                "raft-failed",
                "raft message from %s (node %d) failed: %s",
                peer,
                sender,
                short(exc),
                exc_info=True,
            )

    @staticmethod
    async def _close(writer: asyncio.StreamWriter) -> None:
        try:
            await writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        writer.close()

    async def _authenticate(
        self,
        auth: AuthConfig,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: object,
        first_frame: Frame | None,
    ) -> Principal | None:
        """The SCRAM exchange: client-first -> server-first, client-final -> server-final.
        Anything else first is ILLEGAL_SASL_STATE. Returns the principal, or None after
        answering the failure (the caller closes the connection). ``first_frame``: the
        client-first message, if the caller already read it."""
        name = "?"

        def fail(cid: int, code: ErrorCode, message: str, why: str) -> None:
            self._budget.log(
                logging.WARNING,
                "authentication failed for principal %r from %s: %s",
                name,
                peer,
                why,
            )
            write_buffers(
                writer,
                _auth_frame(
                    cid,
                    AuthenticateResponse(error=int(code), error_message=message, auth_bytes=b""),
                ),
            )

        frame = first_frame or await read_frame(reader, self._max_frame)
        if frame.api_key != ApiKey.AUTHENTICATE:
            self._budget.log(
                logging.WARNING,
                "connection from %s sent %s before authenticating; closing",
                peer,
                _api_name(frame.api_key),
            )
            write_buffers(
                writer,
                error_frame(
                    frame.correlation_id,
                    ErrorCode.ILLEGAL_SASL_STATE,
                    "this listener requires authentication (SCRAM-SHA-256) before any request",
                ),
            )
            return None
        entry: tuple[Principal, scram.Verifier] | None = None

        def verifier_for(principal: str) -> scram.Verifier:
            nonlocal entry, name
            name = principal
            entry = auth.credential(principal, scram.SCRAM_SHA_256)
            return entry[1] if entry else auth.decoy(principal, scram.SCRAM_SHA_256)

        try:
            first = decode_body(AuthenticateRequest, frame.body, b"")
            if first.mechanism != scram.MECHANISM:
                raise scram.ScramError(f"unsupported mechanism {first.mechanism!r}")
            session = scram.ScramServerSession(first.auth_bytes, verifier_for)
        except (DecodeError, scram.ScramError) as exc:
            fail(frame.correlation_id, ErrorCode.ILLEGAL_SASL_STATE, str(exc), str(exc))
            return None
        write_buffers(
            writer,
            _auth_frame(
                frame.correlation_id,
                AuthenticateResponse(error=0, error_message="", auth_bytes=session.first_message()),
            ),
        )
        frame = await read_frame(reader, self._max_frame)
        if frame.api_key != ApiKey.AUTHENTICATE:
            fail(
                frame.correlation_id,
                ErrorCode.ILLEGAL_SASL_STATE,
                "expected the SCRAM client-final message",
                f"sent {_api_name(frame.api_key)} mid-exchange",
            )
            return None
        try:
            final = decode_body(AuthenticateRequest, frame.body, b"")
            server_final = session.verify_client_final(final.auth_bytes)
        except (DecodeError, scram.ScramError) as exc:
            why = "unknown principal" if entry is None else str(exc)
            fail(
                frame.correlation_id,
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                "authentication failed: unknown principal or wrong secret",
                why,
            )
            return None
        assert entry is not None
        principal = entry[0]
        write_buffers(
            writer,
            _auth_frame(
                frame.correlation_id,
                AuthenticateResponse(
                    error=0,
                    error_message="",
                    auth_bytes=server_final,
                    principal_kind=principal.kind,
                ),
            ),
        )
        log.debug("authenticated %r (%s) from %s", principal.name, principal.kind, peer)
        return principal

    async def _respond(
        self,
        pending: asyncio.Queue[tuple[int, asyncio.Future[tuple[int, Any] | None]] | None],
        writer: asyncio.StreamWriter,
        peer: object,
        problems: ConnectionProblems,
        queued: _Queued,
    ) -> None:
        while True:
            item = await pending.get()
            if item is None:
                return
            correlation_id, task = item
            try:
                await task
            except asyncio.CancelledError:
                return
            except Exception:
                pass  # answered below, from the task
            buffers = _answer_buffers(correlation_id, task, peer, problems)
            try:
                if buffers is not None:
                    write_buffers(writer, buffers)
                    await writer.drain()
            except (ConnectionError, RuntimeError):
                return
            finally:
                queued.n -= 1
