"""One size limit, max.message.bytes, checked where it is cheapest: the client refuses a
batch over the topic's limit before sending; the node answers MESSAGE_TOO_LARGE and
keeps the connection (also for a frame over the frame limit); any batch the leader
accepts fits every frame that carries it, so it is replicated without link drops or
elections."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from quorumlog.replica.client import Client, InvalidRequestError, RecordTooLargeError
from quorumlog.replica.client.connection import Connection
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.config import DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES_CEILING
from quorumlog.replica.protocol import (
    API_VERSION,
    DEFAULT_MAX_FRAME_BYTES,
    PREFIX,
    ApiKey,
    ErrorCode,
    encode,
    encode_frame,
    max_batch_bytes,
)
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage import encode_batch

from tests.support.cluster import describe, find_leader
from tests.support.messages import fetch_response
from tests.support.metrics import cluster_total
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The module's 3-node cluster, serving metrics: its request counts show whether a
    batch the client refused ever reached a node."""
    with LocalCluster(3, tmp_path_factory.mktemp("sizes"), metrics=True) as c:
        yield c


def _batch_of(size: int) -> bytes:
    """One single-record batch of at most ``size`` bytes, as close as the format allows
    (Arrow IPC pads buffers to 8 bytes)."""
    overhead = len(encode_batch([b""]))
    best = encode_batch([b"v" * max(0, size - overhead)])
    step = 1
    while len(best) > size:
        best = encode_batch([b"v" * max(0, size - overhead - step)])
        step *= 2
    return best


def _create(c: LocalCluster, topic: str, max_message_bytes: int | None) -> tuple[int, int]:
    c.client.create_topic(topic, 1, max_message_bytes=max_message_bytes)
    c.client.wait_for_leaders(topic)
    return find_leader(c, topic, 0, c.ports)


def _all_replicas_at(c: LocalCluster, leader: int, topic: str, end: int) -> None:
    def at_end() -> bool:
        d = describe(c, leader, topic, 0)
        ends = sorted(v.end_offset for v in d.voters)
        return d.error == 0 and ends == [end] * 3

    wait_until(at_end, 60, f"every replica of {topic}/0 at log end {end}")


def _produce_answers(c: LocalCluster) -> tuple[float, float]:
    """(produce requests answered, MESSAGE_TOO_LARGE answered to them), over every node."""
    return (
        cluster_total(c, "quorumlog_requests_total", listener="native", api="PRODUCE"),
        cluster_total(
            c,
            "quorumlog_request_errors_total",
            listener="native",
            api="PRODUCE",
            code="MESSAGE_TOO_LARGE",
        ),
    )


def _assert_replicated_without_elections(
    c: LocalCluster, topic: str, batch: bytes, leader: int, epoch: int
) -> None:
    res = c.client.produce(topic, 0, batch, timeout_ms=60000)
    assert res.leader_epoch == epoch
    _all_replicas_at(c, leader, topic, res.last_offset + 1)
    d = describe(c, leader, topic, 0)
    assert (d.leader_id, d.leader_epoch) == (leader, epoch), "leadership moved"


def test_one_byte_over_the_topic_limit_fails_at_once_and_the_node_answers_it(
    cluster: LocalCluster,
) -> None:
    over = _batch_of(64 << 10)
    limit = len(over) - 1
    topic = "sizes-small"
    leader, epoch = _create(cluster, topic, limit)
    assert cluster.client.metadata([topic])[topic].partitions[0].max_message_bytes == limit

    # The client refuses it before sending: no node is asked to append it, so no node
    # answers a produce or counts a MESSAGE_TOO_LARGE.
    produces = _produce_answers(cluster)
    with Client(cluster.bootstrap) as fresh:
        with pytest.raises(RecordTooLargeError, match=f"max.message.bytes {limit}"):
            fresh.produce(topic, 0, over)
    with pytest.raises(RecordTooLargeError):
        producer = Producer(cluster.client)
        producer.send(topic, b"v" * limit, partition=0)
        producer.flush()
    assert _produce_answers(cluster) == produces

    # Past the client check, the node answers MESSAGE_TOO_LARGE and keeps the connection.
    conn = Connection(cluster.host, cluster.ports[leader], client_id="raw", timeout_s=10)
    try:
        resp = conn.request(
            ApiKey.PRODUCE,
            m.ProduceRequest(
                topic=topic, partition=0, acks=m.ACKS_QUORUM, timeout_ms=10000, records=over
            ),
            m.ProduceResponse,
        )
        assert resp.error == ErrorCode.MESSAGE_TOO_LARGE, resp
        assert str(limit) in resp.error_message
        # ...and counts it (what the checks above would have seen had the client sent).
        assert _produce_answers(cluster) == (produces[0] + 1, produces[1] + 1)
        under = _batch_of(limit)
        assert len(under) <= limit
        resp = conn.request(
            ApiKey.PRODUCE,
            m.ProduceRequest(
                topic=topic, partition=0, acks=m.ACKS_QUORUM, timeout_ms=10000, records=under
            ),
            m.ProduceResponse,
        )
        assert resp.error == 0 and resp.leader_epoch == epoch, resp
    finally:
        conn.close()

    # A batch just under the limit: replicated and acknowledged on all 3, no election.
    _assert_replicated_without_elections(cluster, topic, _batch_of(limit), leader, epoch)
    # The producer splits a batch over the limit whose records each fit.
    producer = Producer(cluster.client, max_batch_bytes=1 << 30, linger_ms=60000)
    for i in range(40):
        producer.send(topic, f"{i:04d}".encode() * (limit // 16), partition=0)
    results = producer.flush()
    assert len(results) > 1 and sum(r.last_offset - r.base_offset + 1 for r in results) == 40


def test_a_frame_over_the_frame_limit_is_answered_and_the_connection_kept(
    cluster: LocalCluster,
) -> None:
    topic = "sizes-frame"
    leader, _ = _create(cluster, topic, None)
    conn = Connection(cluster.host, cluster.ports[leader], client_id="raw", timeout_s=30)
    try:
        # What a client without the size check sends: one produce frame 1 byte over.
        body, _ = encode(
            m.ProduceRequest(
                topic=topic, partition=0, acks=m.ACKS_QUORUM, timeout_ms=10000, records=b""
            )
        )
        meta_len = len(encode_frame(int(ApiKey.PRODUCE), API_VERSION, 7, "raw", body)[0]) - 8
        payload = bytes(DEFAULT_MAX_FRAME_BYTES - 4 - meta_len + 1)
        buffers = encode_frame(int(ApiKey.PRODUCE), API_VERSION, 7, "raw", body, payload)
        assert PREFIX.unpack_from(buffers[0])[0] == DEFAULT_MAX_FRAME_BYTES + 1
        conn._next_id = 8
        for b in buffers:
            conn._sock.sendall(b)
        with pytest.raises(RecordTooLargeError, match="exceeds the limit"):
            conn.receive(7, m.ProduceResponse)
        resp = conn.request(ApiKey.METADATA, m.MetadataRequest(topics=[topic]), m.MetadataResponse)
        assert resp.error == 0 and resp.topics[0].max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
    finally:
        conn.close()


def test_a_batch_just_under_the_shipped_default_is_replicated(cluster: LocalCluster) -> None:
    """The shipped default is also the largest limit allowed: a batch that size fits the
    produce frame, the replica fetch answer inside the raft envelope and the consumer
    fetch answer, and replicates without an election."""
    assert DEFAULT_MAX_MESSAGE_BYTES == MAX_MESSAGE_BYTES_CEILING
    topic = "sizes-default"
    leader, epoch = _create(cluster, topic, None)
    batch = _batch_of(DEFAULT_MAX_MESSAGE_BYTES)
    _assert_replicated_without_elections(cluster, topic, batch, leader, epoch)
    res = cluster.client.fetch(topic, 0, 1, max_bytes=1)  # KIP-74: one whole batch anyway
    assert len(res.records) == len(batch)  # the header is restamped, the size is the same
    produces = _produce_answers(cluster)
    with pytest.raises(RecordTooLargeError):
        cluster.client.produce(topic, 0, _batch_of(DEFAULT_MAX_MESSAGE_BYTES + 64))
    assert _produce_answers(cluster) == produces, "refused by a node, not by the client"
    # A topic cannot ask for more than one batch can safely be.
    with pytest.raises(InvalidRequestError, match="max.message.bytes must be 1"):
        cluster.client.create_topic(
            "sizes-too-big", 1, max_message_bytes=MAX_MESSAGE_BYTES_CEILING + 1
        )


def test_replica_fetch_frame_with_a_largest_batch_fits_the_frame_limit() -> None:
    """Frame math: a batch of max_batch_bytes (above any allowed max.message.bytes) in a
    replica fetch answer for the longest topic name fits the frame limit."""
    assert MAX_MESSAGE_BYTES_CEILING <= max_batch_bytes()
    records = bytes(max_batch_bytes())
    widest = dict.fromkeys(
        ("high_watermark", "log_start_offset", "fetch_offset", "request_id"), 2**62
    )
    msg = fetch_response(cluster_id="c" * 64, leader_epoch=2**31, records=records, **widest)
    body, payload = encode(msg)
    env, _ = encode(
        m.RaftEnvelope(
            topic="t" * 200, partition=2**31, kind="FetchResponse", body=body, records=b""
        )
    )
    frame = encode_frame(int(ApiKey.RAFT), API_VERSION, 0, "node-" + "9" * 10, env, payload)
    assert sum(len(b) for b in frame) <= DEFAULT_MAX_FRAME_BYTES
