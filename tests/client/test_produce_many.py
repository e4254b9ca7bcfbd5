"""Client.produce_many: batches for many partitions in one round trip. Every leader's
requests are sent before any answer is read (one connection each, answered in order),
each item's outcome comes back in its place, and an item whose pipelined attempt fails is
sent again alone by ``produce``, with its retries and its errors."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from quorumlog.replica.client import Client, ProduceResult, RecordTooLargeError
from quorumlog.replica.client.connection import Connection, ConnectionLost
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import encode_batch

from tests.support.cluster import read_all

PARTITIONS = 6


def _values(client: Client, topic: str, partition: int) -> list[bytes | None]:
    return [v for _, _, v in read_all(client, topic, partition)]


def _record_exchanges(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[tuple[str, int]]]:
    """Every pipelined send and every answer read from now on, per thread: ("send" or
    "receive", the node's port), in order."""
    runs: dict[int, list[tuple[str, int]]] = {}
    real_send, real_receive = Connection.send, Connection.receive

    def send(self: Connection, api: Any, req: Any) -> int:
        runs.setdefault(threading.get_ident(), []).append(("send", self.port))
        return real_send(self, api, req)

    def receive(self: Connection, cid: int, cls: Any) -> Any:
        runs.setdefault(threading.get_ident(), []).append(("receive", self.port))
        return real_receive(self, cid, cls)

    monkeypatch.setattr(Connection, "send", send)
    monkeypatch.setattr(Connection, "receive", receive)
    return runs


@pytest.mark.cluster
def test_produce_many_pipelines_every_leader_and_settles_each_item(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cluster
    c.create_topic("many-pipelined", PARTITIONS)
    with Client(c.bootstrap) as client:
        client.metadata(["many-pipelined"])
        leaders = {
            client.partition_metadata("many-pipelined", p).leader_id for p in range(PARTITIONS)
        }
        assert len(leaders) > 1, "the partitions' leaders are spread over the nodes"
        runs = _record_exchanges(monkeypatch)
        items = [
            ("many-pipelined", p, encode_batch([b"a%d" % p, b"b%d" % p])) for p in range(PARTITIONS)
        ]
        results = client.produce_many(items)
        # One round trip, one frame per leader (ProduceMany, as Kafka's ProduceRequest):
        # every leader's went out before the first answer was read.
        events = runs[threading.get_ident()]
        assert [kind for kind, _ in events] == ["send"] * len(leaders) + ["receive"] * len(leaders)
        assert len({port for _, port in events}) == len(leaders)
        assert [(r.topic, r.partition) for r in results if isinstance(r, ProduceResult)] == [
            ("many-pipelined", p) for p in range(PARTITIONS)
        ]
        assert all(r.last_offset == r.base_offset + 1 for r in results)  # type: ignore[union-attr]
        for p in range(PARTITIONS):
            assert _values(client, "many-pipelined", p) == [b"a%d" % p, b"b%d" % p]


@pytest.mark.cluster
def test_produce_many_retries_a_failed_item_alone_and_reports_errors_in_place(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cluster
    c.create_topic("many-retried", 3)
    with Client(c.bootstrap) as client:
        client.metadata(["many-retried"])
        # Partition 1's cached leader is a follower: its pipelined attempt is answered
        # NOT_LEADER, and it is sent again alone, to the leader.
        pm = client.partition_metadata("many-retried", 1)
        follower = next(r for r in pm.replicas if r != pm.leader_id)
        client._leaders[("many-retried", 1)] = replace(pm, leader_id=follower)
        huge = encode_batch([b"x" * 2048])
        items = [
            ("many-retried", 0, encode_batch([b"zero"])),
            ("many-retried", 1, encode_batch([b"one"])),
            ("many-retried", 2, huge),
            ("many-retried", 7, encode_batch([b"no such partition"])),
        ]
        monkeypatch.setattr(
            client,
            "_leaders",
            {
                k: replace(v, max_message_bytes=1024) if k == ("many-retried", 2) else v
                for k, v in client._leaders.items()
            },
        )
        results = client.produce_many(items, timeout_ms=5000)
        assert isinstance(results[0], ProduceResult) and results[0].partition == 0
        assert isinstance(results[1], ProduceResult) and results[1].partition == 1
        assert isinstance(results[2], RecordTooLargeError)
        assert isinstance(results[3], Exception) and "7" in str(results[3])
        assert _values(client, "many-retried", 0) == [b"zero"]
        assert _values(client, "many-retried", 1) == [b"one"]
        assert client.fetch("many-retried", 2, 0).high_watermark == 0, "nothing of it was sent"

        # A connection lost after the requests went out: their outcome is unknown, so
        # each is sent again alone (a batch with producer fields would be appended
        # once; these have none).
        real_receive = Connection.receive
        lost = []

        def receive(self: Connection, cid: int, cls: Any) -> Any:
            if not lost:
                lost.append(cid)
                self.close()
                raise ConnectionLost("cut by the test")
            return real_receive(self, cid, cls)

        monkeypatch.setattr(Connection, "receive", receive)
        again = client.produce_many(
            [("many-retried", 0, encode_batch([b"again"]))], timeout_ms=5000
        )
        assert lost and isinstance(again[0], ProduceResult)
        assert _values(client, "many-retried", 0)[-1] == b"again"


@pytest.mark.cluster
def test_producer_senders_send_one_nodes_ready_batches_together(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender takes every ready batch its client knows one leader for and sends them in
    one round trip (a node that hangs holds up only its own partitions' sender)."""
    c = cluster
    c.create_topic("many-senders", PARTITIONS)
    with Client(c.bootstrap) as client:
        # Batches stay open until close() closes them all at once.
        producer = Producer(client, linger_ms=60_000, max_in_flight=1)
        producer.send("many-senders", b"warm", partition=0)
        producer.flush(30)  # the (one) sender's client has learnt every leader
        runs = _record_exchanges(monkeypatch)
        futures = [
            producer.send("many-senders", b"v%d" % p, partition=p) for p in range(PARTITIONS)
        ]
        producer.close(30)
        assert sorted(f.result().partition for f in futures) == list(range(PARTITIONS))
        # The pipelined sends of each sender, in runs of consecutive sends (a round
        # trip's requests): every partition's batch went out in fewer round trips than
        # partitions, each round trip one frame to one node.
        trips = []
        for events in runs.values():
            trip: list[int] = []
            for kind, port in [*events, ("receive", 0)]:
                if kind == "send":
                    trip.append(port)
                elif trip:
                    trips.append(trip)
                    trip = []
        assert len(trips) < PARTITIONS and all(len(t) == 1 for t in trips)
