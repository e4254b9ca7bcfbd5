"""A request is handled in the turn of the event loop that read its frame
(``eager.start``), and an answer ready then, with none queued before it, is written in
that turn: a Metadata answer does not wait four turns of a node busy opening thousands
of replicas. Answers still go out in the order of their requests."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from quorumlog.replica.node import eager
from quorumlog.replica.node.transport import Server, read_frame
from quorumlog.replica.protocol import ApiKey, Frame, encode, encode_frame
from quorumlog.replica.protocol.messages import API_VERSION, ErrorResponse

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("eager_test", default="outside")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_coroutine_that_does_not_wait_is_done_when_start_returns() -> None:
    async def main() -> None:
        steps: list[str] = []

        async def handler() -> int:
            steps.append("ran")
            VAR.set("inside")
            return 7

        fut = eager.start(handler())
        assert steps == ["ran"] and fut.done() and fut.result() == 7
        assert VAR.get() == "outside"  # run in a copy of the context, as a task is

    run(main())


def test_a_coroutine_that_waits_goes_on_as_a_task_from_where_it_stopped() -> None:
    async def main() -> None:
        steps: list[str] = []
        gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handler() -> int:
            steps.append("before")
            VAR.set("inside")
            await asyncio.sleep(0)  # a bare yield
            value = await gate
            steps.append(f"after {VAR.get()}")
            return value + 1

        fut = eager.start(handler())
        assert steps == ["before"] and not fut.done()
        gate.set_result(41)
        assert await fut == 42
        assert steps == ["before", "after inside"] and VAR.get() == "outside"

    run(main())


def test_failures_and_cancellation_reach_the_caller_and_the_coroutine() -> None:
    async def main() -> None:
        async def fails_at_once() -> None:
            raise ValueError("at once")

        fut = eager.start(fails_at_once())
        assert fut.done() and isinstance(fut.exception(), ValueError)

        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        cleaned: list[str] = []

        async def fails_later() -> None:
            await gate
            raise KeyError("later")

        later = eager.start(fails_later())
        gate.set_result(None)
        with pytest.raises(KeyError):
            await later

        async def waits_forever() -> None:
            try:
                await asyncio.get_running_loop().create_future()
            finally:
                cleaned.append("finally")

        waiting = eager.start(waits_forever())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert cleaned == ["finally"]

    run(main())


def _request(correlation_id: int, api_key: ApiKey = ApiKey.METADATA) -> list[Any]:
    body, payload = encode(ErrorResponse(error=0, error_message=""))
    return encode_frame(int(api_key), API_VERSION, correlation_id, "t", body, payload)


async def _answer(correlation_id: int) -> tuple[int, Any]:
    return int(ApiKey.ERROR), ErrorResponse(error=0, error_message=str(correlation_id))


def test_answers_keep_the_order_of_their_requests() -> None:
    """A refused request first, then one that waits: the next, ready at once, are written
    after it."""

    async def main() -> list[int]:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def handler(frame: Frame) -> tuple[int, Any]:
            if frame.correlation_id == 1:
                await gate
            return await _answer(frame.correlation_id)

        server = Server("127.0.0.1", 0, handler, lambda frame, sender: None)
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        # Refused by the listener itself (no authentication here) and answered, before
        # the others are sent.
        writer.write(b"".join(bytes(b) for b in _request(0, ApiKey.AUTHENTICATE)))
        got = [(await read_frame(reader, 1 << 20)).correlation_id]
        for cid in (1, 2, 3):
            writer.write(b"".join(bytes(b) for b in _request(cid)))
        await writer.drain()
        await asyncio.sleep(0.05)
        gate.set_result(None)
        got += [(await read_frame(reader, 1 << 20)).correlation_id for _ in range(3)]
        writer.close()
        await server.close()
        return got

    assert run(main()) == [0, 1, 2, 3]


def test_an_answer_ready_at_once_is_written_in_the_turn_its_request_was_read() -> None:
    """Turns of the event loop from the client's write to its read of the answer, in one
    loop on loopback (the kernel delivers a loopback write at once, so the count is
    exact)."""

    async def turns_to_answer(yields: int) -> int:
        turns = 0
        counting = True

        def count() -> None:
            nonlocal turns
            turns += 1
            if counting:
                loop.call_soon(count)

        async def handler(frame: Frame) -> tuple[int, Any]:
            for _ in range(yields):
                await asyncio.sleep(0)
            return await _answer(frame.correlation_id)

        loop = asyncio.get_running_loop()
        server = Server("127.0.0.1", 0, handler, lambda frame, sender: None)
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        loop.call_soon(count)
        counts = []
        for cid in range(1, 4):
            start = turns
            writer.write(b"".join(bytes(b) for b in _request(cid)))
            frame = await read_frame(reader, 1 << 20)
            counts.append(turns - start)
            assert frame.correlation_id == cid
        counting = False
        writer.close()
        await server.close()
        return min(counts)

    async def main() -> tuple[int, int]:
        return await turns_to_answer(0), await turns_to_answer(1)

    at_once, after_a_yield = run(main())
    # The client's write; the server's socket read; the connection's task reads the
    # frame, handles it and writes the answer; the client's socket read; the client's
    # task: four turns (five when the handler ran as a task of its own, as before).
    assert at_once <= 4, at_once
    assert after_a_yield > at_once  # a handler that waits is answered by the responder
