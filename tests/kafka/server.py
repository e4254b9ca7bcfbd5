"""A tiny single-broker Kafka server for tests, built on the codec: one node (itself),
topics created on first Metadata, one partition each, leader epoch 0.

It stores what producers send as quorumlog batches (Kafka -> Arrow conversion) and serves
Fetch by converting them back, so a real client round trip exercises the whole codec.
Runs an asyncio loop in a thread; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

from quorumlog.replica.kafka import messages as m
from quorumlog.replica.kafka.codec import (
    UnsupportedRequest,
    api_versions_body,
    decode_request,
    encode_response,
    fetched_partition,
)
from quorumlog.replica.kafka.convert import kafka_to_quorumlog, quorumlog_to_kafka
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.records import KafkaRecordBatch, check_produced, iter_batches
from quorumlog.replica.kafka.schema import Api, Message
from quorumlog.replica.kafka.wire import FrameDecoder, KafkaDecodeError, frame
from quorumlog.replica.storage.records import HEADER_SIZE, parse_header, restamp_header

NODE_ID = 1
LEADER_EPOCH = 0
PRODUCER_ID = 4242


@dataclass
class Partition:
    stored: list[bytes] = field(default_factory=list)  # quorumlog batches, offsets assigned
    end_offset: int = 0


@dataclass
class KafkaTestBroker:
    host: str = "127.0.0.1"
    port: int = 0
    topics: dict[str, Partition] = field(default_factory=dict)
    topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    produced: list[KafkaRecordBatch] = field(default_factory=list)
    versions_used: Counter[tuple[str, int]] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.AbstractServer | None = None
    _data: asyncio.Condition | None = None
    _main: asyncio.Task[None] | None = None
    # A one-generation-at-a-time group coordinator: enough for one consumer per group.
    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    generation: int = 0
    assignments: dict[str, bytes] = field(default_factory=dict)
    # SASL/PLAIN credentials this broker accepts (None: any); outcomes of SaslAuthenticate.
    # The partitions' leader epoch (bump_leader_epoch moves it), and where each epoch began.
    leader_epoch: int = LEADER_EPOCH
    epoch_starts: dict[str, dict[int, int]] = field(default_factory=dict)
    sasl_users: dict[str, str] | None = None
    authentications: list[tuple[str, bool]] = field(default_factory=list)

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop

            async def main() -> None:
                self._data = asyncio.Condition()
                self._server = await asyncio.start_server(self._serve, self.host, 0)
                self.port = self._server.sockets[0].getsockname()[1]
                ready.set()
                async with self._server:
                    await self._server.serve_forever()

            self._main = loop.create_task(main())
            try:
                loop.run_until_complete(self._main)
            except asyncio.CancelledError:
                pass
            finally:
                # End the connections' tasks inside the loop before closing it.
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name="kafka-test-broker", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("test broker did not start in 10 s")

    def stop(self) -> None:
        loop, main = self._loop, self._main
        if loop is not None and main is not None:
            try:
                loop.call_soon_threadsafe(main.cancel)
            except RuntimeError:  # the loop already ended
                pass
        if self._thread is not None:
            self._thread.join(10)
            assert not self._thread.is_alive(), "test broker thread did not stop in 10 s"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # --- connection ------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameDecoder()
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    return
                for payload in frames.feed(data):
                    response = await self._handle(payload)
                    if response is not None:
                        writer.write(frame(response))
                await writer.drain()
        except KafkaDecodeError as exc:
            self.errors.append(repr(exc))
        except ConnectionError:
            pass  # a client closing its connection its own way (close() resets)
        except asyncio.CancelledError:
            pass  # stop(): end quietly
        finally:
            writer.close()

    async def _handle(self, payload: bytes) -> bytes | None:
        try:
            header, api, body = decode_request(payload)
        except UnsupportedRequest as exc:
            if exc.header.api_key == m.API_VERSIONS.key:
                answer = api_versions_body(0, error_code=KafkaError.UNSUPPORTED_VERSION)
                return encode_response(m.API_VERSIONS, 0, exc.header.correlation_id, answer)
            raise
        version = header.api_version
        self.versions_used[(api.name, version)] += 1
        handler = getattr(self, "_on_" + api.name, None)
        if handler is None:
            self.errors.append(f"unexpected request {api.name} v{version}")
            return None
        result: Message | None = await handler(api, version, body)
        if result is None:
            return None
        return encode_response(api, version, header.correlation_id, result)

    # --- APIs --------------------------------------------------------------------------
    async def _on_ApiVersions(self, api: Api, version: int, body: Message) -> Message:
        return api_versions_body(version)

    def _topic(self, name: str) -> Partition:
        if name not in self.topics:
            self.topics[name] = Partition()
            self.topic_ids[name] = uuid.uuid4()
        return self.topics[name]

    async def _on_Metadata(self, api: Api, version: int, body: Message) -> Message:
        requested = body["topics"]
        names = list(self.topics) if requested is None else [t["name"] for t in requested]
        out = api.default_response(version)
        out["brokers"] = [{"node_id": NODE_ID, "host": self.host, "port": self.port, "rack": None}]
        out["cluster_id"] = "quorumlog-test"
        out["controller_id"] = NODE_ID
        topics = []
        for name in names:
            self._topic(name)
            topics.append(
                {
                    "error_code": 0,
                    "name": name,
                    "topic_id": self.topic_ids[name],
                    "is_internal": False,
                    "partitions": [
                        {
                            "error_code": 0,
                            "partition_index": 0,
                            "leader_id": NODE_ID,
                            "leader_epoch": self.leader_epoch,
                            "replica_nodes": [NODE_ID],
                            "isr_nodes": [NODE_ID],
                            "offline_replicas": [],
                        }
                    ],
                    "topic_authorized_operations": -2147483648,
                }
            )
        out["topics"] = topics
        return out

    async def _on_InitProducerId(self, api: Api, version: int, body: Message) -> Message:
        out = api.default_response(version)
        out["producer_id"] = PRODUCER_ID
        out["producer_epoch"] = 0
        return out

    async def _on_Produce(self, api: Api, version: int, body: Message) -> Message | None:
        responses = []
        for topic in body["topic_data"]:
            partition = self._topic(topic["name"])
            parts = []
            for pdata in topic["partition_data"]:
                base = partition.end_offset
                for batch in iter_batches(pdata["records"] or b""):
                    check_produced(batch)
                    self.produced.append(batch)
                    epoch = self.leader_epoch
                    self.epoch_starts.setdefault(topic["name"], {}).setdefault(
                        epoch, partition.end_offset
                    )
                    stored = kafka_to_quorumlog(batch, leader_epoch=epoch)
                    header = parse_header(stored)
                    stored = (
                        restamp_header(header, partition.end_offset, epoch) + stored[HEADER_SIZE:]
                    )
                    partition.stored.append(stored)
                    partition.end_offset += batch.record_count
                parts.append({"index": pdata["index"], "error_code": 0, "base_offset": base})
            responses.append({"name": topic["name"], "partition_responses": parts})
        assert self._data is not None
        async with self._data:
            self._data.notify_all()
        if body["acks"] == 0:
            return None
        out = api.default_response(version)
        out["responses"] = responses
        return out

    def _by_name_or_id(self, topic: Message) -> str:
        if topic.get("topic"):
            return str(topic["topic"])
        if topic.get("name"):
            return str(topic["name"])
        for name, tid in self.topic_ids.items():
            if tid == topic.get("topic_id"):
                return name
        raise KeyError(topic)

    async def _on_ListOffsets(self, api: Api, version: int, body: Message) -> Message:
        topics = []
        for topic in body["topics"]:
            partition = self._topic(topic["name"])
            parts = []
            for p in topic["partitions"]:
                offset = 0 if p["timestamp"] == -2 else partition.end_offset
                parts.append(
                    {
                        "partition_index": p["partition_index"],
                        "error_code": 0,
                        "timestamp": -1,
                        "offset": offset,
                        "leader_epoch": LEADER_EPOCH,
                    }
                )
            topics.append({"name": topic["name"], "partitions": parts})
        out = api.default_response(version)
        out["topics"] = topics
        return out

    async def _on_OffsetForLeaderEpoch(self, api: Api, version: int, body: Message) -> Message:
        topics = []
        for topic in body["topics"]:
            partition = self._topic(topic["topic"])
            starts = self.epoch_starts.get(topic["topic"], {})
            parts = []
            for p in topic["partitions"]:
                # KIP-101: the largest epoch <= the asked one, and the start of the next
                # epoch after it (the log end for the current epoch).
                asked = p["leader_epoch"]
                known = [e for e in starts if e <= asked]
                later = [starts[e] for e in starts if e > asked]
                parts.append(
                    {
                        "error_code": 0,
                        "partition": p["partition"],
                        "leader_epoch": max(known) if known else -1,
                        "end_offset": min(later) if later else partition.end_offset,
                    }
                )
            topics.append({"topic": topic["topic"], "partitions": parts})
        out = api.default_response(version)
        out["topics"] = topics
        return out

    async def _on_FindCoordinator(self, api: Api, version: int, body: Message) -> Message:
        out = api.default_response(version)
        keys = body["coordinator_keys"] or [body["key"]]
        node = {"node_id": NODE_ID, "host": self.host, "port": self.port}
        out.update(node)
        out["coordinators"] = [
            {"key": k, **node, "error_code": 0, "error_message": None} for k in keys
        ]
        return out

    async def _on_JoinGroup(self, api: Api, version: int, body: Message) -> Message:
        self.generation += 1
        member_id = body["member_id"] or f"member-{self.generation}"
        protocol = body["protocols"][0]
        out = api.default_response(version)
        out.update(
            generation_id=self.generation,
            protocol_type=body["protocol_type"],
            protocol_name=protocol["name"],
            leader=member_id,
            member_id=member_id,
            members=[
                {
                    "member_id": member_id,
                    "group_instance_id": None,
                    "metadata": protocol["metadata"],
                }
            ],
        )
        return out

    async def _on_SyncGroup(self, api: Api, version: int, body: Message) -> Message:
        for a in body["assignments"]:
            self.assignments[a["member_id"]] = a["assignment"]
        out = api.default_response(version)
        out.update(
            protocol_type=body["protocol_type"],
            protocol_name=body["protocol_name"],
            assignment=self.assignments.get(body["member_id"], b""),
        )
        return out

    async def _on_Heartbeat(self, api: Api, version: int, body: Message) -> Message:
        return api.default_response(version)

    async def _on_LeaveGroup(self, api: Api, version: int, body: Message) -> Message:
        out = api.default_response(version)
        out["members"] = [
            {"member_id": mm["member_id"], "group_instance_id": None, "error_code": 0}
            for mm in body["members"]
        ]
        return out

    async def _on_OffsetCommit(self, api: Api, version: int, body: Message) -> Message:
        topics = []
        for t in body["topics"]:
            for p in t["partitions"]:
                key = (body["group_id"], t["name"], p["partition_index"])
                self.committed[key] = p["committed_offset"]
            topics.append(
                {
                    "name": t["name"],
                    "partitions": [
                        {"partition_index": p["partition_index"], "error_code": 0}
                        for p in t["partitions"]
                    ],
                }
            )
        out = api.default_response(version)
        out["topics"] = topics
        return out

    def _offsets(self, group: str, topics: list[Message] | None) -> list[Message]:
        wanted = topics or [{"name": n, "partition_indexes": [0]} for n in self.topics]
        return [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": i,
                        "committed_offset": self.committed.get((group, t["name"], i), -1),
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": 0,
                    }
                    for i in t["partition_indexes"]
                ],
            }
            for t in wanted
        ]

    async def _on_OffsetFetch(self, api: Api, version: int, body: Message) -> Message:
        out = api.default_response(version)
        if version >= 8:
            out["groups"] = [
                {"group_id": g["group_id"], "topics": self._offsets(g["group_id"], g["topics"])}
                for g in body["groups"]
            ]
        else:
            out["topics"] = self._offsets(body["group_id"], body["topics"])
        return out

    async def _on_CreateTopics(self, api: Api, version: int, body: Message) -> Message:
        out = api.default_response(version)
        results = []
        for t in body["topics"]:
            exists = t["name"] in self.topics
            if not exists and not body["validate_only"]:
                self._topic(t["name"])
            results.append(
                {
                    "name": t["name"],
                    "topic_id": self.topic_ids.get(t["name"], uuid.UUID(int=0)),
                    "error_code": int(KafkaError.TOPIC_ALREADY_EXISTS if exists else 0),
                    "error_message": "exists" if exists else None,
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "configs": [],
                }
            )
        out["topics"] = results
        return out

    async def _on_DeleteTopics(self, api: Api, version: int, body: Message) -> Message:
        names = list(body["topic_names"]) + [t["name"] for t in body["topics"] if t["name"]]
        out = api.default_response(version)
        out["responses"] = []
        for name in names:
            known = self.topics.pop(name, None) is not None
            out["responses"].append(
                {
                    "name": name,
                    "topic_id": self.topic_ids.pop(name, uuid.UUID(int=0)),
                    "error_code": 0 if known else int(KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
                    "error_message": None,
                }
            )
        return out

    async def _on_DescribeConfigs(self, api: Api, version: int, body: Message) -> Message:
        out = api.default_response(version)
        out["results"] = [
            {
                "error_code": 0,
                "error_message": None,
                "resource_type": r["resource_type"],
                "resource_name": r["resource_name"],
                "configs": [
                    {
                        "name": "retention.ms",
                        "value": "604800000",
                        "read_only": False,
                        "is_default": True,
                        "config_source": 5,
                        "is_sensitive": False,
                        "synonyms": [],
                        "config_type": 5,
                        "documentation": None,
                    }
                ],
            }
            for r in body["resources"]
        ]
        return out

    async def _on_SaslHandshake(self, api: Api, version: int, body: Message) -> Message:
        out = api.default_response(version)
        out["mechanisms"] = ["PLAIN"]
        if body["mechanism"] != "PLAIN":
            out["error_code"] = int(KafkaError.UNSUPPORTED_SASL_MECHANISM)
        return out

    async def _on_SaslAuthenticate(self, api: Api, version: int, body: Message) -> Message:
        _, user, password = bytes(body["auth_bytes"]).decode().split("\x00")
        ok = self.sasl_users is None or self.sasl_users.get(user) == password
        self.authentications.append((user, ok))
        out = api.default_response(version)
        if not ok:
            out["error_code"] = int(KafkaError.SASL_AUTHENTICATION_FAILED)
            out["error_message"] = f"authentication failed for {user}"
        return out

    async def _on_Fetch(self, api: Api, version: int, body: Message) -> Message:
        def answer() -> tuple[list[Message], bool]:
            topics = []
            any_data = False
            for topic in body["topics"]:
                name = self._by_name_or_id(topic)
                partition = self._topic(name)
                parts = []
                for p in topic["partitions"]:
                    current = p["current_leader_epoch"]
                    if 0 <= current < self.leader_epoch:
                        parts.append(
                            fetched_partition(p["partition"], KafkaError.FENCED_LEADER_EPOCH)
                        )
                        continue
                    chosen = [
                        b
                        for b in partition.stored
                        if parse_header(b).next_offset > p["fetch_offset"]
                    ]
                    records = quorumlog_to_kafka(b"".join(chosen)) if chosen else b""
                    any_data = any_data or bool(records)
                    parts.append(
                        fetched_partition(p["partition"], 0, partition.end_offset, 0, records)
                    )
                topics.append(
                    {"topic": name, "topic_id": self.topic_ids[name], "partitions": parts}
                )
            return topics, any_data

        topics, any_data = answer()
        if not any_data and body["max_wait_ms"] > 0:
            # Long poll: wait for a produce, at most max_wait_ms (capped for test speed).
            assert self._data is not None
            async with self._data:
                try:
                    await asyncio.wait_for(self._data.wait(), min(body["max_wait_ms"], 500) / 1000)
                except TimeoutError:
                    pass
            topics, _ = answer()
        out = api.default_response(version)
        out["responses"] = topics
        return out
