"""A node that accepts connections but never answers (SIGSTOP) must not stall metadata:
every node is asked at once and the silent one is given up on once leaders are known."""

from __future__ import annotations

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
                took = []
                for _ in range(3):
                    t0 = time.monotonic()
                    meta = client.metadata(["t"])["t"]
                    took.append(time.monotonic() - t0)
                    assert sorted(meta.partitions) == [0, 1, 2]
                    assert all(pm.leader_id >= 0 for pm in meta.partitions.values())
                # Sequential asking cost min(request timeout, 5 s) per call with one node hung.
                assert max(took) < 2.0, took
            finally:
                c.resume(paused)
            # The aborted connection is replaced: the resumed node answers again.
            deadline = time.monotonic() + 20
            while True:
                meta = client.metadata(["t"])["t"]
                if len(client._conns) == 3:
                    break
                assert time.monotonic() < deadline, "the resumed node was never asked again"
                time.sleep(0.1)
