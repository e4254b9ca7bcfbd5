"""Cluster metadata: the topics and their replica assignment, rebuilt on every node by
applying the committed records of the metadata partition (as KRaft's metadata log)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

METADATA_TOPIC = "__cluster_metadata"
# Kafka consumer groups' committed offsets (kafka_groups.py), created on first use.
OFFSETS_TOPIC = "__consumer_offsets"
# Listed in Metadata (Kafka: is_internal) but written only by the node itself.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


@dataclass
class TopicAssignment:
    name: str
    replicas: list[list[int]]  # per partition, the replica node ids; the first is preferred
    # The topic's max.message.bytes; None: the node's default applies.
    max_message_bytes: int | None = None


@dataclass
class MetadataState:
    topics: dict[str, TopicAssignment] = field(default_factory=dict)
    # Topics a delete record removed (and not created again since): only their replicas
    # may be deleted from disk, never those of a topic this node has not applied yet.
    deleted: set[str] = field(default_factory=set)
    applied_offset: int = 0  # the next metadata offset to apply

    def apply(self, record: dict[str, Any]) -> None:
        op = record.get("op")
        if op == "create_topic":
            name = str(record["name"])
            limit = record.get("max_message_bytes")
            self.topics[name] = TopicAssignment(
                name,
                [list(map(int, r)) for r in record["replicas"]],
                None if limit is None else int(limit),
            )
            self.deleted.discard(name)
        elif op == "delete_topic":
            name = str(record["name"])
            self.topics.pop(name, None)
            self.deleted.add(name)


def validate_topic_name(name: str) -> str | None:
    if name.startswith("__"):
        return f"topic name {name!r} is reserved (names starting with '__' are internal)"
    if not TOPIC_NAME.match(name):
        return f"topic name {name!r} is invalid: use 1-200 characters of letters, digits, '.', '_' and '-'"
    return None


def assign_replicas(
    name: str, partitions: int, replication_factor: int, nodes: list[int]
) -> list[list[int]]:
    """Kafka's rack-unaware assignment. The first (preferred) replicas go round-robin from
    a per-topic start, so leaders spread across nodes. The followers follow the first at a
    shift that grows by one each time the first replicas have gone round the nodes once:
    the partitions a node prefers have each other node as first follower equally often,
    so when it dies the partitions it led go to the survivors evenly (the first follower
    stands first, ``Driver.peer_unreachable``), not all to the node after it."""
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
