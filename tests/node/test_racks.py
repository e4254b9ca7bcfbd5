"""Racks on a real cluster: 4 nodes on 2 racks (``serve --rack``, two nodes a rack, as
``quorumlog cluster up --nodes-per-rack 2 --racks 2`` starts them). Every node's
registration carries its rack, which Metadata (native and Kafka's) and ``describe``
show; a topic of replication factor 2 never has both replicas of a partition in one
rack, nor after a node is decommissioned and the cluster rebalanced; a placement that
cannot keep replicas apart (replication factor 3 over 2 racks) is made and says so."""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from quorumlog.replica.cli.config_file import apply_config_file
from quorumlog.replica.cli.main import _subparser, build_parser
from quorumlog.replica.cli.top import Scrape, render
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster, rack_layout
from quorumlog.replica.node.config import NodeConfig
from quorumlog.replica.node.metadata import MetadataState, NodeRegistration
from quorumlog.replica.node.nodes import NodeBook

from tests.support.cli import QUORUMLOG, cluster_cli
from tests.support.waits import wait_until

RACKS = rack_layout(2, 2)  # nodes 1, 2 in rack-1; 3, 4 in rack-2


def shared_racks(c: LocalCluster, topic: str) -> dict[int, list[int]]:
    """The partitions of ``topic`` with two replicas in one rack, with their replicas."""
    parts = c.client.metadata([topic])[topic].partitions
    return {
        p: pm.replicas
        for p, pm in parts.items()
        if len({RACKS[n] for n in pm.replicas}) < len(pm.replicas)
    }


@pytest.mark.cluster
@pytest.mark.timeout(300)
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

        # An operator's own move onto one rack is made, and said; rebalance undoes it.
        argv = ["--topic", "pairs", "--partition", "0", "--replicas", "3,4"]
        out = cluster_cli(c.bootstrap, "partition", "reassign", *argv)
        assert "rack warning: pairs: 1 partition(s) have two replicas in one rack" in out
        wait_until(
            lambda: (
                c.client.describe_quorum("pairs", 0).voters
                and sorted(v.replica_id for v in c.client.describe_quorum("pairs", 0).voters)
                == [3, 4]
            ),
            timeout=60,
            what="pairs/0 moved to 3 and 4",
        )
        assert shared_racks(c, "pairs") == {0: [3, 4]}
        cluster_cli(c.bootstrap, "cluster", "rebalance", "--wait", "--timeout-s", "200")
        assert shared_racks(c, "pairs") == {}


DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "deploy"


def test_a_registration_carries_its_rack_and_an_old_one_loads_without() -> None:
    reg = NodeRegistration(3, "dir-3", ("10.0.0.2", 7071), None, "machine-2")
    state = MetadataState()
    state.apply(reg.record())
    assert state.nodes[3] == reg
    assert NodeRegistration.of_request(reg.request(incarnation=7)) == reg
    # A register_node record written before racks existed.
    state.apply({"op": "register_node", "node_id": 4, "directory": "d", "host": "h", "port": 1})
    assert state.nodes[4].rack is None
    book = NodeBook(1, {1: ("h", 1), 3: ("h", 3), 4: ("h", 4)}, {}, rack="machine-1")
    # An earlier registration of its own names no rack: a node keeps the one it runs with.
    state.apply({"op": "register_node", "node_id": 1, "directory": "d", "host": "h", "port": 1})
    book.update(state)
    assert book.racks == {1: "machine-1", 3: "machine-2"}
    state.apply({"op": "create_topic", "name": "t", "replicas": [[1, 3], [3, 4]]})
    assert book.rack_warning(state, "t") == ""
    book.native[5] = ("h", 5)  # in --voters, not registered yet
    assert "nodes [5] have not registered yet" in book.rack_warning(state, "t")
    state.apply({"op": "retire_node", "node_id": 3})
    book.update(state)
    assert book.placeable_racks() == {1: "machine-1"}


def serve_args(argv: list[str], config: Path | None = None) -> argparse.Namespace:
    parser = build_parser()
    if config is not None:
        apply_config_file(_subparser(parser, "serve"), str(config))
    return parser.parse_args(["serve", *argv])


def parse_serve(argv: list[str]) -> NodeConfig:
    return NodeConfig.from_args(serve_args(argv))


def test_rack_from_the_flag_or_the_config_file(tmp_path: Path) -> None:
    base = ["--node-id", "1", "--listen", "127.0.0.1:1", "--voters", "1@127.0.0.1:1"]
    base += ["--data-dir", str(tmp_path), "--cluster-id", "c"]
    assert parse_serve(base).rack is None
    assert parse_serve([*base, "--rack", "eu-west-1a"]).rack == "eu-west-1a"
    with pytest.raises(SystemExit, match="--rack 'a b'"):
        parse_serve([*base, "--rack", "a b"])
    example = serve_args([], DEPLOY / "node-rack.toml")
    assert (example.node_id, example.rack) == (2, "machine-1")
    unit = (DEPLOY / "quorumlog@.service").read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.+)$", unit, re.M)
    assert exec_start.split()[1:] == ["serve", "--config", "/etc/quorumlog/node-%i.toml"]
    assert "ReadWritePaths=/var/lib/quorumlog/node-%i" in unit


def test_cluster_up_layout_and_top_show_the_racks() -> None:
    assert rack_layout(2, 3) == {
        1: "rack-1",
        2: "rack-1",
        3: "rack-2",
        4: "rack-2",
        5: "rack-3",
        6: "rack-3",
    }
    with pytest.raises(ValueError):
        rack_layout(0, 2)
    info = {"quorumlog_node_info": [({"node": "5", "cluster": "c", "rack": "rack-3"}, 1.0)]}
    frame = render([Scrape("http://127.0.0.1:9/metrics", 1.0, info)], None)
    header, row = [ln.split() for ln in frame.splitlines() if ln.startswith(("NODE", "5 "))][:2]
    assert row[header.index("RACK")] == "rack-3"


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_cluster_up_starts_nodes_per_rack(tmp_path: Path) -> None:
    """``quorumlog cluster up --nodes-per-rack 1 --racks 2``, as a user starts it: it says
    which nodes are in which rack, and each registered its rack; Ctrl-C stops it."""
    argv = ["cluster", "up", "--nodes-per-rack", "1", "--racks", "2", "--data-dir", str(tmp_path)]
    proc = subprocess.Popen(
        [*QUORUMLOG, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        said: list[str] = []
        deadline = time.monotonic() + 60
        while not any(ln.startswith("rack-2:") for ln in said) and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"cluster up ended early: {said}"
            said.append(line.strip())
        assert said[0].startswith("quorumlog cluster of 2 nodes is up")
        assert "rack-1: nodes [1]" in said and "rack-2: nodes [2]" in said
        bootstrap = next(ln for ln in said if ln.startswith("bootstrap: ")).split(": ")[1]
        with Client(bootstrap) as client:
            client.refresh_nodes()
            assert client.node_racks == {1: "rack-1", 2: "rack-2"}
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
