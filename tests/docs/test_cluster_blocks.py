"""The blocks of README.md and docs/ marked ``<!-- docs: cluster -->``, run in page order
against one embedded 3-node cluster whose address is in ``BOOTSTRAP``, as a reader with
`quorumlog cluster up` running in another terminal runs them: shell blocks with bash (the
``quorumlog`` of this interpreter's environment first on PATH), Python blocks with this
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.docs.blocks import CLUSTER, Block, all_blocks, shell_commands

BLOCKS = [b for b in all_blocks() if b.marker == CLUSTER]


def _env(cluster: Any) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "BOOTSTRAP": cluster.bootstrap,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }


@pytest.mark.cluster
@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_block_runs_against_a_cluster(block: Block, cluster: Any) -> None:
    if block.language == "shell":
        argv = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", shell_commands(block)]
    else:
        argv = [sys.executable, "-c", block.code]
    proc = subprocess.run(
        argv, env=_env(cluster), capture_output=True, text=True, timeout=180, cwd=block.path.parent
    )
    assert proc.returncode == 0, (
        f"{block.where} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
