"""What DescribeConfigs answers (``handlers``): a topic's configs and this node's, with the
values the node really applies, in Kafka's names.

``retention.ms``, ``retention.bytes``, ``segment.bytes``, ``segment.ms``,
``max.message.bytes``, ``cleanup.policy`` and the compaction settings
(``min.cleanable.dirty.ratio``, ``min.compaction.lag.ms``, ``max.compaction.lag.ms``,
``delete.retention.ms``) are the topic's where it sets them (DYNAMIC_TOPIC_CONFIG;
``topic_configs``), else the node's; those are the ones AlterConfigs and
IncrementalAlterConfigs change. ``min.insync.replicas``
is the quorum's majority of the topic's replicas: acks=all waits for that many.
``compression.type`` is the topic's (default ``producer``): how a Kafka producer's batches
are stored (Arrow IPC buffer compression); fetches answer uncompressed Kafka batches.
The other configs are read-only.
A value the node was started with is
STATIC_BROKER_CONFIG if it differs from the shipped default, else DEFAULT_CONFIG.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import defaults
from ..kafka.schema import Message
from ..node.config import NodeConfig
from ..node.metadata import TopicAssignment

# org.apache.kafka.common.requests.DescribeConfigsResponse.ConfigSource
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
# ... .ConfigType
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
#: How Kafka writes "never" for a time bound (segment.ms, max.compaction.lag.ms).
LONG_MAX = str((1 << 63) - 1)


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str
    source: int
    config_type: int
    documentation: str
    # (name, value, source), the entry's own first, as Kafka lists a config's synonyms.
    synonyms: tuple[tuple[str, str, int], ...] = ()
    read_only: bool = True


NodeValue = int | float | str | None


def _node_value(value: NodeValue, default: NodeValue, unset: str = "-1") -> tuple[str, int]:
    """A node setting as Kafka writes it (``unset`` for None: -1, unlimited, or LONG_MAX,
    never) and where it came from."""
    text = unset if value is None else str(value)
    return text, DEFAULT_CONFIG if value == default else STATIC_BROKER_CONFIG


def _fixed(name: str, value: str, config_type: int, doc: str) -> ConfigEntry:
    return ConfigEntry(
        name, value, DEFAULT_CONFIG, config_type, doc, ((name, value, DEFAULT_CONFIG),)
    )


def _from_node(
    name: str,
    broker_name: str,
    value: NodeValue,
    default: NodeValue,
    config_type: int,
    doc: str,
    unset: str = "-1",
) -> ConfigEntry:
    text, source = _node_value(value, default, unset)
    return ConfigEntry(name, text, source, config_type, doc, ((broker_name, text, source),))


def _topic_or_node(
    topic: TopicAssignment,
    name: str,
    broker_name: str,
    value: NodeValue,
    default: NodeValue,
    config_type: int,
    doc: str,
    unset: str = "-1",
) -> ConfigEntry:
    """A config the topic may set: its own value if it does (the node's as a synonym),
    else the node's."""
    node = _from_node(name, broker_name, value, default, config_type, doc, unset)
    own = topic.configs.get(name)
    if own is None:
        return dataclasses.replace(node, read_only=False)
    return _set_by_topic(name, own, config_type, doc, node.synonyms)


def _topic_only(
    topic: TopicAssignment, name: str, default: str, config_type: int, doc: str
) -> ConfigEntry:
    """A config the topic may set that has no node-wide value: its own, else Kafka's
    default."""
    own = topic.configs.get(name)
    if own is None:
        return dataclasses.replace(_fixed(name, default, config_type, doc), read_only=False)
    return _set_by_topic(name, own, config_type, doc, ())


def _set_by_topic(
    name: str, own: str, config_type: int, doc: str, below: tuple[tuple[str, str, int], ...]
) -> ConfigEntry:
    """A config the topic sets itself: its value first among the synonyms, then
    ``below`` (what applies where the topic sets none)."""
    synonyms = ((name, own, DYNAMIC_TOPIC_CONFIG), *below)
    return ConfigEntry(name, own, DYNAMIC_TOPIC_CONFIG, config_type, doc, synonyms, read_only=False)


def topic_configs(config: NodeConfig, topic: TopicAssignment) -> list[ConfigEntry]:
    replicas = len(topic.replicas[0]) if topic.replicas else 0
    return [
        _topic_or_node(
            topic,
            "cleanup.policy",
            "log.cleanup.policy",
            config.cleanup_policy,
            defaults.CLEANUP_POLICY,
            LIST,
            "delete: retention deletes old segments; compact: the cleaner keeps the latest "
            "record of each key (records without a key are refused); or both.",
        ),
        _topic_or_node(
            topic,
            "delete.retention.ms",
            "log.cleaner.delete.retention.ms",
            config.delete_retention_ms,
            defaults.DELETE_RETENTION_MS,
            LONG,
            "How long a compacted topic keeps a tombstone, from its timestamp.",
        ),
        _topic_only(
            topic,
            "compression.type",
            "producer",
            STRING,
            "How a Kafka producer's batches rest on disk: Arrow IPC buffer compression "
            "(uncompressed, lz4, zstd, or producer: the producer's codec). Fetches answer "
            "uncompressed batches.",
        ),
        _topic_or_node(
            topic,
            "max.message.bytes",
            "message.max.bytes",
            config.max_message_bytes,
            defaults.MAX_MESSAGE_BYTES,
            INT,
            "The largest record batch a producer may send to this topic.",
        ),
        _topic_or_node(
            topic,
            "max.compaction.lag.ms",
            "log.cleaner.max.compaction.lag.ms",
            config.max_compaction_lag_ms,
            defaults.MAX_COMPACTION_LAG_MS,
            LONG,
            "The longest a record stays uncompacted in a compacted topic.",
            unset=LONG_MAX,
        ),
        _fixed(
            "message.timestamp.type",
            "CreateTime",
            STRING,
            "Records keep the timestamp their producer gave them.",
        ),
        _topic_or_node(
            topic,
            "min.cleanable.dirty.ratio",
            "log.cleaner.min.cleanable.ratio",
            config.min_cleanable_dirty_ratio,
            defaults.MIN_CLEANABLE_DIRTY_RATIO,
            DOUBLE,
            "A compacted log is cleaned once this share of it is not yet compacted.",
        ),
        _topic_or_node(
            topic,
            "min.compaction.lag.ms",
            "log.cleaner.min.compaction.lag.ms",
            config.min_compaction_lag_ms,
            defaults.MIN_COMPACTION_LAG_MS,
            LONG,
            "The least time a record stays uncompacted in a compacted topic.",
        ),
        _fixed(
            "min.insync.replicas",
            str(replicas // 2 + 1),
            INT,
            "acks=all waits until a majority of the replicas (the partition's quorum) has "
            "the batch on disk.",
        ),
        _topic_or_node(
            topic,
            "retention.bytes",
            "log.retention.bytes",
            config.retention_bytes,
            defaults.RETENTION_BYTES,
            LONG,
            "The size bound per partition (-1: none).",
        ),
        _topic_or_node(
            topic,
            "retention.ms",
            "log.retention.ms",
            config.retention_ms,
            defaults.RETENTION_MS,
            LONG,
            "The age bound on records (-1: none).",
        ),
        _topic_or_node(
            topic,
            "segment.bytes",
            "log.segment.bytes",
            config.segment_bytes,
            defaults.SEGMENT_BYTES,
            INT,
            "The segment size.",
        ),
        _topic_or_node(
            topic,
            "segment.ms",
            "log.roll.ms",
            config.segment_ms,
            defaults.SEGMENT_MS,
            LONG,
            "Roll the active segment once it is this old.",
            unset=LONG_MAX,
        ),
        _fixed(
            "unclean.leader.election.enable",
            "false",
            BOOLEAN,
            "A leader is elected by its partition's quorum only.",
        ),
    ]


def broker_configs(config: NodeConfig, nodes: int) -> list[ConfigEntry]:
    """This node's configs; ``nodes``: how many nodes take new replicas."""
    node_id = str(config.node_id)

    def static(name: str, value: str, config_type: int, doc: str) -> ConfigEntry:
        return ConfigEntry(
            name,
            value,
            STATIC_BROKER_CONFIG,
            config_type,
            doc,
            ((name, value, STATIC_BROKER_CONFIG),),
        )

    def node(
        name: str,
        value: NodeValue,
        default: NodeValue,
        config_type: int,
        doc: str,
        unset: str = "-1",
    ) -> ConfigEntry:
        return _from_node(name, name, value, default, config_type, doc, unset)

    return [
        static("node.id", node_id, INT, "This node's id."),
        static("broker.id", node_id, INT, "This node's id."),
        _fixed("auto.create.topics.enable", "false", BOOLEAN, "Topics are created explicitly."),
        _fixed("num.partitions", "1", INT, "Partitions of a topic created without a count."),
        _fixed(
            "default.replication.factor",
            str(min(3, nodes)),
            INT,
            "Replicas of a topic created without a replication factor.",
        ),
        node(
            "group.initial.rebalance.delay.ms",
            config.group_initial_rebalance_delay_ms,
            defaults.GROUP_INITIAL_REBALANCE_DELAY_MS,
            INT,
            "How long a new group's first rebalance waits for more members.",
        ),
        node(
            "log.cleaner.delete.retention.ms",
            config.delete_retention_ms,
            defaults.DELETE_RETENTION_MS,
            LONG,
            "delete.retention.ms for topics that set none.",
        ),
        node(
            "log.cleaner.max.compaction.lag.ms",
            config.max_compaction_lag_ms,
            defaults.MAX_COMPACTION_LAG_MS,
            LONG,
            "max.compaction.lag.ms for topics that set none.",
            unset=LONG_MAX,
        ),
        node(
            "log.cleaner.min.cleanable.ratio",
            config.min_cleanable_dirty_ratio,
            defaults.MIN_CLEANABLE_DIRTY_RATIO,
            DOUBLE,
            "min.cleanable.dirty.ratio for topics that set none.",
        ),
        node(
            "log.cleaner.min.compaction.lag.ms",
            config.min_compaction_lag_ms,
            defaults.MIN_COMPACTION_LAG_MS,
            LONG,
            "min.compaction.lag.ms for topics that set none.",
        ),
        node(
            "log.cleanup.policy",
            config.cleanup_policy,
            defaults.CLEANUP_POLICY,
            LIST,
            "cleanup.policy for topics that set none.",
        ),
        node(
            "message.max.bytes",
            config.max_message_bytes,
            defaults.MAX_MESSAGE_BYTES,
            INT,
            "The largest record batch, for topics that set no max.message.bytes.",
        ),
        node(
            "log.retention.bytes",
            config.retention_bytes,
            defaults.RETENTION_BYTES,
            LONG,
            "Size bound per partition (-1: none).",
        ),
        node(
            "log.retention.ms",
            config.retention_ms,
            defaults.RETENTION_MS,
            LONG,
            "Age bound on records (-1: none).",
        ),
        node(
            "log.roll.ms",
            config.segment_ms,
            defaults.SEGMENT_MS,
            LONG,
            "segment.ms for topics that set none.",
            unset=LONG_MAX,
        ),
        node(
            "log.segment.bytes",
            config.segment_bytes,
            defaults.SEGMENT_BYTES,
            INT,
            "Segment size.",
        ),
        node(
            "socket.request.max.bytes",
            config.max_frame_bytes,
            defaults.MAX_FRAME_BYTES,
            INT,
            "The largest request the node accepts.",
        ),
    ]


def config_entries(
    entries: list[ConfigEntry], keys: list[str] | None, synonyms: bool, documentation: bool
) -> list[Message]:
    """DescribeConfigs ``configs`` for ``entries``, those named in ``keys`` (None: all; an
    unknown name is left out, as Kafka does)."""
    wanted = None if keys is None else set(keys)
    return [
        {
            "name": e.name,
            "value": e.value,
            "read_only": e.read_only,
            "is_default": e.source == DEFAULT_CONFIG,
            "config_source": e.source,
            "is_sensitive": False,
            "synonyms": [
                {"name": n, "value": v, "source": s} for n, v, s in (e.synonyms if synonyms else ())
            ],
            "config_type": e.config_type,
            "documentation": e.documentation if documentation else None,
        }
        for e in entries
        if wanted is None or e.name in wanted
    ]
