"""The ``quorumlog`` command against a real cluster, run as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster, free_ports

from tests.support.cli import run_cli
from tests.support.cluster import create_and_find_leader, find_leader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

CONSOLE_SCRIPT = Path(sys.executable).parent / "quorumlog"


def test_topic_create_list_delete(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    r = run_cli("topic", "create", "cli-topic", "-b", b, "--partitions", "2")
    assert r.returncode == 0, r.stderr
    assert "created topic cli-topic with 2 partition(s)" in r.stdout
    r = run_cli("topic", "list", "-b", b)
    assert r.returncode == 0 and "cli-topic" in r.stdout.split()
    r = run_cli("topic", "create", "cli-topic", "-b", b)
    assert r.returncode == 1
    assert "quorumlog: error:" in r.stderr and "already exists" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("topic", "delete", "cli-topic", "-b", b)
    assert r.returncode == 0 and "deleted topic cli-topic" in r.stdout
    r = run_cli("topic", "create", "-b", b)
    assert r.returncode == 2 and "needs a topic name" in r.stderr
    r = run_cli("topic", "create", "bad name", "-b", b)
    assert r.returncode == 1 and "invalid" in r.stderr


def test_produce_stdin_and_consume(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    cluster.create_topic("lines", 1)
    lines = [f"line {i}" for i in range(25)] + ["k1:with key"]
    r = run_cli(
        "produce", "lines", "-b", b, "--partition", "0", "-v", stdin="\n".join(lines) + "\n"
    )
    assert r.returncode == 0, r.stderr
    assert "produced 26 record(s) to lines" in r.stderr
    batches = [json.loads(x) for x in r.stdout.splitlines()]
    assert sum(x["last_offset"] - x["base_offset"] + 1 for x in batches) == 26
    assert {x["partition"] for x in batches} == {0}

    r = run_cli("consume", "lines", "-b", b, "--max-records", "26", "--timeout-ms", "20000")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == lines

    r = run_cli(
        "consume",
        "lines",
        "-b",
        b,
        "--max-records",
        "3",
        "--print-offsets",
        "--timeout-ms",
        "20000",
    )
    rows = [x.split("\t") for x in r.stdout.splitlines()]
    epoch = str(cluster.client.partition_metadata("lines", 0, refresh=True).leader_epoch)
    assert [(p, e, v) for p, _, e, v in rows[:3]] == [("0", epoch, f"line {i}") for i in range(3)]
    offsets = [int(o) for _, o, _, _ in rows[:3]]
    assert offsets == list(range(offsets[0], offsets[0] + 3))


def test_console_script_is_installed(cluster: LocalCluster) -> None:
    # make test installs the package, so a missing console script is a packaging defect.
    assert CONSOLE_SCRIPT.exists(), f"{CONSOLE_SCRIPT} is not installed (see [project.scripts])"
    r = subprocess.run(
        [str(CONSOLE_SCRIPT), "topic", "list", "-b", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def test_describe(cluster: LocalCluster) -> None:
    cluster.create_topic("described", 2)
    cluster.produce("described", 0, [b"a", b"b"])
    r = run_cli("describe", "-b", cluster.bootstrap, "--topic", "described")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split()[:5] == ["TOPIC", "PARTITION", "LEADER", "EPOCH", "HIGH-WATERMARK"]
    assert len(rows) == 2
    for p, row in enumerate(rows):
        cols = row.split()
        pm = cluster.client.partition_metadata("described", p, refresh=True)
        assert cols[:4] == ["described", str(p), str(pm.leader_id), str(pm.leader_epoch)]
        assert int(cols[4]) == pm.high_watermark
        assert "lag" in row
    r = run_cli("describe", "-b", cluster.bootstrap, "--topic", "nope")
    assert r.returncode == 1 and "unknown topic" in r.stderr


def test_force_leader_needs_explicit_data_loss_flag(cluster: LocalCluster) -> None:
    leader, epoch = create_and_find_leader(cluster, "guarded")
    follower = next(n for n in cluster.ports if n != leader)
    force = ("partition", "force-leader", "guarded", "0", "--node", str(follower))
    r = run_cli(*force, "-b", cluster.bootstrap)
    assert r.returncode == 2
    assert "--i-understand-data-loss" in r.stderr and "UNCLEAN" in r.stderr
    # Nothing happened.
    assert find_leader(cluster, "guarded", 0, [leader]) == (leader, epoch)
    r = run_cli(*force, "-b", cluster.bootstrap, "--i-understand-data-loss")
    assert r.returncode == 0, r.stderr
    assert f"node {follower} now leads guarded/0 in epoch" in r.stdout
    new_epoch = int(r.stdout.split()[-1])
    assert new_epoch > epoch
    assert find_leader(cluster, "guarded", 0, [follower], min_epoch=new_epoch)[0] == follower


def test_unreachable_bootstrap_is_a_clear_error() -> None:
    (port,) = free_ports(1)
    # describe reads metadata first: BootstrapUnreachableError at once. (`topic list`
    # retries a refused connection for the whole request timeout, 30 s: see
    # tests/client/test_admin_errors.py::test_list_topics_unreachable_bootstrap.)
    r = run_cli("describe", "-b", f"127.0.0.1:{port}")
    assert r.returncode == 1
    assert "no quorumlog node reachable" in r.stderr
    assert f"127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_topic_max_message_bytes(cluster: LocalCluster) -> None:
    b = cluster.bootstrap
    r = run_cli("topic", "create", "cli-small", "-b", b, "--max-message-bytes", "2000")
    assert r.returncode == 0, r.stderr
    r = run_cli("produce", "cli-small", "-b", b, "--generate", "5", "--value-size", "100")
    assert r.returncode == 0, r.stderr
    r = run_cli("produce", "cli-small", "-b", b, "--generate", "1", "--value-size", "3000")
    assert r.returncode == 1, r.stderr
    assert "quorumlog: error:" in r.stderr and "max.message.bytes 2000" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("topic", "create", "cli-huge", "-b", b, "--max-message-bytes", str(1 << 30))
    assert r.returncode == 1 and "max.message.bytes must be 1.." in r.stderr, r.stderr


def test_topic_alter_grows_partitions_and_sets_configs_describe_shows(
    cluster: LocalCluster,
) -> None:
    b = cluster.bootstrap
    r = run_cli("topic", "create", "cli-alter", "-b", b, "--config", "retention.ms=86400000")
    assert r.returncode == 0, r.stderr
    r = run_cli(
        "topic",
        "alter",
        "cli-alter",
        "-b",
        b,
        "--partitions",
        "3",
        "--config",
        "segment.bytes=1048576",
        "--delete-config",
        "retention.ms",
    )
    assert r.returncode == 0, r.stderr
    assert "altered topic cli-alter: 3 partition(s), configs segment.bytes=1048576" in r.stdout
    r = run_cli("describe", "--topic", "cli-alter", "-b", b)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("cli-alter ")]
    assert sorted(row[1] for row in rows if row[1].isdigit()) == ["0", "1", "2"]
    assert "cli-alter configs: segment.bytes=1048576" in r.stdout
    r = run_cli("topic", "alter", "cli-alter", "-b", b, "--partitions", "2")
    assert r.returncode == 1 and "never shrink" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("topic", "alter", "cli-alter", "-b", b, "--config", "retention.ms")
    assert r.returncode == 1 and "NAME=VALUE" in r.stderr
    r = run_cli("topic", "alter", "-b", b, "--partitions", "4")
    assert r.returncode == 2 and "needs a topic name" in r.stderr


def test_serve_max_message_bytes(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    bad = [
        "serve",
        "--node-id",
        "1",
        "--listen",
        f"127.0.0.1:{port}",
        "--voters",
        f"1@127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path / "bad"),
        "--cluster-id",
        "c",
        "--max-message-bytes",
        "0",
    ]
    r = run_cli(*bad)
    assert r.returncode == 1 and "--max-message-bytes must be 1.." in r.stderr, r.stderr
    assert not (tmp_path / "bad").exists()

    from quorumlog.replica.client import RecordTooLargeError
    from quorumlog.replica.storage import encode_batch

    with LocalCluster(1, tmp_path / "c", node_args=["--max-message-bytes", "100000"]) as c:
        c.create_topic("served", 1)
        assert c.client.metadata(["served"])["served"].partitions[0].max_message_bytes == 100000
        with pytest.raises(RecordTooLargeError, match="max.message.bytes 100000"):
            c.client.produce("served", 0, encode_batch([bytes(100000)]))
        c.client.produce("served", 0, encode_batch([bytes(90000)]))
