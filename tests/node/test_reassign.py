"""Partition replicas move online (``quorumlog partition reassign``) on a real 4-node
cluster: while a producer writes, a partition moves off the node leading it to a node
that held nothing of it. The new replica catches up as an observer and joins the voters,
the leaving leader leads until its removal commits and then resigns, no acknowledged
record is lost or repeated, and the node that left deletes its replica."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import QuorumLogError
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.log import CATCH_UP_FILE

from tests.support.cli import cluster_cli
from tests.support.cluster import find_leader, read_all
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "moving"


def voters_of(c: LocalCluster, partition: int) -> list[int]:
    return sorted(v.replica_id for v in c.client.describe_quorum(TOPIC, partition).voters)


def cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "quorumlog.replica.cli.main", "partition", "reassign"]
    return subprocess.run(
        [*cmd, *args, "-b", c.bootstrap], capture_output=True, text=True, timeout=60
    )


def test_a_partition_moves_off_its_leader_while_a_producer_writes(tmp_path: Path) -> None:
    with LocalCluster(4, tmp_path / "c") as c:
        c.create_topic(TOPIC, 2, 3)
        before = c.client.metadata([TOPIC])[TOPIC].partitions[0].replicas
        leader, _ = find_leader(c, TOPIC, 0, c.ports)
        newcomer = next(n for n in c.ports if n not in before)
        target = [newcomer] + [n for n in before if n != leader]
        acked: list[bytes] = []
        stop = threading.Event()

        errors: list[Exception] = []

        def produce() -> None:
            # An idempotent producer, one record at a time: it must ride the move out
            # (leader changes included) without an error reaching the caller.
            with Client(c.bootstrap) as client:
                producer = Producer(client)
                for i in range(20_000):
                    if stop.is_set():
                        break
                    value = b"r%06d" % i
                    try:
                        producer.send(TOPIC, value, partition=0)
                        producer.flush(timeout_s=30)
                    except QuorumLogError as exc:
                        errors.append(exc)
                        return
                    acked.append(value)
                    time.sleep(0.002)

        writer = threading.Thread(target=produce)
        writer.start()
        try:
            wait_until(lambda: len(acked) > 200, timeout=30, what="records before the move")
            plan = tmp_path / "plan.json"
            moves = [{"topic": TOPIC, "partition": 0, "replicas": target}]
            plan.write_text(json.dumps({"version": 1, "partitions": moves}))
            started = cli(c, "--plan", str(plan))
            assert started.returncode == 0, started.stderr
            assert "reassignment started for 1 partition(s)" in started.stdout
            wait_until(
                lambda: voters_of(c, 0) == sorted(target), timeout=60, what="the move to end"
            )
            moved_at = len(acked)
            wait_until(lambda: len(acked) > moved_at + 200, timeout=30, what="records after")
        finally:
            stop.set()
            writer.join(timeout=60)
        assert not errors, errors
        status = cli(c, "--plan", str(plan), "--status")
        assert status.returncode == 0, status.stderr
        assert f"{TOPIC}/0: voters {sorted(target)} -> {target}: done" in status.stdout
        assert "1/1 moved" in status.stdout
        meta = c.client.metadata([TOPIC])[TOPIC].partitions[0]
        assert meta.replicas == target
        assert meta.leader_id in target
        records = [value for _, _, value in read_all(c.client, TOPIC, 0)]
        assert records == acked  # every acknowledged record, once, in order
        # The node that left deletes its replica once its removal is committed.
        gone = c.node_dir(leader) / f"{TOPIC}-0"
        wait_until(lambda: not gone.exists(), timeout=30, what="the old replica deleted")
        # The other partition did not move.
        assert voters_of(c, 1) == sorted(client_replicas(c, 1))


def client_replicas(c: LocalCluster, partition: int) -> list[int]:
    return list(c.client.metadata([TOPIC])[TOPIC].partitions[partition].replicas)


def test_a_plan_that_names_an_unknown_node_is_refused(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path / "c") as c:
        c.create_topic(TOPIC, 1, 3)
        out = cli(c, "--topic", TOPIC, "--partition", "0", "--replicas", "1,2,9")
        assert out.returncode != 0
        assert "unknown: [9]" in out.stderr
        bad = tmp_path / "bad.json"
        bad.write_text('{"partitions": [{"topic": "x"}]}')
        out = cli(c, "--plan", str(bad))
        assert out.returncode == 2 and "not a reassignment plan" in out.stderr


def quorumlog(c: LocalCluster, *args: str) -> str:
    return cluster_cli(c.bootstrap, *args)


def test_decommission_rebalance_and_replication_factor_on_a_running_cluster(
    tmp_path: Path,
) -> None:
    """A node leaves (its replicas move to the others, it leaves the metadata quorum, and
    the cluster still changes topics), comes back as a voter and takes its share again
    (rebalance), and a topic's replication factor drops: every record stays readable."""
    with LocalCluster(4, tmp_path / "c") as c:
        c.create_topic(TOPIC, 8, 3)
        sent = [b"v%03d" % i for i in range(40)]
        for p in range(8):
            c.produce(TOPIC, p, sent[p * 5 : p * 5 + 5])

        out = quorumlog(c, "cluster", "decommission", "--node", "4")
        assert "node 4 leaves the metadata quorum: voters -> [1, 2, 3]" in out
        meta = c.client.metadata([TOPIC])[TOPIC]
        assert all(4 not in meta.partitions[p].replicas for p in range(8))
        assert all(voters_of(c, p) == sorted(meta.partitions[p].replicas) for p in range(8))
        c.create_topic("after-decommission", 3, 3)  # the 3-voter metadata quorum serves
        placed = c.client.metadata(["after-decommission"])["after-decommission"].partitions
        assert all(4 not in pm.replicas for pm in placed.values())  # retired: none new
        wait_until(
            lambda: not any((c.node_dir(4) / f"{TOPIC}-{p}").exists() for p in range(8)),
            timeout=30,
            what="node 4's replicas deleted",
        )

        assert "voters -> [1, 2, 3, 4]" in quorumlog(c, "cluster", "add-voter", "--node", "4")
        quorumlog(c, "cluster", "recommission", "--node", "4")
        quorumlog(c, "cluster", "rebalance", "--wait", "--timeout-s", "120")
        load = {n: 0 for n in c.ports}
        for t in c.client.metadata().values():
            for pm in t.partitions.values():
                for n in pm.replicas:
                    load[n] += 1
        assert max(load.values()) - min(load.values()) <= 1, load

        quorumlog(c, "topic", "alter", TOPIC, "--replication-factor", "2")
        meta = c.client.metadata([TOPIC])[TOPIC]
        assert all(len(meta.partitions[p].replicas) == 2 for p in range(8))
        assert all(voters_of(c, p) == sorted(meta.partitions[p].replicas) for p in range(8))
        got = [v for p in range(8) for _, _, v in read_all(c.client, TOPIC, p)]
        assert got == sent


def catching_up(c: LocalCluster, node: int) -> bool:
    """Node ``node``'s replica of the partition holds the catch-up mark (no vote yet)."""
    return (c.node_dir(node) / f"{TOPIC}-0" / CATCH_UP_FILE).exists()


def test_the_throttle_changes_on_every_node_while_a_move_runs(tmp_path: Path) -> None:
    """``partition reassign --throttle`` sets every node's catch-up throttle through the
    metadata log, and the moves under way take it at once: a move crawling under the
    nodes' own 32 KiB/s ends in seconds once the throttle is lifted, and with the nodes'
    own rate back (``default``) the next move crawls again."""
    args = ["--catch-up-bytes-per-second", str(32 << 10)]
    with LocalCluster(4, tmp_path / "c", node_args=args) as c:
        c.create_topic(TOPIC, 1, 2)
        with Client(c.bootstrap) as client:
            producer = Producer(client)
            for i in range(4000):
                producer.send(TOPIC, b"%05d" % i + b"x" * 995, partition=0)
            producer.flush(timeout_s=60)  # ~4 MB: two minutes a new replica at 32 KiB/s
        before = client_replicas(c, 0)
        others = [n for n in c.ports if n not in before]

        def moved(target: list[int]) -> bool:
            return voters_of(c, 0) == sorted(target)

        c.client.reassign(TOPIC, {0: others})

        # --status says which new replica copies now, which waits its turn (one copies at
        # a time), and the throttle the leader paces the copy by.
        def copying() -> str | None:
            status = cli(c, "--topic", TOPIC, "--partition", "0", "--status")
            assert status.returncode == 0, status.stderr
            out = status.stdout
            one_each = out.count("(copying, lag ") == out.count("(waits its turn to copy") == 1
            return out if one_each else None

        status = wait_until(copying, timeout=60, what="one new replica copying, one waiting")
        assert "catch-up throttle at the leaders: 32,768 bytes/s a node" in status
        assert "0/1 moved" in status and not moved(others)  # crawling: ~2 minutes to go
        # A move's new replicas vote only once caught up (``catch-up`` mark): a stale
        # voter may still count a copy their node held before and deleted.
        assert all(catching_up(c, n) for n in others)
        lifted = cli(c, "--throttle", "0")
        assert lifted.returncode == 0, lifted.stderr
        assert "catch-up throttle: none (unthrottled)" in lifted.stdout
        # The move under way takes it at once: its leader paces the copy by none now
        # (it paced it by 32 KiB/s above), and the move ends (~2 minutes at 32 KiB/s).
        wait_until(
            lambda: c.client.describe_quorum(TOPIC, 0).catch_up_bytes_per_s == 0,
            timeout=60,
            what="the partition's leader unthrottled",
        )
        wait_until(lambda: moved(others), timeout=60, what="the move, unthrottled")
        assert not any(catching_up(c, n) for n in others)
        wait_until(
            lambda: not any((c.node_dir(n) / f"{TOPIC}-0").exists() for n in before),
            timeout=30,
            what="the old replicas deleted (a move back copies everything again)",
        )
        back = cli(c, "--throttle", "default", "--topic", TOPIC, "--partition", "0")
        assert back.returncode == 2  # --replicas missing: nothing was changed
        assert "--replicas" in back.stderr
        back = cli(c, "--throttle", "default")
        assert back.returncode == 0, back.stderr
        assert "catch-up throttle: each node's own" in back.stdout
        c.client.reassign(TOPIC, {0: before})
        wait_until(
            lambda: c.client.describe_quorum(TOPIC, 0).catch_up_bytes_per_s == 32 << 10,
            timeout=60,
            what="the partition's leader back at the nodes' own throttle",
        )
        wait_until(
            lambda: all(catching_up(c, n) for n in before),
            timeout=60,
            what="the old replicas' copies made anew (catch-up marks)",
        )
        assert not moved(before)  # 32 KiB/s again: ~2 minutes to go
        assert "bad" in cli(c, "--throttle", "bad").stderr
        records = [value[:5] for _, _, value in read_all(c.client, TOPIC, 0)]
        assert records == [b"%05d" % i for i in range(4000)]
