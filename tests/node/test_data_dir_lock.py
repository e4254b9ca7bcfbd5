"""One process per data directory: a second ``quorumlog serve`` on the directory of a
running node exits at once, naming the directory and the holder's pid, and changes
nothing (no file in the directory, no epoch of the metadata quorum)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster, free_ports
from quorumlog.replica.node.metadata import METADATA_TOPIC
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m

from tests.support.cluster import ELECTION_BOUND_S, node_request, wait_caught_up
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _metadata_quorum(c: LocalCluster) -> tuple[int, int]:
    """(leader, epoch) of the metadata quorum, as its leader reports it."""
    for n in c.ports:
        d = node_request(
            c,
            n,
            ApiKey.DESCRIBE_QUORUM,
            m.DescribeQuorumRequest(topic=METADATA_TOPIC, partition=0),
            m.DescribeQuorumResponse,
        )
        if d.error == 0:
            return d.leader_id, d.leader_epoch
    raise AssertionError("no node leads the metadata quorum")


def _listing(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}


def test_second_serve_on_a_busy_data_dir_exits_naming_dir_and_holder(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("busy", 1)
        first = c.produce("busy", 0, [b"x"] * 10)[-1]
        wait_caught_up(c, c.leader_of("busy", 0), "busy", 0, c.ports)
        before = wait_until(lambda: _metadata_quorum(c), ELECTION_BOUND_S, "a metadata leader")
        victim = before[0]  # the metadata leader: the node whose disturbance matters most
        holder_pid = c.procs[victim].pid
        data_dir = c.node_dir(victim)
        assert (data_dir / ".lock").read_text().strip() == str(holder_pid)
        files_before = _listing(data_dir)

        cmd = c.command(victim)
        cmd[cmd.index("--listen") + 1] = f"{c.host}:{free_ports(1)[0]}"
        # The first node holds the lock throughout, so a second serve that waited for it
        # would never exit: subprocess.run's timeout (TimeoutExpired) bounds that wait.
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)

        assert second.returncode != 0, second.stderr
        assert str(data_dir) in second.stderr, second.stderr
        assert f"pid {holder_pid}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr, second.stderr
        # Nothing in the directory changed: the lock still names the first node, no file
        # was added, removed, truncated or extended (the cluster is idle meanwhile).
        assert (data_dir / ".lock").read_text().strip() == str(holder_pid)
        assert _listing(data_dir) == files_before
        # The first node is unaffected: same metadata leader and epoch, still serving.
        assert c.is_running(victim)
        assert _metadata_quorum(c) == before
        after = c.produce("busy", 0, [b"y"])[0]
        assert (after.offset, after.epoch) == (first.offset + 1, first.epoch)
