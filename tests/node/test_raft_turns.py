"""A peer's raft frames are applied back to back while they are in the buffer (one
gathered step for all of them), but for at most RAFT_TURN_S before the event loop's
other work (the tick and its heartbeats, other peers, clients) gets a turn: a burst
from one peer must not hold a node for longer than its other peers wait before they
take it for silent. A real Server on loopback, a real node-authenticated connection;
applying a frame is made to take 10 ms."""

from __future__ import annotations

import asyncio
import math
import threading
import time

from quorumlog.replica.client.connection import Connection
from quorumlog.replica.node.security import AuthConfig, Principal
from quorumlog.replica.node.transport import RAFT_TURN_S, Server
from quorumlog.replica.protocol import Frame
from quorumlog.replica.protocol.scram import make_verifier

from tests.support.forge import METADATA_TOPIC, send_raft
from tests.support.messages import vote_request

FRAMES = 100
APPLY_S = 0.01


def test_a_burst_of_raft_frames_lets_the_loop_run_every_raft_turn() -> None:
    auth = AuthConfig()
    auth.add(Principal("node-2", "node", (), 2), make_verifier("s"))
    applied: list[int] = []

    def one_way(frame: Frame, sender: int) -> None:
        time.sleep(APPLY_S)  # a frame of many partitions' messages
        applied.append(sender)

    async def nothing(frame: Frame) -> None:
        return None

    async def run() -> list[int]:
        server = Server("127.0.0.1", 0, nothing, one_way, node_auth=auth)
        await server.start()
        burst = [vote_request(src=2, dst=1)] * FRAMES

        def peer() -> None:
            conn = Connection(
                "127.0.0.1", server.port, client_id="node-2", timeout_s=10,
                credentials=("node-2", "s"),
            )  # fmt: skip
            send_raft(conn, METADATA_TOPIC, 0, *burst)  # in the node's buffer at once
            conn.close()

        sender = threading.Thread(target=peer, daemon=True)
        sender.start()
        # The loop's other work: each time it runs, how many frames were applied by then.
        seen = [0]
        deadline = time.monotonic() + 60
        while len(applied) < FRAMES and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
            seen.append(len(applied))
        sender.join(10)
        await server.close()
        return seen

    seen = asyncio.run(run())
    assert applied == [2] * FRAMES
    # Each frame takes APPLY_S at least, so a turn of RAFT_TURN_S holds this many at most;
    # a turn of the loop may run the burst's next turn (or two) before the waiting timer.
    per_turn = math.ceil(RAFT_TURN_S / APPLY_S)
    steps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
    assert max(steps) <= 3 * per_turn < FRAMES, seen  # applied back to back: all at once
    assert any(0 < n < FRAMES for n in seen), seen  # the other work ran during the burst
