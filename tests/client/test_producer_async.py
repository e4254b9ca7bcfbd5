"""The native producer is asynchronous and pipelined: ``send`` returns a future at once,
sender threads keep several partitions' batches in flight (a hung leader holds up only
its own partitions), ``send`` blocks (then raises) when its buffer is full, and idle
sender threads go away even if the producer is never closed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.producer import Producer, RecordMetadata
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import encode_batch

from tests.support.cluster import read_all
from tests.support.spies import record_metadata
from tests.support.waits import wait_until

pytestmark = pytest.mark.cluster


def _senders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("quorumlog-producer-")]


def test_futures_and_callbacks_name_each_records_offset(cluster: LocalCluster) -> None:
    c = cluster
    c.create_topic("afut", 1)
    called: list[tuple[BaseException | None, RecordMetadata | None]] = []
    with Client(c.bootstrap) as client, Producer(client, linger_ms=50) as producer:
        futures = [
            producer.send(
                "afut",
                f"v{i}".encode(),
                partition=0,
                on_delivery=lambda err, meta: called.append((err, meta)),
            )
            for i in range(25)
        ]
        assert not all(f.done() for f in futures)  # queued, not sent: send did not wait
        results = producer.flush(30)
    metas = [f.result() for f in futures]
    assert [m.offset for m in metas] == list(range(metas[0].offset, metas[0].offset + 25))
    assert sorted(called, key=lambda c: c[1].offset if c[1] else -1) == [(None, m) for m in metas]
    assert sum(r.last_offset - r.base_offset + 1 for r in results) == 25
    logged = {o: v for o, _, v in read_all(c.client, "afut", 0)}
    assert all(logged[m.offset] == f"v{i}".encode() for i, m in enumerate(metas))


def test_a_hung_leader_holds_up_only_its_own_partitions(cluster: LocalCluster) -> None:
    c = cluster
    c.create_topic("apipe", 3)
    leaders = {p: c.wait_for_leader("apipe", p, 30) for p in range(3)}
    hung = leaders[0]
    free = next((p for p in range(1, 3) if leaders[p] != hung), None)
    if free is None:  # every partition on one node: move one leader away first
        pytest.fail(f"all partitions led by node {hung}: {leaders}")
    done: dict[int, float] = {}

    def stamp(partition: int) -> Callable[[object, object], float]:
        return lambda err, meta: done.setdefault(partition, time.monotonic())

    # Attempts outlast the wait below: a free partition's send that waited behind the
    # hung node's attempt would not be acknowledged within it.
    attempts_ms = 120_000
    with (
        Client(c.bootstrap, attempt_timeout_ms=attempts_ms) as client,
        Producer(client, linger_ms=0) as producer,
    ):
        producer.send("apipe", b"warm", partition=0)
        producer.send("apipe", b"warm", partition=free)
        producer.flush(30)
        c.pause(hung)
        try:
            held: Future[RecordMetadata] = producer.send(
                "apipe", b"held", partition=0, on_delivery=stamp(0)
            )
            producer.send("apipe", b"free", partition=free, on_delivery=stamp(free))
            wait_until(lambda: free in done, attempts_ms / 4000, "the free partition's ack")
            assert not held.done()
        finally:
            c.resume(hung)
        producer.flush(60)
    assert held.result().partition == 0 and done[0] > done[free]


def test_a_sender_routes_by_the_leaders_another_learnt(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sender threads' clients (``Client.clone``) share what their parent knows of the
    cluster: a sender that has not sent yet asks no node for metadata. It used to ask one
    node at random, and when that was a hung leader's node, a partition led elsewhere
    waited an attempt timeout (the test above, one run in five)."""
    c = cluster
    c.create_topic("aclone", 2)
    batch = encode_batch([b"x"])
    with Client(c.bootstrap) as client:
        client.produce("aclone", 1, batch)  # learns the topic
        answered = record_metadata(monkeypatch)
        with client.clone() as twin:
            assert twin.produce("aclone", 1, batch).partition == 1
            twin.produce("aclone", 0, batch)
        assert answered == []


def test_send_blocks_then_raises_when_the_buffer_is_full(cluster: LocalCluster) -> None:
    c = cluster
    c.create_topic("afull", 1)
    leader = c.wait_for_leader("afull", 0, 30)
    with Client(c.bootstrap) as client:
        producer = Producer(client, linger_ms=0, buffer_bytes=4000, max_block_ms=500)
        producer.send("afull", b"x", partition=0)
        producer.flush(30)
        c.pause(leader)
        try:
            # it raises only once its max_block_ms has passed without room, and says so
            with pytest.raises(TimeoutError, match=r"buffer full .* for 0\.5 s"):
                for _ in range(100):
                    producer.send("afull", b"v" * 1000, partition=0)
        finally:
            c.resume(leader)
        producer.close(60)


def test_idle_sender_threads_end_without_close(cluster: LocalCluster) -> None:
    c = cluster
    c.create_topic("aidle", 2)
    with Client(c.bootstrap) as client:
        producer = Producer(client)
        for i in range(10):
            producer.send("aidle", b"v", partition=i % 2)
        producer.flush(30)
        assert _senders()
        wait_until(lambda: not _senders(), 10, "idle senders to end")  # never closed
        producer.send("aidle", b"again", partition=0)  # senders come back on demand
        assert producer.flush(30)


def test_a_batch_that_cannot_be_encoded_fails_alone(cluster: LocalCluster) -> None:
    """Sent with other partitions' batches, one that cannot be encoded (a table without a
    value column) fails its own future; the others are appended and the senders go on."""
    import pyarrow as pa

    c = cluster
    c.create_topic("abad", 3)
    with Client(c.bootstrap) as client:
        producer = Producer(client, linger_ms=60_000, max_in_flight=1)
        producer.send("abad", b"warm", partition=0)
        producer.flush(30)
        good = [producer.send("abad", b"ok%d" % p, partition=p) for p in (1, 2)]
        bad = producer.send_batch("abad", 0, pa.table({"key": [b"k"]}))
        with pytest.raises(ValueError, match="'value'"):
            producer.flush(30)
        with pytest.raises(ValueError, match="'value'"):
            bad.result(0)
        assert sorted(f.result(0).partition for f in good) == [1, 2]
        after = producer.send("abad", b"after", partition=0)
        producer.close(30)
        assert after.result(0).partition == 0
        assert [v for _, _, v in read_all(client, "abad", 0)] == [b"warm", b"after"]


def test_a_failing_delivery_callback_is_logged_and_the_producer_goes_on(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    c = cluster
    c.create_topic("acb", 1)

    def boom(err: object, meta: object) -> None:
        raise RuntimeError("the application's callback failed")

    with Client(c.bootstrap) as client, Producer(client, linger_ms=0) as producer:
        first = producer.send("acb", b"a", partition=0, on_delivery=boom)
        producer.flush(30)
        second = producer.send("acb", b"b", partition=0)
        producer.flush(30)
    assert first.result(0).offset < second.result(0).offset
    assert "on_delivery callback for acb/0 failed" in caplog.text
