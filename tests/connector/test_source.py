"""QuorumLogDataSource entry points, without Spark: the checks Spark triggers at analysis
(``__init__``/``schema()``) and at reader creation."""

from __future__ import annotations

import pytest
from pyspark.sql.types import IntegerType, StructField, StructType
from quorumlog.connector import SPARK_SCHEMA, QuorumLogDataSource, QuorumLogOptionError
from quorumlog.connector.batch import QuorumLogBatchReader
from quorumlog.connector.stream import QuorumLogStreamReader

import pyspark_quorumlog

OPTS = {"bootstrap": "127.0.0.1:1", "topic": "events"}


def test_discovery_module_shape() -> None:
    # what pyspark.sql.worker.lookup_data_sources requires of a pyspark_* module
    assert pyspark_quorumlog.DefaultSource is QuorumLogDataSource
    assert QuorumLogDataSource.name() == "quorumlog"


def test_bad_option_fails_when_the_source_is_created() -> None:
    # parsed at construction, raised by the read methods (the writers take other options)
    source = QuorumLogDataSource({**OPTS, "fetchMaxBytes": "0"})
    for read in (source.schema, lambda: source.reader(None), lambda: source.streamReader(None)):
        with pytest.raises(QuorumLogOptionError, match="option 'fetchMaxBytes'"):
            read()


def test_readers_and_schema() -> None:
    ds = QuorumLogDataSource(dict(OPTS))
    assert ds.schema() == SPARK_SCHEMA
    assert isinstance(ds.reader(SPARK_SCHEMA), QuorumLogBatchReader)
    assert isinstance(ds.streamReader(SPARK_SCHEMA), QuorumLogStreamReader)


def test_user_schema_is_rejected() -> None:
    ds = QuorumLogDataSource(dict(OPTS))
    with pytest.raises(QuorumLogOptionError, match="fixed schema"):
        ds.reader(StructType([StructField("a", IntegerType())]))


def test_ending_offsets_is_batch_only() -> None:
    ds = QuorumLogDataSource({**OPTS, "endingOffsets": "latest"})
    assert isinstance(ds.reader(SPARK_SCHEMA), QuorumLogBatchReader)
    with pytest.raises(QuorumLogOptionError, match="'endingOffsets' is only for batch reads"):
        ds.streamReader(SPARK_SCHEMA)
