"""Topics that change, through Kafka's admin APIs: CreatePartitions (``kafka-topics
--alter --partitions``), AlterConfigs and IncrementalAlterConfigs on topic resources
(``kafka-configs --alter``). Each becomes the native ``AlterTopicRequest`` the metadata
controller decides (``controller.alter_topic``), so a Kafka client and ``quorumlog topic
alter`` change a topic the same way.

Like topic creation, these are decided by the metadata leader (Metadata's controller
id); another node forwards them to it (``topic_changes``). Configs a topic may set are
``topic_configs``'; any other is INVALID_CONFIG, and broker resources are INVALID_REQUEST
(a node's settings are its ``serve`` flags, not dynamic).

* CreatePartitions: the new count, never fewer (INVALID_PARTITIONS); replica
  assignments are not served (INVALID_REQUEST): the new partitions continue the topic's
  own assignment.
* AlterConfigs replaces the topic's configs with those named (Kafka's semantics: what is
  not named goes back to the node's value).
* IncrementalAlterConfigs: SET (0) and DELETE (1); APPEND (2) and SUBTRACT (3) are for
  list configs, of which a topic here has none (INVALID_CONFIG).
"""

from __future__ import annotations

from ..kafka import messages as km
from ..kafka.errors import KafkaError
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from ..node.api import Api
from ..node.topic_changes import TopicChanges
from ..protocol import ErrorCode
from ..protocol import messages as m
from .auth import RESOURCE_TOPIC
from .errors import admin_error
from .groups import Handler

#: (api, lowest version, highest version) served.
SERVED: tuple[tuple[KafkaApi, int, int], ...] = tuple(
    (api, api.min_version, api.max_version)
    for api in (km.CREATE_PARTITIONS, km.ALTER_CONFIGS, km.INCREMENTAL_ALTER_CONFIGS)
)

# IncrementalAlterConfigs' config operations (Kafka's AlterConfigOp.OpType).
OP_SET, OP_DELETE = 0, 1


class TopicAdmin:
    """The topic-changing handlers (``handlers``: api key -> handler)."""

    def __init__(self, api: Api, changes: TopicChanges) -> None:
        self.api = api
        self.changes = changes
        self.handlers: dict[int, Handler] = {
            km.CREATE_PARTITIONS.key: self.create_partitions,
            km.ALTER_CONFIGS.key: self.alter_configs,
            km.INCREMENTAL_ALTER_CONFIGS.key: self.alter_configs,
        }

    async def _alter(self, req: m.AlterTopicRequest) -> tuple[int, str | None]:
        resp = await self.changes.alter_topic(req)
        return admin_error(ErrorCode(resp.error)), resp.error_message or None

    async def create_partitions(self, api: KafkaApi, version: int, body: Message) -> Message:
        async def one(t: Message) -> Message:
            code: int
            text: str | None
            if t["assignments"] is not None:
                code, text = int(KafkaError.INVALID_REQUEST), "replica assignments are not served"
            else:
                req = m.AlterTopicRequest(
                    name=t["name"], partitions=t["count"], validate_only=body["validate_only"]
                )
                code, text = await self._alter(req)
            return {"name": t["name"], "error_code": code, "error_message": text}

        out = api.default_response(version)
        out["results"] = [await one(t) for t in body["topics"]]
        return out

    async def alter_configs(self, api: KafkaApi, version: int, body: Message) -> Message:
        incremental = api.key == km.INCREMENTAL_ALTER_CONFIGS.key

        async def one(r: Message) -> Message:
            answer: Message = {
                "error_code": 0,
                "error_message": None,
                "resource_type": r["resource_type"],
                "resource_name": r["resource_name"],
            }
            if r["resource_type"] != RESOURCE_TOPIC:
                answer["error_code"] = int(KafkaError.INVALID_REQUEST)
                answer["error_message"] = (
                    f"resource type {r['resource_type']} cannot be altered (only topics (2): "
                    "a node's settings are its serve flags)"
                )
                return answer
            changes, problem = self._changes(r["resource_name"], r["configs"], incremental)
            if problem is not None:
                answer["error_code"] = int(KafkaError.INVALID_CONFIG)
                answer["error_message"] = problem
                return answer
            req = m.AlterTopicRequest(
                name=r["resource_name"],
                configs=[m.TopicConfig(name=k, value=v) for k, v in changes.items()],
                validate_only=body["validate_only"],
            )
            answer["error_code"], answer["error_message"] = await self._alter(req)
            return answer

        out = api.default_response(version)
        out["responses"] = [await one(r) for r in body["resources"]]
        return out

    def _changes(
        self, topic: str, configs: list[Message], incremental: bool
    ) -> tuple[dict[str, str | None], str | None]:
        """What to set (a value) or delete (None), or why the request cannot be served."""
        changes: dict[str, str | None] = {}
        if not incremental:
            # The configs named replace the topic's: the others are deleted.
            t = self.api.controller.state.topics.get(topic)
            changes.update(dict.fromkeys(t.configs if t is not None else ()))
        for c in configs:
            op = c.get("config_operation", OP_SET)
            if op == OP_SET:
                changes[c["name"]] = c["value"]
            elif op == OP_DELETE:
                changes[c["name"]] = None
            else:
                return {}, (
                    f"config operation {op} (APPEND/SUBTRACT) applies to list configs; "
                    f"{c['name']!r} is not one"
                )
        return changes, None
