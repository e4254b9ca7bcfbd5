"""Replica storage: record batches (Arrow IPC payloads), segmented log, leader-epoch
cache and the quorum-state file. Disk only; imports nothing else of quorumlog."""

from .epoch_cache import CHECKPOINT_FILE, LeaderEpochCache
from .errors import (
    CorruptCheckpointError,
    CorruptDataError,
    CorruptLogError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    StorageError,
)
from .log import CLEAN_SHUTDOWN_FILE, Log, LogConfig
from .quorum_state import QUORUM_STATE_FILE, QuorumState, QuorumStateStore
from .records import (
    CONTROL_FLAG,
    HEADER_SIZE,
    OUTPUT_SCHEMA,
    RECORD_SCHEMA,
    BatchHeader,
    LeaderChange,
    batches_to_table,
    decode_leader_change,
    encode_arrow,
    encode_batch,
    encode_control_batch,
    iter_batches,
    parse_header,
    restamp_header,
    rewrite_header,
    validate_arrow,
    validate_payload,
)
from .types import UNDEFINED_EPOCH, UNDEFINED_OFFSET, AppendInfo, EpochEndOffset, OffsetAndEpoch

__all__ = [
    "CHECKPOINT_FILE",
    "CLEAN_SHUTDOWN_FILE",
    "CONTROL_FLAG",
    "HEADER_SIZE",
    "OUTPUT_SCHEMA",
    "QUORUM_STATE_FILE",
    "RECORD_SCHEMA",
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "AppendInfo",
    "BatchHeader",
    "CorruptCheckpointError",
    "CorruptDataError",
    "CorruptLogError",
    "CorruptRecordError",
    "EpochEndOffset",
    "LeaderChange",
    "LeaderEpochCache",
    "Log",
    "LogConfig",
    "OffsetAndEpoch",
    "OffsetOutOfRangeError",
    "QuorumState",
    "QuorumStateStore",
    "StorageError",
    "batches_to_table",
    "decode_leader_change",
    "encode_arrow",
    "encode_batch",
    "encode_control_batch",
    "iter_batches",
    "parse_header",
    "restamp_header",
    "rewrite_header",
    "validate_arrow",
    "validate_payload",
]
