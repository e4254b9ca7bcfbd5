"""``quorumlog perf latency`` at a tiny size: every produced record is committed to Delta
and timed, and the figures come out as one JSON line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from quorumlog.replica.perf import latency as perf_latency

from tests.support.figures import assert_numbers


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_every_record_committed_and_timed(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # the test session's SparkSession is used, and left running
    rc = perf_latency.main(
        ["--rate", "20", "--duration", "2", "--partitions", "2", "--nodes", "1", "--json"]
    )
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["records"] == 40 and figures["partitions"] == 2
    assert_numbers(figures, "p50_ms", "p90_ms", "p99_ms", "max_ms")
    assert figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["trigger"] == "default"
    # where the micro-batches' time went, in Spark's own phases
    assert figures["batches"] >= 1
    assert_numbers(figures["batch_median_ms"], "addBatch")
    # the low-latency checkpoint writer was set for the run only
    assert figures["checkpoint_manager"] == "filesystem"
    assert spark.conf.get(perf_latency.CHECKPOINT_FILE_MANAGER_CONF, None) is None
    assert spark.range(3).count() == 3


def test_rate_and_duration_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        perf_latency.main(["--rate", "0"])
