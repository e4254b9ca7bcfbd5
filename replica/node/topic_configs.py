"""Per-topic configs, in Kafka's names: what a topic may set (at create, through
``quorumlog topic alter --config``, Kafka's CreateTopics, AlterConfigs and
IncrementalAlterConfigs), how a value is checked, and the storage settings a topic's
replicas then run with.

A topic's configs are strings as Kafka clients send them, kept in the metadata log with
the topic (a ``create_topic`` or ``alter_topic`` record carries them whole). A config the
topic does not set takes the node's value (``serve --retention-ms`` and friends), as a
Kafka topic takes the broker's ``log.*`` default.

* ``retention.ms`` / ``retention.bytes``: -1 is unlimited (Kafka's meaning);
* ``segment.bytes``: at least ``MIN_SEGMENT_BYTES``, at most 1 GiB (Kafka's bounds are
  14 bytes and 2 GiB; a segment of a few bytes means a file per batch);
* ``max.message.bytes``: the largest record batch a produce may carry (within the frame
  limit, as ``serve --max-message-bytes``);
* ``compression.type``: how the batches a Kafka producer sends rest on disk and travel
  between nodes, as Arrow IPC buffer compression: ``uncompressed``, ``lz4``, ``zstd``, or
  ``producer`` (Kafka's default: the producer's codec, where Arrow has it; gzip becomes
  zstd and snappy lz4, the nearest in ratio and speed). Readers decompress as they read
  (the Spark source, ``Client.fetch(...).to_arrow()``, a Kafka fetch).
* ``segment.ms``: roll the active segment once it is this old (at least 1 ms);
* compaction (docs/compaction.md): ``cleanup.policy`` (``delete``, ``compact`` or both,
  a comma list in any order), ``min.cleanable.dirty.ratio`` (0 to 1),
  ``min.compaction.lag.ms`` (>= 0) at most ``max.compaction.lag.ms`` (>= 1),
  ``delete.retention.ms`` (>= 0): Kafka's types and bounds. A Long.MAX_VALUE
  ``max.compaction.lag.ms`` or ``segment.ms`` is Kafka's "never" (None in ``LogConfig``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from ..storage import LogConfig, batches_to_table
from ..storage.errors import CorruptRecordError
from .config import check_max_message_bytes

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
SEGMENT_BYTES = "segment.bytes"
MAX_MESSAGE_BYTES = "max.message.bytes"
COMPRESSION_TYPE = "compression.type"
#: compression.type values (Kafka's names; gzip and snappy are not Arrow IPC codecs).
COMPRESSION_TYPES = ("producer", "uncompressed", "lz4", "zstd")
#: Kafka codec id -> the Arrow IPC codec a "producer" topic stores it with.
_PRODUCER_CODECS: dict[int, str | None] = {0: None, 1: "zstd", 2: "lz4", 3: "lz4", 4: "zstd"}

SEGMENT_MS = "segment.ms"
CLEANUP_POLICY = "cleanup.policy"
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MAX_COMPACTION_LAG_MS = "max.compaction.lag.ms"
DELETE_RETENTION_MS = "delete.retention.ms"
#: cleanup.policy's values, in the one spelling ``LogConfig`` carries.
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
#: Why a record is refused from a compacted topic (Kafka's INVALID_RECORD).
KEYLESS_RECORD = "compacted topic cannot accept a record without a key"

MIN_SEGMENT_BYTES = 1 << 14
MAX_SEGMENT_BYTES = 1 << 30
_LONG_MAX = (1 << 63) - 1


def _integer(name: str, value: str, low: int, high: int) -> tuple[int | None, str | None]:
    try:
        number = int(value.strip())
    except ValueError:
        return None, f"{name} must be an integer, got {value!r}"
    if not low <= number <= high:
        return None, f"{name} must be in [{low}, {high}], got {number}"
    return number, None


def _unlimited_or_positive(name: str) -> Callable[[str, int], str | None]:
    def check(value: str, max_frame_bytes: int) -> str | None:
        number, problem = _integer(name, value, -1, _LONG_MAX)
        if problem is None and number == 0:
            problem = f"{name} must be -1 (unlimited) or positive, got 0"
        return problem

    return check


def _long_at_least(name: str, low: int) -> Callable[[str, int], str | None]:
    def check(value: str, max_frame_bytes: int) -> str | None:
        return _integer(name, value, low, _LONG_MAX)[1]

    return check


def cleanup_policy(value: str) -> str | None:
    """``value`` (a comma list of compact and delete, in any order, as Kafka takes it)
    in its one spelling (``CLEANUP_POLICIES``), or None if it is not a policy."""
    parts = {p.strip() for p in value.split(",")}
    if not parts <= {"compact", "delete"}:
        return None
    return ",".join(sorted(parts))


def is_compacted(policy: str) -> bool:
    """Whether a topic of this cleanup.policy keeps the latest record of each key (and so
    refuses records without one)."""
    return "compact" in policy.split(",")


def keyless_record(policy: str, records: bytes) -> str | None:
    """Why a produce's ``records`` cannot go to a topic of cleanup.policy ``policy``: a
    record without a key on a compacted topic (the cleaner keeps one record per key, so
    Kafka refuses these with INVALID_RECORD). None if they can; malformed batches are
    left to the append to refuse."""
    if not is_compacted(policy):
        return None
    try:
        keys = batches_to_table(records, verify_crc=False).column("key")
    except CorruptRecordError:
        return None
    missing = keys.null_count
    if not missing:
        return None
    return f"{KEYLESS_RECORD} ({missing} of {len(keys)} records have none)"


def _cleanup_policy(value: str, max_frame_bytes: int) -> str | None:
    if cleanup_policy(value) is not None:
        return None
    return f"{CLEANUP_POLICY} must be delete, compact or compact,delete, got {value!r}"


def _dirty_ratio(value: str, max_frame_bytes: int) -> str | None:
    try:
        ratio = float(value.strip())
    except ValueError:
        return f"{MIN_CLEANABLE_DIRTY_RATIO} must be a number, got {value!r}"
    if not 0.0 <= ratio <= 1.0:  # NaN fails this too
        return f"{MIN_CLEANABLE_DIRTY_RATIO} must be in [0, 1], got {value!r}"
    return None


def _segment_bytes(value: str, max_frame_bytes: int) -> str | None:
    return _integer(SEGMENT_BYTES, value, MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES)[1]


def _max_message_bytes(value: str, max_frame_bytes: int) -> str | None:
    number, problem = _integer(MAX_MESSAGE_BYTES, value, 1, _LONG_MAX)
    if problem is not None or number is None:
        return problem
    return check_max_message_bytes(number, max_frame_bytes, MAX_MESSAGE_BYTES)


def _compression_type(value: str, max_frame_bytes: int) -> str | None:
    if value in COMPRESSION_TYPES:
        return None
    return (
        f"{COMPRESSION_TYPE} must be one of {', '.join(COMPRESSION_TYPES)} (Arrow IPC "
        f"compresses with lz4 or zstd), got {value!r}"
    )


def stored_compression(configs: Mapping[str, str], kafka_codec: int) -> str | None:
    """The Arrow IPC codec (None: uncompressed) a batch a Kafka producer compressed with
    ``kafka_codec`` is stored with, under the topic's ``compression.type``."""
    wanted = configs.get(COMPRESSION_TYPE, "producer")
    if wanted == "producer":
        return _PRODUCER_CODECS.get(kafka_codec)
    return None if wanted == "uncompressed" else wanted


#: Every config a topic may set, and its check (value, the node's frame limit) -> problem.
CHECKS: dict[str, Callable[[str, int], str | None]] = {
    RETENTION_MS: _unlimited_or_positive(RETENTION_MS),
    RETENTION_BYTES: _unlimited_or_positive(RETENTION_BYTES),
    SEGMENT_BYTES: _segment_bytes,
    MAX_MESSAGE_BYTES: _max_message_bytes,
    COMPRESSION_TYPE: _compression_type,
    SEGMENT_MS: _long_at_least(SEGMENT_MS, 1),
    CLEANUP_POLICY: _cleanup_policy,
    MIN_CLEANABLE_DIRTY_RATIO: _dirty_ratio,
    MIN_COMPACTION_LAG_MS: _long_at_least(MIN_COMPACTION_LAG_MS, 0),
    MAX_COMPACTION_LAG_MS: _long_at_least(MAX_COMPACTION_LAG_MS, 1),
    DELETE_RETENTION_MS: _long_at_least(DELETE_RETENTION_MS, 0),
}


def config_problem(configs: Mapping[str, str | None], max_frame_bytes: int) -> str | None:
    """Why these configs cannot be set (a name not served, a value out of bounds), or
    None. A None value is a deletion (back to the node's value), always allowed."""
    unknown = sorted(set(configs) - set(CHECKS))
    if unknown:
        return f"configs {unknown} are not served (a topic may set {sorted(CHECKS)})"
    for name, value in configs.items():
        if value is not None:
            problem = CHECKS[name](value, max_frame_bytes)
            if problem is not None:
                return problem
    low, high = configs.get(MIN_COMPACTION_LAG_MS), configs.get(MAX_COMPACTION_LAG_MS)
    if low is not None and high is not None and int(low) > int(high):
        # Kafka's LogConfig.validateValues.
        return (
            f"conflict topic config setting {MIN_COMPACTION_LAG_MS} ({low.strip()}) > "
            f"{MAX_COMPACTION_LAG_MS} ({high.strip()})"
        )
    return None


def node_config_problem(values: Mapping[str, object]) -> str | None:
    """Why a node's defaults of these topic configs (``serve`` flags: None is
    "unlimited"/"never") are not allowed, or None: the topics' checks."""
    return config_problem(
        {name: None if v is None else str(v) for name, v in values.items()}, 1 << 62
    )


def log_config_for(base: LogConfig, configs: Mapping[str, str]) -> LogConfig:
    """The storage settings of a topic's replicas: the node's ``base`` with what the
    topic sets (checked values: see ``config_problem``)."""
    if not configs:
        return base

    def retention(name: str, default: int | None) -> int | None:
        if name not in configs:
            return default
        number = int(configs[name])
        return None if number < 0 else number

    def never_at_max(name: str, default: int | None) -> int | None:
        if name not in configs:
            return default
        number = int(configs[name])
        return None if number >= _LONG_MAX else number

    policy = cleanup_policy(configs[CLEANUP_POLICY]) if CLEANUP_POLICY in configs else None
    return dataclasses.replace(
        base,
        retention_ms=retention(RETENTION_MS, base.retention_ms),
        retention_bytes=retention(RETENTION_BYTES, base.retention_bytes),
        segment_bytes=int(configs.get(SEGMENT_BYTES, base.segment_bytes)),
        segment_ms=never_at_max(SEGMENT_MS, base.segment_ms),
        cleanup_policy=policy or base.cleanup_policy,
        min_cleanable_dirty_ratio=float(
            configs.get(MIN_CLEANABLE_DIRTY_RATIO, base.min_cleanable_dirty_ratio)
        ),
        min_compaction_lag_ms=int(configs.get(MIN_COMPACTION_LAG_MS, base.min_compaction_lag_ms)),
        max_compaction_lag_ms=never_at_max(MAX_COMPACTION_LAG_MS, base.max_compaction_lag_ms),
        delete_retention_ms=int(configs.get(DELETE_RETENTION_MS, base.delete_retention_ms)),
    )
