"""A cluster's whole life under load, on real processes: 3 nodes, a topic of 64
partitions with 3 replicas, an idempotent producer at a steady rate and a Spark stream
into a Delta table. While they run: nodes 4 and 5 join (``serve --join``) and become
metadata voters, the replicas are rebalanced onto them, node 1 is decommissioned and
stopped, node 2 is killed for good (its directory deleted), its replicas move to a new
node 6, and a last rebalance evens the load. At the end no acknowledged record is lost, the table holds every record of the
log once, replica counts are even within one, and a watch that asked for every
partition's leader throughout ends with each led. (How long a partition went without a
leader during a move is ``quorumlog perf reassign``'s ``max_leaderless_s``.)"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from quorumlog.connector.delta import DeltaSink
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import QuorumLogError
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.perf.reassign import LeaderWatch

from tests.support.cli import cluster_cli
from tests.support.cluster import read_all
from tests.support.spark import source
from tests.support.waits import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(900)]

TOPIC = "life"
PARTITIONS = 64
RATE = 200  # records per second, round-robin over the partitions
MOVE_TIMEOUT_S = "300"


def quorumlog(c: LocalCluster, *args: str) -> str:
    return cluster_cli(c.bootstrap, *args)


class SteadyProducer(threading.Thread):
    """An idempotent ``Producer`` sending RATE records a second until stopped; keeps
    every acknowledged record's (partition, offset) -> value and every error."""

    def __init__(self, c: LocalCluster) -> None:
        super().__init__(daemon=True)
        self.c = c
        self.stop_event = threading.Event()
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[BaseException] = []

    def run(self) -> None:
        with Client(self.c.bootstrap) as client:
            producer = Producer(client)
            futures = []
            i = 0
            started = time.monotonic()
            while not self.stop_event.is_set() and i < RATE * 1200:
                value = b"r%07d" % i
                futures.append((value, producer.send(TOPIC, value, partition=i % PARTITIONS)))
                i += 1
                ahead = i / RATE - (time.monotonic() - started)
                if ahead > 0:
                    self.stop_event.wait(ahead)
            try:
                producer.flush(timeout_s=120)
            except QuorumLogError as exc:
                self.errors.append(exc)
            for value, f in futures:
                try:
                    md = f.result(timeout=1)
                except Exception as exc:
                    self.errors.append(exc)
                    continue
                self.acked[(md.partition, md.offset)] = value
            producer.close()


def replica_counts(c: LocalCluster) -> Counter[int]:
    meta = c.client.metadata([TOPIC])[TOPIC].partitions
    return Counter(n for pm in meta.values() for n in pm.replicas)


def test_grow_shrink_and_heal_a_running_cluster_under_load(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = str(tmp_path / "table")
    with LocalCluster(3, tmp_path / "c") as c:
        c.create_topic(TOPIC, PARTITIONS, 3)
        watch = LeaderWatch(c, PARTITIONS, 0.25, topic=TOPIC)
        producer = SteadyProducer(c)
        query = (
            source(spark, c, TOPIC, stream=True, startingOffsets="earliest")
            .writeStream.foreachBatch(DeltaSink(table))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(processingTime="1 second")
            .start()
        )
        watch.start()
        producer.start()
        try:
            time.sleep(3)  # the stream and the producer under way
            # Grow: two nodes join, become metadata voters and take their share.
            c.join(4)
            c.join(5)
            quorumlog(c, "cluster", "add-voter", "--node", "4")
            assert "voters -> [1, 2, 3, 4, 5]" in quorumlog(
                c, "cluster", "add-voter", "--node", "5"
            )
            quorumlog(c, "cluster", "rebalance", "--wait", "--timeout-s", MOVE_TIMEOUT_S)
            assert set(replica_counts(c)) == {1, 2, 3, 4, 5}

            # Shrink: node 1 leaves, then stops.
            out = quorumlog(
                c, "cluster", "decommission", "--node", "1", "--timeout-s", MOVE_TIMEOUT_S
            )
            assert "node 1 leaves the metadata quorum" in out
            c.terminate(1)

            # Heal: node 2 is lost with its disk; a new node 6 takes its place.
            c.kill(2)
            shutil.rmtree(c.node_dir(2))
            c.join(6)
            quorumlog(
                c,
                "cluster",
                "decommission",
                "--node",
                "2",
                "--replace-with",
                "6",
                "--timeout-s",
                MOVE_TIMEOUT_S,
            )
            assert set(replica_counts(c)) == {3, 4, 5, 6}
            quorumlog(c, "cluster", "rebalance", "--wait", "--timeout-s", MOVE_TIMEOUT_S)
            counts = replica_counts(c)
            assert set(counts) == {3, 4, 5, 6}, counts
            assert max(counts.values()) - min(counts.values()) <= 1, counts
        finally:
            producer.stop_event.set()
            producer.join(timeout=180)
            watched_to_the_end = watch.is_alive()  # it did not die on the way
            watch.stop()

        assert not producer.errors, producer.errors[:3]
        assert producer.acked
        # The watch asked throughout and stopped when told; every partition is led at the
        # end, by a running node.
        assert watched_to_the_end and not watch.is_alive() and watch.samples > 0
        meta = c.client.metadata([TOPIC])[TOPIC].partitions
        leaders = {p: pm.leader_id for p, pm in meta.items()}
        assert sorted(leaders) == list(range(PARTITIONS))
        assert all(c.is_running(n) for n in leaders.values()), leaders
        log = {(p, o): v for p in range(PARTITIONS) for o, _, v in read_all(c.client, TOPIC, p)}

        def caught_up() -> bool:
            try:
                got = DeltaTable(table).to_pyarrow_table(columns=["partition"]).num_rows
            except Exception:
                return False
            return got >= len(log)

        try:
            wait_until(caught_up, timeout=180, what="the stream to reach the log's end")
        finally:
            query.stop()
        assert query.exception() is None, query.exception()

    rows = DeltaTable(table).to_pyarrow_table(columns=["partition", "offset", "value"]).to_pylist()
    held = Counter((r["partition"], r["offset"]) for r in rows)
    assert max(held.values()) == 1  # no duplicate in the table
    got = {(r["partition"], r["offset"]): r["value"] for r in rows}
    assert got == log  # table == log
    missing = {k: v for k, v in producer.acked.items() if log.get(k) != v}
    assert not missing, list(missing.items())[:5]  # nothing acknowledged lost
    assert sorted(log.values()) == sorted(set(log.values()))  # nothing appended twice
