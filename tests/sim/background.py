"""The CI seed sweep, run in the background from the start of the test session and
collected by ``test_ci_seed_budget_has_no_violation``.

The sweep is the suite's largest single cost (~2,000 seeds, ~170 s on two cores), and
most of the suite's other tests wait on sockets, timers and child processes with a core
idle. The sweep's processes run at the lowest priority (nice 19), so the tests that need
the cores take them back at once, and the sweep uses what they leave. The collecting test
waits for whatever is left of it. Run alone (no session start), the test sweeps in its
own process as before."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from .run import run_many

CI_SEEDS = 2000
#: The test that collects the sweep (the session starts the sweep only if it will run).
SWEEP_TEST = "tests/sim/test_sim.py::test_ci_seed_budget_has_no_violation"
_REPO = Path(__file__).resolve().parents[2]

_running: tuple[subprocess.Popen[bytes], Path] | None = None


def start() -> None:
    """Start the sweep of CI_SEEDS seeds at nice 19 (once a session)."""
    global _running
    if _running is not None:
        return
    directory = Path(tempfile.mkdtemp(prefix="sim-sweep-"))
    with open(directory / "output", "wb") as output:
        proc = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "tests.sim.run"]
            + ["--seeds", str(CI_SEEDS), "--report", str(directory / "report.json")],
            cwd=_REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its pool's workers are ended with it
        )
    _running = (proc, directory)


def collect(timeout_s: float) -> tuple[list[str], Counter[str]]:
    """The sweep's violation reports and summed stats: the background one's (waited for
    up to ``timeout_s``), or, if none was started, one run here and now."""
    global _running
    if _running is None:
        failures, stats = run_many(0, CI_SEEDS)
        return [f.report() for f in failures], stats
    proc, directory = _running
    _running = None
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _end(proc)
        raise
    report = directory / "report.json"
    if not report.exists():
        output = (directory / "output").read_text(errors="replace")
        raise RuntimeError(
            f"the sweep exited {proc.returncode} without a report:\n{output[-3000:]}"
        )
    found = json.loads(report.read_text())
    return found["failures"], Counter(found["stats"])


def stop() -> None:
    """End a sweep nobody collected (the session ended first)."""
    global _running
    if _running is not None:
        _end(_running[0])
        _running = None


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
