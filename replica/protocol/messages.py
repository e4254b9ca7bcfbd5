"""Request and response types of the client-facing and admin APIs.

Every response starts with ``error`` (an ``ErrorCode`` value) and ``error_message``. Node to
node raft traffic travels as ``RaftEnvelope`` frames (one-way, like etcd-raft messages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

ACKS_LEADER = 1
ACKS_QUORUM = -1

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

CONSUMER_REPLICA_ID = -1
NO_EPOCH = -1


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    API_VERSIONS = 18
    # SCRAM exchange, once per connection before any other request (Kafka's SaslAuthenticate).
    AUTHENTICATE = 36
    CREATE_TOPIC = 19
    DELETE_TOPIC = 20
    OFFSETS_FOR_LEADER_EPOCH = 23
    RAFT = 50
    DESCRIBE_QUORUM = 55
    LIST_TOPICS = 100
    FORCE_LEADER = 101
    ERROR = 127


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Answer to a request the node could not parse or does not know."""

    error: int
    error_message: str


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest:
    pass


@dataclass(frozen=True, slots=True)
class ApiVersionRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse:
    error: int
    error_message: str
    node_id: int
    cluster_id: str
    apis: list[ApiVersionRange]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    topics: list[str] | None = None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    error: int
    partition: int
    leader_id: int
    leader_epoch: int
    replicas: list[int]
    high_watermark: int
    log_start_offset: int
    is_local_leader: bool


@dataclass(frozen=True, slots=True)
class TopicInfo:
    error: int
    name: str
    partitions: list[PartitionInfo]
    # The largest record batch a produce to this topic may carry (its max.message.bytes,
    # or the answering node's default); 0 when unknown.
    max_message_bytes: int = 0


@dataclass(frozen=True, slots=True)
class MetadataResponse:
    error: int
    error_message: str
    cluster_id: str
    node_id: int
    controller_id: int
    nodes: list[NodeInfo]
    topics: list[TopicInfo]


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    topic: str
    partition: int
    acks: int
    timeout_ms: int
    records: bytes = b""


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    error: int
    error_message: str
    base_offset: int
    last_offset: int
    leader_epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    topic: str
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    error: int
    error_message: str
    leader_id: int
    leader_epoch: int
    high_watermark: int
    log_start_offset: int
    records: bytes = b""


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    topic: str
    partition: int
    current_leader_epoch: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse:
    error: int
    error_message: str
    offset: int
    leader_epoch: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochRequest:
    topic: str
    partition: int
    current_leader_epoch: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochResponse:
    error: int
    error_message: str
    leader_epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class ReplicaStateInfo:
    replica_id: int
    end_offset: int
    last_fetch_ms: int
    lag: int


@dataclass(frozen=True, slots=True)
class DescribeQuorumRequest:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class DescribeQuorumResponse:
    error: int
    error_message: str
    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: list[ReplicaStateInfo] = field(default_factory=list)
    observers: list[ReplicaStateInfo] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    name: str
    partitions: int
    replication_factor: int
    # The topic's max.message.bytes; 0: none set, each node's --max-message-bytes applies.
    max_message_bytes: int = 0


@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    error: int
    error_message: str


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    name: str


@dataclass(frozen=True, slots=True)
class DeleteTopicResponse:
    error: int
    error_message: str


@dataclass(frozen=True, slots=True)
class ListTopicsRequest:
    pass


@dataclass(frozen=True, slots=True)
class ListTopicsResponse:
    error: int
    error_message: str
    topics: list[str]


@dataclass(frozen=True, slots=True)
class ForceLeaderRequest:
    """Unclean leader election on the receiving node: it leads in a new epoch without a
    majority. Committed records it lacks are lost; ``confirm`` must be true."""

    topic: str
    partition: int
    confirm: bool


@dataclass(frozen=True, slots=True)
class ForceLeaderResponse:
    error: int
    error_message: str
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class RaftEnvelope:
    """One-way node-to-node raft message for one partition's quorum. ``kind`` names the
    raft message class; ``body`` is its codec body; ``records`` its payload, if any."""

    topic: str
    partition: int
    kind: str
    body: list[object]
    records: bytes = b""


@dataclass(frozen=True, slots=True)
class AuthenticateRequest:
    """One SCRAM step: ``auth_bytes`` is the RFC 5802 client-first or client-final message."""

    mechanism: str
    auth_bytes: bytes


@dataclass(frozen=True, slots=True)
class AuthenticateResponse:
    """The server-first or server-final message; ``principal_kind`` is set once authenticated."""

    error: int
    error_message: str
    auth_bytes: bytes
    principal_kind: str = ""


REQUESTS: dict[ApiKey, tuple[type, type]] = {
    ApiKey.AUTHENTICATE: (AuthenticateRequest, AuthenticateResponse),
    ApiKey.API_VERSIONS: (ApiVersionsRequest, ApiVersionsResponse),
    ApiKey.METADATA: (MetadataRequest, MetadataResponse),
    ApiKey.PRODUCE: (ProduceRequest, ProduceResponse),
    ApiKey.FETCH: (FetchRequest, FetchResponse),
    ApiKey.LIST_OFFSETS: (ListOffsetsRequest, ListOffsetsResponse),
    ApiKey.OFFSETS_FOR_LEADER_EPOCH: (OffsetsForLeaderEpochRequest, OffsetsForLeaderEpochResponse),
    ApiKey.DESCRIBE_QUORUM: (DescribeQuorumRequest, DescribeQuorumResponse),
    ApiKey.CREATE_TOPIC: (CreateTopicRequest, CreateTopicResponse),
    ApiKey.DELETE_TOPIC: (DeleteTopicRequest, DeleteTopicResponse),
    ApiKey.LIST_TOPICS: (ListTopicsRequest, ListTopicsResponse),
    ApiKey.FORCE_LEADER: (ForceLeaderRequest, ForceLeaderResponse),
}

API_VERSION = 0
