"""A node's link to a peer whose process is gone backs off between connection attempts
(up to 0.75 s), and gives up an attempt that hangs (a host dropping packets) after
``connect_timeout_s``; when that peer's node connects to this one (it restarted, or the
network came back), the link tries at once, so what this node sends it next (a vote in
a failover right after the restart) is not dropped for a back-off or a SYN retry. Real
sockets on loopback."""

from __future__ import annotations

import asyncio
import random
import socket

from quorumlog.replica.node.cluster import free_ports
from quorumlog.replica.node.peers import RENEW_AFTER_S, PeerLink


class LongestPauses(random.Random):
    """Every back-off at its longest; ``paused`` is set as each one begins."""

    def __init__(self) -> None:
        super().__init__(0)
        self.paused = asyncio.Event()
        self.pauses = 0

    def random(self) -> float:
        self.paused.set()
        self.pauses += 1
        return 0.999


async def _reconnect_after_restart(poke: bool) -> float:
    """Seconds from the peer listening again (a back-off having just begun) until the
    link connects."""
    (port,) = free_ports(1)
    rng = LongestPauses()
    refused: list[int] = []
    link = PeerLink(2, "127.0.0.1", port, "node-1", rng, on_refused=refused.append)
    link.start()
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(1.2)  # refused a few times: the back-off is at its cap
        assert refused == [2] and not link.connected
        rng.paused.clear()
        await asyncio.wait_for(rng.paused.wait(), 2)  # a back-off (~0.75 s) begins
        accepted = asyncio.Event()

        def accept(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
            accepted.set()

        server = await asyncio.start_server(accept, "127.0.0.1", port)
        t0 = loop.time()
        if poke:
            link.heard_from()  # what Node does when the peer's node connects to it
        await asyncio.wait_for(accepted.wait(), 5)
        elapsed = loop.time() - t0
        server.close()
        return elapsed
    finally:
        await link.close()


def test_a_link_backing_off_from_a_dead_peer_reconnects_when_the_peer_connects() -> None:
    assert asyncio.run(_reconnect_after_restart(poke=True)) < 0.2


def test_without_word_of_the_peer_the_link_waits_out_its_back_off() -> None:
    # The baseline the first test improves on (and proof the set-up makes it wait).
    assert asyncio.run(_reconnect_after_restart(poke=False)) > 0.5


class Blackhole:
    """A port whose SYNs go unanswered, as a host that drops packets: a listener with a
    full accept queue (the kernel drops further SYNs and the client retries them at 1 s,
    then 3 s, ...)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = int(self.listener.getsockname()[1])
        self.filler = socket.create_connection(("127.0.0.1", self.port), timeout=1)

    def close(self) -> None:
        self.filler.close()
        self.listener.close()


def test_a_connection_attempt_that_hangs_is_given_up() -> None:
    async def run() -> int:
        hole = Blackhole()
        rng = LongestPauses()
        link = PeerLink(2, "127.0.0.1", hole.port, "node-1", rng)
        link.connect_timeout_s = 0.3
        link.start()
        try:
            await asyncio.sleep(1.0)
            assert not link.connected
            return rng.pauses
        finally:
            await link.close()
            hole.close()

    # Given up at 0.3 s, then a back-off: without the timeout, still in the first SYN.
    assert asyncio.run(run()) >= 1


def test_a_hung_attempt_is_dropped_for_a_new_one_when_the_peer_connects() -> None:
    async def run() -> float:
        hole = Blackhole()
        link = PeerLink(2, "127.0.0.1", hole.port, "node-1", LongestPauses())
        link.start()
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(0.3)  # the attempt hangs; the kernel retries its SYN at 1 s
            hole.close()
            accepted = asyncio.Event()

            def accept(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
                accepted.set()

            server = await asyncio.start_server(accept, "127.0.0.1", hole.port)
            t0 = loop.time()
            link.heard_from()  # the peer is back and connected to this node
            await asyncio.wait_for(accepted.wait(), 5)
            server.close()
            return loop.time() - t0
        finally:
            await link.close()

    assert asyncio.run(run()) < 0.2


async def _connections_after_word(wait_s: float) -> tuple[int, bool]:
    """A peer listening; the link connects; ``wait_s`` later the peer's node connects
    to this one (``heard_from``). Connections the peer accepted within 0.3 s after, and
    whether the first was closed."""
    accepted: list[asyncio.StreamReader] = []
    arrived = asyncio.Event()

    def accept(r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        accepted.append(r)
        arrived.set()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = PeerLink(2, "127.0.0.1", port, "node-1", random.Random(0))
    link.start()
    try:
        await asyncio.wait_for(arrived.wait(), 5)
        await asyncio.sleep(wait_s)
        link.heard_from()
        await asyncio.sleep(0.3)
        first_closed = accepted[0].at_eof() or await _eof_within(accepted[0], 0.1)
        return len(accepted), first_closed
    finally:
        await link.close()
        server.close()


async def _eof_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), seconds) == b""
    except TimeoutError:
        return False


def test_a_link_connected_a_while_is_renewed_when_the_peer_connects() -> None:
    # The peer's host may have come back without closing its old connections: the old
    # one may lead nowhere; a new one reaches the new process.
    assert asyncio.run(_connections_after_word(RENEW_AFTER_S + 0.1)) == (2, True)


def test_a_link_connected_a_moment_ago_is_kept_when_the_peer_connects() -> None:
    # Two nodes answering each other's new connections stop after one round.
    assert asyncio.run(_connections_after_word(0.1)) == (1, False)
