"""``util.cpu_seconds``: another process's CPU time to the nanosecond, so that a
short measure of a process that did little (the nodes of a tiny ``perf kafka`` run)
reads more than 0; /proc's clock ticks (10 ms) read 0 there. ``util.MachineCpu``:
the host's share of the machine's CPU time (steal) between two readings.
``util.librdkafka_loop``: a queue that never drains ends the run, saying how far it got."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import confluent_kafka
import pytest
from quorumlog.replica.perf import util
from quorumlog.replica.perf.util import MachineCpu, Progress, cpu_seconds

# Says it is ready, waits for a line, burns 3 ms of CPU, waits for another.
CHILD = (
    "import sys, time\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "t = time.thread_time()\n"
    "while time.thread_time() - t < 0.003: pass\n"
    "sys.stdin.readline()\n"
)


def _sleeping(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def test_cpu_seconds_counts_a_few_milliseconds_of_another_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == b"ready\n"  # started: what follows is measured
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


def test_machine_cpu_steal_share_reads_proc_stat() -> None:
    """The host's share comes from /proc/stat's steal column, over the time between two
    readings, and is a share: 0 to 1."""
    earlier = MachineCpu.now()
    t = time.thread_time()
    while time.thread_time() - t < 0.05:
        pass
    later = MachineCpu.now()
    assert later.total > earlier.total  # the machine's clock ticks advanced
    share = later.steal_share_since(earlier)
    assert 0.0 <= share <= 1.0
    # Known counts: a third of 300 ticks stolen.
    assert MachineCpu(110, 1300).steal_share_since(MachineCpu(10, 1000)) == 100 / 300
    # No time counted (unreadable /proc/stat): no share.
    assert MachineCpu().steal_share_since(MachineCpu()) == 0.0


def test_machine_cpu_busy_share_is_the_time_not_idle() -> None:
    """Busy is every state but idle and iowait, over the time between two readings: a
    loop burning a CPU makes the machine busy, and known counts give known shares."""
    earlier = MachineCpu.now()
    t = time.thread_time()
    while time.thread_time() - t < 0.1:
        pass
    later = MachineCpu.now()
    # One CPU burned of os.cpu_count() (others may idle): busy at least a share of it.
    assert later.busy_share_since(earlier) >= 0.5 / (os.cpu_count() or 1)
    # 300 ticks, 120 of them idle or iowait: 60% busy.
    assert MachineCpu(0, 1300, 420).busy_share_since(MachineCpu(0, 1000, 300)) == 1 - 120 / 300
    assert MachineCpu().busy_share_since(MachineCpu()) == 0.0


def test_librdkafka_loop_ends_the_run_when_its_queue_never_drains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nothing listens there: no delivery ever frees a place in the 10-record queue
    monkeypatch.setattr(util, "QUEUE_WAIT_S", 0.5)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 10}
    )
    keys = [b"%d" % i for i in range(100)]
    try:
        with pytest.raises(SystemExit, match="^loop: 10 of 100 records handed over in 0.5 s$"):
            util.librdkafka_loop(producer, "t", 100, [b"v"], keys, Progress(100, "t"), "loop")
        assert len(producer) == 10  # the ten it handed over, still queued
    finally:
        producer.purge()
