"""A transaction coordinator killed between its decision and its last marker: the commit
is durable (PrepareCommit in ``__transaction_state``) once EndTxn is answered, a
partition leader is hung so its marker cannot be written, and the coordinator's node is
killed -9. The coordinator that takes over (a leader change of that partition) finds the
decision and writes every marker; a read_committed reader then sees every record of the
transaction, on every partition."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.waits import wait_until

from .test_groups import _call

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "txn-faults"
PARTITIONS = 3
WAIT_S = 90.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path / "c", kafka=True) as c:
        c.create_topic(TOPIC, PARTITIONS)
        for p in range(PARTITIONS):
            c.wait_for_leader(TOPIC, p, 60)
        yield c


def _coordinator(c: LocalCluster, tid: str) -> int:
    """The node FindCoordinator names for transactional id ``tid`` (once all agree)."""

    def found() -> int | None:
        body = km.FIND_COORDINATOR.default_request(4)
        body.update(key_type=1, coordinator_keys=[tid])
        answers = set()
        for port in c.kafka_ports.values():
            try:
                (entry,) = _call(port, km.FIND_COORDINATOR, 4, body)["coordinators"]
            except (TimeoutError, OSError):
                return None
            if entry["error_code"]:
                return None
            answers.add(entry["node_id"])
        return answers.pop() if len(answers) == 1 else None

    node = wait_until(found, WAIT_S, f"the coordinator of {tid}")
    assert node is not None
    return node


def _read_committed(c: LocalCluster, expect: int, wait_s: float) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []
        deadline = time.monotonic() + wait_s
        while len(values) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
        return values
    finally:
        consumer.close()


def test_a_decided_commit_is_finished_by_the_next_coordinator(cluster: LocalCluster) -> None:
    c = cluster
    tid = "faulty-coordinator"
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": c.kafka_bootstrap, "transactional.id": tid}
    )
    producer.init_transactions(60)
    coordinator = _coordinator(c, tid)

    def led_elsewhere() -> int | None:
        """A node other than the coordinator that leads a partition: the nodes spread
        leaderships over the preferred replicas (the first of each partition's,
        assigned in turn), so one does once elections settle."""
        leaders = [c.wait_for_leader(TOPIC, p, 60) for p in range(PARTITIONS)]
        return next((node for node in leaders if node != coordinator), None)

    hung = wait_until(led_elsewhere, WAIT_S, f"a partition led by a node other than {coordinator}")
    producer.begin_transaction()
    values = [f"r-{i}".encode() for i in range(30)]
    for i, value in enumerate(values):
        producer.produce(TOPIC, value, partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    c.pause(hung)  # its partitions' markers cannot be written now
    try:
        producer.commit_transaction(60)  # answered once PrepareCommit is durable
        c.kill(coordinator)  # before the hung leader's marker could be written
    finally:
        c.resume(hung)
    # The new coordinator finds the decision and writes every marker: a reader sees all
    # of the transaction, the hung leader's partition included.
    seen = _read_committed(c, len(values), WAIT_S)
    assert sorted(seen) == sorted(values)
