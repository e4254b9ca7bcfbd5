"""A NOT_LEADER answer that names the partition's leader (as Kafka's KIP-951): the client
retries there at once, without asking every node for the topic's metadata, which a
topic of thousands of partitions makes costly just when leadership moves."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import encode_batch


@pytest.mark.cluster
def test_a_not_leader_answer_naming_the_leader_is_followed_without_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("t", 1)
        with Client(c.bootstrap) as client:
            first = client.produce("t", 0, encode_batch([b"a"]))
            pm = client.partition_metadata("t", 0)
            follower = next(r for r in pm.replicas if r != pm.leader_id)
            # The cache as leadership moving leaves it: an older epoch, another node.
            stale = replace(pm, leader_id=follower, leader_epoch=pm.leader_epoch - 1)
            client._leaders[("t", 0)] = stale
            asked: list[Any] = []
            real = client.metadata

            def metadata(*args: Any, **kwargs: Any) -> Any:
                asked.append(args)
                return real(*args, **kwargs)

            monkeypatch.setattr(client, "metadata", metadata)
            second = client.produce("t", 0, encode_batch([b"b"]))
            assert asked == [], "the follower named the leader: no metadata was needed"
            assert second.base_offset == first.last_offset + 1
            now = client.partition_metadata("t", 0)
            assert (now.leader_id, now.leader_epoch) == (pm.leader_id, pm.leader_epoch)
            # A NOT_LEADER that names no newer leader than the cache is not followed: the
            # retry refreshes the metadata, as before.
            client._leaders[("t", 0)] = replace(pm, leader_id=follower)
            third = client.produce("t", 0, encode_batch([b"c"]))
            assert len(asked) == 1 and third.base_offset == second.last_offset + 1
