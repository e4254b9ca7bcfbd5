"""Group tooling on the nodes' Kafka listener, with admin clients nobody here wrote:
kafka-python's KafkaAdminClient lists and describes groups, reads their committed
offsets and deletes a group; librdkafka's AdminClient (confluent-kafka) lists groups by
state, describes them and the cluster; OffsetDelete (which neither client's Python
binding offers) deletes a group's offsets of one topic; aiokafka's static members
(KIP-345) come back from a restart without a rebalance."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiokafka
import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.errors
import pytest
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.groups import subscribed_topics
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.kafka import NO_REBALANCE_DELAY
from tests.support.waits import wait_until

from .test_groups import _call, _coordinator_port, _request

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

WAIT_S = 60.0
RECORDS_PER_PARTITION = 5


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3, tmp_path_factory.mktemp("group-admin"), kafka=True, node_args=NO_REBALANCE_DELAY
    ) as c:
        yield c


@pytest.fixture
def admin(kcluster: LocalCluster) -> Iterator[Any]:
    client = kafka.KafkaAdminClient(
        bootstrap_servers=kcluster.kafka_bootstrap,
        client_id="admin-test",
        request_timeout_ms=30000,
        # Its version probe waits 2 s by default: too short for a loaded 2-core machine.
        api_version_auto_timeout_ms=30000,
    )
    try:
        yield client
    finally:
        client.close()


def _consumer(c: LocalCluster, group: str, topic: str) -> confluent_kafka.Consumer:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "group.id": group,
            "client.id": f"{group}-client",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "heartbeat.interval.ms": 250,
        }
    )
    consumer.subscribe([topic])
    return consumer


def _consume_and_commit(consumer: confluent_kafka.Consumer, n: int) -> None:
    """Poll until ``n`` records came, then commit synchronously."""
    got = 0
    deadline = time.monotonic() + WAIT_S
    while got < n:
        assert time.monotonic() < deadline, f"{got} of {n} records after {WAIT_S}s"
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got += 1
    consumer.commit(asynchronous=False)


def _fill(c: LocalCluster, topic: str, partitions: int) -> dict[int, int]:
    """A new topic with RECORDS_PER_PARTITION records in each partition; the partitions'
    end offsets (what a consumer that read everything commits)."""
    c.create_topic(topic, partitions)
    ends = {}
    for p in range(partitions):
        acks = c.produce(topic, p, [f"{p}-{i}".encode() for i in range(RECORDS_PER_PARTITION)])
        ends[p] = acks[-1].offset + 1
    return ends


def test_kafka_python_admin_lists_describes_reads_offsets_and_deletes_a_group(
    kcluster: LocalCluster, admin: Any
) -> None:
    c = kcluster
    ends = _fill(c, "admin-events", 2)
    consumer = _consumer(c, "admin-group", "admin-events")
    try:
        _consume_and_commit(consumer, 2 * RECORDS_PER_PARTITION)

        assert ("admin-group", "consumer") in admin.list_consumer_groups()
        (described,) = admin.describe_consumer_groups(["admin-group"])
        assert described.group == "admin-group"
        assert described.state == "Stable"
        assert described.protocol_type == "consumer"
        assert described.protocol in ("range", "roundrobin", "cooperative-sticky")
        (member,) = described.members
        assert member.client_id == "admin-group-client"
        assert member.client_host == "/127.0.0.1"
        assert member.member_metadata.topics == ["admin-events"]
        assigned = member.member_assignment.assignment
        assert sorted((t, sorted(ps)) for t, ps in assigned) == [("admin-events", [0, 1])]

        offsets = admin.list_consumer_group_offsets("admin-group")
        assert {(tp.topic, tp.partition): o.offset for tp, o in offsets.items()} == {
            ("admin-events", 0): ends[0],
            ("admin-events", 1): ends[1],
        }
        # A group with a member is not deleted.
        ((gid, error),) = admin.delete_consumer_groups(["admin-group"])
        assert (gid, error) == ("admin-group", kafka.errors.NonEmptyGroupError)
    finally:
        consumer.close()

    # Once its last member left it is Empty, keeps its offsets, and can be deleted.
    (described,) = admin.describe_consumer_groups(["admin-group"])
    assert (described.state, described.members) == ("Empty", [])
    assert ("admin-group", "") in admin.list_consumer_groups()
    ((gid, error),) = admin.delete_consumer_groups(["admin-group"])
    assert (gid, error) == ("admin-group", kafka.errors.NoError)
    assert "admin-group" not in {g for g, _ in admin.list_consumer_groups()}
    assert admin.list_consumer_group_offsets("admin-group") == {}
    (described,) = admin.describe_consumer_groups(["admin-group"])
    assert described.state == "Dead"
    ((gid, error),) = admin.delete_consumer_groups(["admin-group"])
    assert (gid, error) == ("admin-group", kafka.errors.GroupIdNotFoundError)


def test_librdkafka_admin_filters_by_state_deletes_offsets_and_describes_the_cluster(
    kcluster: LocalCluster,
) -> None:
    c = kcluster
    ends = _fill(c, "admin-a", 1)
    _fill(c, "admin-b", 1)
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": c.kafka_bootstrap})
    consumer = _consumer(c, "offsets-group", "admin-a")
    try:
        _consume_and_commit(consumer, RECORDS_PER_PARTITION)
        # Offsets of a topic it does not subscribe to, committed beside its own.
        extra = confluent_kafka.TopicPartition("admin-b", 0, 3)
        consumer.commit(offsets=[extra], asynchronous=False)

        stable = admin.list_consumer_groups(
            states={confluent_kafka.ConsumerGroupState.STABLE}
        ).result(30)
        assert "offsets-group" in {g.group_id for g in stable.valid}
        empty = admin.list_consumer_groups(
            states={confluent_kafka.ConsumerGroupState.EMPTY}
        ).result(30)
        assert "offsets-group" not in {g.group_id for g in empty.valid}

        described = admin.describe_consumer_groups(["offsets-group"])["offsets-group"].result(30)
        assert described.state == confluent_kafka.ConsumerGroupState.STABLE
        assert [m.client_id for m in described.members] == ["offsets-group-client"]

        port = _coordinator_port(c, "offsets-group")
        topics = [
            {"name": t, "partitions": [{"partition_index": 0}]} for t in ("admin-a", "admin-b")
        ]
        body = _request(km.OFFSET_DELETE, 0, group_id="offsets-group", topics=topics)
        answer = _call(port, km.OFFSET_DELETE, 0, body)
        # The subscribed topic's offsets stay while the member reads it; the other goes.
        assert answer["error_code"] == 0
        assert [(t["name"], t["partitions"][0]["error_code"]) for t in answer["topics"]] == [
            ("admin-a", KafkaError.GROUP_SUBSCRIBED_TO_TOPIC),
            ("admin-b", KafkaError.NONE),
        ]
        unknown = _call(port, km.OFFSET_DELETE, 0, {**body, "group_id": "no-such-group"})
        assert unknown["error_code"] in (KafkaError.GROUP_ID_NOT_FOUND, KafkaError.NOT_COORDINATOR)
        committed = consumer.committed(
            [confluent_kafka.TopicPartition(t, 0) for t in ("admin-a", "admin-b")], timeout=30
        )
        assert [tp.offset for tp in committed] == [ends[0], confluent_kafka.OFFSET_INVALID]
    finally:
        consumer.close()

    cluster = admin.describe_cluster().result(30)
    assert sorted(n.id for n in cluster.nodes) == sorted(c.kafka_ports)
    assert sorted(n.port for n in cluster.nodes) == sorted(c.kafka_ports.values())
    assert cluster.controller is not None and cluster.controller.id in c.kafka_ports
    wait_until(
        lambda: (
            "offsets-group"
            in {
                g.group_id
                for g in admin.list_consumer_groups(
                    states={confluent_kafka.ConsumerGroupState.EMPTY}
                )
                .result(30)
                .valid
            }
        ),
        WAIT_S,
        "the group listed as Empty after its member left",
    )


def test_subscriptions_are_read_from_consumer_protocol_metadata() -> None:
    # ConsumerProtocolSubscription v0: version, topics, user data.
    metadata = (
        b"\x00\x00" + b"\x00\x00\x00\x02" + b"\x00\x01a" + b"\x00\x02bc" + b"\xff\xff\xff\xff"
    )
    assert subscribed_topics(metadata) == {"a", "bc"}
    assert subscribed_topics(metadata[:7]) == set()
    assert subscribed_topics(b"") == set()


def test_aiokafka_static_members_survive_a_restart_without_a_rebalance(
    kcluster: LocalCluster,
) -> None:
    """Two aiokafka consumers with group.instance.id (KIP-345) share a topic; one stops
    (a static member sends no LeaveGroup) and a new process of the same instance starts:
    it gets the same partitions back and the other member sees no rebalance (no
    revocation, no new assignment, the same generation). DescribeGroups shows the
    instance ids."""
    c = kcluster
    _fill(c, "static-events", 4)
    asyncio.run(_static_restart(c))


class _Listener(aiokafka.ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.events: list[tuple[str, set[int]]] = []

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.events.append(("revoked", {tp.partition for tp in revoked}))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.events.append(("assigned", {tp.partition for tp in assigned}))


async def _static_restart(c: LocalCluster) -> None:
    def consumer(instance: str) -> aiokafka.AIOKafkaConsumer:
        return aiokafka.AIOKafkaConsumer(
            bootstrap_servers=c.kafka_bootstrap,
            group_id="static-group",
            group_instance_id=instance,
            client_id=instance,
            session_timeout_ms=10000,
            heartbeat_interval_ms=200,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )

    async def assigned(member: aiokafka.AIOKafkaConsumer) -> set[int]:
        return {tp.partition for tp in member.assignment()}

    async def until(what: str, check: Any) -> None:
        deadline = time.monotonic() + WAIT_S
        while not await check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    one, two = consumer("instance-1"), consumer("instance-2")
    listener = _Listener()
    one.subscribe(["static-events"])
    two.subscribe(["static-events"], listener=listener)
    await one.start()
    await two.start()
    restarted = None
    try:

        async def split() -> bool:
            mine, theirs = await assigned(one), await assigned(two)
            # Disjoint too: a member keeps its old assignment until its rebalance ends.
            return (
                bool(mine) and bool(theirs) and not mine & theirs and mine | theirs == {0, 1, 2, 3}
            )

        await until("the two members to split the partitions", split)
        first = await assigned(one)
        generation = two._coordinator.generation
        seen = list(listener.events)
        # DescribeGroups v4+ (librdkafka's; kafka-python's v3 has no instance ids).
        rd_admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": c.kafka_bootstrap})
        described = rd_admin.describe_consumer_groups(["static-group"])["static-group"].result(30)
        instances = sorted(m.group_instance_id for m in described.members)
        assert instances == ["instance-1", "instance-2"]

        await one.stop()
        restarted = consumer("instance-1")
        restarted.subscribe(["static-events"])
        await restarted.start()

        async def back() -> bool:
            return await assigned(restarted) == first

        await until("the restarted member to get its partitions back", back)
        for _ in range(10):  # heartbeats of the other member go on meanwhile
            await asyncio.sleep(0.2)
            assert two._coordinator.generation == generation
        assert listener.events == seen, "the other member saw a rebalance"
        assert await assigned(two) == {0, 1, 2, 3} - first
    finally:
        for member in (two, restarted):
            if member is not None:
                await member.stop()
