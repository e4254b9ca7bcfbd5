"""Spark discovers every top-level ``pyspark_*`` module exporting ``DefaultSource``."""

from quorumlog.connector.source import QuorumLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
