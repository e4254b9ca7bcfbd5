"""A local SparkSession on loopback, as the project's examples and demos build it: the
workers run this interpreter (``PYSPARK_PYTHON``) and Spark binds 127.0.0.1 only."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_spark_session(app: str, master: str = "local[2]", **conf: str) -> Any:
    """``SparkSession`` named ``app`` on ``master`` with the loopback settings, no UI and
    UTC session time; ``conf`` adds or overrides Spark settings (keys as Spark spells them,
    passed as a dict). Spark's own log level is ERROR (the examples print their report)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        **conf,
    }
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
