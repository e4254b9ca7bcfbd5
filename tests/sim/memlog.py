"""An in-memory ``ReplicaLog`` for the simulator and unit tests.

Batch bytes: header ``>qiiBiqhi`` (base offset, record count, leader epoch, flags,
payload length, producer id, producer epoch, base sequence) then ``count`` 8-byte signed
record ids; a clean's sparse batch (flag ``SPARSE``: gaps inside) then each record's
4-byte offset delta. Idempotent producers' batches are checked against the product's
``ProducerStateTable`` exactly as ``storage.Log`` does (``table_class`` lets a teeth test
swap in a broken one). Control batches carry flag 1 and one id
``-(epoch * 1000 + leader_id) - 1``. The log keeps an epoch cache with Kafka's
``end_offset_for`` semantics and tracks the durable end: ``crash()`` drops what was not
flushed, as a power loss would.

Latent corruption: ``damage(offset)`` marks the batch holding ``offset`` as damaged on
"disk". ``read`` never returns it (it stops before it, or raises ``CorruptDataError`` if
it is the first batch), as ``replica.storage.Log`` does with its CRCs.

A full disk: with ``full`` set, every append raises ``DiskError`` and writes nothing.

Compaction (``apply_clean``): a clean drops records below ``cleaned_end`` and leaves
their offsets as gaps (an entry whose base is ``GONE``); the kept records of consecutive
batches that share a header (same epoch and flags, no producer, not control; at most
``MERGED_RECORDS``) become one sparse batch at the first one's offset, and a producer's
batch partly kept a sparse batch of its own (its sequence moved to its first kept
record), as ``storage.clean_batches`` lays them out. A read starting in a gap starts at
the batch whose offsets span it, or the next; a follower copies a leader's gaps (a batch
past its end fills the gap and raises its ``cleaned_end``), as ``storage.Log`` does.
"""

from __future__ import annotations

import errno
import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from quorumlog.replica.raft import (
    CATCH_UP_UNKNOWN,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AppendInfo,
    EpochEndOffset,
)
from quorumlog.replica.raft.log import CorruptDataError, DiskError
from quorumlog.replica.storage.producers import ProducerBatch, ProducerStateTable, last_sequence
from quorumlog.replica.storage.records import TxnMarker
from quorumlog.replica.storage.transactions import TransactionIndex

HEADER = struct.Struct(">qiiBiqhi")
RECORD = struct.Struct(">q")
DELTA = struct.Struct(">i")
#: The records a clean merges into one batch at most (``storage.clean_batches``'s bound,
#: in records: small enough that a simulated log keeps several batches).
MERGED_RECORDS = 12
CONTROL = 1
VOTERS = 2  # with CONTROL: a voter-set change; one record per voter (``voter_id``)
TXN = 4  # written in a transaction; with CONTROL a transaction marker (one record)
COMMIT = 8  # on a marker: it commits (else it aborts)
SPARSE = 16  # on the wire only: the offset deltas follow the record ids
Producer = tuple[int, int, int]  # producer id, producer epoch, base sequence
NO_PRODUCER: Producer = (-1, -1, -1)
GONE = -1  # the batch base of an offset a clean dropped (a gap)


def encode_batch(
    base: int,
    epoch: int,
    ids: list[int],
    flags: int = 0,
    producer: Producer = NO_PRODUCER,
    deltas: Sequence[int] | None = None,
) -> bytes:
    payload = b"".join(RECORD.pack(i) for i in ids)
    if deltas is not None and list(deltas) != list(range(len(ids))):
        flags |= SPARSE
        payload += b"".join(DELTA.pack(d) for d in deltas)
    return HEADER.pack(base, len(ids), epoch, flags, len(payload), *producer) + payload


def client_batch(ids: list[int], producer: Producer = NO_PRODUCER) -> bytes:
    """What a client sends: base offset and epoch are filled in by the leader's log."""
    return encode_batch(0, UNDEFINED_EPOCH, ids, producer=producer)


class SimBatch(NamedTuple):
    base: int
    epoch: int
    flags: int
    ids: list[int]
    producer: Producer
    offsets: list[int]  # each record's: base + its offset delta

    @property
    def next_offset(self) -> int:
        return self.offsets[-1] + 1


def decode_sim_batches(data: bytes) -> Iterator[SimBatch]:
    """Every batch of ``data``, each record's offset with it."""
    pos = 0
    while pos < len(data):
        base, count, epoch, flags, size, *producer = HEADER.unpack_from(data, pos)
        pos += HEADER.size
        ids = [RECORD.unpack_from(data, pos + RECORD.size * i)[0] for i in range(count)]
        deltas: Sequence[int] = range(count)
        if flags & SPARSE:
            at = pos + RECORD.size * count
            deltas = [DELTA.unpack_from(data, at + DELTA.size * i)[0] for i in range(count)]
        pos += size
        yield SimBatch(
            base,
            epoch,
            flags & ~SPARSE,
            ids,
            (producer[0], producer[1], producer[2]),
            [base + d for d in deltas],
        )


def decode_with_producers(data: bytes) -> Iterator[tuple[int, int, int, list[int], Producer]]:
    """(base offset, epoch, flags, record ids, producer) per batch."""
    for b in decode_sim_batches(data):
        yield b.base, b.epoch, b.flags, b.ids, b.producer


_MARKER_IDS = 3 * 10**12


def marker_record_id(producer_id: int, commit: bool) -> int:
    """A marker's record id: its producer and outcome, readable from the history."""
    return -(_MARKER_IDS + 2 * producer_id + int(commit))


def marker_of(record_id: int) -> tuple[int, bool] | None:
    """(producer id, commit) of a marker's record id; None for any other record."""
    if -2 * _MARKER_IDS < record_id <= -_MARKER_IDS:
        pid, commit = divmod(-record_id - _MARKER_IDS, 2)
        return pid, bool(commit)
    return None


def marker_batch(producer_id: int, producer_epoch: int, commit: bool) -> bytes:
    """A transaction coordinator's marker: one record (``marker_record_id``)."""
    flags = CONTROL | TXN | (COMMIT if commit else 0)
    ids = [marker_record_id(producer_id, commit)]
    return encode_batch(0, UNDEFINED_EPOCH, ids, flags, (producer_id, producer_epoch, -1))


def transactional_batch(ids: list[int], producer: Producer) -> bytes:
    """A transactional producer's batch (its sequence as an idempotent one's)."""
    return encode_batch(0, UNDEFINED_EPOCH, ids, TXN, producer)


def decode_batches(data: bytes) -> Iterator[tuple[int, int, int, list[int]]]:
    """(base offset, epoch, flags, record ids) per batch."""
    for base, epoch, flags, ids, _ in decode_with_producers(data):
        yield base, epoch, flags, ids


def _producer_batch(producer: Producer, base: int, count: int) -> ProducerBatch:
    _, epoch, first = producer
    return ProducerBatch(epoch, first, last_sequence(first, count), base, base + count - 1)


def control_id(epoch: int, leader_id: int) -> int:
    return -(epoch * 1000 + leader_id) - 1


_VOTER_IDS = 2 * 10**12


def voter_record_id(base: int, voter: int) -> int:
    """The id of a voter-set record's entry for ``voter`` (unique per base offset)."""
    return -(_VOTER_IDS + base * 1000 + voter)


def is_voter_record(record_id: int) -> bool:
    return -_MARKER_IDS < record_id <= -_VOTER_IDS


def voter_of(record_id: int) -> int:
    return (-record_id - _VOTER_IDS) % 1000


class MemLog:
    """Entries are (epoch, record id, batch base offset, flags) per offset from 0."""

    table_class = ProducerStateTable
    txn_class = TransactionIndex

    def __init__(self) -> None:
        self.entries: list[tuple[int, int, int, int]] = []
        # Batch base offset -> (producer fields, record count) of idempotent batches.
        self.producer_of: dict[int, tuple[Producer, int]] = {}
        self.producers = self.table_class()
        self.txns = self.txn_class()
        self.epochs: list[tuple[int, int]] = []  # (epoch, start offset), epochs ascending
        self.durable = 0
        self.damaged: set[int] = set()  # base offsets of damaged batches
        self.catch_up = -1
        self.voter_sets: list[tuple[int, tuple[int, ...]]] = []  # (offset, voters)
        # A full disk: appends are refused (DiskError), nothing written; counted.
        self.full = False
        self.refusals = 0
        self.cleaned_end = 0  # gaps a clean left (or a follower copied) lie below this
        self.gaps_copied = 0
        self.misfits = 0  # fetched batches refused as not continuing the log
        self.sparse_made = 0  # batches a clean laid out with gaps inside

    # --- ReplicaLog -------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        return 0

    @property
    def end_offset(self) -> int:
        return len(self.entries)

    @property
    def durable_end_offset(self) -> int:
        return self.durable

    @property
    def catch_up_offset(self) -> int:
        return self.catch_up

    def last_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else UNDEFINED_EPOCH

    def end_offset_for(self, epoch: int) -> EpochEndOffset:
        if epoch == UNDEFINED_EPOCH or not self.epochs:
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        if epoch == self.epochs[-1][0]:
            return EpochEndOffset(epoch, self.end_offset)
        keys = [e for e, _ in self.epochs]
        i = bisect_right(keys, epoch)  # first entry with epoch > requested
        if i == len(keys):
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        if i == 0:
            return EpochEndOffset(epoch, self.epochs[0][1])
        return EpochEndOffset(keys[i - 1], self.epochs[i][1])

    @property
    def voters(self) -> tuple[int, ...] | None:
        return self.voter_sets[-1][1] if self.voter_sets else None

    @property
    def voters_before(self) -> tuple[int, ...] | None:
        return self.voter_sets[-2][1] if len(self.voter_sets) > 1 else None

    @property
    def voters_offset(self) -> int:
        return self.voter_sets[-1][0] if self.voter_sets else -1

    def epoch_at(self, offset: int) -> int:
        if 0 <= offset < len(self.entries):
            return self.entries[offset][0]
        return UNDEFINED_EPOCH

    def _append(
        self,
        base: int,
        epoch: int,
        ids: list[int],
        flags: int,
        producer: Producer = NO_PRODUCER,
        offsets: list[int] | None = None,
    ) -> AppendInfo:
        """``offsets``: a sparse batch's (a clean's, copied from a leader), gaps inside."""
        if epoch < self.last_epoch():
            raise ValueError(f"epoch {epoch} below the log's last epoch {self.last_epoch()}")
        if epoch > self.last_epoch():
            self.epochs.append((epoch, base))
        if offsets is None:
            self.entries.extend((epoch, i, base, flags) for i in ids)
        else:
            for offset, uid in zip(offsets, ids, strict=True):
                self.entries.extend((epoch, 0, GONE, 0) for _ in range(offset - self.end_offset))
                self.entries.append((epoch, uid, base, flags))
        span = self.end_offset - base
        if flags & VOTERS:
            self.voter_sets.append((base, tuple(sorted(voter_of(i) for i in ids))))
        if producer != NO_PRODUCER:
            self.producer_of[base] = (producer, span)
            self._note_producer(base, producer, span, flags)
        return AppendInfo(base, base + span - 1, span)

    def _note_producer(self, base: int, producer: Producer, count: int, flags: int) -> None:
        if flags & CONTROL:  # a transaction marker
            self.producers.apply_marker(producer[0], producer[1])
            self.txns.apply(producer[0], base, True, bool(flags & COMMIT))
            return
        self.producers.apply(producer[0], _producer_batch(producer, base, count))
        self.txns.apply(producer[0], base, bool(flags & TXN), None)

    def append_markers(
        self, markers: Sequence[TxnMarker], epoch: int, timestamp_ms: int
    ) -> AppendInfo:
        self._check_room()
        for marker in markers:
            self.producers.check_marker(marker.producer_id, marker.producer_epoch)
        first = self.end_offset
        for marker in markers:
            batch = marker_batch(marker.producer_id, marker.producer_epoch, marker.commit)
            for _, _, flags, ids, producer in decode_with_producers(batch):
                self._append(self.end_offset, epoch, ids, flags, producer)
        return AppendInfo(first, self.end_offset - 1, self.end_offset - first)

    def transactions(self) -> TransactionIndex:
        return self.txns

    def _check_room(self) -> None:
        if self.full:
            self.refusals += 1
            raise DiskError("memlog", OSError(errno.ENOSPC, "No space left on device"))

    @staticmethod
    def plain_span(records: bytes) -> int | None:
        """As the storage's: the records of plain batches (no flags, no producer)."""
        batches = list(decode_sim_batches(records))
        if not batches or any(b.flags or b.producer != NO_PRODUCER for b in batches):
            return None
        return sum(len(b.ids) for b in batches)

    def append_as_leader(self, records: bytes, epoch: int) -> AppendInfo:
        self._check_room()
        batches = list(decode_with_producers(records))
        if any(producer != NO_PRODUCER for *_, producer in batches):
            if len(batches) > 1:
                raise ValueError("an idempotent producer's batch must travel alone")
            _, _, _, ids, producer = batches[0]
            batch = _producer_batch(producer, self.end_offset, len(ids))
            self.producers.check(
                producer[0], producer[1], batch.first_sequence, batch.last_sequence
            )
        first = self.end_offset
        for _, _, flags, ids, producer in batches:
            self._append(self.end_offset, epoch, ids, flags, producer)
        return AppendInfo(first, self.end_offset - 1, self.end_offset - first)

    def append_control(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        self._check_room()
        return self._append(self.end_offset, epoch, [control_id(epoch, leader_id)], CONTROL)

    def append_voters(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> AppendInfo:
        self._check_room()
        base = self.end_offset
        ids = [voter_record_id(base, v) for v in sorted(voters)]
        return self._append(base, epoch, ids, CONTROL | VOTERS)

    def append_as_follower(self, batches: bytes) -> AppendInfo | None:
        if not batches:
            return None
        self._check_room()
        first = self.end_offset
        decoded = list(decode_sim_batches(batches))
        if decoded and decoded[0].base < first < decoded[0].next_offset:
            # As storage.Log: a log ending inside a batch the leader holds whole (its own
            # clean laid the batch out otherwise, a repair truncated it inside) takes the
            # batch's records from its end on, as a batch of their own.
            head = decoded[0]
            keep = [k for k, o in enumerate(head.offsets) if o >= first]
            offsets = [head.offsets[k] for k in keep]
            producer = head.producer
            if producer != NO_PRODUCER:
                producer = (producer[0], producer[1], producer[2] + offsets[0] - head.base)
            decoded[0] = head._replace(
                base=offsets[0], ids=[head.ids[k] for k in keep], producer=producer, offsets=offsets
            )
        expected = first
        for b in decoded:
            if b.base < expected:
                self.misfits += 1
                raise ValueError(f"batch base {b.base} does not continue at {expected}")
            expected = b.next_offset
        for b in decoded:
            if b.base > self.end_offset:  # the leader's log was cleaned here: copy the gap
                self._copy_gap(b.base, b.epoch)
            self._append(b.base, b.epoch, b.ids, b.flags, b.producer, b.offsets)
        return AppendInfo(first, self.end_offset - 1, self.end_offset - first)

    def _copy_gap(self, base: int, epoch: int) -> None:
        """Offsets up to ``base`` (where a batch of ``epoch`` follows) were cleaned from
        the leader's log: gaps here too, in the epoch they were written in (the latest:
        an epoch's first batch, a control batch, is never cleaned)."""
        self.cleaned_end = max(self.cleaned_end, base)
        self.gaps_copied += 1
        gap_epoch = self.last_epoch()
        self.entries.extend((gap_epoch, 0, GONE, 0) for _ in range(base - self.end_offset))

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        out: list[bytes] = []
        size = 0
        entries = self.entries
        if offset >= len(entries):
            return b""
        while offset < len(entries) and entries[offset][2] == GONE:
            offset += 1  # a read starting in a gap starts at the next batch
        if offset >= len(entries):
            return b""
        pos = entries[offset][2]  # the batch holding offset
        while pos < len(entries):
            if entries[pos][2] == GONE:
                pos += 1
                continue
            if max_offset is not None and pos >= max_offset:
                break
            epoch, _, base, flags = entries[pos]
            if base in self.damaged:
                if out:
                    break
                raise CorruptDataError("memlog", base, base, "damaged batch")
            end = pos  # past the batch's last record (a sparse batch has gaps inside)
            scan = pos
            while scan < len(entries) and entries[scan][2] in (base, GONE):
                if entries[scan][2] == base:
                    end = scan + 1
                scan += 1
            producer = self.producer_of.get(base, (NO_PRODUCER, 0))[0]
            held = [o for o in range(base, end) if entries[o][2] == base]
            ids = [entries[o][1] for o in held]
            deltas = [o - base for o in held]
            batch = encode_batch(base, epoch, ids, flags, producer, deltas)
            if out and size + len(batch) > max_bytes:
                break
            out.append(batch)
            size += len(batch)
            pos = end
        return b"".join(out)

    def offset_for_timestamp(self, timestamp_ms: int, max_offset: int) -> tuple[int, int]:
        return max_offset, -1  # simulated records carry no timestamps

    def truncate_to(self, offset: int) -> None:
        offset = max(0, offset)
        del self.entries[offset:]
        self.cleaned_end = min(self.cleaned_end, offset)
        while self.epochs and self.epochs[-1][1] >= offset:
            self.epochs.pop()
        while self.voter_sets and self.voter_sets[-1][0] >= offset:
            self.voter_sets.pop()
        self.durable = min(self.durable, offset)
        self.damaged = {b for b in self.damaged if b < offset}
        # Rebuilt from what is left, as storage.Log does.
        self.producer_of = {b: p for b, p in self.producer_of.items() if b + p[1] <= offset}
        self.producers = self.table_class()
        self.txns = self.txn_class()
        for b, (p, n) in sorted(self.producer_of.items()):
            self._note_producer(b, p, n, self.entries[b][3])

    def truncate_corrupt(self, offset: int) -> None:
        floor = max(self.catch_up, self.durable)
        if offset < floor:
            self.catch_up = floor
        self.truncate_to(offset)

    def mark_catch_up(self, floor: int) -> None:
        if floor == CATCH_UP_UNKNOWN or self.catch_up in (-1, CATCH_UP_UNKNOWN):
            self.catch_up = floor
        else:
            self.catch_up = max(self.catch_up, floor)
        if 0 <= self.catch_up <= self.durable:
            self.catch_up = -1

    def flush(self) -> int:
        self.durable = len(self.entries)
        if 0 <= self.catch_up <= self.durable:
            self.catch_up = -1
        return self.durable

    # --- simulator helpers --------------------------------------------------------
    def crash(self) -> None:
        """Power loss: everything not flushed is gone."""
        self.truncate_to(self.durable)

    def damage(self, offset: int) -> int:
        """Damage the batch holding ``offset`` on disk (in a gap, the next one, or the
        one before if none follows); returns its base offset."""
        at = offset
        while at < len(self.entries) and self.entries[at][2] == GONE:
            at += 1
        if at == len(self.entries):  # the log ends in gaps: the batch before them
            at = offset
            while self.entries[at][2] == GONE:
                at -= 1
        base = self.entries[at][2]
        self.damaged.add(base)
        return base

    def first_damage(self) -> int | None:
        """What a scrub finds: the first damaged batch."""
        return min(self.damaged) if self.damaged else None

    def holds(self, offset: int, rec: tuple[int, int]) -> bool:
        """Durably holds ``rec`` at ``offset``, undamaged (or a gap a clean left there:
        ``tests.sim.compaction`` checks what a clean drops)."""
        return (
            self.durable > offset
            and (self.record(offset) == rec or self.entries[offset][2] == GONE)
            and self.entries[offset][2] not in self.damaged
        )

    def gone(self, offset: int) -> bool:
        """A clean dropped the record at ``offset`` (a gap)."""
        return self.entries[offset][2] == GONE

    def apply_clean(self, end: int, dropped: Sequence[int]) -> None:
        """A clean below ``end`` dropped the records at ``dropped`` (ascending, each
        below ``end`` and present): their offsets become gaps, and the batches below
        ``end`` are laid out as ``storage.clean_batches`` does (see the module
        docstring): merged where they share a header, a producer's batch partly kept
        re-based at its first kept record, its sequence moved with it."""
        entries = self.entries
        touched = {entries[o][2] for o in dropped}
        for o in dropped:
            epoch, uid, _, flags = entries[o]
            entries[o] = (epoch, uid, GONE, flags)
        group: list[int] = []  # the kept offsets of batches merged so far
        for base, held in self._batches_below(end):
            epoch, _, _, flags = entries[held[0]]
            if base in self.damaged:  # what a real clean could not read stays as it is
                self._relay(group)
                group = []
                continue
            mergeable = base not in self.producer_of and not flags & CONTROL
            if group and mergeable:
                first = entries[group[0]]
                if (first[0], first[3]) == (epoch, flags) and len(group) + len(held) <= (
                    MERGED_RECORDS
                ):
                    group += held
                    continue
            self._relay(group)
            group = []
            if mergeable:
                group = list(held)
            elif base in touched and base in self.producer_of:
                producer, _ = self.producer_of.pop(base)
                pid, pepoch, seq = producer
                self._relay(held)
                span = held[-1] - held[0] + 1
                self.producer_of[held[0]] = ((pid, pepoch, seq + held[0] - base), span)
        self._relay(group)
        self.cleaned_end = max(self.cleaned_end, end)

    def _batches_below(self, end: int) -> list[tuple[int, list[int]]]:
        """(base, offsets of its records) of every batch starting below ``end``."""
        entries = self.entries
        out: list[tuple[int, list[int]]] = []
        pos = 0
        limit = min(end, len(entries))
        while pos < limit:
            base = entries[pos][2]
            if base == GONE:
                pos += 1
                continue
            held = []
            scan = pos
            while scan < len(entries) and entries[scan][2] in (base, GONE):
                if entries[scan][2] == base:
                    held.append(scan)
                scan += 1
            out.append((base, held))
            pos = held[-1] + 1
        return out

    def _relay(self, offsets: list[int]) -> None:
        """The records at ``offsets`` as one batch based at the first of them."""
        if not offsets:
            return
        base = offsets[0]
        if offsets[-1] - base + 1 > len(offsets):
            self.sparse_made += 1
        for o in offsets:
            epoch, uid, _, flags = self.entries[o]
            self.entries[o] = (epoch, uid, base, flags)

    def record(self, offset: int) -> tuple[int, int]:
        """(epoch, record id) at offset, for invariant checks."""
        e = self.entries[offset]
        return e[0], e[1]
