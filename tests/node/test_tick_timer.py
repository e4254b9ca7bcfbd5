"""A node ticks its driver when the driver has something due: at its next deadline, at
least TICK_S after the last tick and at most MAX_TICK_S after it, sooner when a step
brings a deadline forward. An idle node no longer wakes every TICK_S (each wake cost an
idle node with 10,000 quiesced partitions ~0.3 ms of CPU: ~3 % of a core)."""

from __future__ import annotations

import asyncio
import dataclasses
import selectors
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from quorumlog.replica.node import node as node_module
from quorumlog.replica.node.controller import METADATA_KEY
from quorumlog.replica.node.node import Node, TickTimer
from quorumlog.replica.protocol import messages as m

from tests.support.config import node_config

T = TypeVar("T")


class _VirtualClock(selectors.DefaultSelector):
    """An event loop's clock that moves only when the loop would wait: a wait for a
    timer takes no real time and ends exactly when the timer is due."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if not events and timeout:
            self.now += timeout
        return events


def _run_on_virtual_time(main: Callable[[Callable[[], int]], Coroutine[Any, Any, T]]) -> T:
    """Run ``main(ms)`` on a loop whose time is virtual; ``ms()`` reads it in ms."""
    clock = _VirtualClock()
    loop = asyncio.SelectorEventLoop(clock)
    loop.time = lambda: clock.now  # type: ignore[method-assign]
    try:
        return loop.run_until_complete(main(lambda: round(clock.now * 1000)))
    finally:
        loop.close()


def test_a_tick_is_due_at_the_drivers_deadline_within_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_module, "MAX_TICK_S", 0.5)

    async def run(ms: Callable[[], int]) -> list[int]:
        deadline: list[int | None] = [None]
        timer = TickTimer(lambda: deadline[0], ms)
        planned = [await timer.wait()]  # nothing due: the longest wait
        deadline[0] = ms() + 120
        planned.append(await timer.wait())  # at the deadline
        deadline[0] = ms() - 50
        planned.append(await timer.wait())  # overdue: the shortest wait
        deadline[0] = ms() + 5_000
        planned.append(await timer.wait())  # far: the longest wait
        return planned

    assert _run_on_virtual_time(run) == [500, 120, 10, 500]


def test_a_deadline_brought_forward_while_waiting_brings_the_tick_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_module, "MAX_TICK_S", 5.0)

    async def run(ms: Callable[[], int]) -> tuple[int, int]:
        deadline: list[int | None] = [None]
        timer = TickTimer(lambda: deadline[0], ms)
        loop = asyncio.get_running_loop()

        def step() -> None:  # what a carried-out step does: a timer 30 ms out
            deadline[0] = ms() + 30
            timer.advance()

        began = ms()
        loop.call_later(0.05, step)
        planned = await timer.wait()
        return ms() - began, planned

    # The wake-up is the step's deadline (50 + 30 ms), not the 5 s wait armed first.
    assert _run_on_virtual_time(run) == (80, 80)


def test_an_idle_node_ticks_for_its_heartbeats_and_a_long_poll_still_ends_on_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With MAX_TICK_S at 2 s an idle one-voter node ticks for its node heartbeats only
    # (every heartbeat_ms: a quarter of the fetch timeout, 1 s here); a fetch parked at
    # the log end for 100 ms must not wait for the next one.
    monkeypatch.setattr(node_module, "MAX_TICK_S", 2.0)

    async def run() -> None:
        node = Node(dataclasses.replace(node_config(tmp_path), port=0, fetch_timeout_ms=4000))
        heartbeat_ms = node.quorum.heartbeat_ms
        # Each tick's wait: (driver ms as it began, the driver's next deadline then,
        # the wait planned as last armed); the timer is the node's own.
        waits: list[tuple[int, int | None, int]] = []
        timed = node.ticks.wait

        async def recorded() -> int:
            began, due = node.clock.now(), node.driver.next_deadline_ms()
            planned = await timed()
            waits.append((began, due, planned))
            return planned

        node.ticks.wait = recorded  # type: ignore[method-assign]
        await node.start()
        try:

            def idle() -> bool:
                # Three ticks in a row each for a deadline a heartbeat after the last one's
                # (ticking every TICK_S, most ticks would find the same deadline due).
                dues = [due for _, due, _ in waits[-4:]]
                return len(dues) == 4 and all(
                    a is not None and b is not None and b - a >= heartbeat_ms
                    for a, b in zip(dues, dues[1:], strict=False)
                )

            for _ in range(600):  # it elects itself, commits, then idles: 30 s at most
                if idle():
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"the idle node never ticked for heartbeats only: {waits}")

            early = 0
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
                seen = len(waits)
                resp = await asyncio.wait_for(node.submit(METADATA_KEY, req), 30)
                assert resp.error == 0 and resp.records == b""
                # The parked fetch brought its tick forward: a wait ended well before the
                # deadline it was armed for (the next heartbeat), as re-armed by the step.
                early += any(
                    due is not None and began + planned + 50 < due
                    for began, due, planned in waits[seen:]
                )
            # A heartbeat due within a fetch's 100 ms ends that one by itself (one or two
            # of five fetches 100 ms apart at most, with heartbeats 1 s apart).
            assert early >= 3, waits[-12:]
        finally:
            await node.stop()

    asyncio.run(run())
