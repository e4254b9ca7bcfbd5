"""The Kafka listener's server: accepts Kafka connections, runs each connection's SASL
exchange (``auth``) where the node authenticates clients, and answers every request
through the node's ``KafkaDispatch`` in the order it came (clients pipeline them)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from ..kafka import messages as km
from ..kafka.codec import decode_request, decode_request_header, encode_response
from ..kafka.wire import FrameDecoder, KafkaDecodeError, frame
from ..node import eager
from ..node.problems import LogBudget
from ..node.security import AuthConfig
from ..node.transport import AUTH_TIMEOUT_S, cancel_answers, start_server
from .auth import KafkaSasl, SaslStateError
from .dispatch import KafkaDispatch

log = logging.getLogger(__name__)

#: A connection's requests read ahead of their answers: at most this many, and no more
#: once those being handled hold this many bytes. A producer under a backlog pipelines
#: thousands of small requests (librdkafka's max.in.flight is a million): read a few
#: dozen at a time, each round of appends took only those, so the records committed
#: per round fell with the requests' size, answers came later, the producer's queue
#: stayed full and its requests small (24k records/s over 64 partitions). Read all at
#: once, one round appends them together.
PIPELINE_REQUESTS = 8192
PIPELINE_BYTES = 64 << 20


class KafkaServer:
    """Accepts Kafka connections; per connection, requests are handled concurrently and
    answered in the order they came (clients pipeline them). ``ssl_context``: serve TLS;
    ``auth``: every connection authenticates (SASL/SCRAM) before anything but
    ApiVersions, one request at a time, within ``AUTH_TIMEOUT_S``."""

    def __init__(
        self,
        dispatch: KafkaDispatch,
        host: str,
        port: int,
        max_frame: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        auth: AuthConfig | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.host = host
        self.port = port
        self.max_frame = max_frame
        self.ssl_context = ssl_context
        self.auth = auth
        self._budget = LogBudget()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        # For the node's metrics (metrics.py): requests refused by reason (with the
        # dispatch's, which counts those it could not answer).
        self.rejected = dispatch.rejected
        self._answer = dispatch.answer

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    async def start(self) -> None:
        self._server = await start_server(self._serve, self.host, self.port, self.ssl_context)
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
        peer = writer.get_extra_info("peername")
        # As Kafka shows a client's host in DescribeGroups: "/" and its address.
        client_host = f"/{peer[0]}" if isinstance(peer, tuple) and peer else ""
        # The connection's authentication: None on a node without --auth-config.
        sasl = KafkaSasl(self.auth, peer, self._budget) if self.auth is not None else None
        auth_deadline = asyncio.get_running_loop().time() + AUTH_TIMEOUT_S
        pending: asyncio.Queue[asyncio.Future[bytes | None] | None] = asyncio.Queue(
            maxsize=PIPELINE_REQUESTS
        )
        responder = asyncio.create_task(self._respond(pending, writer))
        frames = FrameDecoder(self.max_frame)
        window = _ByteWindow(PIPELINE_BYTES)
        try:
            while not responder.done():
                if sasl is not None and not sasl.authenticated:
                    left = auth_deadline - asyncio.get_running_loop().time()
                    data = await asyncio.wait_for(reader.read(1 << 20), max(0.0, left))
                else:
                    data = await reader.read(1 << 20)
                if not data:
                    break
                for payload in frames.feed(data):
                    if sasl is not None and not sasl.authenticated:
                        # One request at a time: each may change the state the next meets.
                        if not sasl.failed:
                            for step in self._before_authenticated(sasl, payload):
                                await pending.put(step)
                        continue
                    principal = sasl.principal if sasl is not None else None
                    await window.admit(len(payload))
                    handling = eager.start(self._answer(payload, principal, client_host))
                    handling.add_done_callback(window.releaser(len(payload)))
                    await pending.put(handling)
        except TimeoutError:
            self.rejected["authentication_timeout"] += 1
            self._budget.log(
                logging.WARNING,
                "kafka connection from %s did not authenticate within %.0f s; closing",
                peer,
                AUTH_TIMEOUT_S,
            )
        except KafkaDecodeError as exc:
            self.rejected["malformed"] += 1
            log.info("kafka connection from %s: %s", peer, exc)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            # The client is gone (or the node stops): nobody waits for the answers.
            await cancel_answers(pending, responder)
            writer.close()
            self._conns.discard(task)

    def _before_authenticated(
        self, sasl: KafkaSasl, payload: bytes
    ) -> list[asyncio.Task[bytes | None]]:
        """What answers one request of a connection that has not authenticated yet: its
        answer, then (if the exchange ends the connection) a step that closes it."""
        try:
            if sasl.raw_tokens:
                answer = sasl.raw_token(payload)
                encoded = answer.body if isinstance(answer.body, bytes) else None
            else:
                header, _, _ = decode_request_header(payload)
                if header.api_key == km.API_VERSIONS.key and sasl.allows_api_versions():
                    return [asyncio.create_task(self._answer(payload, None))]
                if header.api_key not in (km.SASL_HANDSHAKE.key, km.SASL_AUTHENTICATE.key):
                    api = km.API_BY_KEY.get(header.api_key)
                    raise sasl.refuse(api.name if api else f"api key {header.api_key}")
                header, api, body = decode_request(payload, trailing_ok=True)
                step = sasl.handshake if api.key == km.SASL_HANDSHAKE.key else sasl.authenticate
                answer = step(header.api_version, body)
                assert isinstance(answer.body, dict)
                encoded = encode_response(
                    api, header.api_version, header.correlation_id, answer.body
                )
        except (KafkaDecodeError, SaslStateError) as exc:
            self.rejected["authentication_failed"] += 1
            return [asyncio.create_task(_close_connection(exc))]
        steps = [asyncio.create_task(_ready(encoded))]
        if answer.close:
            steps.append(asyncio.create_task(_close_connection(SaslStateError(_CLOSED_BY_SASL))))
        return steps

    async def _respond(
        self,
        pending: asyncio.Queue[asyncio.Future[bytes | None] | None],
        writer: asyncio.StreamWriter,
    ) -> None:
        # After a request that cannot be answered the connection closes (the reader then
        # sees its end); requests already queued are cancelled, never left to block it.
        closed = False
        while True:
            item = await pending.get()
            if item is None:
                return
            if closed:
                item.cancel()
                continue
            try:
                answer = await item
            except KafkaDecodeError as exc:
                log.info("kafka request dropped the connection: %s", exc)
                closed = True
            except Exception:
                log.exception("kafka request failed")
                closed = True
            if not closed and answer is not None:
                writer.write(frame(answer))
                if pending.empty():
                    try:
                        await writer.drain()
                    except ConnectionError:
                        closed = True
            if closed:
                writer.close()


class _ByteWindow:
    """The bytes of a connection's requests being handled: a request is admitted while
    they are within ``limit`` (one larger than it alone is admitted once none are)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._room = asyncio.Event()
        self._room.set()

    async def admit(self, size: int) -> None:
        while self.held and self.held + size > self.limit:
            self._room.clear()
            await self._room.wait()
        self.held += size

    def releaser(self, size: int) -> Callable[[object], None]:
        def release(_: object) -> None:
            self.held -= size
            self._room.set()

        return release


_CLOSED_BY_SASL = "the SASL exchange ended the connection"


async def _ready(answer: bytes | None) -> bytes | None:
    return answer


async def _close_connection(why: Exception) -> bytes | None:
    """A step of the responder's queue that closes the connection (after the answers
    queued before it)."""
    raise KafkaDecodeError(str(why))
