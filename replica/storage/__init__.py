"""Replica storage: record batches (Arrow IPC payloads), segmented log, leader-epoch
cache, the node's quorum-state journal (``quorum_journal``; the per-replica
``quorum-state`` file it replaced is still read, once, to migrate a data directory).
Disk only; imports nothing of quorumlog above it (only the leaf modules
``replica.constants`` and ``replica.defaults``).

``records`` is the one home of the record-batch format (header layout, CRCs, encode and
decode): the client, the producer, the Kafka codec and the connector import it from
here, and the raft core treats batches as opaque bytes."""

from . import errors, records, types
from .epoch_cache import CHECKPOINT_FILE, LeaderEpochCache
from .errors import *  # noqa: F403 (every storage error)
from .fdcache import FdCache, shared_cache
from .groupflush import GroupFlush, flush_logs, syncfs_available
from .log import CLEAN_SHUTDOWN_FILE, Log, LogConfig, PendingFlush
from .quorum_journal import QUORUM_JOURNAL_FILE, QuorumJournal
from .quorum_state import QUORUM_STATE_FILE, QuorumState, QuorumStateStore
from .records import *  # noqa: F403 (the record-batch format, re-exported whole)
from .types import *  # noqa: F403 (the value types the raft core shares)

__all__ = [
    *records.__all__,
    *types.__all__,
    *errors.__all__,
    "CHECKPOINT_FILE",
    "CLEAN_SHUTDOWN_FILE",
    "QUORUM_JOURNAL_FILE",
    "QUORUM_STATE_FILE",
    "FdCache",
    "GroupFlush",
    "LeaderEpochCache",
    "Log",
    "LogConfig",
    "PendingFlush",
    "QuorumJournal",
    "QuorumState",
    "QuorumStateStore",
    "flush_logs",
    "shared_cache",
    "syncfs_available",
]
