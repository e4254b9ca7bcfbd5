"""The native producer is idempotent by default: its batches carry a producer id, epoch
and per-partition sequence numbers, a resent batch is appended once (answered with the
first append's offsets), and across a leader kill (-9) every record is written once."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from quorumlog.replica.client import Client, InvalidProducerEpochError
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import Producer as ProducerFields
from quorumlog.replica.storage.records import encode_batch, iter_batches

from tests.support.cluster import leader_fault, read_all
from tests.support.waits import wait_until

pytestmark = pytest.mark.cluster


def test_a_resent_batch_is_appended_once_and_an_old_epoch_is_fenced(
    cluster: LocalCluster,
) -> None:
    c = cluster
    c.create_topic("nidem", 1)
    client = c.client
    pid, epoch = client.init_producer_id()
    batch = encode_batch([b"a", b"b"], producer=ProducerFields(pid, epoch, 0))
    first = client.produce("nidem", 0, batch)
    again = client.produce("nidem", 0, batch)  # as a retry whose answer was lost
    assert (again.base_offset, again.last_offset) == (first.base_offset, first.last_offset)
    assert client.init_producer_id(pid, epoch) == (pid, epoch + 1)
    client.produce("nidem", 0, encode_batch([b"c"], producer=ProducerFields(pid, epoch + 1, 0)))
    with pytest.raises(InvalidProducerEpochError):
        client.produce("nidem", 0, encode_batch([b"z"], producer=ProducerFields(pid, epoch, 2)))
    assert [v for _, _, v in read_all(client, "nidem", 0)] == [b"a", b"b", b"c"]


def test_the_producer_numbers_each_partitions_batches(cluster: LocalCluster) -> None:
    c = cluster
    c.create_topic("nseq", 2)
    producer = Producer(c.client, linger_ms=60_000, max_batch_records=3)
    for i in range(12):
        producer.send("nseq", f"v{i}".encode(), partition=i % 2)
    producer.flush()
    assert producer.producer_id is not None
    for p in range(2):
        headers = list(iter_batches(c.client.fetch("nseq", p, 0, max_bytes=1 << 20).records))
        assert [h.producer for h in headers if not h.is_control] == [
            ProducerFields(producer.producer_id, 0, seq) for seq in (0, 3)
        ]


@pytest.mark.parametrize("flush_every", [50, 500])
def test_every_record_is_written_once_in_order_across_stalls_and_leader_kills(
    cluster: LocalCluster, flush_every: int
) -> None:
    """The client resends a batch whose answer did not come in time: to a leader whose
    followers stall (it holds the batch, uncommitted) or to the next leader. Flushed
    every 500 records, 25 batches wait at once: the sender has several calls and five
    of the partition's batches in flight when the faults land, and they stay in order."""
    c = cluster
    topic = f"nidemkill{flush_every}"
    c.create_topic(topic, 1)
    total = 3000
    sent: list[bytes] = []
    failures: list[BaseException] = []

    def produce() -> None:
        with Client(c.bootstrap) as client:
            producer = Producer(client, linger_ms=1, max_batch_records=20)
            try:
                for i in range(total):
                    value = f"r{i}".encode()
                    producer.send(topic, value, partition=0)
                    if i % flush_every == flush_every - 1:
                        producer.flush()  # paced by its acks, so faults land mid-stream
                    sent.append(value)
                producer.close()
            except BaseException as exc:  # reported below
                failures.append(exc)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    try:
        for n, fault in enumerate(["stall", "kill", "stall"]):
            deadline = time.monotonic() + 60
            while len(sent) < total // 4 * (n + 1) and time.monotonic() < deadline:
                time.sleep(0.01)
            leader_fault(c, topic, 0, fault)
        worker.join(180)
    finally:
        c.wait_ready()
    assert not worker.is_alive() and not failures, failures[:1]
    logged = [v for _, _, v in read_all(c.client, topic, 0)]
    twice = [v for v, n in Counter(logged).items() if n > 1]
    assert not twice, f"{len(twice)} records written twice, e.g. {twice[:3]}"
    assert set(logged) == set(sent) and len(sent) == total
    assert logged == sent, "the partition's records are not in the order sent"


def test_a_producer_whose_batches_retention_deleted_moves_to_its_next_epoch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Retention deleted every batch of a producer and the node rebuilt its producer
    state from what is left (a restart): the producer's next batch, past sequence 0, is
    refused as UNKNOWN_PRODUCER_ID rather than appended past a gap, and the producer sends
    it again under its next epoch, from sequence 0."""
    args = ["--segment-bytes", "4096", "--retention-bytes", "8192"]
    with LocalCluster(1, tmp_path_factory.mktemp("expire"), node_args=args) as c:
        c.create_topic("expire", 1)
        with Client(c.bootstrap) as client:
            producer = Producer(client, linger_ms=0)
            for value in (b"a", b"b"):
                producer.send("expire", value, partition=0)
                producer.flush()
            pid = producer.producer_id
            # Other writers fill segments until retention deletes the producer's batches.
            for _ in range(40):
                client.produce("expire", 0, encode_batch([bytes(500)] * 2))
            wait_until(
                lambda: client.list_offsets("expire", 0, "earliest").offset > 2,
                15,
                "retention to delete the producer's batches",
            )
            c.restart(1, graceful=True)
            c.wait_ready()
            c.wait_for_leader("expire", 0, 30)
            producer.send("expire", b"c", partition=0)
            producer.flush()
            end = client.list_offsets("expire", 0, "latest").offset
            (last,) = iter_batches(client.fetch("expire", 0, end - 1).records)
            assert last.producer == ProducerFields(pid, 1, 0)
