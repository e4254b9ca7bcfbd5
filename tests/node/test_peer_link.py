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


class LongPauses(LongestPauses):
    """Every back-off a thousand times its base (50 s and more): a link that connects
    within a test's wait did not wait one out."""

    def random(self) -> float:
        super().random()
        return 1000.0


async def _connects_after_restart(poke: bool, wait_s: float) -> bool:
    """The link finds no process at the peer's port and begins a (long) back-off; then
    the peer listens again and, if ``poke``, its node connects to this one: whether the
    link connects within ``wait_s``."""
    (port,) = free_ports(1)
    rng = LongPauses()
    refused: list[int] = []
    link = PeerLink(2, "127.0.0.1", port, "node-1", rng, on_refused=refused.append)
    link.start()
    try:
        await asyncio.wait_for(rng.paused.wait(), 30)  # refused: a back-off begins
        assert refused == [2] and not link.connected
        accepted = asyncio.Event()

        def accept(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
            accepted.set()

        server = await asyncio.start_server(accept, "127.0.0.1", port)
        if poke:
            link.heard_from()  # what Node does when the peer's node connects to it
        try:
            await asyncio.wait_for(accepted.wait(), wait_s)
            return True
        except TimeoutError:
            return False
        finally:
            server.close()
    finally:
        await link.close()


def test_a_link_backing_off_from_a_dead_peer_reconnects_when_the_peer_connects() -> None:
    assert asyncio.run(_connects_after_restart(poke=True, wait_s=30))


def test_without_word_of_the_peer_the_link_waits_out_its_back_off() -> None:
    # The baseline the first test improves on (and proof the set-up makes it wait): its
    # back-off is 50 s, so no wait here ends it.
    assert not asyncio.run(_connects_after_restart(poke=False, wait_s=2))


def _syn_sent_ports(remote_port: int) -> list[int]:
    """Local ports of this host's IPv4 connection attempts to 127.0.0.1:``remote_port``
    still waiting for an answer (SYN_SENT), from /proc/net/tcp."""
    ports = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, remote, state = line.split()[1:4]
            if state == "02" and remote == f"0100007F:{remote_port:04X}":
                ports.append(int(local.split(":")[1], 16))
    return ports


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
            # A back-off begins only once the attempt is given up: without the timeout it
            # would still wait in its SYN's retries (minutes).
            await asyncio.wait_for(rng.paused.wait(), 30)
            assert not link.connected
            return rng.pauses
        finally:
            await link.close()
            hole.close()

    assert asyncio.run(run()) >= 1


def test_a_hung_attempt_is_dropped_for_a_new_one_when_the_peer_connects() -> None:
    async def run() -> tuple[int, int]:
        hole = Blackhole()
        link = PeerLink(2, "127.0.0.1", hole.port, "node-1", LongestPauses())
        link.connect_timeout_s = 600  # never given up here: only the poke ends it
        link.start()
        try:
            hung: list[int] = []
            for _ in range(3000):  # the attempt hangs (the kernel retries its SYN at 1 s)
                hung = _syn_sent_ports(hole.port)
                if hung:
                    break
                await asyncio.sleep(0.01)
            assert len(hung) == 1, hung
            hole.close()
            accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

            def accept(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                if not accepted.done():
                    accepted.set_result(w.get_extra_info("peername")[1])

            server = await asyncio.start_server(accept, "127.0.0.1", hole.port)
            link.heard_from()  # the peer is back and connected to this node
            came_from = await asyncio.wait_for(accepted, 30)
            server.close()
            return hung[0], came_from
        finally:
            await link.close()

    hung, came_from = asyncio.run(run())
    # A new attempt connected, not the hung one (its SYN retried at 1 s would have).
    assert came_from != hung


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
