"""A node ticks its driver when the driver has something due: at its next deadline, at
least TICK_S after the last tick and at most MAX_TICK_S after it, sooner when a step
brings a deadline forward. An idle node no longer wakes every TICK_S (each wake cost an
idle node with 10,000 quiesced partitions ~0.3 ms of CPU: ~3 % of a core)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from quorumlog.replica.node import node as node_module
from quorumlog.replica.node.controller import METADATA_KEY
from quorumlog.replica.node.node import Node, TickTimer
from quorumlog.replica.protocol import messages as m

from tests.support.config import node_config


def _ms() -> int:
    return int(time.monotonic() * 1000)


def _timer(deadline: list[int | None]) -> TickTimer:
    return TickTimer(lambda: deadline[0], _ms)


def test_a_tick_is_due_at_the_drivers_deadline_within_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_module, "MAX_TICK_S", 0.5)

    async def run() -> list[int]:
        deadline: list[int | None] = [None]
        timer = _timer(deadline)
        planned = [await timer.wait()]  # nothing due: the longest wait
        deadline[0] = _ms() + 120
        planned.append(await timer.wait())  # at the deadline
        deadline[0] = _ms() - 50
        planned.append(await timer.wait())  # overdue: the shortest wait
        deadline[0] = _ms() + 5_000
        planned.append(await timer.wait())  # far: the longest wait
        return planned

    longest, at_deadline, overdue, far = asyncio.run(run())
    assert longest == far == 500
    assert 10 < at_deadline <= 121  # 120 less the time between setting it and arming
    assert overdue == 10


def test_a_deadline_brought_forward_while_waiting_brings_the_tick_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_module, "MAX_TICK_S", 5.0)

    async def run() -> tuple[float, int]:
        deadline: list[int | None] = [None]
        timer = _timer(deadline)
        loop = asyncio.get_running_loop()

        def step() -> None:  # what a carried-out step does: a timer 30 ms out
            deadline[0] = _ms() + 30
            timer.advance()

        began = time.monotonic()
        loop.call_later(0.05, step)
        planned = await timer.wait()
        return time.monotonic() - began, planned

    waited, planned = asyncio.run(run())
    assert waited < 1.0  # ~0.08 s; without advance the 5 s wait
    assert planned < 200


def test_an_idle_node_ticks_rarely_and_a_long_poll_still_ends_on_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With MAX_TICK_S at 2 s an idle one-voter node ticks for its node heartbeats only
    # (every heartbeat_ms: a quarter of the fetch timeout, 1 s here); a fetch parked at
    # the log end for 100 ms must not wait for the next one.
    monkeypatch.setattr(node_module, "MAX_TICK_S", 2.0)

    async def run() -> tuple[int, list[float]]:
        node = Node(dataclasses.replace(node_config(tmp_path), port=0, fetch_timeout_ms=4000))
        await node.start()
        try:
            for _ in range(200):  # the metadata partition elects its one voter
                p = node.driver.get(METADATA_KEY)
                if p is not None and p.core.is_leader:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the one voter never led")
            await asyncio.sleep(1.0)  # its first commits settle
            ticks = 0
            tick = node.driver.tick

            def counted(now: int) -> object:
                nonlocal ticks
                ticks += 1
                return tick(now)

            node.driver.tick = counted  # type: ignore[method-assign]
            await asyncio.sleep(2.0)
            idle_ticks = ticks
            waits = []
            for _ in range(5):
                p = node.driver.get(METADATA_KEY)
                assert p is not None
                req = m.FetchRequest(
                    topic=METADATA_KEY[0],
                    partition=METADATA_KEY[1],
                    current_leader_epoch=p.core.epoch,
                    fetch_offset=p.core.high_watermark,
                    max_wait_ms=100,
                    min_bytes=1,
                    max_bytes=1 << 20,
                )
                began = time.monotonic()
                resp = await node.submit(METADATA_KEY, req)
                waits.append(time.monotonic() - began)
                assert resp.error == 0 and resp.records == b""
            return idle_ticks, waits
        finally:
            await node.stop()

    idle_ticks, waits = asyncio.run(run())
    assert idle_ticks <= 6  # 2: its heartbeats; 200 in 2 s before
    # ~0.1 s each; without ``advance`` the next heartbeat's tick ended them (~1 s).
    assert all(0.09 <= w < 0.5 for w in waits), waits
