"""A node that accepts connections but never answers (SIGSTOP) must not stall metadata:
every node is asked at once and the silent one is given up on once leaders are known."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster


@pytest.mark.cluster
def test_metadata_does_not_wait_for_a_paused_node(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("t", 3)
        with Client(c.bootstrap, request_timeout_ms=30000) as client:
            client.metadata(["t"])
            paused = 3  # any node: the others still name every partition's leader
            c.pause(paused)
            try:
                # Each call may wait 60 s for the nodes; the three are given 30 s in all
                # (only a bound on this wait): they can end in time only by giving up on
                # the stopped node once the others named every leader. How long they took
                # is not judged (a loaded machine stretches it).
                answers: list[dict[int, int]] = []

                def three_calls() -> None:
                    for _ in range(3):
                        meta = client.metadata(["t"], timeout_s=60)["t"]
                        answers.append({p: pm.leader_id for p, pm in meta.partitions.items()})

                calls = threading.Thread(target=three_calls, daemon=True)
                calls.start()
                calls.join(30)
                assert not calls.is_alive(), "metadata waited for the stopped node"
                assert len(answers) == 3, answers
                for leaders in answers:
                    assert sorted(leaders) == [0, 1, 2] and min(leaders.values()) >= 0
                assert len(client._conns) < 3  # the stopped node's connection was dropped
            finally:
                c.resume(paused)
            # The aborted connection is replaced: the resumed node answers again.
            deadline = time.monotonic() + 20
            while True:
                client.metadata(["t"])
                if len(client._conns) == 3:
                    break
                assert time.monotonic() < deadline, "the resumed node was never asked again"
                time.sleep(0.1)
