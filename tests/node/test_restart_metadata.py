"""A restarted node knows every topic at once, from its own metadata log, even when no
other voter can tell it the metadata high watermark yet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m


@pytest.mark.cluster
def test_restarted_node_knows_topics_while_the_others_are_unreachable(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("known", 2)
        c.produce("known", 0, [b"v"])
        victim, others = 1, [2, 3]
        # Every node has applied the topic (and checkpointed how far) before the restart.
        deadline = time.monotonic() + 20
        with Client(c.bootstrap) as cl:
            while True:
                answers = [
                    cl._request(
                        ("127.0.0.1", c.ports[n]),
                        ApiKey.METADATA,
                        m.MetadataRequest(topics=["known"]),
                        m.MetadataResponse,
                        5,
                    )
                    for n in (1, 2, 3)
                ]
                if all(a.topics[0].error == 0 for a in answers):
                    break
                assert time.monotonic() < deadline, "topic never applied on every node"
                time.sleep(0.05)
        c.kill(victim)
        for n in others:
            c.pause(n)
        try:
            c.start_node(victim)
            deadline = time.monotonic() + 30
            while True:
                try:
                    with Client(f"127.0.0.1:{c.ports[victim]}", request_timeout_ms=2000) as one:
                        resp = one._request(
                            ("127.0.0.1", c.ports[victim]),
                            ApiKey.METADATA,
                            m.MetadataRequest(topics=["known"]),
                            m.MetadataResponse,
                            2,
                        )
                    break
                except Exception:
                    assert time.monotonic() < deadline, "restarted node never answered"
                    time.sleep(0.05)
            topic = resp.topics[0]
            assert topic.error == 0, f"restarted node does not know the topic: {topic}"
            assert sorted(p.partition for p in topic.partitions) == [0, 1]
        finally:
            for n in others:
                c.resume(n)
