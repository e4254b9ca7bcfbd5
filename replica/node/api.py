"""The api layer: one small handler per client API. Partition requests go to the driver
(answered through its ``Ready``); topic changes to the metadata controller."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..constants import UNKNOWN, or_unknown
from ..driver import Driver, error_response
from ..protocol import ApiKey, ErrorCode, Frame, decode_body
from ..protocol import messages as m
from ..protocol.codec import DecodeError, positional
from ..storage.errors import CorruptRecordError
from ..storage.records import iter_batches
from .config import NodeConfig
from .controller import MetadataController
from .metadata import INTERNAL_TOPICS, METADATA_TOPIC
from .topic_changes import TopicChanges
from .topic_configs import CLEANUP_POLICY, keyless_record

_PARTITION_INFO = positional(m.PartitionInfo)

# Metadata answers are built this many partitions at a time, the node's other work
# running between slices. One of 10,000 partitions costs a node ~50 ms of the event loop;
# a dozen clients refreshing at once (as when leadership moves) would otherwise hold its
# heartbeats back for a second, long enough for its peers to take it for silent and start
# the elections that load it more. Answers are built side by side, a slice of each per
# turn of the loop: one at a time, the last of a dozen waited a dozen answers' turns of a
# busy node, longer than a client waits.
METADATA_SLICE = 2500

#: A producer epoch is an int16; past the last one a producer gets a new id.
MAX_PRODUCER_EPOCH = (1 << 15) - 1

Submit = Callable[[tuple[str, int], Any], Awaitable[Any]]
SubmitEach = Callable[[list[tuple[tuple[str, int], Any]]], list[asyncio.Future[Any]]]
Handler = Callable[[Any], Awaitable[Any]]


class Api:
    def __init__(
        self,
        config: NodeConfig,
        driver: Driver,
        controller: MetadataController,
        changes: TopicChanges,
        submit: Submit,
        submit_each: SubmitEach,
    ) -> None:
        self.config = config
        self.driver = driver
        self.controller = controller
        self.submit = submit
        self.submit_each = submit_each
        self.handlers: dict[ApiKey, Handler] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.partition_request,
            ApiKey.LIST_OFFSETS: self.partition_request,
            ApiKey.OFFSETS_FOR_LEADER_EPOCH: self.partition_request,
            ApiKey.DESCRIBE_QUORUM: self.quorum_request,
            ApiKey.FORCE_LEADER: self.quorum_request,
            ApiKey.CREATE_TOPIC: controller.create_topic,
            ApiKey.DELETE_TOPIC: controller.delete_topic,
            ApiKey.ALTER_TOPIC: controller.alter_topic,
            ApiKey.REASSIGN: controller.reassign,
            ApiKey.CHANGE_VOTER: controller.change_voter,
            ApiKey.REGISTER_NODE: changes.register_node,
            ApiKey.RETIRE_NODE: controller.retire_node,
            ApiKey.CATCH_UP_THROTTLE: controller.catch_up_throttle,
            ApiKey.LIST_TOPICS: self.list_topics,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.PRODUCE_MANY: self.produce_many,
            ApiKey.WRITE_TXN_MARKERS: self.write_txn_markers,
            # The node sets the Kafka side's (``kafka_listener``).
            ApiKey.KAFKA_ENVELOPE: _no_kafka_side,
            ApiKey.TXN_GROUP_COMMIT: _no_kafka_side,
        }
        # Told of every transaction marker this node's leaders committed: the group
        # coordinator completes the transactional offset commits of
        # ``__consumer_offsets`` partitions with it.
        self.marker_written: list[Callable[[m.WriteTxnMarkerRequest], None]] = []

    async def handle(self, frame: Frame) -> tuple[int, Any] | None:
        try:
            api = ApiKey(frame.api_key)
            req_cls, _ = m.REQUESTS[api]
        except (ValueError, KeyError):
            return int(ApiKey.ERROR), m.ErrorResponse(
                error=int(ErrorCode.INVALID_REQUEST),
                error_message=f"unknown api key {frame.api_key}",
            )
        if frame.api_version != m.API_VERSION:
            return int(ApiKey.ERROR), m.ErrorResponse(
                error=int(ErrorCode.UNSUPPORTED_VERSION),
                error_message=f"api {api.name} version {frame.api_version} is not supported",
            )
        try:
            req: Any = decode_body(req_cls, frame.body, frame.payload)
        except Exception as exc:
            return int(ApiKey.ERROR), m.ErrorResponse(
                error=int(ErrorCode.INVALID_REQUEST), error_message=f"malformed {api.name}: {exc}"
            )
        resp = await self.handlers[api](req)
        if type(resp) is m.ErrorResponse:  # a refusal of the request as a whole
            return int(ApiKey.ERROR), resp
        return int(api), resp

    # ------------------------------------------------------------------ partitions
    async def partition_request(self, req: Any) -> Any:
        """Fetch, ListOffsets, OffsetsForLeaderEpoch: served by the driver; the metadata
        log is internal."""
        refused = _metadata_refused(req)
        if refused is not None:
            return refused
        return await self.submit((req.topic, req.partition), req)

    async def quorum_request(self, req: Any) -> Any:
        """DescribeQuorum, ForceLeader: any quorum, the metadata one included."""
        return await self.submit((req.topic, req.partition), req)

    async def produce(self, req: m.ProduceRequest) -> Any:
        refused = self._refused_produce(req)
        if refused is not None:
            return refused
        return await self.submit((req.topic, req.partition), req)

    def _refused_produce(self, req: m.ProduceRequest) -> Any | None:
        """The answer to a produce refused before it reaches the driver, or None."""
        if not req.records:
            return error_response(type(req), ErrorCode.INVALID_REQUEST, "produce without records")
        if req.topic in INTERNAL_TOPICS:
            # As Kafka: "Cannot append to internal topic" (the group coordinator writes it).
            text = f"topic {req.topic!r} is internal: only the node itself writes to it"
            return error_response(type(req), ErrorCode.INVALID_TOPIC, text)
        too_large = self._oversized_batch(req.topic, req.records)
        if too_large is not None:
            return error_response(type(req), ErrorCode.MESSAGE_TOO_LARGE, too_large)
        keyless = keyless_record(self._topic_policy(req.topic), req.records)
        if keyless is not None:
            return error_response(type(req), ErrorCode.INVALID_RECORD, keyless)
        return _metadata_refused(req)

    def _topic_policy(self, topic: str) -> str:
        """The cleanup.policy ``topic`` runs with: its own, else the node's."""
        t = self.controller.state.topics.get(topic)
        own = t.configs.get(CLEANUP_POLICY) if t is not None else None
        return own or self.config.cleanup_policy

    async def produce_many(self, req: m.ProduceManyRequest) -> Any:
        """Each item as its own Produce (its checks, its answer), all handed to the driver
        in this turn of the loop, in the request's order (no task each); the frame is
        answered when the last item is."""
        try:
            items = req.requests()
        except DecodeError as exc:
            return error_response(type(req), ErrorCode.INVALID_REQUEST, str(exc))
        answers = await self.produce_each(items)
        return m.ProduceManyResponse(error=0, error_message="", answers=answers)

    async def produce_each(self, items: Sequence[m.ProduceRequest]) -> list[Any]:
        """Each Produce checked on its own and the rest handed to the driver together, in
        this turn of the loop and in this order (no task each: one driver step, one flush
        and one replication round for all of them); their answers in the same order, once
        the last is answered. ProduceMany appends this way."""
        return list(await asyncio.gather(*self.produce_started(items)))

    def produce_started(self, items: Sequence[m.ProduceRequest]) -> list[asyncio.Future[Any]]:
        """``produce_each``'s appends, handed to the driver now: a future each, done with
        its own answer (the Kafka listener's Produce answers each partition so)."""
        loop = asyncio.get_running_loop()
        answers: list[Any] = [self._refused_produce(item) for item in items]
        submitted = [i for i, answer in enumerate(answers) if answer is None]
        started = iter(
            self.submit_each([((items[i].topic, items[i].partition), items[i]) for i in submitted])
            if submitted
            else ()
        )
        futures: list[asyncio.Future[Any]] = []
        for answer in answers:
            if answer is None:
                futures.append(next(started))
            else:
                done = loop.create_future()
                done.set_result(answer)
                futures.append(done)
        return futures

    async def submit_many(self, requests: list[tuple[tuple[str, int], Any]]) -> list[Any]:
        """``submit`` each, all in this turn of the loop; their answers in the same order."""
        return list(await asyncio.gather(*self.submit_each(requests)))

    async def write_txn_markers(self, req: m.WriteTxnMarkersRequest) -> m.WriteTxnMarkersResponse:
        """Each marker appended by the partition's leader here and answered once a quorum
        holds it (the transaction coordinator retries the others elsewhere)."""
        answers: list[Any] = [_metadata_refused(marker) for marker in req.markers]
        submitted = [i for i, answer in enumerate(answers) if answer is None]
        markers = [req.markers[i] for i in submitted]
        results = await self.submit_many([((mk.topic, mk.partition), mk) for mk in markers])
        for i, marker, result in zip(submitted, markers, results, strict=True):
            answers[i] = result
            if result.error == 0:
                for hook in self.marker_written:
                    hook(marker)
        return m.WriteTxnMarkersResponse(error=0, error_message="", answers=answers)

    def _oversized_batch(self, topic: str, records: bytes) -> str | None:
        """Why a produce's records hold a batch over the topic's max.message.bytes, or None.
        Only headers are parsed; malformed batches are left to the append to reject."""
        limit = self.controller.max_message_bytes(topic)
        if len(records) <= limit:
            return None
        try:
            for h in iter_batches(records):
                if h.size > limit:
                    return (
                        f"record batch of {h.size} bytes at position {h.position} exceeds "
                        f"max.message.bytes {limit} of topic {topic!r}"
                    )
        except CorruptRecordError:
            return None
        return None

    async def init_producer_id(self, req: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        """Producer ids are 62 random bits, drawn by whichever node is asked: no node
        keeps a record of them, and two producers share one with odds of about
        n**2 / 2**63 (the partitions' producer state tells them apart from there). A
        producer that names its id gets its next epoch, which fences its older one."""
        pid, epoch = req.producer_id, req.producer_epoch
        if pid < 0 or not 0 <= epoch < MAX_PRODUCER_EPOCH:
            pid, epoch = secrets.randbits(62), -1
        return m.InitProducerIdResponse(
            error=0, error_message="", producer_id=pid, producer_epoch=epoch + 1
        )

    # ------------------------------------------------------------------ cluster
    async def api_versions(self, req: m.ApiVersionsRequest) -> m.ApiVersionsResponse:
        return m.ApiVersionsResponse(
            error=0,
            error_message="",
            node_id=self.config.node_id,
            cluster_id=self.config.cluster_id,
            apis=[
                m.ApiVersionRange(api_key=int(k), min_version=0, max_version=0) for k in m.REQUESTS
            ],
        )

    async def list_topics(self, req: m.ListTopicsRequest) -> m.ListTopicsResponse:
        return m.ListTopicsResponse(
            error=0, error_message="", topics=sorted(self.controller.state.topics)
        )

    async def metadata(self, req: m.MetadataRequest) -> m.MetadataResponse:
        state = self.controller.state
        topics = []
        for name in req.topics or sorted(state.topics):
            t = state.topics.get(name)
            if t is None:
                code = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                topics.append(m.TopicInfo(error=code, name=name, partitions=[]))
                continue
            parts = await self.partition_infos(name, t.replicas, req.partitions)
            topics.append(
                m.TopicInfo(
                    error=0,
                    name=name,
                    partitions=parts,
                    max_message_bytes=self.controller.max_message_bytes(name),
                    configs=[m.TopicConfig(name=k, value=v) for k, v in sorted(t.configs.items())],
                )
            )
        book, registered = self.controller.book, self.controller.state.nodes
        nodes = [
            m.NodeInfo(
                node_id=i,
                host=h,
                port=p,
                retired=i in book.retired,
                directory=registered[i].directory if i in registered else "",
                rack=book.racks.get(i),
            )
            for i, (h, p) in sorted(book.native.items())
        ]
        return m.MetadataResponse(
            error=0,
            error_message="",
            cluster_id=self.config.cluster_id,
            node_id=self.config.node_id,
            controller_id=self.controller.leader_id(),
            nodes=nodes,
            topics=topics,
        )

    async def partition_infos(
        self, topic: str, assignments: Sequence[list[int]], only: list[int] | None = None
    ) -> list[m.PartitionInfo]:
        """``partition_info`` of every partition of a topic (``assignments[p]``: the
        replicas of partition p), or of those in ``only`` that it has (others are left
        out), METADATA_SLICE at a time: between slices the event loop runs heartbeats,
        replication and other requests."""
        wanted = (
            range(len(assignments))
            if only is None
            else sorted({p for p in only if 0 <= p < len(assignments)})
        )
        infos: list[m.PartitionInfo] = []
        for start in range(0, len(wanted), METADATA_SLICE):
            if start:
                await asyncio.sleep(0)
            infos += [
                self.partition_info(topic, p, assignments[p])
                for p in wanted[start : start + METADATA_SLICE]
            ]
        return infos

    def partition_info(self, topic: str, partition: int, replicas: list[int]) -> m.PartitionInfo:
        """What this node knows of a partition; UNKNOWN where it hosts no replica of it.
        (Built positionally: a Metadata answer holds one per partition, thousands.)"""
        p = self.driver.get((topic, partition))
        if p is None:
            return _PARTITION_INFO(
                0, partition, UNKNOWN, UNKNOWN, replicas, UNKNOWN, UNKNOWN, False
            )
        core = p.core
        return _PARTITION_INFO(
            0,  # error
            partition,
            or_unknown(core.leader_id),
            core.epoch,  # leader_epoch
            replicas,
            core.high_watermark,
            p.log.start_offset,
            core.is_leader,  # is_local_leader
        )


def _metadata_refused(req: Any) -> Any | None:
    """The metadata log is internal: no client request reaches its partition this way."""
    if req.topic == METADATA_TOPIC:
        return error_response(
            type(req), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{req.topic} is internal"
        )
    return None


async def _no_kafka_side(req: Any) -> m.ErrorResponse:
    return m.ErrorResponse(
        error=int(ErrorCode.INVALID_REQUEST), error_message="no Kafka coordinators on this node"
    )
