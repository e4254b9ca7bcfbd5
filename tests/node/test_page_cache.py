"""``serve --page-cache drop``: the nodes' synced log pages leave the page cache (the
memory is reused at once, not left for the kernel to reclaim), and every record still
reads back, from the disk."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.cluster import read_all
from tests.support.pages import resident_pages
from tests.support.waits import wait_until

pytestmark = pytest.mark.cluster

RECORDS = 20_000


def _cached_share(c: LocalCluster, topic: str) -> float:
    """The share of the topic's segment pages, on every node, in the page cache."""
    resident = pages = 0
    for node in (1, 2, 3):
        for segment in c.node_dir(node).rglob(f"{topic}-0/*.log"):
            r, p = resident_pages(segment)
            resident, pages = resident + r, pages + p
    assert pages > 0
    return resident / pages


@pytest.mark.parametrize("page_cache", ["keep", "drop"])
def test_synced_pages_leave_the_page_cache_with_drop(tmp_path: Path, page_cache: str) -> None:
    with LocalCluster(3, tmp_path, node_args=["--page-cache", page_cache]) as c:
        c.create_topic("t", 1)
        c.wait_for_leader("t", 0, 60)
        sent = [b"%090d" % i for i in range(RECORDS)]
        with Client(c.bootstrap) as client:
            producer = Producer(client)
            for value in sent:
                producer.send("t", value, partition=0)
            producer.close(60)
            if page_cache == "drop":  # each node drops what its flusher synced
                wait_until(lambda: _cached_share(c, "t") < 0.1, 10, "the pages dropped")
            else:
                time.sleep(1)  # as long for the nodes to flush: the kernel keeps the pages
                assert _cached_share(c, "t") > 0.9
            read = [value for _, _, value in read_all(client, "t", 0)]
        assert read == sent
