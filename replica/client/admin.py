"""Cluster administration: topics, reassignments, the metadata quorum's voters, nodes,
unclean leader election, and what a node or a partition's quorum reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..protocol import ApiKey
from ..protocol import messages as m
from .errors import TopicExistsError, UnknownTopicError
from .routing import RequestRouting


class AdminCalls(RequestRouting):
    """The admin API: most go to the metadata controller (see ``_admin``)."""

    def list_topics(self) -> list[str]:
        return self._admin(ApiKey.LIST_TOPICS, m.ListTopicsRequest(), m.ListTopicsResponse).topics

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int | None = None,
        *,
        max_message_bytes: int | None = None,
        configs: Mapping[str, str] | None = None,
    ) -> str:
        """``max_message_bytes``: the topic's limit on one record batch (Kafka's
        max.message.bytes); None: each node's ``serve --max-message-bytes`` applies.
        ``configs``: what else the topic sets, in Kafka's names (retention.ms,
        retention.bytes, segment.bytes, max.message.bytes). Returns what the placement
        could not honour of the nodes' racks ("": nothing; the topic is created)."""
        if max_message_bytes is not None and max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be > 0, got {max_message_bytes}")
        attempts: list[float] = []
        try:
            resp = self._admin(
                ApiKey.CREATE_TOPIC,
                m.CreateTopicRequest(
                    name=name,
                    partitions=partitions,
                    replication_factor=replication_factor or 0,
                    max_message_bytes=max_message_bytes or 0,
                    configs=[m.TopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
                ),
                m.CreateTopicResponse,
                controller=True,
                attempts=attempts,
            )
        except TopicExistsError:
            # An attempt that timed out may have created it: a retry then finds the topic.
            # That is this call's success if the topic is the one asked for.
            if len(attempts) < 2 or len(self.metadata([name])[name].partitions) != partitions:
                raise
            return ""
        return resp.warning

    def alter_topic(
        self,
        name: str,
        *,
        partitions: int | None = None,
        configs: Mapping[str, str | None] | None = None,
    ) -> str:
        """Grow ``name`` to ``partitions`` (never fewer) and set its ``configs`` (Kafka's
        names; a None value deletes one, so the nodes' value applies again). Returns what
        the new partitions' placement could not honour of the racks ("": nothing)."""
        return self._admin(
            ApiKey.ALTER_TOPIC,
            m.AlterTopicRequest(
                name=name,
                partitions=partitions or 0,
                configs=[m.TopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
            ),
            m.AlterTopicResponse,
            controller=True,
        ).warning

    def reassign(
        self, topic: str, moves: Mapping[int, Sequence[int]], *, cancel: bool = False
    ) -> None:
        """Move each partition ``p`` of ``topic`` in ``moves`` to the replicas
        ``moves[p]`` (the first becomes its preferred leader), online: new replicas catch
        up, join the voters one at a time, and the leaving ones go (see
        ``reassignment``). ``cancel``: move those partitions back to the replicas they
        had before their latest move instead (the values are ignored)."""
        self._admin(
            ApiKey.REASSIGN,
            m.ReassignRequest(
                topic=topic,
                moves=[
                    m.PartitionMove(partition=p, replicas=list(r)) for p, r in sorted(moves.items())
                ],
                cancel=cancel,
            ),
            m.ReassignResponse,
            controller=True,
        )

    def set_catch_up_throttle(self, bytes_per_s: int | None) -> None:
        """Set the bytes per second every node's leaders send the replicas moves add (0:
        unthrottled), at once for the moves under way too, kept in the cluster's metadata;
        None: each node's own --catch-up-bytes-per-second again."""
        self._admin(
            ApiKey.CATCH_UP_THROTTLE,
            m.CatchUpThrottleRequest(bytes_per_s=m.UNKNOWN if bytes_per_s is None else bytes_per_s),
            m.CatchUpThrottleResponse,
            controller=True,
        )

    def change_voter(self, node_id: int, *, add: bool) -> list[int]:
        """Add ``node_id`` to the metadata quorum's voters (``add``) or remove it; returns
        the voter set the quorum moves to (one voter at a time, online)."""
        resp = self._admin(
            ApiKey.CHANGE_VOTER,
            m.ChangeVoterRequest(node_id=node_id, add=add),
            m.ChangeVoterResponse,
            controller=True,
        )
        return list(resp.voters)

    def register_node(self, req: m.RegisterNodeRequest) -> m.RegisterNodeResponse:
        """Register a node (``serve --join`` does, as that node's principal): the cluster
        it joins. DuplicateNodeError while a live node holds its id with another data
        directory."""
        return self._admin(ApiKey.REGISTER_NODE, req, m.RegisterNodeResponse, controller=True)

    def retire_node(self, node_id: int, *, retired: bool = True) -> None:
        """Decommission ``node_id``: it is given no new replicas (its replicas stay until
        moved, as ``quorumlog cluster decommission`` does); ``retired=False`` takes it
        back (``cluster recommission``)."""
        self._admin(
            ApiKey.RETIRE_NODE,
            m.RetireNodeRequest(node_id=node_id, retired=retired),
            m.RetireNodeResponse,
            controller=True,
        )

    def delete_topic(self, name: str) -> None:
        attempts: list[float] = []
        try:
            self._admin(
                ApiKey.DELETE_TOPIC,
                m.DeleteTopicRequest(name=name),
                m.DeleteTopicResponse,
                controller=True,
                attempts=attempts,
            )
        except UnknownTopicError:
            if len(attempts) < 2:  # else an attempt that timed out deleted it
                raise

    def describe_quorum(self, topic: str, partition: int) -> m.DescribeQuorumResponse:
        return self._leader_call(
            topic,
            partition,
            ApiKey.DESCRIBE_QUORUM,
            lambda pm, _: m.DescribeQuorumRequest(topic=topic, partition=partition),
            m.DescribeQuorumResponse,
            fenced_to_caller=False,
        )

    def force_leader(self, topic: str, partition: int, node_id: int, *, confirm: bool) -> int:
        """Unclean leader election: ``node_id`` leads ``topic/partition`` in a new epoch even
        without a majority. Records it lacks are lost. Returns the new leader epoch."""
        if not confirm:
            raise ValueError("force_leader may lose committed records: pass confirm=True")
        if not self._nodes:
            self.refresh_nodes()
        if node_id not in self._nodes:
            raise ValueError(f"unknown node id {node_id}; known: {sorted(self._nodes)}")
        resp = self._request(
            self._nodes[node_id],
            ApiKey.FORCE_LEADER,
            m.ForceLeaderRequest(topic=topic, partition=partition, confirm=True),
            m.ForceLeaderResponse,
            self.request_timeout_ms / 1000,
        )
        self._check(resp)
        self._leaders.pop((topic, partition), None)
        return resp.leader_epoch

    def api_versions(self, node_id: int | None = None) -> m.ApiVersionsResponse:
        addr = self._nodes[node_id] if node_id is not None else self._addresses()[0]
        return self._request(
            addr,
            ApiKey.API_VERSIONS,
            m.ApiVersionsRequest(),
            m.ApiVersionsResponse,
            self.request_timeout_ms / 1000,
        )
