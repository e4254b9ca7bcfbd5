"""A NOT_LEADER answer that names the partition's leader (as Kafka's KIP-951): the client
retries there at once, without asking every node for the topic's metadata, which a
topic of thousands of partitions makes costly just when leadership moves."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client import client as client_module
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import encode_batch

from tests.support.spies import record_metadata


@pytest.mark.cluster
def test_a_not_leader_answer_naming_the_leader_is_followed_without_metadata(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cluster
    c.create_topic("moved-named", 1)
    with Client(c.bootstrap) as client:
        first = client.produce("moved-named", 0, encode_batch([b"a"]))
        pm = client.partition_metadata("moved-named", 0)
        follower = next(r for r in pm.replicas if r != pm.leader_id)
        # The cache as leadership moving leaves it: an older epoch, another node.
        stale = replace(pm, leader_id=follower, leader_epoch=pm.leader_epoch - 1)
        client._leaders[("moved-named", 0)] = stale
        asked: list[Any] = []
        real = client.metadata

        def metadata(*args: Any, **kwargs: Any) -> Any:
            asked.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(client, "metadata", metadata)
        second = client.produce("moved-named", 0, encode_batch([b"b"]))
        assert asked == [], "the follower named the leader: no metadata was needed"
        assert second.base_offset == first.last_offset + 1
        now = client.partition_metadata("moved-named", 0)
        assert (now.leader_id, now.leader_epoch) == (pm.leader_id, pm.leader_epoch)
        # A NOT_LEADER that names no newer leader than the cache is not followed: the
        # retry refreshes the metadata, as before.
        client._leaders[("moved-named", 0)] = replace(pm, leader_id=follower)
        third = client.produce("moved-named", 0, encode_batch([b"c"]))
        assert len(asked) == 1 and third.base_offset == second.last_offset + 1


@pytest.mark.cluster
def test_a_refresh_asks_the_nodes_for_its_partition_alone(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold cache learns the whole topic from one node; a refresh (here after a
    NOT_LEADER that names no newer leader) asks every node for the one partition it
    routes, and the nodes answer that partition alone: the cache's other partitions stay
    as they were."""
    c = cluster
    c.create_topic("moved-refresh", 4)
    with Client(c.bootstrap) as client:
        answered = record_metadata(monkeypatch)
        first = client.produce("moved-refresh", 2, encode_batch([b"a"]))
        # The cold cache asked one node for the whole topic (and every node for
        # partition 2 only if that node had not yet heard who leads it).
        whole = [a for a in answered if a.request.partitions is None]
        assert len(whole) == 1 and len(whole[0].response.topics[0].partitions) == 4
        assert all(a.request.partitions == [2] for a in answered[1:])
        others = {p: client.partition_metadata("moved-refresh", p) for p in (0, 1, 3)}
        pm = client.partition_metadata("moved-refresh", 2)
        follower = next(r for r in pm.replicas if r != pm.leader_id)
        client._leaders[("moved-refresh", 2)] = replace(pm, leader_id=follower)
        answered.clear()
        second = client.produce("moved-refresh", 2, encode_batch([b"b"]))
        assert second.base_offset == first.last_offset + 1
        assert len(answered) == 3  # every node asked once
        for _, req, resp in answered:
            assert req.partitions == [2]
            assert [p.partition for p in resp.topics[0].partitions] == [2]
        assert client.partition_metadata("moved-refresh", 2).leader_id == pm.leader_id
        assert {p: client.partition_metadata("moved-refresh", p) for p in (0, 1, 3)} == others


@pytest.mark.cluster
def test_a_cold_cache_whose_one_node_fails_asks_every_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one node a cold cache picks is down: the client asks every node instead, and
    the produce goes through."""
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("t", 2)
        c.kill(3)
        dead = (c.host, c.ports[3])
        answered = record_metadata(monkeypatch)
        monkeypatch.setattr(
            client_module.random, "choice", lambda seq: dead if dead in seq else seq[0]
        )
        with Client(c.bootstrap) as client:
            result = client.produce("t", 0, encode_batch([b"a"]))
            assert result.last_offset == result.base_offset >= 0  # one record, appended
            # The whole topic came from every live node, once each (later refreshes, while
            # node 3's partitions find new leaders, ask for one partition).
            whole = sorted(a.port for a in answered if a.request.partitions is None)
            assert whole == sorted(c.ports[n] for n in (1, 2))
