"""Cluster metadata: the topics, their replica assignment and configs, rebuilt on every
node by applying the committed records of the metadata partition (as KRaft's metadata
log).

Records (msgpack maps): ``create_topic`` (name, replicas, configs), ``alter_topic`` (name,
the whole new replicas and configs: applying one twice changes nothing), ``reassign``
(name, ``moves``: [partition, new replicas, replicas before] each), ``quorum_voters``
(the metadata quorum's new voters), ``delete_topic`` (name), ``register_node`` (a node's
id, data directory, listeners and rack: ``NodeRegistration``), ``retire_node`` (node id, and
whether it is given no new replicas from now on, or again some) and ``catch_up_throttle``
(``bytes_per_s`` every node's leaders send new replicas, or None for each node's own). A
``create_topic`` of an earlier version carries ``max_message_bytes`` instead of configs."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..client.balance import Racks, rack_aware_assignment
from ..kafka.coordinators import OFFSETS_TOPIC, TXN_STATE_TOPIC
from ..protocol import messages as m

METADATA_TOPIC = "__cluster_metadata"
# Listed in Metadata (Kafka: is_internal) but written only by the node itself.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_STATE_TOPIC})
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


@dataclass
class TopicAssignment:
    name: str
    replicas: list[list[int]]  # per partition, the replica node ids; the first is preferred
    # The configs the topic sets, in Kafka's names (``topic_configs``); the node's value
    # applies to the rest.
    configs: dict[str, str] = field(default_factory=dict)
    # Partitions moved by a reassignment: the replicas each had before its latest move.
    # Those replicas keep hosting it (as voters until the partition's leader removes
    # them from its voter set, then as observers until the removal is committed), and
    # a replica new to it starts with them as its voters: it is an observer until the
    # voter-set record that adds it reaches its log.
    previous: dict[int, list[int]] = field(default_factory=dict)

    def hosts(self, partition: int) -> list[int]:
        """Every node that may hold a replica of ``partition``: its replicas and, while
        it moves, those it had before."""
        now = self.replicas[partition]
        before = self.previous.get(partition, ())
        return now + [n for n in before if n not in now]

    def voters(self, partition: int) -> list[int]:
        """The voters a replica of ``partition`` opens with (its log's voter-set
        records, once it holds any, replace them)."""
        return self.previous.get(partition, self.replicas[partition])

    @property
    def max_message_bytes(self) -> int | None:
        """The topic's max.message.bytes; None: the node's default applies."""
        value = self.configs.get("max.message.bytes")
        return None if value is None else int(value)


@dataclass(frozen=True)
class NodeRegistration:
    """A node as it registered: its data directory, where it listens (the Kafka
    listener None if it serves none) and its rack (``serve --rack``; None: none given,
    as in every registration a log written before racks holds)."""

    node_id: int
    directory: str
    address: tuple[str, int]
    kafka: tuple[str, int] | None = None
    rack: str | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": "register_node",
            "node_id": self.node_id,
            "directory": self.directory,
            "host": self.address[0],
            "port": self.address[1],
        }
        if self.kafka is not None:
            out["kafka_host"], out["kafka_port"] = self.kafka
        if self.rack is not None:
            out["rack"] = self.rack
        return out

    def request(self, incarnation: int) -> m.RegisterNodeRequest:
        """The REGISTER_NODE request of this registration, by the process of
        ``incarnation``."""
        kafka_host, kafka_port = self.kafka or ("", 0)
        host, port = self.address
        return m.RegisterNodeRequest(
            node_id=self.node_id,
            directory=self.directory,
            host=host,
            port=port,
            kafka_host=kafka_host,
            kafka_port=kafka_port,
            incarnation=incarnation,
            rack=self.rack,
        )

    @staticmethod
    def of_request(req: m.RegisterNodeRequest) -> NodeRegistration:
        kafka = (req.kafka_host, req.kafka_port) if req.kafka_port else None
        return NodeRegistration(
            req.node_id, req.directory, (req.host, req.port), kafka, req.rack or None
        )

    @staticmethod
    def of(record: dict[str, Any]) -> NodeRegistration:
        kafka = record.get("kafka_host")
        return NodeRegistration(
            int(record["node_id"]),
            str(record["directory"]),
            (str(record["host"]), int(record["port"])),
            None if kafka is None else (str(kafka), int(record["kafka_port"])),
            None if record.get("rack") is None else str(record["rack"]),
        )


@dataclass
class MetadataState:
    topics: dict[str, TopicAssignment] = field(default_factory=dict)
    # Topics a delete record removed (and not created again since): only their replicas
    # may be deleted from disk, never those of a topic this node has not applied yet.
    deleted: set[str] = field(default_factory=set)
    applied_offset: int = 0  # the next metadata offset to apply
    # The metadata quorum's voters an operator moved it to (None: those it started with);
    # its leader changes its voter set there one voter at a time.
    quorum_voters: list[int] | None = None
    # Nodes that registered (``serve --join``, or any node at start), by id: the latest
    # registration of each.
    nodes: dict[int, NodeRegistration] = field(default_factory=dict)
    # Decommissioned nodes: placement gives them no new replicas.
    retired: set[int] = field(default_factory=set)
    # The catch-up throttle an operator set for every node (``partition reassign
    # --throttle``; 0: none); None: each node's own --catch-up-bytes-per-second.
    catch_up_bytes_per_s: int | None = None

    def apply(self, record: dict[str, Any]) -> None:
        op = record.get("op")
        if op == "create_topic":
            name = str(record["name"])
            configs = _configs(record)
            limit = record.get("max_message_bytes")
            if limit is not None:
                configs["max.message.bytes"] = str(int(limit))
            self.topics[name] = TopicAssignment(name, _replicas(record), configs)
            self.deleted.discard(name)
        elif op == "alter_topic":
            t = self.topics.get(str(record["name"]))
            if t is not None:
                t.replicas = _replicas(record)
                t.configs = _configs(record)
        elif op == "reassign":
            t = self.topics.get(str(record["name"]))
            if t is not None:
                for partition, replicas, before in record["moves"]:
                    if 0 <= int(partition) < len(t.replicas):
                        t.replicas[int(partition)] = [int(r) for r in replicas]
                        t.previous[int(partition)] = [int(r) for r in before]
        elif op == "quorum_voters":
            self.quorum_voters = [int(v) for v in record["voters"]]
        elif op == "register_node":
            node = NodeRegistration.of(record)
            self.nodes[node.node_id] = node
        elif op == "retire_node":
            if record.get("retired", True):
                self.retired.add(int(record["node_id"]))
            else:
                self.retired.discard(int(record["node_id"]))
        elif op == "catch_up_throttle":
            rate = record.get("bytes_per_s")
            self.catch_up_bytes_per_s = None if rate is None else max(0, int(rate))
        elif op == "delete_topic":
            name = str(record["name"])
            self.topics.pop(name, None)
            self.deleted.add(name)


def _replicas(record: dict[str, Any]) -> list[list[int]]:
    return [list(map(int, r)) for r in record["replicas"]]


def _configs(record: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (record.get("configs") or {}).items()}


def validate_topic_name(name: str) -> str | None:
    if name.startswith("__"):
        return f"topic name {name!r} is reserved (names starting with '__' are internal)"
    if not TOPIC_NAME.match(name):
        return f"topic name {name!r} is invalid: use 1-200 characters of letters, digits, '.', '_' and '-'"
    return None


def assign_replicas(
    name: str,
    partitions: int,
    replication_factor: int,
    nodes: list[int],
    racks: Racks | None = None,
) -> list[list[int]]:
    """Where a topic's partitions go. With ``racks`` (node -> rack, for the nodes that
    have one), Kafka's rack-aware assignment (``balance.rack_aware_assignment``); without,
    Kafka's rack-unaware one. The first (preferred) replicas go round-robin from
    a per-topic start, so leaders spread across nodes. The followers follow the first at a
    shift that grows by one each time the first replicas have gone round the nodes once:
    the partitions a node prefers have each other node as first follower equally often,
    so when it dies the partitions it led go to the survivors evenly (the first follower
    stands first, ``Driver.peer_unreachable``), not all to the node after it."""
    if racks:
        return rack_aware_assignment(name, partitions, replication_factor, nodes, racks)
    ids = sorted(nodes)
    n = len(ids)
    start = zlib.crc32(name.encode()) % n
    out = []
    for p in range(partitions):
        first = (start + p) % n
        shift = p // n
        followers = [
            ids[(first + 1 + (shift + j) % (n - 1)) % n] for j in range(replication_factor - 1)
        ]
        out.append([ids[first], *followers])
    return out


def encode_record(record: dict[str, Any]) -> bytes:
    out: bytes = msgpack.packb(record, use_bin_type=True)
    return out


def decode_record(value: bytes) -> dict[str, Any]:
    out = msgpack.unpackb(value, raw=False)
    if not isinstance(out, dict):
        raise ValueError("metadata record is not a map")
    return out
