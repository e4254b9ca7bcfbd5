"""The Kafka listener (optional, ``serve --kafka-listen HOST:PORT``): Kafka clients
produce to and consume from the same partitions as native clients, with the same leader
epochs and fencing (KIP-320), through the native api layer (``Api``).

Served: ApiVersions, Metadata, Produce (RecordBatch v2; acks 0, 1, all = quorum-durable;
idempotent and transactional batches checked by the partition's producer state), Fetch
(read_committed below the last stable offset), ListOffsets, OffsetForLeaderEpoch,
InitProducerId (idempotence; with a transactional id, ``txn_coordinator``), CreateTopics and
DeleteTopics (decided by the metadata controller, forwarded to it from another node:
``topic_changes``), DescribeConfigs (``configs``),
SaslHandshake and SaslAuthenticate, the consumer-group APIs, the transaction APIs
(``txn_coordinator``; WriteTxnMarkers refused to clients), and CreatePartitions,
AlterConfigs and IncrementalAlterConfigs (``topic_admin``). ApiVersions lists only these,
so a client does not ask for the rest; a request for an API it does not list is answered with
UNSUPPORTED_VERSION where its answer has a top-level error code, else the connection
closes (as a Kafka broker does for an api key it does not know).

Security is the node's: with TLS the listener serves TLS with the node's certificate
(clients: ``security.protocol=SSL`` or ``SASL_SSL``); with ``--auth-config`` every
connection authenticates with SASL/SCRAM first (``server``) and every request is then
authorized as the native listener authorizes its principal (``auth.TopicGate``).

Records cross the boundary through ``kafka.convert``: a produced Kafka batch becomes one
quorumlog batch (key, value, timestamp, headers, producer fields); a fetch turns stored
batches back into RecordBatch v2 with the same base offset and leader epoch.

Consumer groups (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch; offsets in ``__consumer_offsets``) are served by
``groups``, their administration (ListGroups, DescribeGroups, DeleteGroups,
OffsetDelete) by ``group_admin``; both are listed by ApiVersions too, and so is
DescribeCluster.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..constants import UNKNOWN, or_unknown
from ..kafka import messages as km
from ..kafka.codec import (
    api_versions_body,
    fetched_partition,
)
from ..kafka.convert import quorumlog_to_kafka
from ..kafka.coordinators import OFFSETS_TOPIC
from ..kafka.errors import KafkaError
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from ..kafka.wire import KafkaDecodeError
from ..node.api import Api
from ..node.metadata import INTERNAL_TOPICS, METADATA_TOPIC
from ..node.topic_changes import TopicChanges
from ..protocol import ErrorCode
from ..protocol import messages as m
from .auth import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    config_result,
)
from .configs import broker_configs, config_entries, topic_configs
from .errors import admin_error
from .errors import kafka_error as kafka_error
from .group_admin import SERVED as GROUP_ADMIN_APIS
from .group_admin import GroupAdmin
from .groups import SERVED as GROUP_APIS
from .groups import KafkaGroups
from .produce import ProduceAppender, partition_produced
from .topic_admin import SERVED as TOPIC_ADMIN_APIS
from .topic_admin import TopicAdmin
from .txn_admin import TxnAdmin
from .txn_coordinator import SERVED as TXN_APIS
from .txn_coordinator import TransactionCoordinator
from .txn_markers import MarkerWriter

log = logging.getLogger(__name__)

#: (api, lowest version, highest version) the listener serves; ApiVersions lists these.
SERVED: tuple[tuple[KafkaApi, int, int], ...] = (
    (km.PRODUCE, km.PRODUCE.min_version, km.PRODUCE.max_version),
    (km.FETCH, km.FETCH.min_version, km.FETCH.max_version),
    (km.LIST_OFFSETS, km.LIST_OFFSETS.min_version, km.LIST_OFFSETS.max_version),
    (km.METADATA, km.METADATA.min_version, km.METADATA.max_version),
    (km.API_VERSIONS, km.API_VERSIONS.min_version, km.API_VERSIONS.max_version),
    (km.CREATE_TOPICS, km.CREATE_TOPICS.min_version, km.CREATE_TOPICS.max_version),
    (km.DELETE_TOPICS, km.DELETE_TOPICS.min_version, km.DELETE_TOPICS.max_version),
    (km.INIT_PRODUCER_ID, km.INIT_PRODUCER_ID.min_version, km.INIT_PRODUCER_ID.max_version),
    (
        km.OFFSET_FOR_LEADER_EPOCH,
        km.OFFSET_FOR_LEADER_EPOCH.min_version,
        km.OFFSET_FOR_LEADER_EPOCH.max_version,
    ),
    *GROUP_APIS,
    *TXN_APIS,
    (km.WRITE_TXN_MARKERS, km.WRITE_TXN_MARKERS.min_version, km.WRITE_TXN_MARKERS.max_version),
    *GROUP_ADMIN_APIS,
    *TOPIC_ADMIN_APIS,
    (km.DESCRIBE_CLUSTER, km.DESCRIBE_CLUSTER.min_version, km.DESCRIBE_CLUSTER.max_version),
    (km.DESCRIBE_CONFIGS, km.DESCRIBE_CONFIGS.min_version, km.DESCRIBE_CONFIGS.max_version),
    (km.SASL_HANDSHAKE, km.SASL_HANDSHAKE.min_version, km.SASL_HANDSHAKE.max_version),
    (km.SASL_AUTHENTICATE, km.SASL_AUTHENTICATE.min_version, km.SASL_AUTHENTICATE.max_version),
)
SERVED_KEYS = tuple((api.key, low, high) for api, low, high in SERVED)

#: Fixed for every node, so a client's topic ids agree whichever node it asks.
_TOPIC_ID_NAMESPACE = uuid.UUID("6d1c7c3e-2f4b-4d0e-9a57-0b9b3c5f8e21")

Handler = Callable[[KafkaApi, int, Message], Awaitable[Message | None]]

#: DescribeCluster's endpoint type of broker listeners (KIP-919).
_BROKER_ENDPOINTS = 1
#: The cluster's authorized operations when asked for: every one Kafka defines on the
#: cluster (AclOperation codes as bits: CREATE 7, ALTER 4, DESCRIBE 8, CLUSTER_ACTION 9,
#: DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12).
_CLUSTER_OPERATIONS = sum(1 << op for op in (4, 7, 8, 9, 10, 11, 12))

#: The most partition entries one Fetch may name (a topic of thousands fits).
MAX_FETCH_PARTITIONS = 10_000


class KafkaHandlers:
    """One handler per Kafka API, each mapping onto the native ``Api`` of this node."""

    def __init__(
        self,
        api: Api,
        advertised: dict[int, tuple[str, int]],
        changes: TopicChanges,
    ) -> None:
        """``changes``: where topic changes are decided (the metadata leader)."""
        self.api = api
        self.advertised = advertised
        self.changes = changes
        self.appender = ProduceAppender(api)
        self.handlers: dict[int, Handler] = {
            km.API_VERSIONS.key: self.api_versions,
            km.METADATA.key: self.metadata,
            km.PRODUCE.key: self.produce,
            km.FETCH.key: self.fetch,
            km.LIST_OFFSETS.key: self.list_offsets,
            km.OFFSET_FOR_LEADER_EPOCH.key: self.offset_for_leader_epoch,
            km.CREATE_TOPICS.key: self.create_topics,
            km.DELETE_TOPICS.key: self.delete_topics,
            km.INIT_PRODUCER_ID.key: self.init_producer_id,
            km.DESCRIBE_CONFIGS.key: self.describe_configs,
            km.DESCRIBE_CLUSTER.key: self.describe_cluster,
            km.SASL_HANDSHAKE.key: self.sasl_out_of_place,
            km.SASL_AUTHENTICATE.key: self.sasl_out_of_place,
        }
        self.groups = KafkaGroups(api, advertised)
        self.handlers.update(self.groups.handlers)
        self.transactions = TransactionCoordinator(api, MarkerWriter(api, changes))
        self.groups.transactions = self.transactions.topic
        self.handlers.update(self.transactions.handlers)
        self.handlers.update(TxnAdmin(self.transactions).handlers)
        self.handlers[km.WRITE_TXN_MARKERS.key] = self.write_txn_markers
        api.marker_written.append(self._marker_written)
        self.handlers.update(GroupAdmin(self.groups).handlers)
        self.handlers.update(TopicAdmin(api, self.changes).handlers)

    def topic_id(self, name: str) -> uuid.UUID:
        """Derived, not stored: a client naming endless unknown topics costs no memory."""
        return uuid.uuid5(_TOPIC_ID_NAMESPACE, f"{self.api.config.cluster_id}/{name}")

    def _topic_by_id(self, topic_id: Any) -> str | None:
        for name in self.api.controller.state.topics:
            if self.topic_id(name) == topic_id:
                return name
        return None

    # ------------------------------------------------------------------ cluster
    async def api_versions(self, api: KafkaApi, version: int, body: Message) -> Message:
        return api_versions_body(version, SERVED_KEYS)

    async def metadata(self, api: KafkaApi, version: int, body: Message) -> Message:
        state = self.api.controller.state
        requested = body["topics"]
        names = (
            sorted(state.topics)
            if requested is None
            else [t["name"] or self._topic_by_id(t["topic_id"]) or "" for t in requested]
        )
        out = api.default_response(version)
        racks = self.api.controller.book.racks
        out["brokers"] = [
            {"node_id": i, "host": h, "port": p, "rack": racks.get(i)}
            for i, (h, p) in sorted(self.advertised.items())
        ]
        out["cluster_id"] = self.api.config.cluster_id
        out["controller_id"] = or_unknown(self.api.controller.leader_id())
        topics = []
        for name in names:
            t = state.topics.get(name) if name != METADATA_TOPIC else None
            entry: Message = {
                "error_code": 0,
                "name": name,
                "topic_id": self.topic_id(name),
                "is_internal": name in INTERNAL_TOPICS,
                "partitions": [],
                "topic_authorized_operations": -2147483648,
            }
            if t is None:
                entry["error_code"] = int(KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
            else:
                for info in await self.api.partition_infos(name, t.replicas):
                    known = info.leader_id >= 0
                    entry["partitions"].append(
                        {
                            "error_code": 0 if known else int(KafkaError.LEADER_NOT_AVAILABLE),
                            "partition_index": info.partition,
                            "leader_id": info.leader_id,
                            "leader_epoch": info.leader_epoch,
                            "replica_nodes": info.replicas,
                            "isr_nodes": info.replicas,
                            "offline_replicas": [],
                        }
                    )
            topics.append(entry)
        out["topics"] = topics
        return out

    async def describe_cluster(self, api: KafkaApi, version: int, body: Message) -> Message:
        """The nodes' Kafka listeners and the metadata leader as controller. Only broker
        endpoints (type 1) are served: a request for controller endpoints (2) is answered
        UNSUPPORTED_ENDPOINT_TYPE, as a broker answers it."""
        out = api.default_response(version)
        if body["endpoint_type"] != _BROKER_ENDPOINTS:
            out["error_code"] = int(KafkaError.UNSUPPORTED_ENDPOINT_TYPE)
            out["error_message"] = "only broker endpoints (type 1) are served"
            return out
        out["cluster_id"] = self.api.config.cluster_id
        out["controller_id"] = or_unknown(self.api.controller.leader_id())
        racks = self.api.controller.book.racks
        out["brokers"] = [
            {"broker_id": i, "host": h, "port": p, "rack": racks.get(i)}
            for i, (h, p) in sorted(self.advertised.items())
        ]
        if body["include_cluster_authorized_operations"]:
            out["cluster_authorized_operations"] = _CLUSTER_OPERATIONS
        return out

    async def describe_configs(self, api: KafkaApi, version: int, body: Message) -> Message:
        """Topic (2) and broker (4) resources; any other type is INVALID_REQUEST."""
        config = self.api.config

        def one(r: Message) -> Message:
            kind, name = r["resource_type"], r["resource_name"]
            if kind == RESOURCE_TOPIC:
                topic = self.api.controller.state.topics.get(name)
                if topic is None or name == METADATA_TOPIC:
                    return config_result(
                        r, KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
                    )
                entries = topic_configs(config, topic)
            elif kind == RESOURCE_BROKER:
                if name == "":
                    entries = []  # no cluster-wide dynamic defaults exist
                elif name == str(config.node_id):
                    entries = broker_configs(config, len(self.api.controller.book.placeable()))
                else:
                    return config_result(
                        r,
                        KafkaError.INVALID_REQUEST,
                        f"unexpected broker id {name!r}: this is node {config.node_id} (ask "
                        "each node for its own configs)",
                    )
            else:
                return config_result(
                    r,
                    KafkaError.INVALID_REQUEST,
                    f"resource type {kind} is not served (only topics (2) and brokers (4))",
                )
            out = config_result(r, KafkaError.NONE, None)
            out["configs"] = config_entries(
                entries,
                r["configuration_keys"],
                body["include_synonyms"],
                body["include_documentation"],
            )
            return out

        out = api.default_response(version)
        out["results"] = [one(r) for r in body["resources"]]
        return out

    async def sasl_out_of_place(self, api: KafkaApi, version: int, body: Message) -> Message:
        """SaslHandshake / SaslAuthenticate where no exchange is due: on a node without
        authentication, or after the connection authenticated (no re-authentication)."""
        out = api.default_response(version)
        out["error_code"] = int(KafkaError.ILLEGAL_SASL_STATE)
        if api.key == km.SASL_AUTHENTICATE.key:
            out["error_message"] = "no SASL exchange is due on this connection"
        return out

    async def create_topics(self, api: KafkaApi, version: int, body: Message) -> Message:
        """Decided by the metadata leader (Metadata's controller_id), forwarded to it from
        another node; a validate-only create is checked there only (elsewhere:
        NOT_CONTROLLER, which clients retry there). Configs: those a topic may set (``topic_configs``); any other is refused with
        INVALID_CONFIG."""

        async def one(t: Message) -> Message:
            answer: Message = {
                "name": t["name"],
                "topic_id": self.topic_id(t["name"]),
                "error_code": 0,
                "error_message": None,
                "num_partitions": t["num_partitions"],
                "replication_factor": t["replication_factor"],
                "configs": None,
            }
            if t["assignments"]:
                answer["error_code"] = int(KafkaError.INVALID_REQUEST)
                answer["error_message"] = "replica assignments are not served"
                return answer
            req = m.CreateTopicRequest(
                name=t["name"],
                partitions=t["num_partitions"] if t["num_partitions"] > 0 else 1,
                replication_factor=max(0, t["replication_factor"]),
                configs=[
                    m.TopicConfig(name=c["name"], value=c["value"])
                    for c in t["configs"]
                    if c["value"] is not None
                ],
            )
            if body["validate_only"]:
                problem = self.api.controller.create_problem(req)
                code, text = problem if problem is not None else (ErrorCode.NONE, "")
            else:
                resp = await self.changes.create_topic(req)
                code, text = ErrorCode(resp.error), resp.error_message
            answer["error_code"] = admin_error(code)
            answer["error_message"] = text or None
            return answer

        out = api.default_response(version)
        out["topics"] = [await one(t) for t in body["topics"]]
        return out

    async def delete_topics(self, api: KafkaApi, version: int, body: Message) -> Message:
        names = list(body["topic_names"]) + [
            t["name"] or self._topic_by_id(t["topic_id"]) or "" for t in body["topics"]
        ]
        out = api.default_response(version)
        out["responses"] = []
        for name in names:
            resp = await self.changes.delete_topic(m.DeleteTopicRequest(name=name))
            out["responses"].append(
                {
                    "name": name,
                    "topic_id": self.topic_id(name),
                    "error_code": admin_error(ErrorCode(resp.error)),
                    "error_message": resp.error_message or None,
                }
            )
        return out

    async def init_producer_id(self, api: KafkaApi, version: int, body: Message) -> Message:
        """An idempotent producer's id and epoch (the native api draws them), or with a
        transactional id, its transaction coordinator's answer (``txn_coordinator``)."""
        out = api.default_response(version)
        if body["transactional_id"] is not None:
            code, pid, epoch = await self.transactions.init_producer_id(
                body["transactional_id"],
                body["transaction_timeout_ms"],
                body["producer_id"],
                body["producer_epoch"],
            )
            if code == KafkaError.PRODUCER_FENCED and version < 4:
                code = KafkaError.INVALID_PRODUCER_EPOCH  # PRODUCER_FENCED is v4's (KIP-588)
            out.update(error_code=int(code), producer_id=pid, producer_epoch=epoch)
            return out
        resp = await self.api.init_producer_id(
            m.InitProducerIdRequest(
                producer_id=body["producer_id"], producer_epoch=body["producer_epoch"]
            )
        )
        out["producer_id"], out["producer_epoch"] = resp.producer_id, resp.producer_epoch
        return out

    async def write_txn_markers(self, api: KafkaApi, version: int, body: Message) -> Message:
        """Markers are written between nodes, over the native listener as a node
        principal: a Kafka client asking for them is refused."""
        out = api.default_response(version)
        out["markers"] = [
            {
                "producer_id": mk["producer_id"],
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {
                                "partition_index": p,
                                "error_code": int(KafkaError.CLUSTER_AUTHORIZATION_FAILED),
                            }
                            for p in t["partition_indexes"]
                        ],
                    }
                    for t in mk["topics"]
                ],
            }
            for mk in body["markers"]
        ]
        return out

    def _marker_written(self, marker: m.WriteTxnMarkerRequest) -> None:
        """A marker this node's leader committed: on an offsets partition, it completes
        (or drops) the producer's transactional offset commits there."""
        if marker.topic == OFFSETS_TOPIC:
            self.groups.marker_written(
                marker.partition, marker.producer_id, marker.producer_epoch, marker.commit
            )

    # ------------------------------------------------------------------ partitions
    async def produce(self, api: KafkaApi, version: int, body: Message) -> Message | None:
        """Every partition's batches appended with those of the other Produce requests of
        this turn (``produce.ProduceAppender``), so a request costs what its records and
        batches cost, however many partitions it names; a partition whose batches are
        refused is answered for itself."""
        acks = body["acks"]
        if acks not in (0, 1, -1):
            return self._produce_answer(api, version, body, KafkaError.INVALID_REQUIRED_ACKS)
        native_acks = m.ACKS_QUORUM if acks == -1 else m.ACKS_LEADER
        answers = iter(await self.appender.produce(body, native_acks))
        if acks == 0:
            return None
        # Built as it is (a field it lacks is written as its default), not from
        # default_response's walk of the schema: a backlog brings thousands a second.
        return {
            "responses": [
                {
                    "name": t["name"],
                    "partition_responses": [next(answers) for _ in t["partition_data"]],
                }
                for t in body["topic_data"]
            ],
            "throttle_time_ms": 0,
        }

    def _produce_answer(
        self, api: KafkaApi, version: int, body: Message, error: KafkaError
    ) -> Message:
        out = api.default_response(version)
        out["responses"] = [
            {
                "name": t["name"],
                "partition_responses": [
                    partition_produced(pd["index"], int(error), UNKNOWN, error.name)
                    for pd in t["partition_data"]
                ],
            }
            for t in body["topic_data"]
        ]
        return out

    async def fetch(self, api: KafkaApi, version: int, body: Message) -> Message:
        """Partitions are read one after another within the request's ``max_bytes`` (the
        first with data whole, as KIP-74), so a Fetch naming many partitions, or one many
        times, holds at most that much (and one batch) in memory; partitions past it are
        answered with their high watermark and no records."""
        names = [
            t.get("topic") or self._topic_by_id(t.get("topic_id")) or "" for t in body["topics"]
        ]
        wanted = [
            (name, p)
            for name, t in zip(names, body["topics"], strict=True)
            for p in t["partitions"]
        ]
        if len(wanted) > MAX_FETCH_PARTITIONS:
            raise KafkaDecodeError(
                f"Fetch names {len(wanted)} partitions; at most {MAX_FETCH_PARTITIONS} served"
            )
        isolation = _isolation(body)

        async def one(
            name: str, p: Message, max_wait_ms: int, max_bytes: int
        ) -> tuple[Message, bool]:
            req = m.FetchRequest(
                topic=name,
                partition=p["partition"],
                current_leader_epoch=p["current_leader_epoch"],
                fetch_offset=p["fetch_offset"],
                max_wait_ms=max_wait_ms,
                min_bytes=1,
                max_bytes=max(1, max_bytes),
                isolation_level=isolation,
            )
            resp = await self.api.partition_request(req)
            records = b""
            if resp.error == 0 and resp.records:
                records = quorumlog_to_kafka(resp.records, verify_crc=False)
            ok = resp.error == 0
            answer = fetched_partition(
                p["partition"],
                kafka_error(resp.error),
                resp.high_watermark if ok else -1,
                resp.log_start_offset if ok else -1,
                records,
                last_stable_offset=resp.last_stable_offset if ok else -1,
                aborted_transactions=[
                    (a.producer_id, a.first_offset) for a in resp.aborted_transactions
                ]
                if isolation == m.READ_COMMITTED
                else None,
            )
            if resp.error in (ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.NOT_LEADER):
                answer["current_leader"] = {
                    "leader_id": resp.leader_id,
                    "leader_epoch": resp.leader_epoch,
                }
            return answer, bool(records) or resp.error != 0

        def no_room(name: str, p: Message) -> tuple[Message, bool]:
            info = self.api.partition_info(name, p["partition"], [])
            if not info.is_local_leader:
                code = int(KafkaError.NOT_LEADER_OR_FOLLOWER)
                return fetched_partition(p["partition"], code, -1, -1, b""), True
            hwm, start = info.high_watermark, info.log_start_offset
            # Its last stable offset is not looked up: -1 tells the client it is unknown.
            answer = fetched_partition(p["partition"], 0, hwm, start, b"", last_stable_offset=-1)
            return answer, False

        async def collect() -> list[tuple[Message, bool]]:
            budget = max(1, body["max_bytes"])
            out = []
            for n, p in wanted:
                if budget <= 0:
                    out.append(no_room(n, p))
                    continue
                answer, found = await one(n, p, 0, min(p["partition_max_bytes"], budget))
                budget -= len(answer["records"])
                out.append((answer, found))
            return out

        # A first pass that does not wait. When it finds nothing at all: a long poll of
        # every partition (each asks for one batch), until the first has something or
        # max_wait_ms ends; the polls still parked are dropped (the driver answers them
        # at their deadline, to no one) and a second pass collects what is there by then.
        results = await collect()
        if body["max_wait_ms"] > 0 and wanted and not any(found for _, found in results):
            wait = body["max_wait_ms"]
            polls = [asyncio.ensure_future(one(n, p, wait, 1)) for n, p in wanted]
            try:
                pending = set(polls)
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    if any(task.result()[1] for task in done):
                        break
            finally:
                for task in polls:
                    task.cancel()
                await asyncio.gather(*polls, return_exceptions=True)
            results = await collect()
        answers = iter(a for a, _ in results)
        out = api.default_response(version)
        out["responses"] = [
            {
                "topic": name,
                "topic_id": t.get("topic_id") or uuid.UUID(int=0),
                "partitions": [next(answers) for _ in t["partitions"]],
            }
            for name, t in zip(names, body["topics"], strict=True)
        ]
        return out

    async def list_offsets(self, api: KafkaApi, version: int, body: Message) -> Message:
        isolation = _isolation(body)

        async def one(name: str, p: Message) -> Message:
            req = m.ListOffsetsRequest(
                topic=name,
                partition=p["partition_index"],
                current_leader_epoch=p["current_leader_epoch"],
                timestamp=p["timestamp"],
                isolation_level=isolation,
            )
            resp = await self.api.partition_request(req)
            ok = resp.error == 0
            return {
                "partition_index": p["partition_index"],
                "error_code": kafka_error(resp.error),
                "old_style_offsets": [],
                "timestamp": resp.timestamp if ok else -1,
                "offset": resp.offset if ok else -1,
                "leader_epoch": resp.leader_epoch if ok else -1,
            }

        return await _each_partition(api, version, body, "name", one)

    async def offset_for_leader_epoch(self, api: KafkaApi, version: int, body: Message) -> Message:
        async def one(name: str, p: Message) -> Message:
            req = m.OffsetsForLeaderEpochRequest(
                topic=name,
                partition=p["partition"],
                current_leader_epoch=p["current_leader_epoch"],
                leader_epoch=p["leader_epoch"],
            )
            resp = await self.api.partition_request(req)
            ok = resp.error == 0
            return {
                "error_code": kafka_error(resp.error),
                "partition": p["partition"],
                "leader_epoch": resp.leader_epoch if ok else -1,
                "end_offset": resp.end_offset if ok else -1,
            }

        return await _each_partition(api, version, body, "topic", one)


async def _each_partition(
    api: KafkaApi,
    version: int,
    body: Message,
    name_key: str,
    one: Callable[[str, Message], Awaitable[Message]],
) -> Message:
    """The answer to a request of ``topics[]: <name_key>, partitions[]``: ``one`` for
    every partition, concurrently, in the request's order."""
    out = api.default_response(version)
    out["topics"] = [
        {
            name_key: t[name_key],
            "partitions": await asyncio.gather(*(one(t[name_key], p) for p in t["partitions"])),
        }
        for t in body["topics"]
    ]
    return out


def _isolation(body: Message) -> int:
    """A Fetch's or ListOffsets' isolation level (Kafka's: 1 read_committed)."""
    return m.READ_COMMITTED if body["isolation_level"] == 1 else m.READ_UNCOMMITTED
