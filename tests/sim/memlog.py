"""An in-memory ``ReplicaLog`` for the simulator and unit tests.

Batch bytes: header ``>qiiBiqhi`` (base offset, record count, leader epoch, flags,
payload length, producer id, producer epoch, base sequence) then ``count`` 8-byte signed
record ids. Idempotent producers' batches are checked against the product's
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
their offsets as gaps (an entry whose base is ``GONE``); a kept run of a partly kept
batch becomes a batch of its own at its first offset (its producer's sequence moved with
it), as ``storage.cleaner`` writes it. Reads skip gaps (a read starting in one starts at
the next batch); a follower copies a leader's gaps (a batch past its end fills the gap
and raises its ``cleaned_end``), as ``storage.Log`` does.
"""

from __future__ import annotations

import errno
import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence

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
CONTROL = 1
VOTERS = 2  # with CONTROL: a voter-set change; one record per voter (``voter_id``)
TXN = 4  # written in a transaction; with CONTROL a transaction marker (one record)
COMMIT = 8  # on a marker: it commits (else it aborts)
Producer = tuple[int, int, int]  # producer id, producer epoch, base sequence
NO_PRODUCER: Producer = (-1, -1, -1)
GONE = -1  # the batch base of an offset a clean dropped (a gap)


def encode_batch(
    base: int, epoch: int, ids: list[int], flags: int = 0, producer: Producer = NO_PRODUCER
) -> bytes:
    payload = b"".join(RECORD.pack(i) for i in ids)
    return HEADER.pack(base, len(ids), epoch, flags, len(payload), *producer) + payload


def client_batch(ids: list[int], producer: Producer = NO_PRODUCER) -> bytes:
    """What a client sends: base offset and epoch are filled in by the leader's log."""
    return encode_batch(0, UNDEFINED_EPOCH, ids, producer=producer)


def decode_with_producers(data: bytes) -> Iterator[tuple[int, int, int, list[int], Producer]]:
    """(base offset, epoch, flags, record ids, producer) per batch."""
    pos = 0
    while pos < len(data):
        base, count, epoch, flags, size, *producer = HEADER.unpack_from(data, pos)
        pos += HEADER.size
        ids = [RECORD.unpack_from(data, pos + 8 * i)[0] for i in range(count)]
        pos += size
        yield base, epoch, flags, ids, (producer[0], producer[1], producer[2])


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
        self, base: int, epoch: int, ids: list[int], flags: int, producer: Producer = NO_PRODUCER
    ) -> AppendInfo:
        if epoch < self.last_epoch():
            raise ValueError(f"epoch {epoch} below the log's last epoch {self.last_epoch()}")
        if epoch > self.last_epoch():
            self.epochs.append((epoch, base))
        self.entries.extend((epoch, i, base, flags) for i in ids)
        if flags & VOTERS:
            self.voter_sets.append((base, tuple(sorted(voter_of(i) for i in ids))))
        if producer != NO_PRODUCER:
            self.producer_of[base] = (producer, len(ids))
            self._note_producer(base, producer, len(ids), flags)
        return AppendInfo(base, base + len(ids) - 1, len(ids))

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
        decoded = list(decode_with_producers(batches))
        if decoded and decoded[0][0] < first < decoded[0][0] + len(decoded[0][3]):
            # As storage.Log: a log ending inside a batch the leader holds whole (its own
            # clean cut the batch, a repair truncated it at a run's start) takes the batch
            # from its end on.
            base, epoch, flags, ids, producer = decoded[0]
            skip = first - base
            if producer != NO_PRODUCER:
                producer = (producer[0], producer[1], producer[2] + skip)
            decoded[0] = (first, epoch, flags, ids[skip:], producer)
        expected = first
        for base, _, _, ids, _ in decoded:
            if base < expected:
                self.misfits += 1
                raise ValueError(f"batch base {base} does not continue at {expected}")
            expected = base + len(ids)
        for base, epoch, flags, ids, producer in decoded:
            if base > self.end_offset:  # the leader's log was cleaned here: copy the gap
                self._copy_gap(base, epoch)
            self._append(base, epoch, ids, flags, producer)
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
            end = pos
            while end < len(self.entries) and self.entries[end][2] == base:
                end += 1
            producer = self.producer_of.get(base, (NO_PRODUCER, 0))[0]
            ids = [e[1] for e in self.entries[pos:end]]
            batch = encode_batch(base, epoch, ids, flags, producer)
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
        below ``end`` and present): their offsets become gaps, each kept run of a partly
        kept batch a batch of its own at its first offset, its producer's sequence moved
        with it (``storage.cleaner``'s rewrite)."""
        entries = self.entries
        touched = sorted({entries[o][2] for o in dropped})
        for o in dropped:
            epoch, uid, _, flags = entries[o]
            entries[o] = (epoch, uid, GONE, flags)
        for base in touched:
            producer = self.producer_of.pop(base, None)
            pos = base
            while pos < len(entries) and entries[pos][2] in (base, GONE):
                if entries[pos][2] == GONE:
                    pos += 1
                    continue
                run = pos
                while pos < len(entries) and entries[pos][2] == base:
                    pos += 1
                if run != base:
                    for o in range(run, pos):
                        epoch, uid, _, flags = entries[o]
                        entries[o] = (epoch, uid, run, flags)
                if producer is not None:
                    (pid, pepoch, seq), _ = producer
                    self.producer_of[run] = ((pid, pepoch, seq + run - base), pos - run)
        self.cleaned_end = max(self.cleaned_end, end)

    def record(self, offset: int) -> tuple[int, int]:
        """(epoch, record id) at offset, for invariant checks."""
        e = self.entries[offset]
        return e[0], e[1]
