"""Connector fixtures: a fake client for unit tests (no cluster), a real LocalCluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from quorumlog.connector import planning

from .fakes import FakeCluster


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    """A fake cluster; every Client the connector opens talks to it."""
    cluster = FakeCluster()
    monkeypatch.setattr(planning, "connect", lambda *a, **k: cluster.client())
    return cluster


@pytest.fixture
def local_cluster(tmp_path: Any) -> Iterator[Any]:
    from quorumlog.replica.node.cluster import LocalCluster

    with LocalCluster(nodes=3, data_dir=tmp_path / "cluster") as cluster:
        yield cluster
