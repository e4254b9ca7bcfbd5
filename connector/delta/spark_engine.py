"""The Delta sink's commit through delta-spark (``DeltaSink(engine="delta-spark")``): the
batch's summary from a Spark aggregate (the rows stay distributed), the app transaction
from ``txnAppId``/``txnVersion``, the replace from ``replaceWhere``, the positions from
``userMetadata``."""

from __future__ import annotations

import json
import logging
from typing import Any

from .commits import CommitPlan, DeltaSinkError, PartitionRange

logger = logging.getLogger(__name__)

DELTA_SPARK_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


def delta_spark_available(spark: Any) -> bool:
    """True if the session is configured for delta-spark and its classes load."""
    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
        if DELTA_SPARK_EXTENSION not in extensions:
            return False
        jvm = spark.sparkContext._jvm
        jvm.java.lang.Class.forName(DELTA_SPARK_EXTENSION)
        return True
    except Exception:  # Spark Connect (no JVM), class not found, ...
        logger.debug("delta-spark is not usable in this session", exc_info=True)
        return False


def delta_spark_ranges(df: Any) -> tuple[PartitionRange, ...]:
    """The batch's summary per topic-partition from a Spark aggregate (empty: no rows).
    Raises if an offset appears twice."""
    from pyspark.sql import functions as F

    summary = (
        df.groupBy("topic", "partition")
        .agg(
            F.min("offset").alias("min_offset"),
            F.max("offset").alias("max_offset"),
            F.min_by("leaderEpoch", "offset").alias("first_epoch"),
            F.max_by("leaderEpoch", "offset").alias("last_epoch"),
            F.count("*").alias("rows"),
            F.count_distinct("offset").alias("distinct_offsets"),
        )
        .collect()
    )
    for s in summary:
        if s["rows"] != s["distinct_offsets"]:
            raise DeltaSinkError(
                f"The micro-batch holds an offset of {s['topic']}/{s['partition']} twice."
            )
    return tuple(
        PartitionRange(
            s["topic"],
            int(s["partition"]),
            int(s["min_offset"]),
            int(s["max_offset"]),
            int(s["first_epoch"]),
            int(s["last_epoch"]),
            int(s["rows"]),
        )
        for s in summary
    )


def write_delta_spark(df: Any, path: str, plan: CommitPlan, partition_by: list[str] | None) -> None:
    """The batch as one delta-spark commit: ``plan``'s app transaction and metadata, an
    append or (a truncation) a ``replaceWhere`` overwrite; ``partition_by`` for a new
    table."""
    writer = (
        df.write.format("delta")
        .option("txnAppId", plan.app_id)
        .option("txnVersion", plan.batch_id)
        .option("userMetadata", json.dumps(plan.metadata()))
    )
    if plan.replaces:
        writer = writer.mode("overwrite").option("replaceWhere", plan.predicate())
    else:
        writer = writer.mode("append")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(path)
