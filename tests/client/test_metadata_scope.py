"""What a client's Metadata requests ask the nodes for: learning the nodes and the
metadata controller (before an admin request, in ``LocalCluster.wait_ready``) asks for no
partition, so it costs the nodes nothing whatever the size of the topics."""

from __future__ import annotations

from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.spies import record_metadata


@pytest.mark.cluster
def test_learning_the_nodes_and_controller_asks_for_no_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("t", 8)
        answered = record_metadata(monkeypatch)
        with Client(c.bootstrap) as client:
            client.create_topic("u", 2)  # an admin request: the controller first
            assert answered, "the controller was learnt from Metadata"
            for _, req, resp in answered:
                assert req.partitions == []
                assert {t.name for t in resp.topics} >= {"t"}
                assert all(t.partitions == [] for t in resp.topics)
            assert len(client._nodes) == 3 and client._controller_id in client._nodes
        answered.clear()
        c.wait_ready(30)
        assert answered and all(a.request.partitions == [] for a in answered)
