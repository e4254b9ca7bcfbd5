"""Kafka consumer groups on the nodes' Kafka listener, with a real librdkafka client
(confluent-kafka) on a 3-node cluster: subscribe() consumers consume, commit and leave
the group on close, successors resume at the committed offsets, two members split the
partitions and rebalance, committed offsets survive kill -9 of the coordinator; and the
group APIs at the newest versions (the Java client's), byte for byte."""

from __future__ import annotations

import random
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka import records as kafka_records
from quorumlog.replica.kafka.codec import decode_response, encode_request
from quorumlog.replica.kafka.coordinators import OFFSETS_TOPIC, partition_for
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.schema import Api, Message
from quorumlog.replica.kafka.wire import FrameDecoder, frame
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.kafka import NO_REBALANCE_DELAY
from tests.support.waits import retry, wait_until

from .test_fuzz import _mutations

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

WAIT_S = 60.0
# Members' sessions outlast every wait here: a member that leaves within one left by its
# LeaveGroup (its close), not by its session expiring.
SESSION_TIMEOUT_MS = 300_000
FUZZ_FRAMES = 1500

Seen = tuple[int, int]  # (partition, offset)


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3, tmp_path_factory.mktemp("groups"), kafka=True, node_args=NO_REBALANCE_DELAY
    ) as c:
        yield c


class Consumers:
    """confluent-kafka consumers a test opens; every one still open is closed at the end."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.open: list[confluent_kafka.Consumer] = []

    def new(self, group: str, **config: Any) -> confluent_kafka.Consumer:
        settings = {
            "bootstrap.servers": self.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "heartbeat.interval.ms": 250,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
        }
        settings.update({k.replace("_", "."): v for k, v in config.items()})
        consumer = confluent_kafka.Consumer(settings)
        self.open.append(consumer)
        return consumer

    def subscribed(
        self, topic: str, *, group: str | None = None, **config: Any
    ) -> confluent_kafka.Consumer:
        """A new consumer subscribed to ``topic``, in ``group`` (by default named as the
        topic)."""
        consumer = self.new(topic if group is None else group, **config)
        consumer.subscribe([topic])
        return consumer

    def close(self, consumer: confluent_kafka.Consumer) -> None:
        self.open.remove(consumer)
        consumer.close()

    def wait_left(self, group: str, members: int = 0) -> None:
        """Until ``group`` has ``members`` members as the coordinator describes it."""
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": self.bootstrap})

        def left() -> bool:
            found = admin.describe_consumer_groups([group])[group].result(30)
            return len(found.members) == members

        wait_until(left, WAIT_S, f"group {group} down to {members} member(s)", interval=0.1)

    def close_all(self) -> None:
        while self.open:
            self.close(self.open[0])


@pytest.fixture
def consumers(kcluster: LocalCluster) -> Iterator[Consumers]:
    made = Consumers(kcluster.kafka_bootstrap)
    try:
        yield made
    finally:
        made.close_all()


def _fill(c: LocalCluster, topic: str, partitions: int, per_partition: int) -> list[Seen]:
    """``per_partition`` records to each partition; their (partition, offset)s."""
    out = []
    for p in range(partitions):
        acks = c.produce(topic, p, [f"{p}-{i}".encode() for i in range(per_partition)])
        out += [(p, a.offset) for a in acks]
    return out


def _ends(written: list[Seen], partitions: int) -> dict[int, int]:
    """One past the last offset ``written`` to each of the topic's ``partitions``."""
    return {p: max(o for pp, o in written if pp == p) + 1 for p in range(partitions)}


def _poll_until(
    consumer: confluent_kafka.Consumer,
    seen: list[Seen],
    done: Callable[[], bool],
    what: str,
    timeout: float = WAIT_S,
    retried: frozenset[int] = frozenset(),
) -> None:
    """Poll ``consumer`` (appending what it delivers to ``seen``) until ``done()``; an
    error whose code is in ``retried`` is one the consumer retries past (else any error
    fails)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        error = msg.error()
        if error is not None and error.code() in retried:
            continue
        assert error is None, error
        seen.append((msg.partition(), msg.offset()))


def _committed(consumer: confluent_kafka.Consumer, topic: str, partitions: int) -> dict[int, int]:
    tps = [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)]
    answer = consumer.committed(tps, timeout=30)
    assert all(tp.error is None for tp in answer), answer
    return {tp.partition: tp.offset for tp in answer}


def test_a_subscribed_consumer_commits_leaves_on_close_and_its_successor_resumes(
    kcluster: LocalCluster, consumers: Consumers
) -> None:
    """A commits synchronously half-way and closes, leaving the group; B (auto-commit)
    reads exactly the rest, and its close commits where it stopped."""
    c = kcluster
    c.create_topic("gresume", 4)
    everything = _fill(c, "gresume", 4, 50)
    ends = _ends(everything, 4)

    a = consumers.subscribed("gresume")
    first: list[Seen] = []
    # Until every partition has given 10: the last of them is then part-read.
    _poll_until(
        a, first, lambda: all(sum(pp == p for pp, _ in first) >= 10 for p in range(4)), "10 each"
    )
    committed = {tp.partition: tp.offset for tp in a.commit(asynchronous=False)}
    for p in range(4):
        mine = [o for pp, o in first if pp == p]
        assert mine == [o for pp, o in everything if pp == p][: len(mine)]  # in order
        assert committed[p] == mine[-1] + 1
    assert any(committed[p] < ends[p] for p in range(4))
    consumers.close(a)
    consumers.wait_left("gresume")  # its close left the group

    b = consumers.subscribed("gresume", enable_auto_commit=True, auto_commit_interval_ms=100)
    second: list[Seen] = []
    _poll_until(b, second, lambda: len(first) + len(second) >= 200, "B to read the rest")
    assert not set(first) & set(second), "B read again what A had committed"
    assert len(set(second)) == len(second) and set(first) | set(second) == set(everything)
    for p in range(4):  # exactly after what A committed: no re-read, no gap
        resumed = [o for pp, o in second if pp == p][:1]
        assert resumed == ([committed[p]] if committed[p] < ends[p] else []), (p, committed)
    consumers.close(b)
    consumers.wait_left("gresume")

    checker = consumers.new("gresume")
    assert _committed(checker, "gresume", 4) == ends


def test_two_members_split_the_partitions_and_one_takes_all_when_the_other_leaves(
    kcluster: LocalCluster, consumers: Consumers
) -> None:
    c = kcluster
    c.create_topic("gsplit", 4)
    one = consumers.new("gsplit", enable_auto_commit=True, auto_commit_interval_ms=100)
    two = consumers.new("gsplit", enable_auto_commit=True, auto_commit_interval_ms=100)
    got: dict[str, list[Seen]] = {"one": [], "two": []}
    members = {"one": one, "two": two}
    for consumer in members.values():
        consumer.subscribe(["gsplit"])

    def owned(name: str) -> set[int]:
        return {tp.partition for tp in members[name].assignment()}

    def poll_both(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            for name, consumer in members.items():
                msg = consumer.poll(0.05)
                if msg is not None:
                    assert msg.error() is None, msg.error()
                    got[name].append((msg.partition(), msg.offset()))

    poll_both(
        lambda: (
            bool(owned("one"))
            and bool(owned("two"))
            and owned("one") | owned("two") == {0, 1, 2, 3}
        ),
        "both members to hold partitions",
    )
    split = {name: owned(name) for name in members}
    assert not split["one"] & split["two"]
    before = _fill(c, "gsplit", 4, 20)
    poll_both(lambda: len(got["one"]) + len(got["two"]) >= 80, "80 records between them")
    for name in members:
        assert {p for p, _ in got[name]} <= split[name], (name, split)

    consumers.close(two)
    consumers.wait_left("gsplit", members=1)
    del members["two"]
    poll_both(lambda: owned("one") == {0, 1, 2, 3}, "the remaining member to take all")
    after = _fill(c, "gsplit", 4, 10)
    poll_both(lambda: len(got["one"]) + len(got["two"]) >= 120, "the 40 records after")
    seen = got["one"] + got["two"]
    assert sorted(seen) == sorted(before + after), "a gap or a re-read"


def test_committed_offsets_survive_kill_9_of_the_coordinator(
    kcluster: LocalCluster, consumers: Consumers
) -> None:
    c = kcluster
    c.create_topic("gfail", 2)
    written = _fill(c, "gfail", 2, 20)
    x = consumers.subscribed("gfail")
    seen: list[Seen] = []
    _poll_until(x, seen, lambda: len(seen) >= 40, "all 40 records")
    x.commit(asynchronous=False)
    partitions = _offsets_partitions(c)
    coordinator = c.leader_of(OFFSETS_TOPIC, partition_for("gfail", partitions))
    c.kill(coordinator)
    try:
        # The same consumer finds the new coordinator, which read the offsets from the log.
        assert _committed(x, "gfail", 2) == _ends(written, 2)
        consumers.close(x)
        more = _fill(c, "gfail", 2, 5)
        y = consumers.subscribed("gfail")
        after: list[Seen] = []
        _poll_until(y, after, lambda: len(after) >= 10, "the 10 new records")
        assert sorted(after) == sorted(more)
        consumers.close_all()
    finally:
        c.start_node(coordinator)
        c.wait_ready()


def _offsets_partitions(c: LocalCluster) -> int:
    """Partitions of __consumer_offsets (every node knows it soon after its creation)."""
    return retry(lambda: len(c.client.metadata([OFFSETS_TOPIC])[OFFSETS_TOPIC].partitions))


# ---------------------------------------------------------------------- raw protocol
def _call(port: int, api: Api, version: int, body: Message) -> Message:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(frame(encode_request(api, version, 1, body, client_id="raw")))
        frames = FrameDecoder()
        while True:
            data = s.recv(1 << 16)
            assert data, "the listener closed the connection"
            for payload in frames.feed(data):
                return decode_response(api, version, payload)[1]


def _request(api: Api, version: int, **fields: Any) -> Message:
    body = api.default_request(version)
    body.update(fields)
    return body


def test_the_group_apis_at_the_java_clients_versions(kcluster: LocalCluster) -> None:
    """FindCoordinator v4 (batched keys), JoinGroup v9, SyncGroup v5, Heartbeat v4,
    OffsetCommit v9, OffsetFetch v9 (batched groups), LeaveGroup v5 (batched members); a
    node that does not coordinate says so; __consumer_offsets is internal."""
    c = kcluster
    c.create_topic("graw", 1)
    any_port = next(iter(c.kafka_ports.values()))

    def coordinators(*groups: str) -> dict[str, int] | None:
        """What every node answers, once they agree. (Before __consumer_offsets exists
        the metadata leader creates it; the others name the metadata leader.)"""
        body = _request(km.FIND_COORDINATOR, 4, coordinator_keys=list(groups))
        answers = []
        for port in c.kafka_ports.values():
            found = _call(port, km.FIND_COORDINATOR, 4, body)["coordinators"]
            if any(f["error_code"] for f in found):
                return None
            answers.append({f["key"]: f["node_id"] for f in found})
        return answers[0] if all(a == answers[0] for a in answers) else None

    wait_until(lambda: coordinators("graw"), WAIT_S, "a coordinator")  # the topic exists
    partitions = _offsets_partitions(c)
    # A second group hashed to the same partition, so one coordinator answers both.
    sibling = next(
        f"graw-{i}"
        for i in range(10_000)
        if partition_for(f"graw-{i}", partitions) == partition_for("graw", partitions)
    )
    found = wait_until(lambda: coordinators("graw", sibling), WAIT_S, "a coordinator")
    assert found["graw"] == found[sibling]
    port = c.kafka_ports[found["graw"]]
    other = next(p for n, p in c.kafka_ports.items() if n != found["graw"])

    join = _request(
        km.JOIN_GROUP,
        9,
        group_id="graw",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[{"name": "range", "metadata": b"meta"}],
    )
    assert _call(other, km.JOIN_GROUP, 9, join)["error_code"] == KafkaError.NOT_COORDINATOR
    first = _call(port, km.JOIN_GROUP, 9, join)
    assert first["error_code"] == KafkaError.MEMBER_ID_REQUIRED
    member = first["member_id"]
    joined = _call(port, km.JOIN_GROUP, 9, {**join, "member_id": member})
    assert (joined["error_code"], joined["generation_id"], joined["leader"]) == (0, 1, member)
    assert (joined["protocol_type"], joined["protocol_name"]) == ("consumer", "range")
    assert joined["members"] == [
        {"member_id": member, "group_instance_id": None, "metadata": b"meta"}
    ]

    sync = _request(
        km.SYNC_GROUP,
        5,
        group_id="graw",
        generation_id=1,
        member_id=member,
        protocol_type="consumer",
        protocol_name="range",
        assignments=[{"member_id": member, "assignment": b"mine"}],
    )
    synced = _call(port, km.SYNC_GROUP, 5, sync)
    assert (synced["error_code"], synced["assignment"]) == (0, b"mine")

    beat = _request(km.HEARTBEAT, 4, group_id="graw", generation_id=1, member_id=member)
    assert _call(port, km.HEARTBEAT, 4, beat)["error_code"] == KafkaError.NONE
    stale = {**beat, "generation_id": 0}
    assert _call(port, km.HEARTBEAT, 4, stale)["error_code"] == KafkaError.ILLEGAL_GENERATION

    def commit(generation: int) -> list[int]:
        parts = [
            {
                "partition_index": 0,
                "committed_offset": 7,
                "committed_leader_epoch": 3,
                "committed_metadata": "md",
            },
            {
                "partition_index": 99,
                "committed_offset": 1,
                "committed_leader_epoch": -1,
                "committed_metadata": None,
            },
        ]
        body = _request(
            km.OFFSET_COMMIT,
            9,
            group_id="graw",
            generation_id_or_member_epoch=generation,
            member_id=member,
            topics=[{"name": "graw", "partitions": parts}],
        )
        answer = _call(port, km.OFFSET_COMMIT, 9, body)
        return [p["error_code"] for p in answer["topics"][0]["partitions"]]

    assert commit(0) == [KafkaError.ILLEGAL_GENERATION] * 2
    assert commit(1) == [KafkaError.NONE, KafkaError.UNKNOWN_TOPIC_OR_PARTITION]

    fetch = _request(
        km.OFFSET_FETCH,
        9,
        groups=[
            {"group_id": "graw", "member_id": None, "member_epoch": -1, "topics": None},
            {
                "group_id": sibling,
                "member_id": None,
                "member_epoch": -1,
                "topics": [{"name": "graw", "partition_indexes": [0]}],
            },
        ],
    )
    mine, theirs = _call(port, km.OFFSET_FETCH, 9, fetch)["groups"]
    assert mine["error_code"] == theirs["error_code"] == 0
    assert mine["topics"] == [
        {
            "name": "graw",
            "partitions": [
                {
                    "partition_index": 0,
                    "committed_offset": 7,
                    "committed_leader_epoch": 3,
                    "metadata": "md",
                    "error_code": 0,
                }
            ],
        }
    ]
    assert theirs["topics"][0]["partitions"][0]["committed_offset"] == -1

    leave = _request(
        km.LEAVE_GROUP,
        5,
        group_id="graw",
        members=[
            {"member_id": member, "group_instance_id": None, "reason": "done"},
            {"member_id": "nobody", "group_instance_id": None, "reason": None},
        ],
    )
    left = _call(port, km.LEAVE_GROUP, 5, leave)
    assert left["error_code"] == 0
    assert [mb["error_code"] for mb in left["members"]] == [0, KafkaError.UNKNOWN_MEMBER_ID]
    assert _call(port, km.HEARTBEAT, 4, beat)["error_code"] == KafkaError.UNKNOWN_MEMBER_ID

    # The internal topic: listed as such, and no client writes to it.
    meta = _call(
        any_port,
        km.METADATA,
        12,
        _request(km.METADATA, 12, topics=[{"topic_id": uuid.UUID(int=0), "name": OFFSETS_TOPIC}]),
    )
    assert meta["topics"][0]["is_internal"] is True
    produce = _request(km.PRODUCE, 9, acks=-1, timeout_ms=5000)
    batch = kafka_records.encode_batch([b"forged"], [b"key"])
    produce["topic_data"] = [
        {"name": OFFSETS_TOPIC, "partition_data": [{"index": 0, "records": batch}]}
    ]
    written = _call(any_port, km.PRODUCE, 9, produce)  # refused on any node, leader or not
    code = written["responses"][0]["partition_responses"][0]["error_code"]
    assert code == KafkaError.INVALID_TOPIC_EXCEPTION
    controller = c.kafka_ports[meta["controller_id"]]
    deleted = _call(
        controller,
        km.DELETE_TOPICS,
        5,
        _request(km.DELETE_TOPICS, 5, topic_names=[OFFSETS_TOPIC], timeout_ms=5000),
    )
    assert deleted["responses"][0]["error_code"] == KafkaError.INVALID_TOPIC_EXCEPTION


def _coordinator_port(c: LocalCluster, group: str) -> int:
    """The Kafka port of ``group``'s coordinator, once every node agrees on it."""

    def agreed() -> int | None:
        body = _request(km.FIND_COORDINATOR, 3, key=group, key_type=0)
        answers = {
            _call(port, km.FIND_COORDINATOR, 3, body)["node_id"] for port in c.kafka_ports.values()
        }
        (node,) = answers if len(answers) == 1 else (None,)
        return c.kafka_ports.get(node) if node is not None else None

    return wait_until(agreed, WAIT_S, f"the coordinator of {group}")


def test_mutated_group_requests_do_not_hurt_the_coordinator(
    kcluster: LocalCluster, consumers: Consumers
) -> None:
    """FUZZ_FRAMES mutations of valid group requests to the coordinator: no handler
    fails on what decodes (no "kafka request failed" in its log), and a group still
    consumes and commits afterwards."""
    c = kcluster
    group = "gfuzz"
    port = _coordinator_port(c, group)
    node = next(n for n, p in c.kafka_ports.items() if p == port)
    join = _request(
        km.JOIN_GROUP,
        9,
        group_id=group,
        session_timeout_ms=6000,
        rebalance_timeout_ms=6000,
        member_id="",
        protocol_type="consumer",
        protocols=[{"name": "range", "metadata": b"m"}],
    )
    member = _call(port, km.JOIN_GROUP, 9, join)["member_id"]
    commit_part = {
        "partition_index": 0,
        "committed_offset": 5,
        "committed_leader_epoch": 1,
        "committed_metadata": "x",
    }
    bases = [
        (km.FIND_COORDINATOR, 4, _request(km.FIND_COORDINATOR, 4, coordinator_keys=[group])),
        (km.JOIN_GROUP, 9, join),
        (km.JOIN_GROUP, 5, {**join, "member_id": member}),
        (
            km.SYNC_GROUP,
            5,
            _request(
                km.SYNC_GROUP,
                5,
                group_id=group,
                generation_id=1,
                member_id=member,
                assignments=[{"member_id": member, "assignment": b"a"}],
            ),
        ),
        (
            km.HEARTBEAT,
            4,
            _request(km.HEARTBEAT, 4, group_id=group, generation_id=1, member_id=member),
        ),
        (
            km.LEAVE_GROUP,
            5,
            _request(
                km.LEAVE_GROUP,
                5,
                group_id=group,
                members=[{"member_id": member, "group_instance_id": None, "reason": None}],
            ),
        ),
        (
            km.OFFSET_COMMIT,
            9,
            _request(
                km.OFFSET_COMMIT,
                9,
                group_id=group,
                member_id="",
                topics=[{"name": "graw-none", "partitions": [commit_part]}],
            ),
        ),
        (
            km.OFFSET_FETCH,
            9,
            _request(
                km.OFFSET_FETCH,
                9,
                groups=[{"group_id": group, "member_id": None, "member_epoch": -1, "topics": None}],
            ),
        ),
        (km.OFFSET_FETCH, 7, _request(km.OFFSET_FETCH, 7, group_id=group, topics=None)),
    ]
    encoded = [encode_request(api, v, 7, body) for api, v, body in bases]
    log_before = c.log_path(node).stat().st_size
    rng = random.Random(16)
    sock: socket.socket | None = None
    try:
        for _ in range(FUZZ_FRAMES):
            if sock is None:
                # A join may be parked for seconds: a blocked send starts a new connection.
                sock = socket.create_connection(("127.0.0.1", port), timeout=1)
            (mutated,) = _mutations(rng, rng.choice(encoded), 1)
            try:
                sock.sendall(frame(mutated))
            except OSError:
                sock.close()
                sock = None
    finally:
        if sock is not None:
            sock.close()
    with c.log_path(node).open("rb") as f:
        f.seek(log_before)
        logged = f.read().decode(errors="replace")
    assert "kafka request failed" not in logged and "tick failed" not in logged, logged[-3000:]

    c.create_topic("gfuzz-after", 1)
    written = _fill(c, "gfuzz-after", 1, 10)
    consumer = consumers.subscribed("gfuzz-after", group=group)
    seen: list[Seen] = []
    # A mutated JoinGroup may have left a member of another protocol in the group (as
    # Kafka does, the group refuses members of no common protocol until that one's
    # session expires): the consumer's joins are refused meanwhile, and it retries.
    _poll_until(
        consumer,
        seen,
        lambda: len(seen) >= 10,
        "the group to consume",
        retried=frozenset({confluent_kafka.KafkaError.INCONSISTENT_GROUP_PROTOCOL}),
    )
    assert seen == written
    consumer.commit(asynchronous=False)
    assert _committed(consumer, "gfuzz-after", 1) == {0: written[-1][1] + 1}


def test_no_node_loads_pandas(kcluster: LocalCluster, consumers: Consumers) -> None:
    """pyarrow imports pandas, when installed, on a process's first array built from
    Python objects: a node's first topic create cost it 0.6-0.8 s of CPU, at its busiest.
    A node never uses pandas and blocks the import (``keep_pandas_out``): after a topic
    create, produce through both listeners, a group's consume, commit and committed
    offsets read back, no node has pandas loaded."""
    c = kcluster
    c.create_topic("nopandas", 2)
    _fill(c, "nopandas", 2, 10)
    producer = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap})
    for i in range(10):
        producer.produce("nopandas", b"kafka-%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    consumer = consumers.subscribed("nopandas")
    seen: list[Seen] = []
    _poll_until(consumer, seen, lambda: len(seen) >= 30, "every record")
    consumer.commit(asynchronous=False)
    assert _committed(consumer, "nopandas", 2) == _ends(seen, 2)
    for n, proc in c.procs.items():
        with open(f"/proc/{proc.pid}/maps") as maps:
            assert "/pandas/" not in maps.read(), f"node {n} loaded pandas"
