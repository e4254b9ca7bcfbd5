"""``quorumlog perf reassign`` at a tiny size: the move completes under the produce load
and every figure the issue names is in the final JSON line."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.cli.main import PERF
from quorumlog.replica.perf import reassign as perf_reassign

from tests.support.figures import assert_numbers


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_perf_reassign_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    assert PERF["reassign"] == "reassign"
    # Producers at a set rate: as fast as acknowledged, the new replicas, on the same two
    # cores and disk as the old, may never catch up, and the disk fills.
    rc = perf_reassign.main(
        [
            *("--topic-mb", "2", "--partitions", "2", "--measure-s", "1"),
            *("--produce-mb-per-s", "4", "--in-flight", "2"),
            "--json",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # --json: the JSON line only
    figures = json.loads(lines[-1])
    assert rc == 0 and figures["bench"] == "reassign" and figures["moved"] is True
    assert figures["in_flight"] == 2
    # Both replicas of each partition were copied: at least the topic's 2 MB, twice.
    assert figures["moved_bytes"] >= 2 * 2 * 1024 * 1024
    assert_numbers(
        figures, "moved_mb_per_s", "produce_rec_per_s_before", "produce_rec_per_s_during"
    )
    windows = figures["produce_rec_per_s_during_windows"]
    assert windows and min(windows) <= figures["produce_rec_per_s_during"] <= max(windows)
    assert len(figures["steal_pct_during_windows"]) == len(windows)
    # The machine's limit beside them: the rate into a topic of three replicas; and the
    # rate alone again once moved.
    assert_numbers(
        figures,
        "produce_rec_per_s_three_replicas",
        "during_vs_three_replicas",
        "produce_rec_per_s_after",
    )
    # The host's share of the CPUs in each measure, and the rates compared over what is left.
    for phase in ("before", "three_replicas", "during", "after"):
        assert 0 <= figures[f"steal_pct_{phase}"] <= 100  # a share, by its definition
    assert_numbers(figures, "during_vs_before_given_cpu")
    # Every partition ends led by a replica the move added: an election each at least.
    assert figures["elections"] >= 2
    # How long a partition went without a leader and a node's longest answer to the probe
    # are figures (a loaded machine stretches both): reported, from samples taken.
    assert figures["leader_samples"] > 0 and isinstance(figures["max_leaderless_s"], float | int)
    assert isinstance(figures["max_node_answer_ms"], int)  # reported, not judged
