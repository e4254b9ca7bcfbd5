"""One Kafka request in, its answer out: decoding, the handler of its API, the principal's
authorization (``auth.TopicGate``), encoding. The Kafka listener (``server``) answers its
connections' requests here, and so does the native listener the Kafka requests it carries
(``KafkaEnvelopeRequest``, as Kafka's Envelope, KIP-590): the native client reaches the
transaction and group coordinators this way, with the principal it authenticated as on
the native listener. Every node has one, with or without a Kafka listener."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from ..kafka import messages as km
from ..kafka.codec import UnsupportedRequest, api_versions_body, decode_request, encode_response
from ..kafka.errors import KafkaError
from ..kafka.schema import Message
from ..kafka.wire import KafkaDecodeError
from ..node.security import Principal
from ..node.transport import REQUEST_PRINCIPAL
from ..protocol import ErrorCode
from ..protocol import messages as m
from .auth import TopicGate
from .groups import REQUEST_CLIENT
from .handlers import SERVED_KEYS, KafkaHandlers

log = logging.getLogger(__name__)


class KafkaDispatch:
    """Answers Kafka requests with ``handlers``. ``rejected``: requests refused, by reason
    (for the node's metrics); ``observe``: told of every answer (API name, perf_counter at
    its start, the answer)."""

    def __init__(self, handlers: KafkaHandlers) -> None:
        self.handlers = handlers
        self.gate = TopicGate(handlers._topic_by_id)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.observe: Callable[[str, float, Message | None], None] | None = None

    def start(self) -> None:
        self.handlers.transactions.start()

    async def close(self) -> None:
        await self.handlers.groups.close()
        await self.handlers.transactions.close()

    async def answer(
        self, payload: bytes, principal: Principal | None, client_host: str = ""
    ) -> bytes | None:
        """The encoded answer to the request ``payload`` (None: a Produce with acks=0).
        ``principal``: who asks (None: a node without ``--auth-config``). Raises
        KafkaDecodeError for a request that cannot be read."""
        try:
            header, api, body = decode_request(payload, trailing_ok=True)
        except UnsupportedRequest as exc:
            self.rejected["unsupported_version"] += 1
            if exc.header.api_key == km.API_VERSIONS.key:
                answer = api_versions_body(0, SERVED_KEYS, KafkaError.UNSUPPORTED_VERSION)
                return encode_response(km.API_VERSIONS, 0, exc.header.correlation_id, answer)
            raise
        REQUEST_CLIENT.set((header.client_id or "", client_host))
        handler = self.handlers.handlers.get(api.key)
        if handler is None:
            self.rejected["unsupported_api"] += 1
            out = api.default_response(header.api_version)
            if "error_code" not in out:
                raise KafkaDecodeError(f"{api.name} is not served and has no error code")
            out["error_code"] = int(KafkaError.UNSUPPORTED_VERSION)
            return encode_response(api, header.api_version, header.correlation_id, out)
        began = time.perf_counter()
        if principal is not None:
            result = await self.gate(principal, api, header.api_version, body, handler)
        else:
            result = await handler(api, header.api_version, body)
        if self.observe is not None:
            self.observe(api.name, began, result)
        if result is None:
            return None
        return encode_response(api, header.api_version, header.correlation_id, result)

    async def envelope(self, req: m.KafkaEnvelopeRequest) -> m.KafkaEnvelopeResponse:
        """A Kafka request the native listener carried, answered for the principal of
        its connection."""
        principal, client_host = REQUEST_PRINCIPAL.get()
        try:
            answer = await self.answer(req.request, principal, client_host)
        except KafkaDecodeError as exc:
            self.rejected["malformed"] += 1
            return m.KafkaEnvelopeResponse(
                error=int(ErrorCode.INVALID_REQUEST), error_message=f"Kafka request: {exc}"
            )
        return m.KafkaEnvelopeResponse(error=0, error_message="", response=answer or b"")
