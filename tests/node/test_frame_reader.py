"""FrameReader: a connection's bytes, read back exactly as sent however the socket
split them, with back-pressure past its limit."""

from __future__ import annotations

import asyncio
import functools
import random
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from quorumlog.replica.node.transport import FrameReader

pytestmark = pytest.mark.timeout(60)


def in_a_loop(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


def reader_fed(chunks: list[bytes], eof: bool = True) -> FrameReader:
    reader = FrameReader(1 << 20, asyncio.get_running_loop())
    for chunk in chunks:
        reader.feed_data(chunk)
    if eof:
        reader.feed_eof()
    return reader


@in_a_loop
async def test_reads_exactly_across_and_within_chunks() -> None:
    data = bytes(range(256)) * 40
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, len(data)), 60))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    reader = reader_fed(chunks)
    got = []
    at = 0
    while at < len(data):
        n = min(rng.randrange(1, 700), len(data) - at)
        got.append(await reader.readexactly(n))
        at += n
    assert b"".join(got) == data
    assert reader.at_eof()
    assert await reader.read(10) == b""


@in_a_loop
async def test_a_read_that_is_one_whole_chunk_is_that_chunk() -> None:
    chunk = bytes(1 << 16)
    reader = reader_fed([b"abcd", chunk])
    assert await reader.readexactly(4) == b"abcd"
    assert (await reader.readexactly(len(chunk))) is chunk


@in_a_loop
async def test_eof_inside_a_frame_raises_with_what_arrived() -> None:
    reader = reader_fed([b"abc", b"de"])
    with pytest.raises(asyncio.IncompleteReadError) as err:
        await reader.readexactly(8)
    assert (err.value.partial, err.value.expected) == (b"abcde", 8)


@in_a_loop
async def test_read_returns_what_is_there_up_to_n() -> None:
    reader = reader_fed([b"abc", b"defg"], eof=False)
    assert await reader.read(2) == b"ab"
    assert await reader.read(100) == b"cdefg"
    waiting = asyncio.ensure_future(reader.read(5))
    await asyncio.sleep(0)
    assert not waiting.done()
    reader.feed_data(b"hi")
    assert await waiting == b"hi"


@in_a_loop
async def test_a_slow_reader_gets_every_byte_of_a_fast_socket() -> None:
    """5 MB of frames written as fast as the socket takes them, read by a reader that
    stops to wait: it pauses its socket past twice its limit and resumes below it."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    rng = random.Random(3)
    frames = [rng.randbytes(rng.randrange(1, 300_000)) for _ in range(40)]
    sender = threading.Thread(
        target=lambda: (
            theirs.sendall(b"".join(len(f).to_bytes(4, "big") + f for f in frames)),
            theirs.close(),
        )
    )
    reader = FrameReader(1 << 16, loop)
    transport, _ = await loop.connect_accepted_socket(
        lambda: asyncio.StreamReaderProtocol(reader), sock=ours
    )
    sender.start()
    paused = 0
    got = []
    for _ in frames:
        size = int.from_bytes(await reader.readexactly(4), "big")
        got.append(await reader.readexactly(size))
        paused += reader._paused
        await asyncio.sleep(0.002)
    sender.join(10)
    transport.close()
    assert got == frames
    assert paused > 0
