"""``quorumlog perf delta`` at a tiny size, in the suite's Spark session (the command uses
a session already running in its process and leaves it running): the log's records
through the Delta sink and through Spark's Parquet writer, timed, and the figures as one
JSON line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from quorumlog.replica.perf import delta as perf_delta

from tests.support.figures import assert_numbers, is_number


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_perf_delta_writes_both_ways_and_reports_the_ratio(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = perf_delta.main(
        ["--records", "20000", "--batch-records", "5000", "--nodes", "1", "--json"]
    )
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["bench"] == "delta" and figures["records"] == 20000
    assert len(figures["delta_s"]) == 2 and all(is_number(s) for s in figures["delta_s"])
    assert_numbers(figures, "delta_vs_parquet")
    assert figures["master"] == spark.sparkContext.master
    # the suite's session is the one it used, and it is left running for the next test
    assert spark.range(3).count() == 3
