"""``perfutil.cpu_seconds``: another process's CPU time to the nanosecond, so that a
short measure of a process that did little (the nodes of a tiny ``perf kafka`` run)
reads more than 0; /proc's clock ticks (10 ms) read 0 there."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from quorumlog.replica.cli.perfutil import cpu_seconds

# Waits for a line, burns 3 ms of CPU, waits for another.
CHILD = (
    "import sys, time\n"
    "sys.stdin.readline()\n"
    "t = time.thread_time()\n"
    "while time.thread_time() - t < 0.003: pass\n"
    "sys.stdin.readline()\n"
)


def _sleeping(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def test_cpu_seconds_counts_a_few_milliseconds_of_another_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE)
    assert child.stdin is not None
    try:
        time.sleep(0.2)  # started, and waiting for its first line
        before = cpu_seconds(child.pid)
        child.stdin.write(b"go\n")
        child.stdin.flush()
        for _ in range(500):  # until it has burnt its 3 ms and waits again
            if cpu_seconds(child.pid) - before >= 0.003 and _sleeping(child.pid):
                break
            time.sleep(0.01)
        spent = cpu_seconds(child.pid) - before
        assert 0.003 <= spent < 0.5, spent
        # Not a whole number of clock ticks, as /proc/<pid>/stat would give.
        ticks = spent * os.sysconf("SC_CLK_TCK")
        assert abs(ticks - round(ticks)) > 1e-6, spent
    finally:
        child.stdin.write(b"end\n")
        child.stdin.close()
        child.wait(10)
