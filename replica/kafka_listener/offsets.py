"""The committed offsets of ``__consumer_offsets`` as the group coordinator keeps them
(``groups``): the records (an OffsetCommit's, and a
TxnOffsetCommit's that counts only once its transaction commits there), and the cache of
one partition."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import msgpack

from .internal_topics import loaded

OFFSET_KEY_VERSION = 1
TXN_OFFSET_KEY_VERSION = 2


@dataclass(frozen=True)
class Committed:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


def encode_offset_key(group_id: str, topic: str, partition: int) -> bytes:
    out: bytes = msgpack.packb([OFFSET_KEY_VERSION, group_id, topic, partition])
    return out


def encode_offset_value(c: Committed) -> bytes:
    out: bytes = msgpack.packb(
        {
            "offset": c.offset,
            "leader_epoch": c.leader_epoch,
            "metadata": c.metadata,
            "commit_timestamp": c.commit_timestamp,
        }
    )
    return out


def encode_txn_offset_key(
    group_id: str, topic: str, partition: int, producer_id: int, producer_epoch: int
) -> bytes:
    """The key of a transactional offset commit: it counts once its transaction's
    commit marker follows it in the partition."""
    out: bytes = msgpack.packb(
        [TXN_OFFSET_KEY_VERSION, group_id, topic, partition, producer_id, producer_epoch]
    )
    return out


def decode_txn_offset_record(
    key: bytes | None, value: bytes | None
) -> tuple[int, int, tuple[str, str, int], Committed] | None:
    """(producer id, producer epoch, (group, topic, partition), offset) of a
    transactional offset commit; None for a record of another kind."""
    if key is None or value is None:
        return None
    k = msgpack.unpackb(key, raw=False)
    if not isinstance(k, list) or len(k) != 6 or k[0] != TXN_OFFSET_KEY_VERSION:
        return None
    v = msgpack.unpackb(value, raw=False)
    committed = Committed(
        int(v["offset"]), int(v["leader_epoch"]), str(v["metadata"]), int(v["commit_timestamp"])
    )
    return int(k[4]), int(k[5]), (str(k[1]), str(k[2]), int(k[3])), committed


def decode_offset_record(
    key: bytes | None, value: bytes | None
) -> tuple[tuple[str, str, int], Committed | None] | None:
    """((group, topic, partition), committed or None for a deletion); None for a record
    of another kind (a later key version), which loading skips."""
    if key is None:
        return None
    k = msgpack.unpackb(key, raw=False)
    if not isinstance(k, list) or len(k) != 4 or k[0] != OFFSET_KEY_VERSION:
        return None
    ident = (str(k[1]), str(k[2]), int(k[3]))
    if value is None:
        return ident, None
    v = msgpack.unpackb(value, raw=False)
    return ident, Committed(
        int(v["offset"]), int(v["leader_epoch"]), str(v["metadata"]), int(v["commit_timestamp"])
    )


@dataclass
class OffsetsCache:
    """The committed offsets of ``__consumer_offsets`` partition ``partition``, as of its
    log in leader epoch ``epoch``."""

    partition: int
    epoch: int
    groups: dict[str, dict[tuple[str, int], Committed]] = field(default_factory=dict)
    task: asyncio.Task[bool] | None = None
    stale: bool = False  # a commit's outcome is unknown: reload before the next use
    # Transactional offset commits (TxnOffsetCommit) waiting for their transaction's
    # marker: producer id -> (producer epoch, offsets).
    pending: dict[int, tuple[int, dict[tuple[str, str, int], Committed]]] = field(
        default_factory=dict
    )

    @property
    def ready(self) -> bool:
        return loaded(self.task)

    def apply(self, ident: tuple[str, str, int], committed: Committed | None) -> None:
        group, topic, partition = ident
        if committed is None:
            offsets = self.groups.get(group)
            if offsets is not None:
                offsets.pop((topic, partition), None)
                if not offsets:
                    del self.groups[group]
        else:
            self.groups.setdefault(group, {})[(topic, partition)] = committed

    def add_pending(
        self, producer_id: int, producer_epoch: int, ident: tuple[str, str, int], c: Committed
    ) -> None:
        epoch, offsets = self.pending.get(producer_id, (producer_epoch, {}))
        if producer_epoch > epoch:
            offsets = {}  # a new epoch's transaction: the older one's were aborted
        elif producer_epoch < epoch:
            return  # a fenced producer's
        offsets[ident] = c
        self.pending[producer_id] = (producer_epoch, offsets)

    def end_pending(
        self, producer_id: int, producer_epoch: int, commit: bool
    ) -> dict[tuple[str, str, int], Committed]:
        """A transaction marker of ``producer_id``: its pending offsets become committed
        (only those of the marker's epoch: a fenced producer's never are) or are dropped.
        Returns those committed."""
        epoch, offsets = self.pending.pop(producer_id, (producer_epoch, {}))
        if not (commit and epoch == producer_epoch):
            return {}
        for ident, c in offsets.items():
            self.apply(ident, c)
        return offsets
