"""Kafka's transaction coordinator, its pure part (KIP-98, KIP-360, KIP-447): what a
transactional id's state is, how it is written to the transaction-state topic, and what
each request does to it. The listener (``kafka_listener.txn_coordinator``) does the I/O:
it writes each new state to the topic (acks=quorum) before acting on it, and sends the
markers.

States, as Kafka's ``TransactionState``::

    Empty --AddPartitions/AddOffsets--> Ongoing --EndTxn--> PrepareCommit | PrepareAbort
    PrepareCommit --markers written--> CompleteCommit   (and Abort alike)
    Complete* --AddPartitions--> Ongoing;  any but Prepare* --InitProducerId--> Empty

A Prepare* state is the decision: once it is in the topic, a new coordinator (a leader
change of the topic's partition) finishes it, whatever happened to the old one.

Records: key msgpack ``[0, transactional_id]``; value msgpack map (``producer_id``,
``producer_epoch``, ``timeout_ms``, ``state``, ``partitions`` [[topic, partition]],
``started_ms``, ``updated_ms``: wall-clock ms). The last record of a key wins.

**Transaction groups** (quorumlog's, for writers whose tasks each have a producer, as a
Spark sink's): the transactions of ids ``G#member`` belong to group ``G`` and are
coordinated with it (their partition is ``G``'s). ``group_commit`` decides a group's
batch at once: every member named commits, or all abort, in one record batch appended to
the coordinator's partition (atomic: each member's Prepare* record and the group's fence,
key ``[1, G]``, value ``{"batch": b}``, the last batch committed). A batch at or below the
fence is decided already: its members abort (a replay writes nothing visible again).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum

import msgpack

from .errors import KafkaError

__all__ = [
    "MAX_PRODUCER_EPOCH",
    "FENCE_KEY_VERSION",
    "TXN_KEY_VERSION",
    "Decision",
    "TxnMetadata",
    "TxnState",
    "add_partitions",
    "begin_abort_on_timeout",
    "check_producer",
    "complete",
    "decode_fence_record",
    "decode_txn_record",
    "encode_fence_key",
    "encode_fence_value",
    "encode_txn_key",
    "encode_txn_value",
    "end_txn",
    "group_commit",
    "group_of",
    "init_producer_id",
    "names_another_producer",
]

TXN_KEY_VERSION = 0
FENCE_KEY_VERSION = 1
#: Separates a transaction group from its member in a transactional id (``G#member``).
GROUP_SEPARATOR = "#"
#: A producer epoch is an int16; past the last one a transactional id gets a new id.
MAX_PRODUCER_EPOCH = (1 << 15) - 1


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5

    @property
    def kafka_name(self) -> str:
        """As DescribeTransactions and ListTransactions name it."""
        return "".join(word.capitalize() for word in self.name.split("_"))

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[Partition] = frozenset()
    started_ms: int = -1  # when the ongoing transaction began (wall clock), else -1
    updated_ms: int = -1


@dataclass(frozen=True, slots=True)
class Decision:
    """What a request does: the error to answer, else the state to write first (None:
    nothing to write) and, for a transaction to end, its markers' outcome."""

    error: KafkaError = KafkaError.NONE
    write: TxnMetadata | None = None


def encode_txn_key(transactional_id: str) -> bytes:
    out: bytes = msgpack.packb([TXN_KEY_VERSION, transactional_id])
    return out


def encode_txn_value(meta: TxnMetadata) -> bytes:
    out: bytes = msgpack.packb(
        {
            "producer_id": meta.producer_id,
            "producer_epoch": meta.producer_epoch,
            "timeout_ms": meta.timeout_ms,
            "state": int(meta.state),
            "partitions": sorted([t, p] for t, p in meta.partitions),
            "started_ms": meta.started_ms,
            "updated_ms": meta.updated_ms,
        }
    )
    return out


def decode_txn_record(
    key: bytes | None, value: bytes | None
) -> tuple[str, TxnMetadata | None] | None:
    """(transactional id, its state or None for a deletion); None for a record of
    another kind (a later key version), which loading skips. Raises ValueError,
    KeyError or msgpack's errors on a damaged record."""
    if key is None:
        return None
    k = msgpack.unpackb(key, raw=False)
    if not isinstance(k, list) or len(k) != 2 or k[0] != TXN_KEY_VERSION:
        return None
    tid = str(k[1])
    if value is None:
        return tid, None
    v = msgpack.unpackb(value, raw=False)
    return tid, TxnMetadata(
        tid,
        int(v["producer_id"]),
        int(v["producer_epoch"]),
        int(v["timeout_ms"]),
        TxnState(int(v["state"])),
        frozenset((str(t), int(p)) for t, p in v["partitions"]),
        int(v["started_ms"]),
        int(v["updated_ms"]),
    )


def group_of(transactional_id: str) -> str:
    """The transaction group an id belongs to (itself for a plain id): the key its
    coordinator is placed by."""
    return transactional_id.partition(GROUP_SEPARATOR)[0]


def encode_fence_key(group: str) -> bytes:
    out: bytes = msgpack.packb([FENCE_KEY_VERSION, group])
    return out


def encode_fence_value(batch: int) -> bytes:
    out: bytes = msgpack.packb({"batch": batch})
    return out


def decode_fence_record(key: bytes | None, value: bytes | None) -> tuple[str, int] | None:
    """(group, last batch committed) of a fence record; None for another kind."""
    if key is None or value is None:
        return None
    k = msgpack.unpackb(key, raw=False)
    if not isinstance(k, list) or len(k) != 2 or k[0] != FENCE_KEY_VERSION:
        return None
    return str(k[1]), int(msgpack.unpackb(value, raw=False)["batch"])


def check_producer(meta: TxnMetadata | None, producer_id: int, producer_epoch: int) -> KafkaError:
    """Whether a request naming (``producer_id``, ``producer_epoch``) speaks for the
    transactional id's current producer: an older epoch is a fenced zombie."""
    if meta is None or meta.producer_id != producer_id:
        return KafkaError.INVALID_PRODUCER_ID_MAPPING
    if producer_epoch != meta.producer_epoch:
        return KafkaError.PRODUCER_FENCED
    return KafkaError.NONE


def names_another_producer(meta: TxnMetadata | None, expected: tuple[int, int]) -> bool:
    """An InitProducerId naming (id, epoch) (KIP-360) that are not the id's current
    producer: a zombie of an earlier epoch, fenced (PRODUCER_FENCED), which must not
    touch the live producer's transaction."""
    pid, epoch = expected
    return pid >= 0 and meta is not None and (pid, epoch) != (meta.producer_id, meta.producer_epoch)


def init_producer_id(
    meta: TxnMetadata | None,
    transactional_id: str,
    timeout_ms: int,
    expected: tuple[int, int],
    new_producer_id: int,
    now_ms: int,
) -> Decision:
    """InitProducerId with a transactional id. ``expected``: the (id, epoch) the client
    names (KIP-360; (-1, -1): none); ``new_producer_id``: an id to take if one is needed.
    An ongoing transaction is not handled here: the caller aborts it first
    (``begin_abort_on_timeout`` with the epoch bumped), then asks again."""
    if meta is not None and meta.state.preparing:
        return Decision(KafkaError.CONCURRENT_TRANSACTIONS)
    if names_another_producer(meta, expected):
        return Decision(KafkaError.PRODUCER_FENCED)
    if meta is None or meta.producer_epoch >= MAX_PRODUCER_EPOCH:
        producer_id, producer_epoch = new_producer_id, 0
    else:
        producer_id, producer_epoch = meta.producer_id, meta.producer_epoch + 1
    return Decision(
        write=TxnMetadata(
            transactional_id,
            producer_id,
            producer_epoch,
            timeout_ms,
            TxnState.EMPTY,
            frozenset(),
            -1,
            now_ms,
        )
    )


def add_partitions(
    meta: TxnMetadata | None,
    producer_id: int,
    producer_epoch: int,
    partitions: frozenset[Partition],
    now_ms: int,
) -> Decision:
    """AddPartitionsToTxn (and AddOffsetsToTxn, whose partition is the group's offsets
    partition): the transaction is ongoing from here and holds these partitions."""
    error = check_producer(meta, producer_id, producer_epoch)
    if error != KafkaError.NONE:
        return Decision(error)
    assert meta is not None
    if meta.state.preparing:
        return Decision(KafkaError.CONCURRENT_TRANSACTIONS)
    if meta.state == TxnState.ONGOING and partitions <= meta.partitions:
        return Decision()
    ongoing = meta.state == TxnState.ONGOING
    return Decision(
        write=replace(
            meta,
            state=TxnState.ONGOING,
            partitions=(meta.partitions if ongoing else frozenset()) | partitions,
            started_ms=meta.started_ms if ongoing else now_ms,
            updated_ms=now_ms,
        )
    )


def end_txn(
    meta: TxnMetadata | None, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
) -> Decision:
    """EndTxn: the decision (Prepare*) to write; a retry of a transaction already ended
    the same way succeeds with nothing to write."""
    error = check_producer(meta, producer_id, producer_epoch)
    if error != KafkaError.NONE:
        return Decision(error)
    assert meta is not None
    done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    if meta.state == done:
        return Decision()
    if meta.state == preparing:
        return Decision(KafkaError.CONCURRENT_TRANSACTIONS)
    if meta.state != TxnState.ONGOING:
        return Decision(KafkaError.INVALID_TXN_STATE)
    return Decision(write=replace(meta, state=preparing, updated_ms=now_ms))


def begin_abort_on_timeout(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """The PrepareAbort of an ongoing transaction the coordinator ends itself (its
    timeout passed, or a new producer of the id initialises): the epoch is bumped, so
    the markers fence the producer that began it on every partition it wrote."""
    return replace(
        meta,
        producer_epoch=meta.producer_epoch + 1,
        state=TxnState.PREPARE_ABORT,
        updated_ms=now_ms,
    )


def complete(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """The Complete* state once every marker of a Prepare* state is written."""
    assert meta.state.preparing
    state = (
        TxnState.COMPLETE_COMMIT
        if meta.state == TxnState.PREPARE_COMMIT
        else (TxnState.COMPLETE_ABORT)
    )
    return replace(meta, state=state, partitions=frozenset(), started_ms=-1, updated_ms=now_ms)


def expired(meta: TxnMetadata, now_ms: int) -> bool:
    """An ongoing transaction past its timeout (the coordinator aborts it)."""
    return meta.state == TxnState.ONGOING and now_ms > meta.started_ms + meta.timeout_ms


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """``group_commit``'s outcome: the error to answer, the members' states to write
    (with the fence, if it moves, in one batch) and the fence after it."""

    error: KafkaError
    writes: tuple[TxnMetadata, ...]
    fence: int
    fence_moves: bool


def group_commit(
    fence: int,
    batch: int,
    members: list[tuple[TxnMetadata | None, int, int]],
    commit: bool,
    now_ms: int,
) -> GroupDecision:
    """Decide ``batch`` of a transaction group whose fence (last batch committed) is
    ``fence``, for ``members`` (each its current state and the producer id and epoch the
    writer names): with ``commit``, every member's open transaction commits and the fence
    moves to ``batch``, but only if every member is still that producer's (else none
    commits: all abort, and the error says why); without, they all abort. A batch at or
    below the fence was decided already: nothing commits again, its members' open
    transactions abort. A member that wrote nothing (no transaction open) has nothing to
    end; a member now another producer's (a newer attempt) is left alone."""
    ongoing = [
        m
        for m, pid, epoch in members
        if m is not None
        and m.state == TxnState.ONGOING
        and (m.producer_id, m.producer_epoch) == (pid, epoch)
    ]
    if batch <= fence or not commit:
        return GroupDecision(KafkaError.NONE, _prepared(ongoing, False, now_ms), fence, False)
    for meta, pid, epoch in members:
        error = check_producer(meta, pid, epoch)
        if error == KafkaError.NONE and meta is not None and meta.state.preparing:
            error = KafkaError.CONCURRENT_TRANSACTIONS
        if error != KafkaError.NONE:
            return GroupDecision(error, _prepared(ongoing, False, now_ms), fence, False)
    return GroupDecision(KafkaError.NONE, _prepared(ongoing, True, now_ms), batch, True)


def _prepared(ongoing: list[TxnMetadata], commit: bool, now_ms: int) -> tuple[TxnMetadata, ...]:
    state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    return tuple(replace(m, state=state, updated_ms=now_ms) for m in ongoing)
