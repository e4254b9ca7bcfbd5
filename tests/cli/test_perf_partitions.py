"""``quorumlog perf partitions`` at tiny sizes: every phase runs and its figures are sane."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from quorumlog.replica.cli import perf_partitions
from quorumlog.replica.cli.main import PERF
from quorumlog.replica.cli.perfutil import Progress, cpu_seconds

KEYS = {
    "partitions",
    "nodes",
    "idle_seconds",
    "all_led_s",
    "idle_cpu_pct",
    "idle_cpu_pct_max",
    "idle_elections",
    "idle_epoch_increase",
    "leaders_per_node",
    "failover_max_s",
    "failover_median_s",
    "produce_rec_per_s",
}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], dict[str, Any]]:
    rc = perf_partitions.main(list(argv))
    lines = capsys.readouterr().out.strip().splitlines()
    return rc, lines[:-1], json.loads(lines[-1])


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_perf_partitions_tiny(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert PERF["partitions"] == "replica.cli.perf_partitions"
    start = time.monotonic()
    rc, human, fig = _run(
        capsys,
        *("--partitions", "6", "--idle-seconds", "2", "--produce-seconds", "2"),
        *("--settle-seconds", "0", "--data-dir", str(tmp_path)),
    )
    assert rc == 0, fig.get("error")
    assert KEYS <= fig.keys() and "error" not in fig
    assert fig["partitions"] == 6 and fig["nodes"] == 3 and fig["idle_seconds"] == 2
    assert 0 < fig["all_led_s"] < 30
    assert len(fig["idle_cpu_pct"]) == 3 and all(c >= 0 for c in fig["idle_cpu_pct"])
    assert fig["idle_cpu_pct_max"] == max(fig["idle_cpu_pct"])
    assert fig["idle_elections"] >= 0 and fig["idle_epoch_increase"] >= fig["idle_elections"]
    assert len(fig["leaders_per_node"]) == 3 and sum(fig["leaders_per_node"]) == 6
    # The victim led the most partitions, so at least 2 of 6; every one was re-led.
    assert fig["failover_partitions"] >= 2 and fig["failover_unled"] == 0
    assert 0 < fig["failover_median_s"] <= fig["failover_max_s"] < 30
    assert sum(fig["leaders_per_node_after_restart"]) == 6
    assert fig["produce_rec_per_s"] > 0 and fig["produce_mode"] == "threads"
    assert fig["produce_partitions"] == 6
    # One human line per phase, printed before the JSON line.
    for phase in ("all led after", "idle ", "kill -9 of node", "restarted", "produce: "):
        assert any(phase in line for line in human), (phase, human)
    assert time.monotonic() - start < 60


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_perf_partitions_producer_processes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, human, fig = _run(
        capsys,
        *("--partitions", "2", "--idle-seconds", "1", "--settle-seconds", "0"),
        *("--skip-failover", "--producer-mode", "processes", "--producers", "2"),
        *("--produce-seconds", "1", "--data-dir", str(tmp_path), "--json"),
    )
    assert rc == 0, fig.get("error")
    assert human == []  # --json: the JSON line only
    assert fig["failover_max_s"] is None and "failover_victim" not in fig
    assert fig["produce_mode"] == "processes" and fig["produce_records"] > 0
    assert fig["produce_client_cpu_pct"] > 0
    # Producing time ends when the producers stop producing, not when their processes exit.
    assert 1 <= fig["produce_seconds"] < 3


def test_cpu_seconds_counts_this_process() -> None:
    before = cpu_seconds(os.getpid())
    t = time.process_time()
    while time.process_time() - t < 0.1:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.05


def test_progress_heartbeat_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    quiet = Progress(10, "quiet")
    quiet.update(5, "nothing")
    beating = Progress(10, "phase", heartbeat_s=0)
    beating.update(5, "5/10 led")
    err = capsys.readouterr().err
    assert "quiet" not in err
    assert err.startswith("phase: ") and err.rstrip().endswith("5/10 led")
