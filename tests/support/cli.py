"""The ``quorumlog`` command run as a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

QUORUMLOG = [sys.executable, "-m", "quorumlog.replica.cli.main"]


def run_cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``quorumlog *args`` with ``stdin`` as its input and ``env`` added to the environment."""
    return subprocess.run(
        [*QUORUMLOG, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def cluster_cli(bootstrap: str, *args: str, timeout: float = 400) -> str:
    """``quorumlog *args -b bootstrap``, which must succeed; its standard output."""
    out = run_cli(*args, "-b", bootstrap, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
