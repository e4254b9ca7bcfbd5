"""Secured clusters shared by the security tests (real processes, real TLS)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from quorumlog.replica.node.cluster import LocalCluster

PRINCIPALS = {
    "ingest": ("producer", ["granted*"]),
    "reader": ("consumer", ["granted"]),
}


@pytest.fixture(scope="package")
def secure_cluster() -> Iterator[LocalCluster]:
    """Three nodes, TLS + SCRAM; raft between them authenticates as node principals."""
    with LocalCluster(3, secure=True, principals=PRINCIPALS, log_level="INFO") as cluster:
        cluster.create_topic("granted", 1)
        cluster.create_topic("other", 1)
        cluster.produce("granted", 0, [b"a", b"b", b"c"])
        cluster.produce("other", 0, [b"x"])
        yield cluster
