"""Schemas of the group, topic and cluster administration APIs (``messages`` lists them
with the rest): ListGroups, DescribeGroups, DeleteGroups, OffsetDelete, DescribeCluster,
CreatePartitions, AlterConfigs and IncrementalAlterConfigs.

Transcribed like ``messages`` from apache/kafka's message definitions
(``clients/src/main/resources/common/message/*.json``, commit 1eb7644349cb): field names
in snake_case, version ranges, nullability and defaults as there. Each ``Api`` serves
every version defined there (admin clients negotiate down: kafka-python asks for
ListGroups 2, DescribeGroups 3, DeleteGroups 1; the Java client the newest).
"""

from __future__ import annotations

from .schema import Api, F

# fmt: off
DESCRIBE_GROUPS = Api(15, "DescribeGroups", 0, 5, flexible="5+",
    request=(
        F("groups", "[]string", "0+"),
        F("include_authorized_operations", "bool", "3+", default=False),
    ),
    response=(
        F("throttle_time_ms", "int32", "1+", default=0),
        F("groups", "[]", "0+", fields=(
            F("error_code", "int16", "0+"),
            F("group_id", "string", "0+"),
            F("group_state", "string", "0+"),
            F("protocol_type", "string", "0+"),
            F("protocol_data", "string", "0+"),
            F("members", "[]", "0+", fields=(
                F("member_id", "string", "0+"),
                F("group_instance_id", "string", "4+", nullable="4+", default=None),
                F("client_id", "string", "0+"),
                F("client_host", "string", "0+"),
                F("member_metadata", "bytes", "0+"),
                F("member_assignment", "bytes", "0+"),
            )),
            F("authorized_operations", "int32", "3+", default=-2147483648),
        )),
    ),
)
LIST_GROUPS = Api(16, "ListGroups", 0, 5, flexible="3+",
    request=(
        F("states_filter", "[]string", "4+"),
        F("types_filter", "[]string", "5+"),
    ),
    response=(
        F("throttle_time_ms", "int32", "1+", default=0),
        F("error_code", "int16", "0+"),
        F("groups", "[]", "0+", fields=(
            F("group_id", "string", "0+"),
            F("protocol_type", "string", "0+"),
            F("group_state", "string", "4+", default=""),
            F("group_type", "string", "5+", default=""),
        )),
    ),
)
DELETE_GROUPS = Api(42, "DeleteGroups", 0, 2, flexible="2+",
    request=(
        F("groups_names", "[]string", "0+"),
    ),
    response=(
        F("throttle_time_ms", "int32", "0+", default=0),
        F("results", "[]", "0+", fields=(
            F("group_id", "string", "0+"),
            F("error_code", "int16", "0+"),
        )),
    ),
)
OFFSET_DELETE = Api(47, "OffsetDelete", 0, 0, flexible="none",
    request=(
        F("group_id", "string", "0+"),
        F("topics", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("partitions", "[]", "0+", fields=(
                F("partition_index", "int32", "0+"),
            )),
        )),
    ),
    response=(
        F("error_code", "int16", "0+"),
        F("throttle_time_ms", "int32", "0+", default=0),
        F("topics", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("partitions", "[]", "0+", fields=(
                F("partition_index", "int32", "0+"),
                F("error_code", "int16", "0+"),
            )),
        )),
    ),
)
DESCRIBE_CLUSTER = Api(60, "DescribeCluster", 0, 1, flexible="0+",
    request=(
        F("include_cluster_authorized_operations", "bool", "0+"),
        F("endpoint_type", "int8", "1+", default=1),
    ),
    response=(
        F("throttle_time_ms", "int32", "0+", default=0),
        F("error_code", "int16", "0+"),
        F("error_message", "string", "0+", nullable="0+", default=None),
        F("endpoint_type", "int8", "1+", default=1),
        F("cluster_id", "string", "0+"),
        F("controller_id", "int32", "0+", default=-1),
        F("brokers", "[]", "0+", fields=(
            F("broker_id", "int32", "0+"),
            F("host", "string", "0+"),
            F("port", "int32", "0+"),
            F("rack", "string", "0+", nullable="0+", default=None),
        )),
        F("cluster_authorized_operations", "int32", "0+", default=-2147483648),
    ),
)

def _alter_configs(key: int, name: str, high: int, flexible: str, operation: bool) -> Api:
    """AlterConfigs and IncrementalAlterConfigs: the same but for a config's operation."""
    return Api(key, name, 0, high, flexible=flexible,
        request=(
            F("resources", "[]", "0+", fields=(
                F("resource_type", "int8", "0+"),
                F("resource_name", "string", "0+"),
                F("configs", "[]", "0+", fields=(
                    F("name", "string", "0+"),
                    *((F("config_operation", "int8", "0+"),) if operation else ()),
                    F("value", "string", "0+", nullable="0+"),
                )),
            )),
            F("validate_only", "bool", "0+"),
        ),
        response=(
            F("throttle_time_ms", "int32", "0+", default=0),
            F("responses", "[]", "0+", fields=(
                F("error_code", "int16", "0+"),
                F("error_message", "string", "0+", nullable="0+"),
                F("resource_type", "int8", "0+"),
                F("resource_name", "string", "0+"),
            )),
        ),
    )


ALTER_CONFIGS = _alter_configs(33, "AlterConfigs", 2, "2+", operation=False)
INCREMENTAL_ALTER_CONFIGS = _alter_configs(
    44, "IncrementalAlterConfigs", 1, "1+", operation=True
)
CREATE_PARTITIONS = Api(37, "CreatePartitions", 0, 3, flexible="2+",
    request=(
        F("topics", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("count", "int32", "0+"),
            F("assignments", "[]", "0+", nullable="0+", fields=(
                F("broker_ids", "[]int32", "0+"),
            )),
        )),
        F("timeout_ms", "int32", "0+"),
        F("validate_only", "bool", "0+"),
    ),
    response=(
        F("throttle_time_ms", "int32", "0+", default=0),
        F("results", "[]", "0+", fields=(
            F("name", "string", "0+"),
            F("error_code", "int16", "0+"),
            F("error_message", "string", "0+", nullable="0+", default=None),
        )),
    ),
)
# fmt: on

GROUP_ADMIN_APIS: tuple[Api, ...] = (DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE)
