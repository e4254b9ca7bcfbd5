"""The Spark side of quorumlog: ``spark.readStream.format("quorumlog")`` and
``spark.read.format("quorumlog")``, reading as a KIP-320 consumer-follower."""

from .batch import ending_offsets_json, next_offsets
from .offsets import Position, TopicPartition, offsets_json, parse_offsets_json
from .options import QuorumLogOptionError, SourceOptions, parse_options
from .schema import ARROW_SCHEMA, SPARK_SCHEMA
from .source import QuorumLogDataSource, register
from .truncation import LogTruncationException, TruncatedPartition
from .validation import QuorumLogSourceError

__all__ = [
    "ARROW_SCHEMA",
    "SPARK_SCHEMA",
    "LogTruncationException",
    "Position",
    "QuorumLogDataSource",
    "QuorumLogOptionError",
    "QuorumLogSourceError",
    "SourceOptions",
    "TopicPartition",
    "TruncatedPartition",
    "ending_offsets_json",
    "next_offsets",
    "offsets_json",
    "parse_offsets_json",
    "parse_options",
    "register",
]
