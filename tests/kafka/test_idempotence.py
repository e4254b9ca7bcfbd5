"""Idempotent producing through the Kafka listener on a 3-node cluster: InitProducerId,
a retried Produce written once and answered with the first write's offsets, sequence
gaps and fenced epochs refused with Kafka's errors, and a librdkafka producer with
enable.idempotence writing each record exactly once while leaders are killed (-9)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka.codec import decode_response
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.records import encode_batch
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.cluster import leader_fault, read_all
from tests.support.kafka import idempotent_producer

from .test_listener import _exchange, _request

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

# Record index -> (fault, partition), injected by ``leader_fault``.
FAULTS = {1000: ("stall", 0), 2500: ("kill", 1), 4000: ("stall", 1), 5000: ("kill", 0)}


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("idem"), kafka=True, log_level="INFO") as c:
        yield c


def _init_producer_id(port: int, producer_id: int = -1, producer_epoch: int = -1) -> Any:
    body = km.INIT_PRODUCER_ID.default_request(4)
    body.update(
        transactional_id=None,
        transaction_timeout_ms=60000,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )
    (raw,) = _exchange(port, [_request(port, km.INIT_PRODUCER_ID, 4, body, 1)])
    return decode_response(km.INIT_PRODUCER_ID, 4, raw)[1]


def _produce(port: int, topic: str, batch: bytes) -> Any:
    body = km.PRODUCE.default_request(9)
    body.update(
        acks=-1,
        timeout_ms=10000,
        topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    )
    (raw,) = _exchange(port, [_request(port, km.PRODUCE, 9, body, 2)])
    return decode_response(km.PRODUCE, 9, raw)[1]["responses"][0]["partition_responses"][0]


def test_a_retried_produce_is_written_once_and_gaps_and_old_epochs_are_refused(
    kcluster: LocalCluster,
) -> None:
    c = kcluster
    c.create_topic("kidem", 1)
    port = c.kafka_ports[c.wait_for_leader("kidem", 0, 30)]
    ident = _init_producer_id(port)
    assert ident["error_code"] == 0 and ident["producer_id"] >= 0
    pid, epoch = ident["producer_id"], ident["producer_epoch"]

    def batch(first: int, count: int, producer_epoch: int = epoch) -> bytes:
        values = [f"v{first + i}".encode() for i in range(count)]
        return encode_batch(
            values, producer_id=pid, producer_epoch=producer_epoch, base_sequence=first
        )

    first = _produce(port, "kidem", batch(0, 3))
    again = _produce(port, "kidem", batch(0, 3))  # the retry of a request whose answer was lost
    assert (first["error_code"], again["error_code"]) == (0, 0)
    assert again["base_offset"] == first["base_offset"]
    gap = _produce(port, "kidem", batch(5, 1))
    assert gap["error_code"] == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _produce(port, "kidem", batch(3, 2))["error_code"] == 0

    bumped = _init_producer_id(port, pid, epoch)  # KIP-360: the same id, the next epoch
    assert (bumped["producer_id"], bumped["producer_epoch"]) == (pid, epoch + 1)
    assert _produce(port, "kidem", batch(0, 1, epoch + 1))["error_code"] == 0
    fenced = _produce(port, "kidem", batch(5, 1))
    assert fenced["error_code"] == KafkaError.INVALID_PRODUCER_EPOCH
    # A producer id the partition holds nothing of starts at sequence 0: its batch 3-4
    # would go in ahead of the 0-2 it lacks (Kafka accepts it, since KIP-360).
    other = _init_producer_id(port)["producer_id"]
    ahead = encode_batch([b"w3", b"w4"], producer_id=other, producer_epoch=0, base_sequence=3)
    assert _produce(port, "kidem", ahead)["error_code"] == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER

    logged = [v for _, _, v in read_all(c.client, "kidem", 0)]
    assert logged == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v0"]


def test_an_idempotent_kafka_producer_writes_each_record_once_across_stalls_and_kills(
    kcluster: LocalCluster,
) -> None:
    """librdkafka with enable.idempotence resends what a stalled or killed leader left
    unanswered; the leader (or its successor) already holds many of those batches.
    Checked from the log: every acknowledged record is there, and no record twice."""
    c = kcluster
    c.create_topic("kidemkill", 2)
    producer = idempotent_producer(c)
    acked: list[bytes] = []
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        (failed if err is not None else acked).append(err if err is not None else msg.value())

    total = 6000
    try:
        for i in range(total):
            producer.produce("kidemkill", f"r{i}".encode(), partition=i % 2, on_delivery=delivered)
            producer.poll(0)
            if i in FAULTS:
                fault, partition = FAULTS[i]
                leader_fault(c, "kidemkill", partition, fault)
            if i % 200 == 0:
                time.sleep(0.005)
        assert producer.flush(120) == 0
    finally:
        c.wait_ready()
    assert not failed, failed[:3]
    logged = [v for p in range(2) for _, _, v in read_all(c.client, "kidemkill", p)]
    twice = [v for v, n in Counter(logged).items() if n > 1]
    assert not twice, f"{len(twice)} records written twice, e.g. {twice[:3]}"
    assert len(acked) == total and set(acked) == set(logged)
