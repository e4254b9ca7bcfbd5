"""A request handler started at once, in the turn of the event loop that read its frame.

``asyncio.create_task`` runs a coroutine's first step at the loop's next turn, and its
answer is written at the turn after it finishes: a request that needs nothing but the
node's state (Metadata, ApiVersions) took four turns from its frame to its answer. While
a node opens thousands of replicas, a turn runs a slice of opens, a tick and a peer's
raft frames, and four of them held a client's Metadata answer for a few hundred
milliseconds. ``start`` runs the first step here (Python 3.12's eager tasks do the same),
so a handler that does not wait is answered in the turn its frame was read, and one that
waits goes on as a task from where it stopped.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


def start(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run ``coro`` up to its first wait, in a copy of the current context (as a task
    would): a done future if it finished, else the task that runs the rest."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:
        first = context.run(coro.send, None)
    except StopIteration as stop:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(stop.value)
        return done
    except (KeyboardInterrupt, SystemExit):
        raise
    except asyncio.CancelledError:
        cancelled: asyncio.Future[T] = loop.create_future()
        cancelled.cancel()
        return cancelled
    except BaseException as exc:
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(exc)
        return failed
    return loop.create_task(_rest(coro, first), context=context)


async def _rest(coro: Coroutine[Any, Any, T], first: Any) -> T:
    return await _drive(coro, first)  # type: ignore[misc, no-any-return]


@types.coroutine
def _drive(coro: Coroutine[Any, Any, T], waiting: Any) -> Generator[Any, Any, T]:
    """Hand what ``coro`` waits on to the task driving this (a future, or None for a bare
    yield), and resume ``coro`` with what the task sends or throws back, to its end."""
    while True:
        try:
            sent = yield waiting
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                waiting = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                waiting = coro.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
