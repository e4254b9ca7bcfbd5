"""The node's flush job: one job (one worker thread) for every partition named while no
job ran, the next job for those named meanwhile, exact durability per log, and a
failing log that stops only itself."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from quorumlog.replica.driver import PartitionKey, Ready
from quorumlog.replica.node.flusher import Flusher
from quorumlog.replica.storage import FdCache, GroupFlush, Log, flush_logs
from quorumlog.replica.storage.records import encode_batch


class FakeDriver:
    """Records each ``flushed`` with what the log then held and had made durable;
    ``on_flushed`` may hand back a Ready (as the driver does)."""

    def __init__(self, logs: dict[PartitionKey, Log]) -> None:
        self.logs = logs
        self.partitions: dict[PartitionKey, object] = {k: object() for k in logs}
        self.flushed_calls: list[tuple[PartitionKey, int]] = []
        self.on_flushed: Callable[[PartitionKey], None] | None = None

    def get(self, key: PartitionKey) -> Any:
        return self.partitions.get(key)

    def flushed(self, key: PartitionKey, now: int) -> Ready:
        self.flushed_calls.append((key, self.logs[key].durable_end_offset))
        if self.on_flushed is not None:
            self.on_flushed(key)
        return Ready()


class RecordingFlush:
    """``flush_logs`` that records each job's logs and can hold a job until released."""

    def __init__(self) -> None:
        self.jobs: list[list[str]] = []
        self.hold: threading.Event | None = None
        self.started = threading.Event()

    def __call__(self, logs: Sequence[Log], *, syncfs_min: int) -> GroupFlush:
        self.jobs.append(sorted(Path(lg.directory).name for lg in logs))
        if self.hold is None:
            return flush_logs(logs, syncfs_min=syncfs_min)
        # Held between the capture and the sync, as a long sync would be.
        pending = [lg.begin_flush() for lg in logs]
        self.started.set()
        assert self.hold.wait(10)
        for p in pending:
            p.sync_files()
        return GroupFlush([p.complete() for p in pending])


def append(lg: Log, count: int) -> None:
    lg.append_as_leader(encode_batch([b"v%d" % i for i in range(count)]), 1)


def setup(tmp_path: Path, n: int) -> tuple[dict[PartitionKey, Log], FakeDriver]:
    cache = FdCache(16)
    logs = {("t", i): Log(str(tmp_path / f"t-{i}"), files=cache) for i in range(n)}
    return logs, FakeDriver(logs)


def close_all(logs: dict[PartitionKey, Log]) -> None:
    for lg in logs.values():
        try:
            lg.close()
        except Exception:
            pass


def test_every_key_named_before_the_job_runs_is_flushed_by_one_job(tmp_path: Path) -> None:
    logs, driver = setup(tmp_path, 40)
    recorder = RecordingFlush()

    async def main() -> Flusher:
        flusher = Flusher(driver, lambda ready: None, lambda: 0, flush=recorder)
        for key, lg in logs.items():
            append(lg, key[1] + 1)
            flusher.request(key, driver.partitions[key], lg)
        await flusher.wait_idle()
        return flusher

    flusher = asyncio.run(main())
    assert len(recorder.jobs) == 1 and len(recorder.jobs[0]) == 40
    assert flusher.jobs == 1 and flusher.flushed_logs == 40
    assert sorted(driver.flushed_calls) == sorted((key, key[1] + 1) for key in logs)
    close_all(logs)


def test_keys_named_while_a_job_runs_go_in_the_next_job(tmp_path: Path) -> None:
    logs, driver = setup(tmp_path, 4)
    recorder = RecordingFlush()
    recorder.hold = threading.Event()
    keys = list(logs)
    durable_at_flushed: dict[PartitionKey, tuple[int, int]] = {}

    def note(key: PartitionKey) -> None:
        durable_at_flushed[key] = (logs[key].durable_end_offset, logs[key].end_offset)

    driver.on_flushed = note

    async def main() -> None:
        flusher = Flusher(driver, lambda ready: None, lambda: 0, flush=recorder)
        append(logs[keys[0]], 3)
        flusher.request(keys[0], driver.partitions[keys[0]], logs[keys[0]])
        await asyncio.get_running_loop().run_in_executor(None, recorder.started.wait, 10)
        # The first job is running (held): these wait for the next one.
        for key in keys[1:]:
            append(logs[key], 2)
            flusher.request(key, driver.partitions[key], logs[key])
        # Appended after the first job captured its log: not claimed by that job.
        append(logs[keys[0]], 5)
        assert flusher.running
        recorder.hold.set()  # type: ignore[union-attr]
        await flusher.wait_idle()

    asyncio.run(main())
    assert recorder.jobs == [["t-0"], ["t-1", "t-2", "t-3"]]
    assert durable_at_flushed[keys[0]] == (3, 8)  # exactly what it held at the start
    for key in keys[1:]:
        assert durable_at_flushed[key] == (2, 2)
    close_all(logs)


def test_a_flushed_handler_asking_again_gets_the_next_job(tmp_path: Path) -> None:
    logs, driver = setup(tmp_path, 2)
    recorder = RecordingFlush()
    key = ("t", 0)
    flusher_box: list[Flusher] = []

    def again(k: PartitionKey) -> None:
        # As the driver does for messages held past the durable end: flush again.
        if logs[k].durable_end_offset < logs[k].end_offset:
            flusher_box[0].request(k, driver.partitions[k], logs[k])

    driver.on_flushed = again

    async def main() -> None:
        flusher = Flusher(driver, lambda ready: None, lambda: 0, flush=recorder)
        flusher_box.append(flusher)
        recorder.hold = threading.Event()
        append(logs[key], 1)
        flusher.request(key, driver.partitions[key], logs[key])
        await asyncio.get_running_loop().run_in_executor(None, recorder.started.wait, 10)
        append(logs[key], 1)
        recorder.hold.set()
        await flusher.wait_idle()

    asyncio.run(main())
    assert recorder.jobs == [["t-0"], ["t-0"]]
    assert driver.flushed_calls == [(key, 1), (key, 2)]
    close_all(logs)


@pytest.mark.parametrize("syncfs_min", [0, 2])
def test_a_failing_log_does_not_stop_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, syncfs_min: int
) -> None:
    logs, driver = setup(tmp_path, 5)
    bad = ("t", 2)
    gone = ("t", 4)
    executed: list[Ready] = []

    async def main() -> Flusher:
        flusher = Flusher(driver, executed.append, lambda: 0, syncfs_min=syncfs_min)
        for lg in logs.values():
            append(lg, 4)
        # A writeback error the fd cache met closing the bad log's descriptor.
        logs[bad]._segments[-1]._file.error = OSError(errno.EIO, "injected")
        for key, lg in logs.items():
            flusher.request(key, driver.partitions[key], lg)
        driver.partitions[gone] = object()  # closed and reopened meanwhile
        await flusher.wait_idle()
        return flusher

    with caplog.at_level(logging.CRITICAL, logger="quorumlog.replica.node.flusher"):
        flusher = asyncio.run(main())
    assert sorted(driver.flushed_calls) == [(("t", 0), 4), (("t", 1), 4), (("t", 3), 4)]
    assert len(executed) == 3
    assert logs[bad].durable_end_offset == 0
    assert flusher.failures == 1
    assert any("t/2: log flush failed" in r.getMessage() for r in caplog.records)
    logs.pop(bad)._segments[-1].close()
    close_all(logs)
