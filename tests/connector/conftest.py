"""Connector fixtures: real node processes (LocalCluster) on loopback, no fakes. The
module-scoped ``cluster`` comes from tests/support (via tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from quorumlog.connector import planning
from quorumlog.replica.client import DEFAULT_ATTEMPT_TIMEOUT_MS, Client


@pytest.fixture(scope="module")
def retention_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A cluster whose nodes roll 4 KiB segments and keep at most 8 KiB per partition (the
    node applies retention about every 5 s). Its fetch timeout is 6 s, so a leader whose
    followers stop resigns only after 9 s (1.5 x): long enough to look at records it holds
    beyond its high watermark."""
    from quorumlog.replica.node.cluster import LocalCluster

    with LocalCluster(
        3,
        tmp_path_factory.mktemp("retention"),
        node_args=[
            "--segment-bytes",
            "4096",
            "--retention-bytes",
            "8192",
            "--fetch-timeout-ms",
            "6000",
        ],
    ) as c:
        yield c


class RecordingClient(Client):
    """The real client, noting the OffsetsForLeaderEpoch requests it sends (to check when
    the reader validates a position)."""

    def __init__(self, *args: Any, requests: list[tuple[str, Any]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = requests

    def offsets_for_leader_epoch(  # type: ignore[override]
        self, topic: str, partition: int, leader_epoch: int, current_leader_epoch: int | None = None
    ) -> Any:
        self.requests.append(("ofle", (topic, partition, leader_epoch)))
        return super().offsets_for_leader_epoch(
            topic, partition, leader_epoch, current_leader_epoch=current_leader_epoch
        )


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every client the connector opens is a ``RecordingClient``; the list it records to."""
    seen: list[tuple[str, Any]] = []

    def connect(bootstrap: str, request_timeout_ms: int, role: str, *a: Any, **k: Any) -> Client:
        return RecordingClient(
            bootstrap,
            client_id=f"quorumlog-spark-{role}",
            request_timeout_ms=request_timeout_ms,
            attempt_timeout_ms=k.get("attempt_timeout_ms", DEFAULT_ATTEMPT_TIMEOUT_MS),
            requests=seen,
        )

    monkeypatch.setattr(planning, "connect", connect)
    return seen
