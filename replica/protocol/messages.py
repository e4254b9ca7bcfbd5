"""Request and response types of the client-facing and admin APIs.

Every message is a frozen, slotted, keyword-only dataclass: build it with keywords. The
codec carries its fields in declaration order, and that order follows one convention:

1. on a response, ``error`` (an ``ErrorCode`` value) then ``error_message``;
2. the identity of what the message is about: ``topic``, ``partition`` (or ``name``;
   ``cluster_id``, ``node_id`` for a node);
3. the fencing / leadership fields: ``current_leader_epoch`` on a request, ``leader_id``,
   ``leader_epoch`` of the answering leader on a response;
4. the rest, fields with a default last (``records`` travels as the frame's payload).

The small base classes below carry the shared heads (``Response``, ``PartitionRequest``,
``FencedRequest``, ``LeaderResponse``). A field without a value holds ``UNKNOWN`` (-1,
``replica.constants``). Node to node raft traffic travels as ``RaftEnvelope`` frames
(one-way, like etcd-raft messages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from ..constants import CONSUMER_REPLICA_ID as CONSUMER_REPLICA_ID
from ..constants import UNKNOWN as UNKNOWN
from .codec import DecodeError

ACKS_LEADER = 1
ACKS_QUORUM = -1

LATEST_TIMESTAMP = -1
#: A consumer's isolation level (Kafka's): read_uncommitted reads to the high watermark;
#: read_committed to the last stable offset, and is told which transactions aborted.
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
EARLIEST_TIMESTAMP = -2

# The current_leader_epoch that skips fencing (KIP-320: a client that knows no epoch).
NO_EPOCH = UNKNOWN


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
    INIT_PRODUCER_ID = 22
    OFFSETS_FOR_LEADER_EPOCH = 23
    RAFT = 50
    RAFT_BATCH = 51  # many partitions' raft messages to one node, in one frame
    DESCRIBE_QUORUM = 55
    LIST_TOPICS = 100
    FORCE_LEADER = 101
    PRODUCE_MANY = 102  # batches for many partitions of one topic, in one frame
    ALTER_TOPIC = (
        103  # add partitions, set or delete configs (Kafka: CreatePartitions, AlterConfigs)
    )
    REASSIGN = 104  # move partitions' replicas (Kafka: AlterPartitionReassignments)
    CHANGE_VOTER = 105  # add or remove a metadata quorum voter (Kafka: AddRaftVoter, ...)
    REGISTER_NODE = 106  # a node joins or starts (Kafka: BrokerRegistration)
    RETIRE_NODE = 107  # no new replicas on a node (Kafka: UnregisterBroker, ...)
    # every node's catch-up throttle (Kafka: leader.replication.throttled.rate, a dynamic
    # broker config)
    CATCH_UP_THROTTLE = 108
    # transaction markers a transaction coordinator writes (Kafka's WriteTxnMarkers):
    # from nodes only
    WRITE_TXN_MARKERS = 27
    # a Kafka request carried whole (Kafka's Envelope, KIP-590): how the native client
    # reaches the transaction and group coordinators, which speak Kafka's messages
    KAFKA_ENVELOPE = 58
    # decide a transaction group's batch (quorumlog's: the Spark sink's tasks' transactions)
    TXN_GROUP_COMMIT = 109
    ERROR = 127


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """The head of every response; alone, an answer that says only how it went."""

    error: int
    error_message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderResponse(Response):
    """A partition's answer naming the leader that gave it and that leader's epoch."""

    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRequest:
    """The head of every request about one partition."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FencedRequest(PartitionRequest):
    """A partition request fenced by the leader epoch the client knows (KIP-320);
    ``NO_EPOCH`` skips the check."""

    current_leader_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorResponse(Response):
    """Answer to a request the node could not parse or does not know."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionsRequest:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionsResponse(Response):
    cluster_id: str
    node_id: int
    apis: list[ApiVersionRange]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    node_id: int
    host: str
    port: int
    # A decommissioned node: it is given no new replicas (it may still lead some).
    retired: bool = False
    # The data directory it registered with ("": it has not registered yet).
    directory: str = ""
    # The rack it registered with (``serve --rack``; Kafka's broker.rack), None: none.
    rack: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataRequest:
    topics: list[str] | None = None
    # Only these partitions of each topic named (None: all of them). A client that must
    # learn one partition's leader asks for it alone: a topic of 10,000 partitions costs
    # every node asked ~0.2 s of its loop to describe whole.
    partitions: list[int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionInfo:
    error: int
    partition: int
    leader_id: int
    leader_epoch: int
    replicas: list[int]
    high_watermark: int
    log_start_offset: int
    is_local_leader: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    """One config a topic sets, in Kafka's names (``retention.ms``, ...). ``value`` None:
    in an alter, delete it (the node's value applies again)."""

    name: str
    value: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicInfo:
    error: int
    name: str
    partitions: list[PartitionInfo]
    # The largest record batch a produce to this topic may carry (its max.message.bytes,
    # or the answering node's default); 0 when unknown.
    max_message_bytes: int = 0
    # The configs the topic sets (the nodes' values apply to the rest).
    configs: list[TopicConfig] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataResponse(Response):
    cluster_id: str
    node_id: int
    controller_id: int
    nodes: list[NodeInfo]
    topics: list[TopicInfo]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequest(PartitionRequest):
    acks: int
    timeout_ms: int
    records: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponse(LeaderResponse):
    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequest(FencedRequest):
    fetch_offset: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int = READ_UNCOMMITTED


@dataclass(frozen=True, slots=True, kw_only=True)
class AbortedTransaction:
    """A transaction aborted in a fetched range: its producer and first offset (the
    reader drops that producer's transactional batches from there to its abort marker)."""

    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResponse(LeaderResponse):
    high_watermark: int
    log_start_offset: int
    records: bytes = b""
    # The first offset a transaction still holds open (else the high watermark); -1
    # where unknown (an error).
    last_stable_offset: int = -1
    # read_committed only: the aborted transactions overlapping the records served.
    aborted_transactions: list[AbortedTransaction] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsRequest(FencedRequest):
    timestamp: int
    # read_committed: LATEST is the last stable offset, not the high watermark.
    isolation_level: int = READ_UNCOMMITTED


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsResponse(Response):
    """``leader_epoch`` is the epoch of the record at ``offset`` (KIP-320)."""

    offset: int
    leader_epoch: int
    timestamp: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetsForLeaderEpochRequest(FencedRequest):
    leader_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetsForLeaderEpochResponse(Response):
    leader_epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaStateInfo:
    replica_id: int
    end_offset: int
    last_fetch_ms: int
    lag: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeQuorumRequest(PartitionRequest):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeQuorumResponse(LeaderResponse):
    high_watermark: int
    voters: list[ReplicaStateInfo] = field(default_factory=list)
    observers: list[ReplicaStateInfo] = field(default_factory=list)
    # The new replica a move copies the partition to now (the others wait their turn);
    # UNKNOWN: none.
    copying: int = UNKNOWN
    # The catch-up throttle the leader's node paces copies by (0: unthrottled).
    catch_up_bytes_per_s: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicRequest:
    name: str
    partitions: int
    replication_factor: int
    # The topic's max.message.bytes; 0: none set, each node's --max-message-bytes applies.
    max_message_bytes: int = 0
    # Configs the topic sets (``node.topic_configs``), Kafka's names.
    configs: list[TopicConfig] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicResponse(Response):
    # Created, but a placement rule could not be met (replicas of a partition share a
    # rack: fewer racks than replicas); "": every rule was.
    warning: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AlterTopicRequest:
    """Change a topic: grow it to ``partitions`` (0: unchanged; never fewer, as Kafka's
    CreatePartitions) and set (or, with a None value, delete) ``configs``. ``validate_only``
    checks and answers without changing anything."""

    name: str
    partitions: int = 0
    configs: list[TopicConfig] = field(default_factory=list)
    validate_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AlterTopicResponse(Response):
    # As CreateTopicResponse's, for the partitions a growth added.
    warning: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionMove:
    """One partition's new replicas; the first is its preferred leader."""

    partition: int
    replicas: list[int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReassignRequest:
    """Move partitions of ``topic`` to new replicas (``moves``), or, with ``cancel``, back
    to the replicas each had before its latest move (the moves' replicas are ignored)."""

    topic: str
    moves: list[PartitionMove] = field(default_factory=list)
    cancel: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReassignResponse(Response):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchUpThrottleRequest:
    """Set the bytes per second every node's leaders send the replicas moves add (0:
    unthrottled), for the moves under way and those to come; ``UNKNOWN``: each node's own
    --catch-up-bytes-per-second again."""

    bytes_per_s: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchUpThrottleResponse(Response):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeVoterRequest:
    """Add ``node_id`` to the metadata quorum's voters (``add``) or remove it."""

    node_id: int
    add: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeVoterResponse(Response):
    voters: list[int] = field(default_factory=list)  # the voter set it moves to


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterNodeRequest:
    """Node ``node_id`` (data directory ``directory``) serves raft and native clients at
    ``host:port`` and, if ``kafka_port``, Kafka clients at ``kafka_host:kafka_port``."""

    node_id: int
    directory: str
    host: str
    port: int
    kafka_host: str = ""
    kafka_port: int = 0
    # The registering process's heartbeat incarnation: heartbeats of another one under
    # this id, heard lately, mean another process serves as this node.
    incarnation: int = 0
    # ``serve --rack``: the failure domain it stands in (None: none given).
    rack: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAddress:
    node_id: int
    host: str
    port: int
    kafka_host: str = ""
    kafka_port: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterNodeResponse(Response):
    """The cluster a node joins: its id, every node's addresses, and the voters the
    metadata quorum was started with (its voter-set records change them from there)."""

    cluster_id: str = ""
    nodes: list[NodeAddress] = field(default_factory=list)
    metadata_voters: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetireNodeRequest:
    """Decommission ``node_id`` (no new replicas for it), or, not ``retired``, take it
    back into placement."""

    node_id: int
    retired: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class RetireNodeResponse(Response):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicRequest:
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicResponse(Response):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ListTopicsRequest:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ListTopicsResponse(Response):
    topics: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceLeaderRequest(PartitionRequest):
    """Unclean leader election on the receiving node: it leads in a new epoch without a
    majority. Committed records it lacks are lost; ``confirm`` must be true."""

    confirm: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceLeaderResponse(Response):
    leader_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftEnvelope(PartitionRequest):
    """One-way node-to-node raft message for one partition's quorum. ``kind`` names the
    raft message class; ``body`` is its codec body; ``records`` its payload, if any."""

    kind: str
    body: list[object]
    records: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftBatch:
    """One-way node-to-node raft messages for many partitions in one frame (what one
    step of a node sends to one peer): item i is a ``kinds[i]`` message for
    (``topics[i]``, ``partitions[i]``) with codec body ``bodies[i]``; its records are the
    next ``sizes[i]`` bytes of ``records`` (the frame's payload)."""

    topics: list[str]
    partitions: list[int]
    kinds: list[str]
    bodies: list[object]
    sizes: list[int]
    records: bytes = b""

    def items(self) -> list[tuple[str, int, str, object, bytes | memoryview]]:
        """(topic, partition, kind, body, records) per item; DecodeError if the lists
        disagree or the sizes do not add up to the payload exactly."""
        n = len(self.topics)
        if not len(self.partitions) == len(self.kinds) == len(self.bodies) == n:
            raise DecodeError("raft batch lists differ in length")
        parts = split_payload(self.records, self.sizes, n, "raft batch")
        return [
            (self.topics[i], self.partitions[i], self.kinds[i], self.bodies[i], parts[i])
            for i in range(n)
        ]


def split_payload(records: bytes, sizes: list[int], n: int, what: str) -> list[memoryview]:
    """The ``n`` back-to-back parts of a frame's payload, ``sizes[i]`` bytes each (views);
    DecodeError unless there are ``n`` sizes that add up to the payload exactly."""
    if len(sizes) != n:
        raise DecodeError(f"{what}: {len(sizes)} sizes for {n} items")
    if any(type(s) is not int or s < 0 for s in sizes) or sum(sizes) != len(records):
        raise DecodeError(f"{what}: sizes do not add up to its payload")
    view = memoryview(records)
    out: list[memoryview] = []
    at = 0
    for size in sizes:
        out.append(view[at : at + size])
        at += size
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceManyRequest:
    """Batches for several partitions of one topic in one frame, as a Kafka producer sends
    a broker every partition it has ready in one ProduceRequest: partition
    ``partitions[i]``'s records are the next ``sizes[i]`` bytes of ``records`` (the frame's
    payload). Each is appended and answered as its own ProduceRequest would be. One topic
    a frame, so that a principal is authorized for a frame's topic as for a Produce."""

    topic: str
    partitions: list[int]
    sizes: list[int]
    acks: int
    timeout_ms: int
    records: bytes = b""

    def requests(self) -> list[ProduceRequest]:
        """The ProduceRequest of each item; DecodeError if the sizes do not add up."""
        parts = split_payload(self.records, self.sizes, len(self.partitions), "produce-many")
        return [
            ProduceRequest(
                topic=self.topic,
                partition=partition,
                acks=self.acks,
                timeout_ms=self.timeout_ms,
                records=bytes(part),
            )
            for partition, part in zip(self.partitions, parts, strict=True)
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceManyResponse(Response):
    """``answers[i]`` answers the request's item i (empty with an error of the whole)."""

    answers: list[ProduceResponse] = field(default_factory=list)


RAFT_KEYS = frozenset({ApiKey.RAFT, ApiKey.RAFT_BATCH})


@dataclass(frozen=True, slots=True, kw_only=True)
class InitProducerIdRequest:
    """An idempotent producer's identity: a new one (-1, -1), or the next epoch of the
    one it has (after an error left its sequence numbers in doubt; Kafka's KIP-360)."""

    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class InitProducerIdResponse(Response):
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthenticateRequest:
    """One SCRAM step: ``auth_bytes`` is the RFC 5802 client-first or client-final message."""

    mechanism: str
    auth_bytes: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthenticateResponse(Response):
    """The server-first or server-final message; ``principal_kind`` is set once authenticated."""

    auth_bytes: bytes
    principal_kind: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarkerRequest(PartitionRequest):
    """The marker that ends producer ``producer_id``'s transaction on one partition, as
    its transaction coordinator decided it (``commit`` or abort), appended by the
    partition's leader and answered once a quorum holds it (as an acks=quorum produce)."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    timeout_ms: int
    timestamp_ms: int  # the marker record's (the coordinator's wall clock)


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarkersRequest:
    """Markers for partitions this node leads (Kafka's WriteTxnMarkers): each is written
    and answered as its own ``WriteTxnMarkerRequest``."""

    markers: list[WriteTxnMarkerRequest]


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarkersResponse(Response):
    """``answers[i]`` answers marker i (empty with an error of the whole)."""

    answers: list[ProduceResponse] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaEnvelopeRequest:
    """One Kafka request (its header and body as on Kafka's wire, without the length),
    answered by this node's Kafka handlers as if its Kafka listener had received it from
    the connection's principal."""

    request: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaEnvelopeResponse(Response):
    """The Kafka response (header and body, without the length); empty with an error
    of the envelope (a request that could not be read)."""

    response: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnGroupMember:
    """A member of a transaction group: the transactional id ``group#...`` and the
    producer id and epoch it wrote its open transaction with."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnGroupCommitRequest:
    """Decide batch ``batch`` of transaction group ``group`` (``kafka.txn.group_commit``):
    ``commit`` every member's open transaction at once and move the group's fence to the
    batch, or abort them. A batch at or below the fence was decided already: its
    members abort. No members and no commit: only the fence is answered."""

    group: str
    batch: int
    commit: bool
    members: list[TxnGroupMember] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnGroupCommitResponse(Response):
    """``committed_batch``: the group's fence after the request (-1: none yet)."""

    committed_batch: int = -1


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
    ApiKey.ALTER_TOPIC: (AlterTopicRequest, AlterTopicResponse),
    ApiKey.REASSIGN: (ReassignRequest, ReassignResponse),
    ApiKey.CHANGE_VOTER: (ChangeVoterRequest, ChangeVoterResponse),
    ApiKey.REGISTER_NODE: (RegisterNodeRequest, RegisterNodeResponse),
    ApiKey.RETIRE_NODE: (RetireNodeRequest, RetireNodeResponse),
    ApiKey.CATCH_UP_THROTTLE: (CatchUpThrottleRequest, CatchUpThrottleResponse),
    ApiKey.LIST_TOPICS: (ListTopicsRequest, ListTopicsResponse),
    ApiKey.FORCE_LEADER: (ForceLeaderRequest, ForceLeaderResponse),
    ApiKey.INIT_PRODUCER_ID: (InitProducerIdRequest, InitProducerIdResponse),
    ApiKey.PRODUCE_MANY: (ProduceManyRequest, ProduceManyResponse),
    ApiKey.WRITE_TXN_MARKERS: (WriteTxnMarkersRequest, WriteTxnMarkersResponse),
    ApiKey.KAFKA_ENVELOPE: (KafkaEnvelopeRequest, KafkaEnvelopeResponse),
    ApiKey.TXN_GROUP_COMMIT: (TxnGroupCommitRequest, TxnGroupCommitResponse),
}

API_VERSION = 0
