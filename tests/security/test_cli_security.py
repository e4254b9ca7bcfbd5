"""The CLI against a secured cluster, and ``quorumlog auth add-principal``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.security import AuthConfig

from tests.support.cli import run_cli

pytestmark = pytest.mark.cluster


def test_add_principal_writes_a_verifier_not_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    r = run_cli(
        "auth",
        "add-principal",
        "ingest",
        "--kind",
        "producer",
        "--topics",
        "a,b*",
        "--config",
        str(path),
        "--secret-env",
        "QL_SECRET",
        env={"QL_SECRET": "s3cret-xyz"},
    )
    assert r.returncode == 0, r.stderr
    assert "s3cret-xyz" not in path.read_text() and "s3cret-xyz" not in r.stdout + r.stderr
    r = run_cli("auth", "add-principal", "ops", "--kind", "admin", "--config", str(path))
    assert r.returncode == 0, r.stderr
    generated = r.stdout.strip()
    assert len(generated) >= 24 and generated not in path.read_text()
    doc = json.loads(path.read_text())
    assert set(doc["principals"]["ingest"]["scram"]) == {
        "mechanism",
        "salt",
        "iterations",
        "stored_key",
        "server_key",
    }
    auth = AuthConfig.load(path)
    assert auth.principals["ingest"][0].topics == ("a", "b*")
    assert auth.principals["ops"][0].kind == "admin"


def test_cli_topic_produce_consume_over_tls_with_auth(secure_cluster: LocalCluster) -> None:
    c = secure_cluster
    tls = ("-b", c.bootstrap, "--tls-ca", c.ca_file)
    admin = (*tls, "--principal", "admin", "--secret-file", str(c.secret_file("admin")))
    r = run_cli("topic", "list", *admin)
    assert r.returncode == 0 and "granted" in r.stdout, r.stderr
    env = {"INGEST_SECRET": c.secrets["ingest"]}
    assert run_cli("topic", "create", "granted-cli", *admin).returncode == 0
    ingest = (*tls, "--principal", "ingest", "--secret-env", "INGEST_SECRET")
    r = run_cli("produce", "granted-cli", *ingest, stdin="hello\n", env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli("consume", "granted-cli", *admin, "--max-records", "1", "--timeout-ms", "5000")
    assert r.returncode == 0 and r.stdout.strip() == "hello", r.stderr
    # Wrong secret: a clear one-line error, exit 1, nothing secret printed.
    wrong = (*tls, "--principal", "admin", "--secret-env", "BAD")
    r = run_cli("topic", "list", *wrong, env={"BAD": "wrong-secret-123"})
    assert r.returncode == 1
    assert "unknown principal or wrong secret" in r.stderr and "wrong-secret-123" not in r.stderr
