"""``quorumlog serve --config FILE``: every key is a flag, the command line wins, an
unknown key or a value of the wrong kind is an error naming it; the example config of
examples/deploy parses; a node started from a config file serves."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest
from quorumlog.replica.cli.main import build_parser, main
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import free_ports

from tests.support.cli import QUORUMLOG
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy"


def _parse(argv: list[str]) -> argparse.Namespace:
    """``serve`` argv parsed as main() does (the config file applied first)."""
    from quorumlog.replica.cli.config_file import apply_config_file, config_path
    from quorumlog.replica.cli.main import _subparser

    parser = build_parser()
    path = config_path(argv[1:])
    if path is not None:
        apply_config_file(_subparser(parser, "serve"), path)
    return parser.parse_args(argv)


def test_example_config_parses_and_the_command_line_wins() -> None:
    conf = str(DEPLOY / "node.toml")
    args = _parse(["serve", "--config", conf])
    want = {
        "node_id": 1,
        "listen": "10.0.0.1:7070",
        "cluster_id": "prod-eu-1",
        "metrics_listen": "10.0.0.1:9101",
        "segment_bytes": 1 << 30,
        "tls_ca": "/etc/quorumlog/ca.pem",
    }
    assert {k: getattr(args, k) for k in want} == want
    args = _parse(["serve", "--config", conf, "--log-level", "DEBUG", "--node-id", "2"])
    assert (args.log_level, args.node_id) == ("DEBUG", 2)


def test_every_flag_has_a_key(tmp_path: Path) -> None:
    conf = tmp_path / "all.toml"
    conf.write_text(
        'node-id = 3\nlisten = "127.0.0.1:1"\nvoters = "3@127.0.0.1:1"\n'
        'data-dir = "d"\ncluster-id = "c"\nno-quiesce = true\n'
        'peer-address = ["3@127.0.0.1:2"]\nmetrics-per-partition = true\n'
    )
    args = _parse(["serve", "--config", str(conf)])
    assert args.quiesce is False and args.metrics_per_partition is True
    assert args.peer_address == ["3@127.0.0.1:2"]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("nodeid = 1", "unknown key 'nodeid'"),
        ('node-id = "one"', "key 'node-id' takes an integer"),
        ('no-quiesce = "yes"', "key 'no-quiesce' is a switch"),
        ("listen = [1, 2]", "key 'listen' takes one value"),
        ("node-id = ", "is not valid TOML"),
    ],
)
def test_bad_config_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, error: str
) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text(line + "\n")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--config", str(conf)])
    assert exited.value.code == 2
    assert error in capsys.readouterr().err


def test_systemd_unit_runs_serve_from_a_config_file() -> None:
    unit = (DEPLOY / "quorumlog.service").read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.+)$", unit, re.M)
    assert exec_start.split()[1:] == ["serve", "--config", "/etc/quorumlog/node.toml"]
    assert re.search(r"^User=quorumlog$", unit, re.M) and "KillSignal=SIGTERM" in unit


@pytest.mark.cluster
def test_a_node_serves_from_its_config_file(tmp_path: Path) -> None:
    port, metrics = free_ports(2)
    conf = tmp_path / "node.toml"
    conf.write_text(
        f'node-id = 1\nlisten = "127.0.0.1:{port}"\nvoters = "1@127.0.0.1:{port}"\n'
        f'data-dir = "{tmp_path / "data"}"\ncluster-id = "from-file"\n'
        f'metrics-listen = "127.0.0.1:{metrics}"\nlog-level = "WARNING"\n'
    )
    proc = subprocess.Popen(
        [*QUORUMLOG, "serve", "--config", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with Client(f"127.0.0.1:{port}", request_timeout_ms=2000) as c:
            info = wait_until(lambda: c.api_versions(), 30, "the node to answer", interval=0.1)
        assert info.cluster_id == "from-file"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
