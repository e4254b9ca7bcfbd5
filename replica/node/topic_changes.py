"""Topic changes and node registrations asked of any node, decided by the metadata
controller.

The Kafka listener's admin APIs (CreateTopics, DeleteTopics, CreatePartitions,
AlterConfigs, IncrementalAlterConfigs) come here. On the metadata leader they are decided
at once; another node forwards the native request to the leader and answers what it
answers, as Kafka's brokers forward admin requests to the controller (KIP-590). Admin
clients do not all go to the controller themselves: kafka-python's and the Java client's
AlterConfigs go to any node and do not retry NOT_CONTROLLER elsewhere.

One hop only: the leader's native API decides and never forwards. When the leader is
unknown, is this node, or cannot be reached in time, the answer stays the local one,
NOT_LEADER (Kafka's NOT_CONTROLLER, which clients retry after refreshing Metadata).

A node registering itself (``serve --join``, or any node at start) is forwarded the same
way, as this node's principal: the leader takes registrations from nodes only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from ..constants import UNKNOWN
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
)
from ..protocol import messages as m
from ..protocol.messages import ErrorResponse
from .config import NodeConfig
from .controller import MetadataController
from .nodes import NodeBook
from .peers import CONNECT_TIMEOUT_S, AuthError, authenticate
from .security import peer_client_context
from .transport import AUTH_TIMEOUT_S, read_frame, write_buffers

log = logging.getLogger(__name__)

_R = TypeVar(
    "_R",
    m.CreateTopicResponse,
    m.AlterTopicResponse,
    m.DeleteTopicResponse,
    m.RegisterNodeResponse,
)
_A = TypeVar("_A", bound=m.Response)
# After the two SCRAM steps (correlation ids 1 and 2) of ``peers.authenticate``.
_CORRELATION_ID = 3


class TopicChanges:
    """``create_topic``, ``alter_topic`` and ``delete_topic`` decided by the metadata
    leader, wherever they are asked, and ``register_node``. ``credentials``: the node
    principal this node forwards topic changes as where the leader's listener
    authenticates clients (None: it does not); ``node_credentials``: the one it forwards
    registrations as (always)."""

    def __init__(
        self,
        controller: MetadataController,
        config: NodeConfig,
        credentials: tuple[str, str] | None,
        book: NodeBook,
        *,
        node_credentials: tuple[str, str] | None = None,
    ) -> None:
        self.controller = controller
        self.config = config
        self.credentials = credentials
        self.node_credentials = node_credentials
        self.book = book
        # Connections kept to other nodes (``ask_node``), one request at a time each.
        self._links: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self._node_locks: dict[int, asyncio.Lock] = {}
        # Connecting, authenticating, then the leader's own commit deadline.
        self.timeout_s = CONNECT_TIMEOUT_S + AUTH_TIMEOUT_S + config.produce_timeout_ms / 1000

    async def create_topic(self, req: m.CreateTopicRequest) -> m.CreateTopicResponse:
        resp = await self.controller.create_topic(req)
        return await self._or_forwarded(resp, ApiKey.CREATE_TOPIC, req)

    async def alter_topic(self, req: m.AlterTopicRequest) -> m.AlterTopicResponse:
        resp = await self.controller.alter_topic(req)
        return await self._or_forwarded(resp, ApiKey.ALTER_TOPIC, req)

    async def delete_topic(self, req: m.DeleteTopicRequest) -> m.DeleteTopicResponse:
        resp = await self.controller.delete_topic(req)
        return await self._or_forwarded(resp, ApiKey.DELETE_TOPIC, req)

    async def register_node(self, req: m.RegisterNodeRequest) -> m.RegisterNodeResponse:
        resp = await self.controller.register_node(req)
        return await self._or_forwarded(
            resp, ApiKey.REGISTER_NODE, req, credentials=self.node_credentials
        )

    async def ask_node(self, node_id: int, api_key: ApiKey, req: object, answer: type[_A]) -> _A:
        """One native request to node ``node_id`` as this node's principal (a transaction
        coordinator's markers to a partition's leader), on a connection kept for the next
        (one request at a time per node). Raises OSError, TimeoutError, AuthError,
        FrameError or DecodeError if it gets no answer in time; the connection is then
        dropped."""
        if node_id not in self.book.native:
            raise OSError(f"node {node_id} has no known address")
        lock = self._node_locks.setdefault(node_id, asyncio.Lock())
        async with lock, asyncio.timeout(self.timeout_s):
            link = self._links.pop(node_id, None)
            try:
                if link is None:
                    link = await self._connect(node_id, self.node_credentials)
                result = await self._exchange(*link, api_key, req, answer)
            except BaseException:
                if link is not None:
                    link[1].close()
                raise
            self._links[node_id] = link
            return result

    async def close(self) -> None:
        for _, writer in self._links.values():
            writer.close()
        self._links.clear()

    async def _or_forwarded(
        self,
        local: _R,
        api_key: ApiKey,
        req: object,
        *,
        credentials: tuple[str, str] | None = None,
    ) -> _R:
        """``local`` unless it says this node does not lead the metadata log and another
        node does: then that node's answer (or ``local`` if it gave none in time)."""
        if local.error != ErrorCode.NOT_LEADER:
            return local
        leader = self.controller.leader_id()
        if leader == UNKNOWN or leader == self.config.node_id or leader not in self.book.native:
            return local
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._ask(
                    leader, api_key, req, type(local), credentials or self.credentials
                )
        except (OSError, TimeoutError, AuthError, FrameError, DecodeError) as exc:
            log.warning(
                "could not forward %s to the metadata leader (node %d): %s",
                api_key.name,
                leader,
                exc or type(exc).__name__,
            )
            return local

    async def _ask(
        self,
        leader: int,
        api_key: ApiKey,
        req: object,
        answer: type[_A],
        credentials: tuple[str, str] | None,
    ) -> _A:
        """One request on a connection of its own to node ``leader``'s native listener,
        reached as its raft links reach it, authenticated as ``credentials`` if any."""
        reader, writer = await self._connect(leader, credentials)
        try:
            return await self._exchange(reader, writer, api_key, req, answer)
        finally:
            writer.close()

    async def _connect(
        self, node_id: int, credentials: tuple[str, str] | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        voter_host, voter_port = self.book.native[node_id]
        host, port = self.config.peer_addresses.get(node_id, (voter_host, voter_port))
        tls = peer_client_context(self.config.tls) if self.config.tls else None
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=voter_host if tls is not None else None
        )
        try:
            if credentials is not None:
                await authenticate(reader, writer, *credentials)
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        api_key: ApiKey,
        req: object,
        answer: type[_A],
    ) -> _A:
        body, payload = encode(req)
        client_id = f"node-{self.config.node_id}"
        write_buffers(
            writer,
            encode_frame(int(api_key), API_VERSION, _CORRELATION_ID, client_id, body, payload),
        )
        await writer.drain()
        frame = await read_frame(reader, DEFAULT_MAX_FRAME_BYTES)
        if frame.api_key == ApiKey.ERROR:
            refused = decode_body(ErrorResponse, frame.body)
            return answer(error=refused.error, error_message=refused.error_message)
        return decode_body(answer, frame.body, frame.payload)
