"""A restarted node knows every topic at once, from its own metadata log, even when no
other voter can tell it the metadata high watermark yet."""

from __future__ import annotations

from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m

from tests.support.cluster import local_view, node_request
from tests.support.waits import wait_until


@pytest.mark.cluster
def test_restarted_node_knows_topics_while_the_others_are_unreachable(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("known", 2)
        c.produce("known", 0, [b"v"])
        victim, others = 1, [2, 3]
        # Every node has applied the topic (and checkpointed how far) before the restart.
        wait_until(
            lambda: all(local_view(c, n, "known", 0) is not None for n in c.ports),
            20,
            "the topic applied on every node",
        )
        c.kill(victim)
        for n in others:
            c.pause(n)
        try:
            c.start_node(victim)
            resp = wait_until(
                lambda: node_request(
                    c,
                    victim,
                    ApiKey.METADATA,
                    m.MetadataRequest(topics=["known"]),
                    m.MetadataResponse,
                ),
                30,
                "the restarted node to answer",
            )
            topic = resp.topics[0]
            assert topic.error == 0, f"restarted node does not know the topic: {topic}"
            assert sorted(p.partition for p in topic.partitions) == [0, 1]
        finally:
            for n in others:
                c.resume(n)
