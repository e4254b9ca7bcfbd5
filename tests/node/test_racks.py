"""Racks on a real cluster: 4 nodes on 2 racks (``serve --rack``, two nodes a rack, as
``quorumlog cluster up --nodes-per-rack 2 --racks 2`` starts them). Every node's
registration carries its rack, which Metadata (native and Kafka's) and ``describe``
show; a topic of replication factor 2 never has both replicas of a partition in one
rack, nor after a node is decommissioned and the cluster rebalanced; a placement that
cannot keep replicas apart (replication factor 3 over 2 racks) is made and says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from quorumlog.replica.node.cluster import LocalCluster, rack_layout

from tests.support.cli import cluster_cli
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

RACKS = rack_layout(2, 2)  # nodes 1, 2 in rack-1; 3, 4 in rack-2


def shared_racks(c: LocalCluster, topic: str) -> dict[int, list[int]]:
    """The partitions of ``topic`` with two replicas in one rack, with their replicas."""
    parts = c.client.metadata([topic])[topic].partitions
    return {
        p: pm.replicas
        for p, pm in parts.items()
        if len({RACKS[n] for n in pm.replicas}) < len(pm.replicas)
    }


def test_replicas_stay_on_distinct_racks_through_decommission_and_rebalance(
    tmp_path: Path,
) -> None:
    with LocalCluster(4, tmp_path / "c", racks=RACKS, kafka=True) as c:
        c.client.refresh_nodes()
        assert c.client.node_racks == RACKS
        admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
        brokers = admin.describe_cluster(request_timeout=30).result(timeout=30).nodes
        assert {b.id: b.rack for b in brokers} == RACKS

        warning = c.client.create_topic("pairs", 8, 2)
        assert warning == ""
        c.client.wait_for_leaders("pairs")
        assert shared_racks(c, "pairs") == {}
        leaders = [
            pm.replicas[0] for pm in c.client.metadata(["pairs"])["pairs"].partitions.values()
        ]
        assert sorted(leaders) == [1, 1, 2, 2, 3, 3, 4, 4]  # preferred leaders spread

        # Three replicas over two racks: created, and the answer says what it could not do.
        out = cluster_cli(
            c.bootstrap,
            "topic",
            "create",
            "triples",
            "--partitions",
            "2",
            "--replication-factor",
            "3",
        )
        assert "created topic triples" in out
        assert "rack warning: triples: replication factor 3 over 2 rack(s)" in out
        out = cluster_cli(c.bootstrap, "describe", "--topic", "triples")
        assert "racks: rack-1: nodes 1, 2; rack-2: nodes 3, 4" in out
        assert "rack warning: triples: replication factor 3" in out

        # Node 1 leaves: its replicas go to rack-1's other node, where each partition's
        # other replica is in rack-2.
        out = cluster_cli(
            c.bootstrap, "cluster", "decommission", "--node", "1", "--timeout-s", "200"
        )
        assert "node 1 holds no replica any more" in out
        assert "rack warning: pairs" not in out
        meta = c.client.metadata(["pairs"])["pairs"].partitions
        assert all(1 not in pm.replicas for pm in meta.values())
        assert shared_racks(c, "pairs") == {}

        cluster_cli(c.bootstrap, "cluster", "rebalance", "--wait", "--timeout-s", "200")
        assert shared_racks(c, "pairs") == {}
        meta = c.client.metadata(["pairs"])["pairs"].partitions
        assert all(1 not in pm.replicas for pm in meta.values())
        wait_until(
            lambda: all(
                sorted(v.replica_id for v in c.client.describe_quorum("pairs", p).voters)
                == sorted(meta[p].replicas)
                for p in meta
            ),
            timeout=60,
            what="every partition's voters the replicas the metadata names",
        )
