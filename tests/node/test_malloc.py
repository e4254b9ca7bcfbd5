"""A node process tunes glibc's malloc (``tune_malloc``) so that the buffers it
allocates and frees all the time (socket reads, frames, fetched batches) reuse heap
pages instead of faulting fresh ones in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

SMALL_LOAD = [
    *("-m", "quorumlog.replica.cli.main", "perf", "partitions", "--partitions", "16"),
    *("--idle-seconds", "0.2", "--settle-seconds", "0.2", "--skip-failover"),
    *("--produce-seconds", "1.5", "--in-flight", "16"),
]


def python(args: list[str], **env: str) -> str:
    """Run this interpreter with ``args`` and malloc's variables only as ``env`` sets
    them; its standard output."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    return subprocess.run(
        [sys.executable, *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=150,
        check=True,
    ).stdout


def page_faults_per_node(**env: str) -> list[int]:
    """Page faults per second of each node of a 3-node cluster under 8 producers."""
    figures = json.loads(python(SMALL_LOAD, **env).strip().splitlines()[-1])
    assert figures["produce_rec_per_s"] > 0
    faults: list[int] = figures["produce_page_faults_per_s"]
    return faults


def test_nodes_under_load_fault_in_fewer_pages_with_malloc_tuned() -> None:
    """GLIBC_TUNABLES in the environment (empty: glibc's own defaults) leaves malloc as
    it is: the same load then faults in pages several times as often (~4,000 against
    ~550 a node and second here)."""
    tuned = page_faults_per_node()
    untuned = page_faults_per_node(GLIBC_TUNABLES="")
    assert max(tuned) * 2 < min(untuned), (tuned, untuned)


def test_tune_malloc_leaves_malloc_set_by_the_environment_alone() -> None:
    code = ["-c", "from quorumlog.replica.node.node import tune_malloc; print(tune_malloc())"]
    assert python(code).strip() == "True"
    assert python(code, MALLOC_TRIM_THRESHOLD_="1000000").strip() == "False"
    assert python(code, GLIBC_TUNABLES="").strip() == "False"
