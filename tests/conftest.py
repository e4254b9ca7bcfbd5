"""Shared fixtures: one real local SparkSession per test session, temp dirs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Spark's Python workers must run this interpreter; Spark binds to loopback only.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


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
