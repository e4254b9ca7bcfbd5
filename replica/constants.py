"""Values with one meaning on the wire, on disk and in memory, shared by every layer.

This module imports nothing, so storage, protocol, raft, client and node all use it.
"""

from __future__ import annotations

__all__ = ["CONSUMER_REPLICA_ID", "UNKNOWN", "or_unknown"]

# Kafka's -1 for "no value": no leader (id), no leader epoch, no offset, no timestamp, no
# node. Where a field may lack a value it holds UNKNOWN, never a literal -1. The raft core
# keeps unknown ids as None inside and turns them into UNKNOWN at its edges.
UNKNOWN = -1

# The replica id a consumer's Fetch carries (Kafka's CONSUMER_REPLICA_ID): served up to the
# high watermark and never counted as a follower.
CONSUMER_REPLICA_ID = -1


def or_unknown(value: int | None) -> int:
    """An id the core keeps as None when unknown, as the wire and disk spell it."""
    return UNKNOWN if value is None else value
