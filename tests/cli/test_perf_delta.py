"""``quorumlog perf delta`` at a tiny size, as its own process (it stops its SparkSession):
the log's records through the Delta sink and through Spark's Parquet writer, timed, and
the figures as one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.spark import SHORT_JVM


@pytest.mark.cluster
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_perf_delta_writes_both_ways_and_reports_the_ratio() -> None:
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        JAVA_TOOL_OPTIONS=SHORT_JVM,  # its Spark lives a minute on 20,000 rows
    )
    run = subprocess.run(
        [sys.executable, "-m", "quorumlog.replica.cli.main", "perf", "delta"]
        + ["--records", "20000", "--batch-records", "5000", "--nodes", "1", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=560,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "delta" and figures["records"] == 20000
    assert figures["delta_vs_parquet"] > 0 and len(figures["delta_s"]) == 2
