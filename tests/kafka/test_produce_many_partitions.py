"""A Kafka Produce request naming many partitions is appended as one: one flush on its
leader and one replication round (one flush on each follower), however many partitions it
names; a per-partition path pays for each partition (issue 64). Small plain batches of
the requests a node reads together are stored as one batch, each answered with its own
offsets."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka import records as kafka_records
from quorumlog.replica.kafka.codec import decode_response, encode_request
from quorumlog.replica.kafka.wire import FrameDecoder, frame
from quorumlog.replica.kafka_listener.produce import TURN_BYTES
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import CONTROL_FLAG, BatchHeader, iter_batches

from tests.support.waits import wait_until

pytestmark = pytest.mark.cluster

TOPIC = "wide"
#: The partitions one request names; the topic has one such set led by each node.
PARTITIONS = 64
_FLUSH_JOBS = re.compile(r"^quorumlog_log_flush_duration_seconds_count (\S+)$", re.M)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("wide"), kafka=True, metrics=True) as c:
        c.create_topic(TOPIC, 3 * PARTITIONS)
        yield c


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster whose leaders wait long for their followers (``--fetch-timeout-ms``):
    the tests that stop a leader's followers a moment must not see it resign (and answer
    what it holds with an error), however loaded the machine."""
    with LocalCluster(
        3,
        tmp_path_factory.mktemp("patient"),
        kafka=True,
        node_args=["--fetch-timeout-ms", "5000"],
    ) as c:
        yield c


def _flush_jobs(c: LocalCluster) -> dict[int, int]:
    """Each node's log flush jobs so far (its metrics)."""
    out = {}
    for node, url in c.metrics_urls.items():
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        match = _FLUSH_JOBS.search(text)
        out[node] = int(float(match.group(1))) if match else 0
    return out


def _settled(client: Client, partitions: list[int]) -> bool:
    """Every replica of these partitions holds what its leader holds, all of it committed
    (no flush is due anywhere for them)."""
    for p in partitions:
        q = client.describe_quorum(TOPIC, p)
        if any(v.end_offset != q.high_watermark for v in q.voters):
            return False
    return True


def _produce_request(topic: str, partitions: list[int], batch: bytes, cid: int) -> bytes:
    body = km.PRODUCE.default_request(9)
    body.update(
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            {"name": topic, "partition_data": [{"index": p, "records": batch} for p in partitions]}
        ],
    )
    return frame(encode_request(km.PRODUCE, 9, cid, body, client_id="raw"))


def _exchange(port: int, requests: list[bytes]) -> list[dict[str, Any]]:
    """``requests`` sent at once on one connection; their answers, in order."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"".join(requests))
        return _read_answers(s, len(requests))


def _read_answers(s: socket.socket, count: int) -> list[dict[str, Any]]:
    """The next ``count`` Produce answers of connection ``s``, in order."""
    frames = FrameDecoder()
    answers: list[bytes] = []
    while len(answers) < count:
        data = s.recv(1 << 16)
        assert data, "the listener closed the connection"
        answers.extend(frames.feed(data))
    return [decode_response(km.PRODUCE, 9, a)[1] for a in answers]


def _first_partition(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each answer's first partition entry."""
    return [a["responses"][0]["partition_responses"][0] for a in answers]


def _stored(c: LocalCluster, node: int, topic: str) -> list[BatchHeader]:
    """The data batches node ``node`` stores of ``topic``'s partition 0."""
    return [
        h
        for f in sorted(c.node_dir(node).glob(f"{topic}-0/*.log"))
        for h in iter_batches(f.read_bytes())
        if not h.flags & CONTROL_FLAG
    ]


@contextlib.contextmanager
def _followers_stopped(c: LocalCluster, leader: int) -> Iterator[None]:
    """Every node but ``leader`` stopped (SIGSTOP) for the block, then let go on."""
    followers = [n for n in c.procs if n != leader]
    for n in followers:
        c.procs[n].send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for n in followers:
            c.procs[n].send_signal(signal.SIGCONT)


def _produce(port: int, partitions: list[int]) -> dict[str, Any]:
    batch = kafka_records.encode_batch([b"v" * 100] * 10, [b"k%d" % i for i in range(10)])
    return _exchange(port, [_produce_request(TOPIC, partitions, batch, 1)])[0]


def test_a_produce_over_64_partitions_is_one_flush_and_one_replication_round(
    cluster: LocalCluster,
) -> None:
    c = cluster
    leaders = {p: c.wait_for_leader(TOPIC, p, 60) for p in range(3 * PARTITIONS)}
    by_node: dict[int, list[int]] = {}
    for p, node in leaders.items():
        by_node.setdefault(node, []).append(p)
    node, led = max(by_node.items(), key=lambda item: len(item[1]))
    assert len(led) >= PARTITIONS, f"node {node} leads {len(led)} partitions: {by_node}"
    wide = led[:PARTITIONS]
    with Client(c.bootstrap) as client:
        wait_until(lambda: _settled(client, list(leaders)), 60, "every replica caught up")
        before = _flush_jobs(c)
        answer = _produce(c.kafka_ports[node], wide)
        wait_until(lambda: _settled(client, wide), 60, "the records on every replica")
        after = _flush_jobs(c)
    parts = answer["responses"][0]["partition_responses"]
    assert sorted(r["index"] for r in parts) == wide
    assert all(r["error_code"] == 0 and r["base_offset"] >= 0 for r in parts), parts
    # The leader's appends of all 64 partitions made durable by one flush job, and each
    # follower's copies of them by one: one replication round.
    assert {n: after[n] - before[n] for n in after} == {n: 1 for n in after}


def test_small_batches_of_requests_read_together_are_stored_as_one_each_with_its_offsets(
    cluster: LocalCluster,
) -> None:
    """50 requests of one record each, sent at once: each answered with its own offset,
    in the order sent, and the leader stores them in fewer batches than requests."""
    c = cluster
    c.create_topic("merged", 1)
    leader = c.wait_for_leader("merged", 0, 60)
    requests = [
        _produce_request("merged", [0], kafka_records.encode_batch([b"v%d" % i], [b"k%d" % i]), i)
        for i in range(50)
    ]
    answers = _exchange(c.kafka_ports[leader], requests)
    parts = _first_partition(answers)
    assert all(p["error_code"] == 0 for p in parts), parts
    offsets = [p["base_offset"] for p in parts]
    assert offsets == list(range(offsets[0], offsets[0] + 50))
    stored = _stored(c, leader, "merged")
    assert sum(h.record_count for h in stored) == 50
    assert len(stored) < 50


def test_a_backlog_read_at_once_is_appended_in_the_order_sent(cluster: LocalCluster) -> None:
    """100 requests (2 MB for one partition) read at once, more than a turn takes
    (``produce.TURN_BYTES``): appended in the order they were sent (those waiting for a
    later turn are not passed by later ones), each answered with its own offsets, and no
    stored batch holds more than a turn's records."""
    c = cluster
    c.create_topic("backlog", 1)
    leader = c.wait_for_leader("backlog", 0, 60)
    value = b"v" * 1000
    per_request = 20
    requests = [
        _produce_request("backlog", [0], kafka_records.encode_batch([value] * per_request), i)
        for i in range(100)
    ]
    answers = _exchange(c.kafka_ports[leader], requests)
    parts = _first_partition(answers)
    assert all(p["error_code"] == 0 for p in parts), parts
    offsets = [p["base_offset"] for p in parts]
    assert offsets == list(range(offsets[0], offsets[0] + 100 * per_request, per_request))
    stored = _stored(c, leader, "backlog")
    assert sum(h.record_count for h in stored) == 100 * per_request
    most = max(h.record_count for h in stored) * len(value)
    assert most <= TURN_BYTES + per_request * len(value)


def test_requests_coming_while_a_partition_s_appends_are_out_are_stored_together(
    patient: LocalCluster,
) -> None:
    """50 one-record requests for one partition, sent one by one a little apart (each read
    in a turn of its own), none waiting for its answer, while its followers are stopped
    (its appends cannot commit): the first ``APPENDS_IN_FLIGHT`` are appended as they
    come, the others wait and merge, so the leader stores a few batches; once the
    followers go on, each request is answered with its own offset, in the order sent.
    Appended as each turn came, each request made a batch of its own."""
    c = patient
    c.create_topic("held", 1)
    leader = c.wait_for_leader("held", 0, 60)
    count = 50
    with socket.create_connection(("127.0.0.1", c.kafka_ports[leader]), timeout=60) as s:
        with _followers_stopped(c, leader):
            for i in range(count):
                batch = kafka_records.encode_batch([b"v%d" % i], [b"k%d" % i])
                s.sendall(_produce_request("held", [0], batch, i))
                time.sleep(0.002)
        parts = _first_partition(_read_answers(s, count))
    assert all(p["error_code"] == 0 for p in parts), parts
    offsets = [p["base_offset"] for p in parts]
    assert offsets == list(range(offsets[0], offsets[0] + count))
    stored = _stored(c, leader, "held")
    assert sum(h.record_count for h in stored) == count
    assert len(stored) <= 5, [h.record_count for h in stored]


def test_a_partition_whose_appends_wait_holds_back_no_other(patient: LocalCluster) -> None:
    """A partition whose appends cannot commit (its followers stopped) has its requests
    held back; a partition of the same leader that needs no follower (replication factor
    1) is answered meanwhile: what is held back is held per partition."""
    c = patient
    c.create_topic("stuck", 1)
    c.create_topic("alone", 6, 1)
    leader = c.wait_for_leader("stuck", 0, 60)
    mine = [p for p in range(6) if c.wait_for_leader("alone", p, 60) == leader]
    assert mine, "no partition of 'alone' on the leader of 'stuck'"
    port = c.kafka_ports[leader]
    record = kafka_records.encode_batch([b"v"], [b"k"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as held,
        socket.create_connection(("127.0.0.1", port), timeout=30) as free,
        _followers_stopped(c, leader),
    ):
        for i in range(10):
            held.sendall(_produce_request("stuck", [0], record, i))
            time.sleep(0.002)
        free.sendall(_produce_request("alone", mine[:1], record, 100))
        [part] = _first_partition(_read_answers(free, 1))
        # ...while the held partition's requests are not answered yet.
        held.setblocking(False)
        with pytest.raises(BlockingIOError):
            held.recv(1 << 16)
    assert part["error_code"] == 0 and part["base_offset"] >= 0, part
