"""``make demo`` itself, run as a test: the report must show every check passing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.spark import SHORT_JVM

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.spark
def test_pipeline_demo_report() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pipeline.py")],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=ROOT,
        env=dict(os.environ, JAVA_TOOL_OPTIONS=SHORT_JVM),  # its Spark lives a minute
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, f"no report; exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1][len("REPORT ") :])
    assert proc.returncode == 0, report
    assert all(report["checks"].values()), report["checks"]
    assert report["duplicates"] == 0 and report["stale"] == 0
    assert report["log"] == report["delta"]
    assert any(t["partition"] == 0 for t in report["truncations"]), report["truncations"]
    # How long it took is the demo's figure to show, not this test's to judge (a loaded
    # CI machine would miss any bound): reported, and the process's timeout bounds it.
    assert isinstance(report["seconds"], float | int), report  # reported, not judged
