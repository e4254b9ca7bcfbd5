"""The group administration APIs of the Kafka listener: ListGroups, DescribeGroups,
DeleteGroups and OffsetDelete, over the membership and offsets ``groups`` keeps.

What tools (kafka-consumer-groups, lag monitors, consoles, admin clients) see:

* A group exists while it has members (the coordinator's memory) or committed offsets
  (``__consumer_offsets``). One with offsets only is ``Empty`` with protocol type ""
  (its membership is not persisted, so neither is the type its members had).
* **ListGroups** is answered per node, as Kafka's brokers do: the groups of every
  ``__consumer_offsets`` partition this node leads (admin clients ask every node and
  merge). Partitions not loaded yet are loaded first, all at once.
* **DescribeGroups** on the group's coordinator: state, protocol type, and per member its
  id, instance id (static members), client id and host; the protocol and each member's metadata and assignment only
  while the group is Stable (Kafka's ``GroupMetadata.summary``). A group that does not
  exist is ``Dead`` with no error, as Kafka answers versions 0-5.
* **DeleteGroups**: only a group without members (NON_EMPTY_GROUP otherwise;
  GROUP_ID_NOT_FOUND if it has no offsets either): tombstones for all its offsets, one
  batch, durable on a quorum before the answer.
* **OffsetDelete**: tombstones for the named partitions; refused per partition with
  GROUP_SUBSCRIBED_TO_TOPIC while a member's subscription names its topic, and for the
  whole request with NON_EMPTY_GROUP if a group with members is not a consumer group.
"""

from __future__ import annotations

import asyncio

from ..kafka import messages as km
from ..kafka.coordinators import OFFSETS_TOPIC
from ..kafka.errors import KafkaError
from ..kafka.groups import CONSUMER_PROTOCOL_TYPE, Group, GroupState, Member
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from .groups import Handler, KafkaGroups
from .offsets import OffsetsCache

#: (api, lowest version, highest version) served.
SERVED: tuple[tuple[KafkaApi, int, int], ...] = tuple(
    (api, api.min_version, api.max_version)
    for api in (km.LIST_GROUPS, km.DESCRIBE_GROUPS, km.DELETE_GROUPS, km.OFFSET_DELETE)
)

#: ListGroups v5's group type of every group here: the classic protocol (KIP-848's
#: "consumer" groups are not served).
CLASSIC_GROUP_TYPE = "classic"
_DEAD = "Dead"
#: "Not asked for" in an authorized-operations field (Kafka's Integer.MIN_VALUE).
OPERATIONS_NOT_ASKED = -(1 << 31)
#: What a group's authorized operations are when asked for: every operation Kafka
#: defines on a group (READ 3, DELETE 6, DESCRIBE 8; AclOperation codes as bits).
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


class GroupAdmin:
    """The group administration handlers (``handlers``: api key -> handler)."""

    def __init__(self, groups: KafkaGroups) -> None:
        self.groups = groups
        self.handlers: dict[int, Handler] = {
            km.LIST_GROUPS.key: self.list_groups,
            km.DESCRIBE_GROUPS.key: self.describe_groups,
            km.DELETE_GROUPS.key: self.delete_groups,
            km.OFFSET_DELETE.key: self.offset_delete,
        }

    # ------------------------------------------------------------------ ListGroups
    async def list_groups(self, api: KafkaApi, version: int, body: Message) -> Message:
        states = {s.lower() for s in body["states_filter"]}
        types = {t.lower() for t in body["types_filter"]}
        listed, code = await self._every_group()
        out = api.default_response(version)
        out["error_code"] = int(code)
        out["groups"] = [
            {
                "group_id": gid,
                "protocol_type": protocol_type,
                "group_state": state,
                "group_type": CLASSIC_GROUP_TYPE,
            }
            for gid, (protocol_type, state) in sorted(listed.items())
            if (not states or state.lower() in states)
            and (not types or CLASSIC_GROUP_TYPE in types)
        ]
        return out

    async def _every_group(self) -> tuple[dict[str, tuple[str, str]], KafkaError]:
        """group id -> (protocol type, state) of every group this node coordinates, and
        COORDINATOR_LOAD_IN_PROGRESS if a partition it leads could not be loaded."""
        groups = self.groups
        topic = groups._offsets_topic()
        if topic is None:
            return {}, KafkaError.NONE
        led = [
            p
            for p in range(len(topic.replicas))
            if (part := groups.api.driver.get((OFFSETS_TOPIC, p))) is not None
            and part.core.is_leader
        ]
        groups._start_ticker()
        loaded = await asyncio.gather(*(groups._loaded(p) for p in led))
        listed: dict[str, tuple[str, str]] = {}
        code = KafkaError.NONE
        for cache, error in loaded:
            if cache is None:
                code = error
                continue
            listed.update(dict.fromkeys(cache.groups, ("", GroupState.EMPTY.value)))
        for gid, group in groups.machine.groups.items():
            listed[gid] = (group.member_protocol_type(), group.state.value)
        return listed, code

    # ------------------------------------------------------------------ DescribeGroups
    async def describe_groups(self, api: KafkaApi, version: int, body: Message) -> Message:
        operations = (
            GROUP_OPERATIONS if body["include_authorized_operations"] else OPERATIONS_NOT_ASKED
        )
        out = api.default_response(version)
        out["groups"] = [await self._describe(gid, operations) for gid in body["groups"]]
        return out

    async def _describe(self, group_id: str, operations: int) -> Message:
        answer: Message = {
            "error_code": 0,
            "group_id": group_id,
            "group_state": _DEAD,
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
            "authorized_operations": operations,
        }
        cache, code = await self.groups._coordinate(group_id)
        if cache is None:
            answer.update(error_code=int(code), group_state="")
            return answer
        group = self.groups.machine.groups.get(group_id)
        if group is None:
            if group_id in cache.groups:
                answer["group_state"] = GroupState.EMPTY.value
            return answer
        stable = group.state is GroupState.STABLE and group.protocol_name is not None
        answer.update(
            group_state=group.state.value,
            protocol_type=group.member_protocol_type(),
            protocol_data=group.protocol_name if stable else "",
            members=[
                {
                    "member_id": member.member_id,
                    "group_instance_id": member.group_instance_id,
                    "client_id": member.client_id,
                    "client_host": member.client_host,
                    "member_metadata": (
                        member.metadata(group.protocol_name)
                        if stable and group.protocol_name is not None
                        else b""
                    ),
                    "member_assignment": member.assignment if stable else b"",
                }
                for member in group.members.values()
            ],
        )
        return answer

    # ------------------------------------------------------------------ DeleteGroups
    async def delete_groups(self, api: KafkaApi, version: int, body: Message) -> Message:
        out = api.default_response(version)
        out["results"] = [
            {"group_id": gid, "error_code": int(await self._delete(gid))}
            for gid in body["groups_names"]
        ]
        return out

    async def _delete(self, group_id: str) -> KafkaError:
        cache, code = await self.groups._coordinate(group_id)
        if cache is None:
            return code
        if group_id in self.groups.machine.groups:
            return KafkaError.NON_EMPTY_GROUP
        committed = cache.groups.get(group_id)
        if not committed:
            return KafkaError.GROUP_ID_NOT_FOUND
        return await self.groups._write(group_id, cache, dict.fromkeys(committed))

    # ------------------------------------------------------------------ OffsetDelete
    async def offset_delete(self, api: KafkaApi, version: int, body: Message) -> Message:
        group_id = body["group_id"]
        out = api.default_response(version)
        cache, code = await self.groups._coordinate(group_id)
        group = self.groups.machine.groups.get(group_id)
        if cache is not None:
            code = self._offsets_deletable(group_id, cache, group)
        if code != KafkaError.NONE or cache is None:
            out["error_code"] = int(code)
            return out
        subscribed = set[str]().union(*(m.subscribed_topics() for m in _members(group)))
        codes: dict[tuple[str, int], KafkaError] = {}
        committed = cache.groups.get(group_id, {})
        for t in body["topics"]:
            for p in t["partitions"]:
                where = (t["name"], p["partition_index"])
                codes[where] = (
                    KafkaError.GROUP_SUBSCRIBED_TO_TOPIC
                    if t["name"] in subscribed
                    else KafkaError.NONE
                )
        gone = [w for w, c in codes.items() if c == KafkaError.NONE and w in committed]
        if gone:
            written = await self.groups._write(group_id, cache, dict.fromkeys(gone))
            codes.update(dict.fromkeys(gone, written))
        out["topics"] = [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": int(codes[(t["name"], p["partition_index"])]),
                    }
                    for p in t["partitions"]
                ],
            }
            for t in body["topics"]
        ]
        return out

    @staticmethod
    def _offsets_deletable(group_id: str, cache: OffsetsCache, group: Group | None) -> KafkaError:
        if group is None:
            return KafkaError.NONE if group_id in cache.groups else KafkaError.GROUP_ID_NOT_FOUND
        if group.members and group.member_protocol_type() != CONSUMER_PROTOCOL_TYPE:
            return KafkaError.NON_EMPTY_GROUP
        return KafkaError.NONE


def _members(group: Group | None) -> list[Member]:
    return [] if group is None else list(group.members.values())
