"""Spark for tests: the local SparkSession the suite shares (a session fixture), the
``format("quorumlog")`` reader, and Spark jobs run as their own process (local-cluster
mode: executors in their own JVMs), which print one ``RESULT <json>`` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Spark's Python workers must run this interpreter; Spark binds to loopback only. Set on
# import, so that job scripts importing build_spark_session get it too.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

REPO = Path(__file__).resolve().parents[2]

#: JVM options for a Spark application a test runs as its own process, which lives seconds
#: to a minute on little data: the quick compiler only and the serial collector (set as
#: JAVA_TOOL_OPTIONS, every JVM it starts takes them: driver, local-cluster executors).
#: Its start-up takes ~40% less wall time on a loaded 2-core machine, where the optimizing
#: compiler's threads compete with it. Not for the suite's long-lived session, nor a job
#: that computes long (test_distributed).
SHORT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_spark_session(master: str = "local[2]", app: str = "quorumlog-tests", **conf: str) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return (
        builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = build_spark_session()
    try:
        yield session
    finally:
        session.stop()


def source(spark: Any, cluster: Any, topic: str, *, stream: bool = False, **options: str) -> Any:
    """A ``format("quorumlog")`` DataFrame (batch, or streaming if ``stream``) of ``topic``."""
    reader = spark.readStream if stream else spark.read
    reader = (
        reader.format("quorumlog").option("bootstrap", cluster.bootstrap).option("topic", topic)
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def triples(df: Any) -> list[tuple[int, int, int, bytes]]:
    """(partition, offset, leaderEpoch, value) of every row, sorted."""
    return sorted(
        (r["partition"], r["offset"], r["leaderEpoch"], bytes(r["value"]))
        for r in df.select("partition", "offset", "leaderEpoch", "value").collect()
    )


def run_available_now(df: Any, out: Path, checkpoint: Path) -> Any:
    """Stream ``df`` into parquet at ``out`` with an availableNow trigger; the query, once
    it ended (or after 180 s); a failure is read through ``query.exception()``."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    except Exception:  # the failure is inspected through query.exception()
        pass
    return query


def run_spark_script(script: Path, timeout: float) -> Any:
    """Run a Spark job script as its own process (from the repository root, Spark on
    loopback); the JSON of the last ``RESULT <json>`` line it printed."""
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(lines[-1][len("RESULT ") :])
