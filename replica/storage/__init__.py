"""Replica storage: record batches (Arrow IPC payloads), segmented log, leader-epoch
cache and the quorum-state file. Disk only; imports nothing of quorumlog above it (only
the leaf modules ``replica.constants`` and ``replica.defaults``).

``records`` is the one home of the record-batch format (header layout, CRCs, encode and
decode): the client, the producer, the Kafka codec and the connector import it from
here, and the raft core treats batches as opaque bytes."""

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
from .types import (
    CATCH_UP_UNKNOWN,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AppendInfo,
    EpochEndOffset,
    OffsetAndEpoch,
)

__all__ = [
    "CATCH_UP_UNKNOWN",
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
