"""``quorumlog perf sink`` at a tiny size: both deliveries write every row, the ratio and
the read_committed latencies are reported."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.perf import sink as perf_sink

from tests.support.figures import is_number


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_both_deliveries_and_the_commit_latency(capsys: pytest.CaptureFixture[str]) -> None:
    rc = perf_sink.main(
        [
            "--records",
            "5000",
            "--rounds",
            "1",
            "--stream-seconds",
            "2",
            "--warmup-seconds",
            "1",
            "--stream-rate",
            "200",
            "--json",
        ]
    )
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["bench"] == "sink"
    # Each write was timed until a read_committed reader saw every row: the rates are
    # reported (the command prints them; a test does not judge a rate).
    for key in ("exactly_once_rows_per_s", "at_least_once_rows_per_s"):
        assert isinstance(figures[key], int), key
    assert isinstance(figures["exactly_once_vs_at_least_once"], float)
    assert len(figures["exactly_once_s"]) == len(figures["at_least_once_s"]) == 2
    assert figures["commits_seen"] >= 1 and figures["stream_rows"] > 0
    for key in (
        "written_to_visible_ms_p50",
        "written_to_visible_ms_p99",
        "end_to_end_ms_p50",
        "end_to_end_ms_p99",
        "at_least_once_end_to_end_ms_p50",
        "at_least_once_end_to_end_ms_p99",
    ):
        assert is_number(figures[key]), key
    assert figures["written_to_visible_ms_p50"] <= figures["written_to_visible_ms_p99"]
    assert figures["end_to_end_ms_p50"] <= figures["end_to_end_ms_p99"]
    p50, p99 = (figures[f"at_least_once_end_to_end_ms_{p}"] for p in ("p50", "p99"))
    assert p50 <= p99
