"""README.md's tour, run as a newcomer pastes it: its shell blocks in one bash session
(from the repository, so ``source .venv/bin/activate`` and the background cluster work as
written) and its Python blocks in one Python interpreter started from that session, as
``python`` typed in the same terminal. Each block must succeed before the next runs."""

from __future__ import annotations

import ast
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, tour_blocks

# A block's deadline. On a quiet 2-core machine the whole tour takes about a minute;
# on one shared with other Spark jobs, starting Spark alone has taken 90 s.
BLOCK_TIMEOUT_S = 360
DONE = "__docs_tour_block_done__"

# The interpreter that stands for the reader's `python`: runs each block it is sent (a
# length line, then the code) in one namespace, then prints the marker and ok or failed.
PYTHON_DRIVER = f"""
import sys, traceback
ns = {{"__name__": "__main__"}}
while True:
    size = sys.stdin.readline()
    if not size:
        break
    code = sys.stdin.read(int(size))
    try:
        exec(compile(code, "<README tour>", "exec"), ns)
        status = "ok"
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        status = "failed"
    print("{DONE}", status, flush=True)
"""


class Session:
    """A child process fed blocks on stdin; its output is read by a thread, so every wait
    for a block's end has a deadline."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, new_session: bool) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
            start_new_session=new_session,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def wait_done(self, where: str) -> str:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{where} still running after {BLOCK_TIMEOUT_S}s:\n{self.tail()}"
                )
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"{where}: the session ended:\n{self.tail()}")
            if line.startswith(DONE):
                return line.split()[1]
            self.output.append(line)

    def tail(self) -> str:
        return "".join(self.output[-60:])


def _env_of(bash: Session, env_file: Path) -> dict[str, str]:
    bash.send(f"env -0 > {env_file}; echo {DONE} ok\n")
    assert bash.wait_done("env") == "ok"
    pairs = [item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item]
    return {k: v for k, v in pairs}


def _stop(proc: subprocess.Popen[str], group: bool) -> None:
    if proc.poll() is not None:
        return
    target = os.getpgid(proc.pid) if group else proc.pid
    kill = os.killpg if group else os.kill
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            kill(target, sig)
        except ProcessLookupError:
            return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill(target, signal.SIGKILL)
        proc.wait(timeout=30)


def _check_what_the_tour_promises(output: list[str]) -> None:
    """The figures the README states: 1,000 rows, then 2,000 with partition 0's later rows
    under a new leader epoch."""
    lines = [line.strip() for line in output]
    assert "1000" in lines, "the first stream did not print 1000 rows:\n" + "".join(output[-40:])
    after = [line for line in lines if line.startswith("2000 {")]
    assert after, "the failover block did not print 2000 rows:\n" + "".join(output[-40:])
    counts = ast.literal_eval(after[-1].split(" ", 1)[1])
    epochs_of_0 = {epoch for (partition, epoch) in counts if partition == 0}
    assert len(epochs_of_0) >= 2, f"partition 0 shows no new leader epoch: {counts}"


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_readme_tour_runs_as_pasted() -> None:
    blocks = tour_blocks()
    assert [b.language for b in blocks].count("python") >= 1, "the tour has no Python block"
    assert (ROOT / ".venv" / "bin" / "activate").exists(), "the tour needs `make venv` first"
    work = Path(tempfile.mkdtemp(prefix="quorumlog-docs-tour-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    # Not the reader's setting but this shared machine's: a Python worker that needs more
    # than Spark's default 15 s to start and connect back (a machine at load 20+) must
    # not fail the stream. spark-defaults.conf leaves the README's code as it is.
    conf_dir = work / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.python.authenticate.socketTimeout 180s\n")
    env["SPARK_CONF_DIR"] = str(conf_dir)
    bash = Session(["bash", "--noprofile", "--norc"], env, new_session=True)
    python: Session | None = None
    # The background cluster is in the bash session's process group: stopping the group
    # stops it and its nodes (SIGCONT first: the tour pauses one).
    group = os.getpgid(bash.proc.pid)
    started = time.monotonic()
    try:
        bash.send("set -eo pipefail\n")
        for block in blocks:
            began = time.monotonic()
            if block.language == "shell":
                bash.send(block.code + f"echo {DONE} ok\n")
                assert bash.wait_done(block.where) == "ok"
                print(f"{block.where}: {time.monotonic() - began:.1f}s")
                continue
            if python is None:
                shell_env = _env_of(bash, work / "env")
                interpreter = shutil.which("python", path=shell_env.get("PATH"))
                assert interpreter, "no `python` on the tour's PATH"
                python = Session([interpreter, "-u", "-c", PYTHON_DRIVER], shell_env, True)
            python.send(f"{len(block.code)}\n{block.code}")
            status = python.wait_done(block.where)
            assert status == "ok", f"{block.where} failed:\n{python.tail()}"
            print(f"{block.where}: {time.monotonic() - began:.1f}s")
        print(f"the README tour took {time.monotonic() - started:.0f}s")
        assert python is not None
        _check_what_the_tour_promises(python.output)
    finally:
        if python is not None:
            _stop(python.proc, group=True)
        _stop(bash.proc, group=True)
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(work, ignore_errors=True)
