"""Which coordinator a key belongs to, as Kafka places them: a group id (key type 0) on a
partition of ``__consumer_offsets``, a transactional id (key type 1) on one of
``__transaction_state``, each ``abs(javaHashCode(key)) % partitions``; the partition's
leader coordinates it. The nodes and the native client both place keys so."""

from __future__ import annotations

# Kafka consumer groups' committed offsets (kafka_listener/groups.py), created on first use.
OFFSETS_TOPIC = "__consumer_offsets"
# Kafka transactions' coordinator state (kafka_listener/txn_coordinator.py), created on
# first use.
TXN_STATE_TOPIC = "__transaction_state"

GROUP_KEY_TYPE = 0  # FindCoordinator key_type: 0 group, 1 transaction
TXN_KEY_TYPE = 1


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, 32-bit wrap-around)."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % partitionCount`` (GroupMetadataManager's and
    TransactionStateManager's ``partitionFor``)."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions
