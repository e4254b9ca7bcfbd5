"""A node's graceful stop (SIGTERM) ends promptly whatever it is doing: requests in
flight are cancelled, not waited for, and a stop that hangs anyway is cut short at
``STOP_DEADLINE_S`` with every thread's stack in the node's log."""

from __future__ import annotations

import select
from pathlib import Path

from quorumlog.replica.client.connection import Connection
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.transport import MAX_IN_FLIGHT
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m


def test_sigterm_exits_promptly_with_answers_nobody_reads(tmp_path: Path) -> None:
    """A client asks for megabytes and stops reading (a stalled executor, a cut link): the
    node's answers back up. Its stop cancels them (it waited up to 35 s for them)."""
    topic = "unread"
    with LocalCluster(1, tmp_path) as c:
        c.create_topic(topic, 1)
        for b in range(4):
            c.produce(topic, 0, [bytes([b]) * 100_000 for _ in range(5)])
        fetch = m.FetchRequest(
            topic=topic,
            partition=0,
            current_leader_epoch=m.NO_EPOCH,
            fetch_offset=0,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=4 << 20,
        )
        conn = Connection(c.host, c.ports[1], client_id="never-reads", timeout_s=10)
        try:
            for _ in range(MAX_IN_FLIGHT):  # ~2 MB each, never read: far more than the
                conn.send(ApiKey.FETCH, fetch)  # socket buffers hold, so answers back up
            sock = conn._sock
            assert sock is not None
            readable, _, _ = select.select([sock], [], [], 60)
            assert readable, "no answer reached the client in 60 s"
            # The node answers, and cannot finish: its stop must cancel what is left.
            c.terminate(1, timeout_s=60)
        finally:
            conn.close()
        log_tail = c.tail(1, 200)
    # A stop that waited for the unread answers would still wait when the stop deadline
    # cut it short, with status 1 and every thread's stack in the log.
    assert c.procs[1].returncode == 0, log_tail
    assert "node 1 stopped" in log_tail
    assert "Timeout (" not in log_tail


# A node whose graceful stop never ends (a stand-in for a flush stuck in the kernel).
_STUCK_STOP = """
import asyncio, sys
from quorumlog.replica.cli.main import main
from quorumlog.replica.node import node

async def stop(self, graceful=True):
    await asyncio.Event().wait()

node.STOP_DEADLINE_S = 1.0
node.Node.stop = stop
sys.exit(main())
"""


class _StuckStopCluster(LocalCluster):
    def command(self, node: int) -> list[str]:
        python, _m, _module, *args = super().command(node)
        return [python, "-c", _STUCK_STOP, *args]


def test_a_stop_that_hangs_is_cut_short_at_the_deadline(tmp_path: Path) -> None:
    with _StuckStopCluster(1, tmp_path) as c:
        c.terminate(1, timeout_s=60)
        log_tail = c.tail(1, 200)
    assert c.procs[1].returncode == 1
    assert "shutting down gracefully" in log_tail
    assert "node 1 stopped" not in log_tail
    # faulthandler's dump of every thread, armed for the node's deadline (1 s here).
    assert "Timeout (0:00:01)!" in log_tail
