"""What one driver step sends a peer travels in frames of at most BATCH_MESSAGES raft
messages, in order: its receiver applies a frame in one go, so a step that speaks for
thousands of partitions (a node heard again, a wave of elections) must not become one
frame that holds the receiver, heartbeats and all, for most of a second. Node and
PeerLink are real (not started); the frames are read back from the link's queue."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from quorumlog.replica.node.node import BATCH_MESSAGES, Node
from quorumlog.replica.node.peers import PeerLink
from quorumlog.replica.protocol import ApiKey, decode_body
from quorumlog.replica.protocol import messages as m

from tests.support.config import node_config
from tests.support.messages import vote_request
from tests.support.wire import read_frame

STEP = 5 * BATCH_MESSAGES + 7  # partitions one step speaks for


def test_a_step_for_thousands_of_partitions_reaches_a_peer_in_bounded_frames(
    tmp_path: Path,
) -> None:
    async def run() -> list[tuple[int, list[int]]]:
        node = Node(node_config(tmp_path))
        link = PeerLink(2, "127.0.0.1", 1, "node-1", random.Random(0))
        link.connected = True  # never started: what it would write stays in its queue
        node.peers[2] = link
        sends = [(("t", p), vote_request(src=1, dst=2)) for p in range(STEP)]
        node._send(sends)  # type: ignore[arg-type]
        frames = []
        while not link._queue.empty():
            buffers = link._queue.get_nowait()
            assert buffers is not None
            frame = read_frame(b"".join(bytes(b) for b in buffers))  # exactly one frame
            assert frame.api_key == ApiKey.RAFT_BATCH
            batch = decode_body(m.RaftBatch, frame.body, frame.payload)
            frames.append((len(batch.partitions), list(batch.partitions)))
        return frames

    frames = asyncio.run(run())
    assert [n for n, _ in frames] == [BATCH_MESSAGES] * 5 + [7]
    assert [p for _, parts in frames for p in parts] == list(range(STEP))  # in order
