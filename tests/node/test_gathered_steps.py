"""Driver steps a node carries out together: those of one turn of the event loop are
merged (one journal write, one frame per peer), and steps are carried out in the order
the driver took them, persists before sends."""

from __future__ import annotations

import asyncio

from quorumlog.replica.driver import Ready
from quorumlog.replica.node.node import GatheredSteps
from quorumlog.replica.raft import ElectionState


def step(n: int) -> Ready:
    ready = Ready()
    ready.persist.append((("t", n), ElectionState(epoch=n)))
    ready.send.append((("t", n), f"message {n}"))  # type: ignore[arg-type]
    ready.answers.append((n, f"answer {n}"))
    return ready


def test_steps_of_one_turn_are_carried_out_once_and_in_order() -> None:
    carried: list[Ready] = []

    async def main() -> None:
        steps = GatheredSteps(carried.append)
        for n in range(3):
            steps.soon(step(n))
        assert carried == []  # not before the loop turns
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(carried) == 1
        steps.soon(step(3))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert len(carried) == 2
    first = carried[0]
    assert [k for k, _ in first.persist] == [("t", 0), ("t", 1), ("t", 2)]
    assert [msg for _, msg in first.send] == ["message 0", "message 1", "message 2"]
    assert [t for t, _ in first.answers] == [0, 1, 2]
    assert [k for k, _ in carried[1].persist] == [("t", 3)]


def test_a_step_carried_out_now_takes_the_gathered_ones_first() -> None:
    """A tick's step (carried out at once) may send what a gathered step made durable
    state of: the gathered steps go with it, ahead of it, never after."""
    carried: list[Ready] = []

    async def main() -> None:
        steps = GatheredSteps(carried.append)
        steps.soon(step(0))
        steps.soon(step(1))
        steps.now(step(2))
        assert len(carried) == 1
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert len(carried) == 1  # nothing left for the loop's turn
    assert [msg for _, msg in carried[0].send] == ["message 0", "message 1", "message 2"]


def test_work_handed_in_for_the_next_turn_is_carried_out_with_the_gathered_steps() -> None:
    """A turn's appends reach the driver at the next turn (``wake``, then ``pending``):
    their step goes in the same carrying out as the steps gathered meanwhile, after
    them (one frame per peer, one set of flushes), whichever was handed in first."""
    carried: list[Ready] = []
    handed: list[int] = []

    def pending() -> Ready | None:
        if not handed:
            return None
        n = handed.pop()
        return step(n)

    async def main() -> None:
        steps = GatheredSteps(carried.append, pending)
        handed.append(9)
        steps.wake()
        steps.soon(step(0))
        steps.soon(step(1))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(carried) == 1
        handed.append(10)  # alone in its turn
        steps.wake()
        steps.wake()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        steps.wake()  # nothing handed: nothing carried out
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert [[msg for _, msg in r.send] for r in carried] == [
        ["message 0", "message 1", "message 9"],
        ["message 10"],
    ]
