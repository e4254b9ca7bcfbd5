"""``QuorumLogDataSource``: format "quorumlog" for ``spark.read`` and ``spark.readStream``.

Installing the package is enough: Spark imports every top-level ``pyspark_*`` module on
the Python path and registers its ``DefaultSource`` under ``name()``; the top-level module
``pyspark_quorumlog`` exports this class. ``register(spark)`` does the same explicitly.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .batch import QuorumLogBatchReader
from .options import QuorumLogOptionError, SourceOptions, parse_options
from .schema import SPARK_SCHEMA, schema_matches
from .sink import (
    QuorumLogBatchWriter,
    QuorumLogStreamWriter,
    check_sink_schema,
    sink_options,
)
from .stream import QuorumLogStreamReader


class QuorumLogDataSource(DataSource):  # type: ignore[misc]
    """Reads a quorumlog topic as a KIP-320 consumer-follower.

    Options: bootstrap (required), topic | topicPattern, startingOffsets, endingOffsets
    (batch only), startingTimestamp, startingOffsetsByTimestamp, endingTimestamp and
    endingOffsetsByTimestamp (batch only), includeHeaders, maxOffsetsPerTrigger,
    minPartitions, maxRecordsPerPartition, onTruncation (fail | resume), failOnDataLoss,
    fetchMaxBytes, requestTimeoutMs. See the README's connector section."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # Read options are parsed here, when the DataFrame is defined. A write has options
        # of its own (no 'topic' needed with a topic column), so a read-option error is
        # raised by the read methods (schema() runs at load()), not by the writers.
        self._source_options: SourceOptions | None = None
        self._read_error: QuorumLogOptionError | None = None
        try:
            self._source_options = parse_options(options)
        except QuorumLogOptionError as exc:
            self._read_error = exc

    @property
    def source_options(self) -> SourceOptions:
        if self._source_options is None:
            assert self._read_error is not None
            raise self._read_error
        return self._source_options

    @classmethod
    def name(cls) -> str:
        return "quorumlog"

    def schema(self) -> StructType:
        self.source_options  # noqa: B018 (parse now: bad read options fail at load())
        return SPARK_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> QuorumLogBatchWriter:
        opts = sink_options(self.options)
        check_sink_schema(schema, opts.topic)
        return QuorumLogBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> QuorumLogStreamWriter:
        opts = sink_options(self.options)
        check_sink_schema(schema, opts.topic)
        return QuorumLogStreamWriter(opts)

    def _check_schema(self, schema: Any) -> None:
        if schema is not None and not schema_matches(schema):
            raise QuorumLogOptionError(
                "The quorumlog source has a fixed schema and cannot be read with a "
                f"user-specified one ({schema.simpleString() if hasattr(schema, 'simpleString') else schema}). "
                f"Remove .schema(...); the schema is {SPARK_SCHEMA.simpleString()}."
            )

    def reader(self, schema: StructType) -> QuorumLogBatchReader:
        self._check_schema(schema)
        return QuorumLogBatchReader(self.source_options)

    def streamReader(self, schema: StructType) -> QuorumLogStreamReader:
        self._check_schema(schema)
        if self.source_options.ending_timestamps is not None:
            raise QuorumLogOptionError(
                "Options 'endingTimestamp' and 'endingOffsetsByTimestamp' are only for batch "
                "reads (spark.read); a streaming query reads until it is stopped."
            )
        if self.source_options.ending_offsets is not None:
            raise QuorumLogOptionError(
                "Option 'endingOffsets' is only for batch reads (spark.read); a streaming "
                "query reads until it is stopped (use Trigger.AvailableNow to stop at the "
                "data present when the query starts)."
            )
        return QuorumLogStreamReader(self.source_options)


def register(spark: Any) -> None:
    """Register format "quorumlog" explicitly (discovery via pyspark_quorumlog makes this
    unnecessary once the package is installed)."""
    spark.dataSource.register(QuorumLogDataSource)
