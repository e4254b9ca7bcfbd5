"""A node process tunes glibc's malloc (``tune_malloc``) so that the buffers it
allocates and frees all the time (socket reads, frames, fetched batches) reuse heap
pages instead of faulting fresh ones in.

What that buys is measured on the node's own read path (``transport.start_server``,
``FrameReader``, ``read_frame``) in a process of its own, not on a whole cluster: under
glibc's defaults the mmap and trim thresholds follow what the process happened to free
before (a node's first 4 MB disk reserve alone raises them to 4 and 8 MB), so a
cluster's page faults under a steady produce load no longer tell a tuned node from an
untuned one, while bursts of frames past the trim threshold (producers' in-flight
batches arriving together, then acknowledged) fault every page in again untuned."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
FRAME_BYTES = 1 << 20
# A burst is more than twice any buffer a node frees at start (its 4 MB disk reserve),
# so glibc's default trim threshold never holds it.
BURST_FRAMES = 16
ROUNDS = 12  # the first fills the heap and is not counted
PAGE = os.sysconf("SC_PAGE_SIZE")


def python(args: list[str], **env: str) -> str:
    """Run this interpreter with ``args`` and malloc's variables only as ``env`` sets
    them; its standard output."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    return subprocess.run(
        [sys.executable, *args],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    ).stdout


def _send_bursts(port: int, frames: list[list[bytes | memoryview]]) -> int:
    """Send ``ROUNDS`` bursts of ``frames``, each acknowledged by one byte; the page
    faults of this process during all but the first."""
    start = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for i in range(ROUNDS):
            if i == 1:
                start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for frame in frames:
                for buf in frame:
                    sock.sendall(buf)
            if sock.recv(1) != b"k":
                raise ConnectionError("the reader closed before acknowledging a burst")
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start


async def _read_bursts() -> int:
    """Frames read as a node reads them, a burst held until its last frame came, then
    dropped and acknowledged (as a node answers a produce once it is durable)."""
    from quorumlog.replica.node.transport import read_frame, start_server
    from quorumlog.replica.protocol.framing import encode_frame

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held = []
        for _ in range(ROUNDS * BURST_FRAMES):
            held.append(await read_frame(reader, 2 * FRAME_BYTES))
            if len(held) == BURST_FRAMES:
                held.clear()
                writer.write(b"k")
                await writer.drain()
        writer.close()

    payload = b"v" * FRAME_BYTES
    frames = [encode_frame(0, 0, i, "c", None, payload) for i in range(BURST_FRAMES)]
    server = await start_server(serve, "127.0.0.1", 0, None)
    try:
        port = server.sockets[0].getsockname()[1]
        return await asyncio.wait_for(asyncio.to_thread(_send_bursts, port, frames), 60)
    finally:
        server.close()


def page_faults_reading_bursts(**env: str) -> int:
    """Page faults of a process that tunes malloc as a node does (unless ``env`` sets
    malloc's variables), frees a 4 MB buffer (a node's disk reserve), then reads
    ``ROUNDS - 1`` bursts of ``BURST_FRAMES`` frames of ``FRAME_BYTES``."""
    return int(python(["-m", "tests.node.test_malloc"], **env).strip())


def test_bursts_of_frames_fault_in_fresh_pages_only_with_malloc_untuned() -> None:
    """GLIBC_TUNABLES in the environment (empty: glibc's own defaults) leaves malloc as
    it is: glibc then trims the heap after each burst and faults every page of the next
    one in again (~47,000 faults for 176 MB read), tuned it reuses them (0-65 here)."""
    pages = (ROUNDS - 1) * BURST_FRAMES * FRAME_BYTES // PAGE
    tuned = page_faults_reading_bursts()
    untuned = page_faults_reading_bursts(GLIBC_TUNABLES="")
    assert untuned > pages // 2, (untuned, pages)
    assert tuned < pages // 20, (tuned, pages)


def test_tune_malloc_leaves_malloc_set_by_the_environment_alone() -> None:
    code = ["-c", "from quorumlog.replica.node.node import tune_malloc; print(tune_malloc())"]
    assert python(code).strip() == "True"
    assert python(code, MALLOC_TRIM_THRESHOLD_="1000000").strip() == "False"
    assert python(code, GLIBC_TUNABLES="").strip() == "False"


if __name__ == "__main__":
    from quorumlog.replica.node.node import tune_malloc

    tune_malloc()
    reserve = bytes(4 << 20)  # freed at once, as a node's disk reserve is at its start
    del reserve
    print(asyncio.run(_read_bursts()))
