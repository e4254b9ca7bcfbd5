"""A node joins a running cluster with ``serve --join HOST:PORT`` (no voter list names
it): it registers itself in the metadata log, every node then lists it (native and Kafka
Metadata) and links to it, ``cluster add-voter`` makes it a metadata voter and a
partition can move onto it. A second process under a live node's id is refused, and only
a node holding the cluster secret may register at all."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import AuthorizationError
from quorumlog.replica.node.cluster import LocalCluster, free_ports
from quorumlog.replica.protocol import messages as m

from tests.support.cli import cluster_cli
from tests.support.cluster import read_all
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def quorumlog(c: LocalCluster, *args: str) -> str:
    return cluster_cli(c.bootstrap, *args)


def test_a_node_joins_a_running_cluster_and_takes_replicas(tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    with LocalCluster(3, tmp_path / "c", kafka=True) as c:
        c.create_topic("t", 2, 3)
        c.produce("t", 0, [b"a", b"b"])
        c.join(4)  # returns once every node's Metadata lists node 4
        assert c.client.metadata(["t"])  # the client learns node 4 too
        assert 4 in c.client.node_ids
        kafka = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
        brokers = kafka.list_topics(timeout=10).brokers
        assert sorted(brokers) == [1, 2, 3, 4]
        assert brokers[4].port == c.kafka_ports[4]

        assert "voters -> [1, 2, 3, 4]" in quorumlog(c, "cluster", "add-voter", "--node", "4")
        c.client.reassign("t", {0: [4, 1, 2]})

        def moved() -> bool:
            q = c.client.describe_quorum("t", 0)
            return sorted(v.replica_id for v in q.voters) == [1, 2, 4]

        wait_until(moved, timeout=60, what="t/0 moved onto node 4")
        c.force_leader("t", 0, 4)
        c.produce("t", 0, [b"c"])
        assert [v for _, _, v in read_all(c.client, "t", 0)] == [b"a", b"b", b"c"]

        # Restarted on another port, it registers again: the others learn where it is.
        c.kill(4)
        c.ports[4] = free_ports(1)[0]
        c.start_node(4)

        def listed_at_new_port() -> bool:
            return any(n.node_id == 4 and n.port == c.ports[4] for n in c.nodes_listed_by(3))

        wait_until(listed_at_new_port, timeout=60, what="node 4's new address known")
        # Restarted while the node it joined through is down, it starts from the nodes it
        # learned (joined.json).
        c.kill(1)
        c.restart(4)
        wait_until(
            lambda: c.client.describe_quorum("t", 0).leader_id in (2, 4),
            timeout=60,
            what="t/0 led again after node 4's restart",
        )
        c.produce("t", 0, [b"d"])
        assert (c.node_dir(4) / "joined.json").exists()


def test_a_second_process_under_a_live_nodes_id_is_refused(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path / "c", node_args=["--fetch-timeout-ms", "2000"]) as c:
        c.join(4)
        first = (c.node_dir(4) / "meta.properties").read_text()
        cmd = c.command(4)  # node 4's command, another data directory
        cmd[cmd.index("--data-dir") + 1] = str(tmp_path / "impostor")
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        assert "node id 4 is held by a live node" in out.stderr, out.stderr
        assert c.is_running(4)
        assert (c.node_dir(4) / "meta.properties").read_text() == first


def test_only_a_node_may_register(tmp_path: Path) -> None:
    """A plaintext cluster's anonymous clients may do much, but not claim to be a node:
    a registration names where raft traffic for that id goes."""
    with LocalCluster(3, tmp_path / "c") as c:
        req = m.RegisterNodeRequest(node_id=9, directory="x" * 32, host="127.0.0.1", port=1)
        with Client(c.bootstrap) as anonymous, pytest.raises(AuthorizationError):
            anonymous.register_node(req)
        with Client(c.bootstrap) as client:
            client.refresh_nodes()
            assert client.node_ids == [1, 2, 3]
