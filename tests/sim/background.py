"""The CI seed sweep, run in the background during the test session and collected by
``test_ci_seed_budget_has_no_violation``.

The sweep is the suite's largest single cost (2,000 seeds, ~170 s on two cores), and
most of the suite's other tests wait on sockets, timers and child processes with a core
idle. The sweep starts with the first test past the chaos campaigns (those are CPU-bound:
beside the sweep, a third slower), at the idle scheduling class and nice 19, so the tests
that need the cores take them back at once and the sweep uses what they leave. The
collecting test waits for whatever is left of it. Run without a session that planned it,
the test sweeps in its own process as before.

Under pytest-xdist the sweep is the controller's: it hands each worker the sweep's
directory (``workerinput``), starts the sweep when a worker begins the first test past
the chaos campaigns, and ends it with the session; the worker that runs the collecting
test waits for the sweep's exit mark in that directory."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tests.support.waits import wait_until

from .run import run_many

CI_SEEDS = 2000
#: The test that collects the sweep (a session starts the sweep only if it will run).
SWEEP_TEST = "tests/sim/test_sim.py::test_ci_seed_budget_has_no_violation"
#: Tests the sweep does not start beside.
NOT_BESIDE = "tests/chaos/"
_REPO = Path(__file__).resolve().parents[2]


#: Written (by rename, so it is whole when seen) once the sweep process has exited: its
#: exit status.
EXIT_MARK = "exit"
#: The ``workerinput`` key an xdist controller passes its sweep's directory under.
WORKER_INPUT = "sim_sweep_dir"


class _Sweep:
    planned = False
    proc: subprocess.Popen[bytes] | None = None
    directory: Path | None = None
    #: A worker's: the directory of the sweep its xdist controller runs.
    elsewhere: Path | None = None


_sweep = _Sweep()


def plan(nodeids: Iterable[str]) -> None:
    """Sweep in the background if SWEEP_TEST is among the session's tests."""
    _sweep.planned = SWEEP_TEST in nodeids


def before_test(nodeid: str) -> None:
    """Start the planned sweep before the first test it may run beside."""
    if _sweep.planned and _sweep.proc is None and not nodeid.startswith(NOT_BESIDE):
        _start()


def directory_for_workers() -> Path:
    """An xdist controller's: the directory its sweep will use, made on the first call,
    for the workers to wait on."""
    if _sweep.directory is None:
        _sweep.directory = Path(tempfile.mkdtemp(prefix="sim-sweep-"))
    return _sweep.directory


def run_elsewhere(directory: str | None) -> None:
    """An xdist worker's: the session's sweep is its controller's, in ``directory``."""
    _sweep.elsewhere = None if directory is None else Path(directory)


def _start() -> None:
    directory = directory_for_workers()
    idle = ["chrt", "--idle", "0"] if shutil.which("chrt") else []
    sweep = [sys.executable, "-m", "tests.sim.run", "--seeds", str(CI_SEEDS)]
    sweep += ["--report", str(directory / "report.json")]
    # The shell writes the exit mark once the sweep has exited (report written).
    exit_mark = shlex.quote(str(directory / EXIT_MARK))
    mark = f'"$@"; echo $? > {exit_mark}.part && mv {exit_mark}.part {exit_mark}'
    with open(directory / "output", "wb") as output:
        _sweep.proc = subprocess.Popen(
            [*idle, "nice", "-n", "19", "sh", "-c", mark, "sh", *sweep],
            cwd=_REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its pool's workers are ended with it
        )


def collect(timeout_s: float) -> tuple[list[str], Counter[str]]:
    """The sweep's violation reports and summed stats: the background one's (waited for
    up to ``timeout_s``), or, if none was started, one run here and now."""
    proc, directory = _sweep.proc, _sweep.directory
    _sweep.planned = False
    if _sweep.elsewhere is not None:
        return _collect_elsewhere(_sweep.elsewhere, timeout_s)
    if proc is None or directory is None:
        failures, stats = run_many(0, CI_SEEDS)
        return [f.report() for f in failures], stats
    try:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _end(proc)
            raise
        return _report(directory, proc.returncode)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _collect_elsewhere(directory: Path, timeout_s: float) -> tuple[list[str], Counter[str]]:
    """An xdist worker's: the controller's sweep, once it has exited (the controller
    removes its directory when the session ends)."""
    mark = directory / EXIT_MARK
    wait_until(
        mark.exists, timeout_s, f"the controller's seed sweep to exit ({mark})", interval=0.5
    )
    return _report(directory, int(mark.read_text().strip() or -1))


def _report(directory: Path, returncode: int | None) -> tuple[list[str], Counter[str]]:
    report = directory / "report.json"
    if not report.exists():
        output = (directory / "output").read_text(errors="replace")
        raise RuntimeError(f"the sweep exited {returncode} without a report:\n{output[-3000:]}")
    found = json.loads(report.read_text())
    return found["failures"], Counter(found["stats"])


def stop() -> None:
    """End a sweep nobody collected (the session ended first)."""
    _sweep.planned = False
    if _sweep.proc is not None and _sweep.proc.returncode is None:
        _end(_sweep.proc)
    if _sweep.directory is not None:
        shutil.rmtree(_sweep.directory, ignore_errors=True)


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
