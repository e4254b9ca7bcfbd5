"""The sink's default divergence resolver asks the real cluster (OffsetsForLeaderEpoch)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from quorumlog.connector.delta import DeltaSink, LogDivergenceResolver, Position
from quorumlog.replica.node.cluster import LocalCluster


@pytest.mark.cluster
def test_resolver_answers_with_the_log_end_of_the_epoch(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path / "cluster") as c:
        c.create_topic("r", 1)
        acked = c.produce("r", 0, [b"a", b"b", b"c"])
        epoch = acked[-1].epoch
        end = acked[-1].offset + 1
        resolver = pickle.loads(pickle.dumps(LogDivergenceResolver(c.bootstrap)))
        # A table that believes it holds offsets up to end + 50 in this epoch: the log
        # ends this epoch at `end`, so everything from there on must be replaced.
        assert resolver("r", 0, Position(end + 50, epoch)) == end
        # Nothing diverged below the table's position.
        assert resolver("r", 0, Position(end - 1, epoch)) == end - 1
        # A position without an epoch cannot be resolved.
        assert resolver("r", 0, Position(end, -1)) is None
        sink = DeltaSink(tmp_path / "table", bootstrap=c.bootstrap)
        assert isinstance(sink.resolve_divergence, LogDivergenceResolver)
