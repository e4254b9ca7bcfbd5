"""How a node's identity is configured: the cluster secret of a plaintext cluster, and the
node id of a node principal (no processes started)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from quorumlog.replica.cli.main import build_parser, main
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.config import NodeConfig
from quorumlog.replica.node.security import (
    AuthConfig,
    AuthConfigError,
    ForgedSender,
    check_raft_sender,
    node_id_of_name,
    node_secret,
)

from tests.support.messages import (
    begin_quorum_epoch,
    end_quorum_epoch,
    fetch_request,
    vote_response,
)

VOTERS = "1@127.0.0.1:9001,2@127.0.0.1:9002,3@127.0.0.1:9003"


def serve_config(*extra: str, voters: str = VOTERS) -> NodeConfig:
    args = build_parser().parse_args(
        ["serve", "--node-id", "1", "--listen", "127.0.0.1:9001", "--voters", voters,
         "--data-dir", "/tmp/unused", "--cluster-id", "c", *extra]
    )  # fmt: skip
    return NodeConfig.from_args(args)


def test_plaintext_cluster_of_several_voters_needs_the_cluster_secret(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--cluster-secret-file"):
        serve_config()
    assert serve_config(voters="1@127.0.0.1:9001").cluster_secret is None  # one voter: none
    secret = tmp_path / "cluster.secret"
    secret.write_text("the-cluster-secret\n")
    cfg = serve_config("--cluster-secret-file", str(secret))
    assert cfg.cluster_secret == "the-cluster-secret"
    assert "the-cluster-secret" not in repr(cfg)
    with pytest.raises(SystemExit, match="QL_NOT_SET is not set"):
        serve_config("--cluster-secret-env", "QL_NOT_SET")
    # With principals the node principals are the identity: the two do not mix.
    node_secret_file = tmp_path / "n1.secret"
    node_secret_file.write_text("n1\n")
    with pytest.raises(ValueError, match="for plaintext clusters"):
        serve_config(
            "--auth-config",
            "auth.json",
            "--auth-secret-file",
            str(node_secret_file),
            "--cluster-secret-file",
            str(secret),
        )


def test_local_cluster_creates_a_private_cluster_secret(tmp_path: Path) -> None:
    cluster = LocalCluster(3, tmp_path / "c")
    path = cluster.cluster_secret_file
    assert path.parent == tmp_path / "c"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "--cluster-secret-file" in cluster.command(1)
    # A cluster restarted on the same data root keeps its secret.
    again = LocalCluster(3, tmp_path / "c")
    assert again.cluster_secret == cluster.cluster_secret
    assert again.node_credentials(2) == ("node-2", node_secret(cluster.cluster_secret, 2))
    assert node_secret(cluster.cluster_secret, 2) != node_secret(cluster.cluster_secret, 3)
    assert node_secret("another", 2) != node_secret(cluster.cluster_secret, 2)


def test_cluster_new_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s"
    assert main(["cluster", "new-secret", str(path)]) == 0
    text = path.read_text()
    assert len(text.strip()) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert text.strip() not in capsys.readouterr().out
    assert main(["cluster", "new-secret", str(path)]) == 1  # never replaces a secret
    assert path.read_text() == text


def test_node_principal_ids(tmp_path: Path) -> None:
    assert [node_id_of_name(n) for n in ["node-3", "node-03", "node-", "nodes-3", "x"]] == [
        3,
        None,
        None,
        None,
        None,
    ]
    path = tmp_path / "auth.json"
    assert main(["auth", "add-principal", "node-7", "--kind", "node", "--config", str(path)]) == 0
    argv = ["auth", "add-principal", "rack-a", "--kind", "node", "--config", str(path)]
    assert main(argv) == 1  # a node principal needs an id
    assert main([*argv, "--node-id", "4"]) == 0
    assert main(["auth", "add-principal", "ops", "--kind", "admin", "--config", str(path),
                 "--node-id", "4"]) == 1  # fmt: skip
    auth = AuthConfig.load(path)
    assert auth.principals["node-7"][0].node_id == 7
    assert auth.principals["rack-a"][0].node_id == 4
    doc = json.loads(path.read_text())
    assert doc["principals"]["rack-a"]["node_id"] == 4
    assert "node_id" not in doc["principals"]["node-7"]  # implied by the name
    doc["principals"]["rack-a"]["kind"] = "admin"
    with pytest.raises(AuthConfigError, match="only node principals"):
        AuthConfig.from_json(doc)


def test_a_raft_message_must_claim_its_connection_node() -> None:
    from_2 = fetch_request(
        replica_id=2, current_leader_epoch=5, fetch_offset=10, last_fetched_epoch=5
    )
    check_raft_sender(begin_quorum_epoch(src=2, dst=1, leader_id=2, leader_epoch=5), 2)
    check_raft_sender(from_2, 2)
    forged = [
        # Announces another leader.
        (begin_quorum_epoch(src=3, dst=1, leader_id=2, leader_epoch=5), "claims node 2"),
        (
            end_quorum_epoch(src=3, dst=1, leader_id=2, leader_epoch=5, preferred_successors=(3,)),
            "claims node 2",
        ),
        (from_2, "claims node 2"),
        (vote_response(src=2, leader_epoch=5, candidate_epoch=5), "claims node 2"),
    ]
    for msg, why in forged:
        with pytest.raises(ForgedSender, match=why):
            check_raft_sender(msg, 3)


def test_a_node_refuses_to_start_as_another_nodes_principal(tmp_path: Path) -> None:
    from quorumlog.replica.node.node import Node
    from quorumlog.replica.node.security import Principal
    from quorumlog.replica.protocol.scram import make_verifier

    auth = AuthConfig()
    for name, nid in [("node-1", 1), ("node-2", 2)]:
        auth.add(Principal(name, "node", (), nid), make_verifier("s"))
    auth.add(Principal("ops", "admin"), make_verifier("s"))
    path = tmp_path / "auth.json"
    auth.save(path)
    secret = tmp_path / "n.secret"
    secret.write_text("s\n")
    base = ["--auth-config", str(path), "--auth-secret-file", str(secret)]
    Node(serve_config(*base))  # node-1 as node 1
    for principal in ["node-2", "ops"]:
        with pytest.raises(SystemExit, match="peers would refuse its raft traffic"):
            Node(serve_config(*base, "--auth-principal", principal))
