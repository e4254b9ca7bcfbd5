"""The Kafka APIs quorumlog speaks: schemas and the versions served.

Most schemas are generated from ``kio`` (``kio_messages``, written by
``python -m tests.kafka.kio_generate``): kio's classes are generated from apache/kafka's
own message definitions. The ones here are transcribed from those definitions
(``clients/src/main/resources/common/message/*.json``, trunk of October 2024, commit
1eb7644349cb; field names in snake_case, version ranges, nullability, tags and defaults as
there): Produce, Fetch, ListOffsets and Metadata, where the listener's record-batch codec
and its hot path read the fields directly, and OffsetCommit, OffsetFetch, CreateTopics,
DeleteTopics and DescribeConfigs, whose version 0 (still negotiated by clients) Kafka 4's
definitions, and so kio, no longer have. Each ``Api`` names the versions we serve: from
the first version that carries RecordBatch v2 / leader epochs a modern client needs, to
the newest defined there (librdkafka 2.x and the Java client 3.x negotiate inside these).
"""

from __future__ import annotations

from typing import Any

# Re-exported: every API's schema is reached through this module.
from .kio_messages import ADD_OFFSETS_TO_TXN as ADD_OFFSETS_TO_TXN
from .kio_messages import ADD_PARTITIONS_TO_TXN as ADD_PARTITIONS_TO_TXN
from .kio_messages import ALTER_CONFIGS as ALTER_CONFIGS
from .kio_messages import API_VERSIONS as API_VERSIONS
from .kio_messages import CREATE_PARTITIONS as CREATE_PARTITIONS
from .kio_messages import DELETE_GROUPS as DELETE_GROUPS
from .kio_messages import DESCRIBE_CLUSTER as DESCRIBE_CLUSTER
from .kio_messages import DESCRIBE_GROUPS as DESCRIBE_GROUPS
from .kio_messages import DESCRIBE_TRANSACTIONS as DESCRIBE_TRANSACTIONS
from .kio_messages import END_TXN as END_TXN
from .kio_messages import FIND_COORDINATOR as FIND_COORDINATOR
from .kio_messages import HEARTBEAT as HEARTBEAT
from .kio_messages import INCREMENTAL_ALTER_CONFIGS as INCREMENTAL_ALTER_CONFIGS
from .kio_messages import INIT_PRODUCER_ID as INIT_PRODUCER_ID
from .kio_messages import JOIN_GROUP as JOIN_GROUP
from .kio_messages import LEAVE_GROUP as LEAVE_GROUP
from .kio_messages import LIST_GROUPS as LIST_GROUPS
from .kio_messages import LIST_TRANSACTIONS as LIST_TRANSACTIONS
from .kio_messages import OFFSET_DELETE as OFFSET_DELETE
from .kio_messages import OFFSET_FOR_LEADER_EPOCH as OFFSET_FOR_LEADER_EPOCH
from .kio_messages import SASL_AUTHENTICATE as SASL_AUTHENTICATE
from .kio_messages import SASL_HANDSHAKE as SASL_HANDSHAKE
from .kio_messages import SYNC_GROUP as SYNC_GROUP
from .kio_messages import TXN_OFFSET_COMMIT as TXN_OFFSET_COMMIT
from .kio_messages import WRITE_TXN_MARKERS as WRITE_TXN_MARKERS
from .schema import Api, F

# fmt: off


# Structures several APIs share (Kafka's common structs), parameterised by the versions
# their fields exist in.
def _endpoints(name: str, v: str, rack: str, **tagging: Any) -> F:
    """An array of node endpoints (Kafka's NodeEndpoint / MetadataResponseBroker)."""
    return F(name, "[]", v, **tagging, fields=(
        F("node_id", "int32", v),
        F("host", "string", v),
        F("port", "int32", v),
        F("rack", "string", rack, nullable=rack, default=None),
    ))


def _topic_partitions(v: str, *partition_fields: F) -> F:
    """``topics[]: name, partitions[]: partition_index, <partition_fields>``."""
    return F("topics", "[]", v, fields=(
        F("name", "string", v),
        F("partitions", "[]", v, fields=(F("partition_index", "int32", v), *partition_fields)),
    ))


def _committed_offset(v: str, epoch: str) -> tuple[F, ...]:
    """One partition's committed position in an OffsetFetch answer."""
    return (
        F("committed_offset", "int64", v),
        F("committed_leader_epoch", "int32", epoch, default=-1),
        F("metadata", "string", v, nullable=v),
        F("error_code", "int16", v),
    )


PRODUCE = Api(0, "Produce", 3, 11, flexible="9+",
    request=(
        F("transactional_id", "string", "3+", nullable="3+", default=None),
        F("acks", "int16", "0+"),
        F("timeout_ms", "int32", "0+"),
        F("topic_data", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("partition_data", "[]", "0+", fields=(
                F("index", "int32", "0+"),
                F("records", "records", "0+", nullable="0+"),
            )),
        )),
    ),
    response=(
        F("responses", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("partition_responses", "[]", "0+", fields=(
                F("index", "int32", "0+"),
                F("error_code", "int16", "0+"),
                F("base_offset", "int64", "0+"),
                F("log_append_time_ms", "int64", "2+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
                F("record_errors", "[]", "8+", fields=(
                    F("batch_index", "int32", "8+"),
                    F("batch_index_error_message", "string", "8+", nullable="8+", default=None),
                )),
                F("error_message", "string", "8+", nullable="8+", default=None),
                F("current_leader", "{}", "10+", tag=0, tagged="10+", fields=(
                    F("leader_id", "int32", "10+", default=-1),
                    F("leader_epoch", "int32", "10+", default=-1),
                )),
            )),
        )),
        F("throttle_time_ms", "int32", "1+", default=0),
        _endpoints("node_endpoints", "10+", "10+", tag=0, tagged="10+"),
    ),
)
FETCH = Api(1, "Fetch", 4, 17, flexible="12+",
    request=(
        F("cluster_id", "string", "12+", nullable="12+", tag=0, tagged="12+", default=None),
        F("replica_id", "int32", "0-14", default=-1),
        F("replica_state", "{}", "15+", tag=1, tagged="15+", fields=(
            F("replica_id", "int32", "15+", default=-1),
            F("replica_epoch", "int64", "15+", default=-1),
        )),
        F("max_wait_ms", "int32", "0+"),
        F("min_bytes", "int32", "0+"),
        F("max_bytes", "int32", "3+", default=2147483647),
        F("isolation_level", "int8", "4+", default=0),
        F("session_id", "int32", "7+", default=0),
        F("session_epoch", "int32", "7+", default=-1),
        F("topics", "[]", "0+", fields=(
            F("topic", "string", "0-12"),
            F("topic_id", "uuid", "13+"),
            F("partitions", "[]", "0+", fields=(
                F("partition", "int32", "0+"),
                F("current_leader_epoch", "int32", "9+", default=-1),
                F("fetch_offset", "int64", "0+"),
                F("last_fetched_epoch", "int32", "12+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
                F("partition_max_bytes", "int32", "0+"),
                F("replica_directory_id", "uuid", "17+", tag=0, tagged="17+"),
            )),
        )),
        F("forgotten_topics_data", "[]", "7+", fields=(
            F("topic", "string", "7-12"),
            F("topic_id", "uuid", "13+"),
            F("partitions", "[]int32", "7+"),
        )),
        F("rack_id", "string", "11+", default=""),
    ),
    response=(
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "7+"),
        F("session_id", "int32", "7+", default=0),
        F("responses", "[]", "0+", fields=(
            F("topic", "string", "0-12"),
            F("topic_id", "uuid", "13+"),
            F("partitions", "[]", "0+", fields=(
                F("partition_index", "int32", "0+"),
                F("error_code", "int16", "0+"),
                F("high_watermark", "int64", "0+"),
                F("last_stable_offset", "int64", "4+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
                F("diverging_epoch", "{}", "12+", tag=0, tagged="12+", fields=(
                    F("epoch", "int32", "12+", default=-1),
                    F("end_offset", "int64", "12+", default=-1),
                )),
                F("current_leader", "{}", "12+", tag=1, tagged="12+", fields=(
                    F("leader_id", "int32", "12+", default=-1),
                    F("leader_epoch", "int32", "12+", default=-1),
                )),
                F("snapshot_id", "{}", "12+", tag=2, tagged="12+", fields=(
                    F("end_offset", "int64", "0+", default=-1),
                    F("epoch", "int32", "0+", default=-1),
                )),
                F("aborted_transactions", "[]", "4+", nullable="4+", fields=(
                    F("producer_id", "int64", "4+"),
                    F("first_offset", "int64", "4+"),
                )),
                F("preferred_read_replica", "int32", "11+", default=-1),
                F("records", "records", "0+", nullable="0+"),
            )),
        )),
        _endpoints("node_endpoints", "16+", "16+", tag=0, tagged="16+"),
    ),
)
LIST_OFFSETS = Api(2, "ListOffsets", 1, 10, flexible="6+",
    request=(
        F("replica_id", "int32", "0+"),
        F("isolation_level", "int8", "2+"),
        _topic_partitions("0+",
            F("current_leader_epoch", "int32", "4+", default=-1),
            F("timestamp", "int64", "0+"),
            F("max_num_offsets", "int32", "0", default=1),
        ),
        F("timeout_ms", "int32", "10+"),
    ),
    response=(
        F("throttle_time_ms", "int32", "2+"),
        _topic_partitions("0+",
            F("error_code", "int16", "0+"),
            F("old_style_offsets", "[]int64", "0"),
            F("timestamp", "int64", "1+", default=-1),
            F("offset", "int64", "1+", default=-1),
            F("leader_epoch", "int32", "4+", default=-1),
        ),
    ),
)
METADATA = Api(3, "Metadata", 0, 12, flexible="9+",
    request=(
        F("topics", "[]", "0+", nullable="1+", fields=(
            F("topic_id", "uuid", "10+"),
            F("name", "string", "0+", nullable="10+"),
        )),
        F("allow_auto_topic_creation", "bool", "4+", default=True),
        F("include_cluster_authorized_operations", "bool", "8-10"),
        F("include_topic_authorized_operations", "bool", "8+"),
    ),
    response=(
        F("throttle_time_ms", "int32", "3+"),
        _endpoints("brokers", "0+", "1+"),
        F("cluster_id", "string", "2+", nullable="2+", default=None),
        F("controller_id", "int32", "1+", default=-1),
        F("topics", "[]", "0+", fields=(
            F("error_code", "int16", "0+"),
            F("name", "string", "0+", nullable="12+"),
            F("topic_id", "uuid", "10+"),
            F("is_internal", "bool", "1+", default=False),
            F("partitions", "[]", "0+", fields=(
                F("error_code", "int16", "0+"),
                F("partition_index", "int32", "0+"),
                F("leader_id", "int32", "0+"),
                F("leader_epoch", "int32", "7+", default=-1),
                F("replica_nodes", "[]int32", "0+"),
                F("isr_nodes", "[]int32", "0+"),
                F("offline_replicas", "[]int32", "5+"),
            )),
            F("topic_authorized_operations", "int32", "8+", default=-2147483648),
        )),
        F("cluster_authorized_operations", "int32", "8-10", default=-2147483648),
    ),
)
OFFSET_COMMIT = Api(8, "OffsetCommit", 0, 9, flexible="8+",
    request=(
        F("group_id", "string", "0+"),
        F("generation_id_or_member_epoch", "int32", "1+", default=-1),
        F("member_id", "string", "1+"),
        F("group_instance_id", "string", "7+", nullable="7+", default=None),
        F("retention_time_ms", "int64", "2-4", default=-1),
        _topic_partitions("0+",
            F("committed_offset", "int64", "0+"),
            F("committed_leader_epoch", "int32", "6+", default=-1),
            F("commit_timestamp", "int64", "1", default=-1),
            F("committed_metadata", "string", "0+", nullable="0+"),
        ),
    ),
    response=(
        F("throttle_time_ms", "int32", "3+"),
        _topic_partitions("0+", F("error_code", "int16", "0+")),
    ),
)
OFFSET_FETCH = Api(9, "OffsetFetch", 0, 9, flexible="6+",
    request=(
        F("group_id", "string", "0-7"),
        F("topics", "[]", "0-7", nullable="2-7", fields=(
            F("name", "string", "0-7"),
            F("partition_indexes", "[]int32", "0-7"),
        )),
        F("groups", "[]", "8+", fields=(
            F("group_id", "string", "8+"),
            F("member_id", "string", "9+", nullable="9+", default=None),
            F("member_epoch", "int32", "9+", default=-1),
            F("topics", "[]", "8+", nullable="8+", fields=(
                F("name", "string", "8+"),
                F("partition_indexes", "[]int32", "8+"),
            )),
        )),
        F("require_stable", "bool", "7+", default=False),
    ),
    response=(
        F("throttle_time_ms", "int32", "3+"),
        _topic_partitions("0-7", *_committed_offset("0-7", "5-7")),
        F("error_code", "int16", "2-7", default=0),
        F("groups", "[]", "8+", fields=(
            F("group_id", "string", "8+"),
            _topic_partitions("8+", *_committed_offset("8+", "8+")),
            F("error_code", "int16", "8+", default=0),
        )),
    ),
)
CREATE_TOPICS = Api(19, "CreateTopics", 0, 7, flexible="5+",
    request=(
        F("topics", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("num_partitions", "int32", "0+"),
            F("replication_factor", "int16", "0+"),
            F("assignments", "[]", "0+", fields=(
                F("partition_index", "int32", "0+"),
                F("broker_ids", "[]int32", "0+"),
            )),
            F("configs", "[]", "0+", fields=(
                F("name", "string", "0+"),
                F("value", "string", "0+", nullable="0+"),
            )),
        )),
        F("timeout_ms", "int32", "0+", default=60000),
        F("validate_only", "bool", "1+", default=False),
    ),
    response=(
        F("throttle_time_ms", "int32", "2+"),
        F("topics", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("topic_id", "uuid", "7+"),
            F("error_code", "int16", "0+"),
            F("error_message", "string", "1+", nullable="0+"),
            F("topic_config_error_code", "int16", "5+", tag=0, tagged="5+"),
            F("num_partitions", "int32", "5+", default=-1),
            F("replication_factor", "int16", "5+", default=-1),
            F("configs", "[]", "5+", nullable="5+", fields=(
                F("name", "string", "5+"),
                F("value", "string", "5+", nullable="5+"),
                F("read_only", "bool", "5+"),
                F("config_source", "int8", "5+", default=-1),
                F("is_sensitive", "bool", "5+"),
            )),
        )),
    ),
)
DELETE_TOPICS = Api(20, "DeleteTopics", 0, 6, flexible="4+",
    request=(
        F("topics", "[]", "6+", fields=(
            F("name", "string", "6+", nullable="6+", default=None),
            F("topic_id", "uuid", "6+"),
        )),
        F("topic_names", "[]string", "0-5"),
        F("timeout_ms", "int32", "0+"),
    ),
    response=(
        F("throttle_time_ms", "int32", "1+"),
        F("responses", "[]", "0+", fields=(
            F("name", "string", "0+", nullable="6+"),
            F("topic_id", "uuid", "6+"),
            F("error_code", "int16", "0+"),
            F("error_message", "string", "5+", nullable="5+", default=None),
        )),
    ),
)
DESCRIBE_CONFIGS = Api(32, "DescribeConfigs", 0, 4, flexible="4+",
    request=(
        F("resources", "[]", "0+", fields=(
            F("resource_type", "int8", "0+"),
            F("resource_name", "string", "0+"),
            F("configuration_keys", "[]string", "0+", nullable="0+"),
        )),
        F("include_synonyms", "bool", "1+", default=False),
        F("include_documentation", "bool", "3+", default=False),
    ),
    response=(
        F("throttle_time_ms", "int32", "0+"),
        F("results", "[]", "0+", fields=(
            F("error_code", "int16", "0+"),
            F("error_message", "string", "0+", nullable="0+"),
            F("resource_type", "int8", "0+"),
            F("resource_name", "string", "0+"),
            F("configs", "[]", "0+", fields=(
                F("name", "string", "0+"),
                F("value", "string", "0+", nullable="0+"),
                F("read_only", "bool", "0+"),
                F("is_default", "bool", "0"),
                F("config_source", "int8", "1+", default=-1),
                F("is_sensitive", "bool", "0+"),
                F("synonyms", "[]", "1+", fields=(
                    F("name", "string", "1+"),
                    F("value", "string", "1+", nullable="0+"),
                    F("source", "int8", "1+"),
                )),
                F("config_type", "int8", "3+", default=0),
                F("documentation", "string", "3+", nullable="0+"),
            )),
        )),
    ),
)
# fmt: on

ALL_APIS: tuple[Api, ...] = (
    PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR,
    JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, SASL_HANDSHAKE, API_VERSIONS,
    CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID, OFFSET_FOR_LEADER_EPOCH,
    DESCRIBE_CONFIGS, SASL_AUTHENTICATE, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS,
    OFFSET_DELETE, DESCRIBE_CLUSTER, CREATE_PARTITIONS, ALTER_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN,
    TXN_OFFSET_COMMIT, WRITE_TXN_MARKERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS,
)  # fmt: skip
API_BY_KEY: dict[int, Api] = {api.key: api for api in ALL_APIS}
# (api key, min version, max version): what an ApiVersions response advertises.
SUPPORTED_APIS: tuple[tuple[int, int, int], ...] = tuple(
    sorted((api.key, api.min_version, api.max_version) for api in ALL_APIS)
)
