"""Idempotent producers: the per-partition producer state a leader checks a batch
against, so that a retried batch is appended once (Kafka's ProducerStateManager).

The state is a function of the log: for every producer id, the epoch of its latest batch
and the sequence and offset ranges of its last ``BATCHES_KEPT`` batches. Every replica
builds it from the batches it appends, leader and follower alike, and rebuilds it from
its log after a truncation or on open, so a new leader knows what its predecessor
appended. Pure: the logs (``storage.Log``, the simulator's in-memory log) feed it.

Rules for a batch of producer ``pid``, epoch ``e``, sequences ``first..last``, checked
by the leader before it appends (Kafka's ``ProducerAppendInfo.checkSequence``):

* ``pid`` unknown: accepted at sequence 0 (a new producer, or a new epoch). At any
  other sequence the batches before it are not here: appending it would leave a gap
  that a client reads as "the earlier batch was written" (librdkafka acknowledges an
  unanswered batch when a later one succeeds). So it is refused: ``OutOfOrderSequence``
  when the table was built from the partition's first offset (``complete``: the earlier
  batches were never appended here, e.g. lost with a deposed leader's tail, and the
  producer resends them first), else ``UnknownProducerId`` (retention may have deleted
  them; the producer moves to a new epoch, as Kafka's clients do on that error). Kafka
  accepts such a batch since KIP-360; refusing it is what keeps a log gapless;
* ``e`` below the producer's epoch: ``InvalidProducerEpoch`` (a fenced zombie);
* ``e`` equal and ``first..last`` one of the kept batches: ``DuplicateSequence``, which
  names that batch's offsets; the leader answers the retry with them, as success;
* ``e`` equal: ``first`` must follow the last sequence (``OutOfOrderSequence``);
* ``e`` above: a new epoch starts at sequence 0 (``OutOfOrderSequence``).

Sequences wrap from 2**31 - 1 to 0, as Kafka's do.

A transaction marker (``check_marker`` / ``apply_marker``) carries the producer's epoch
and no sequence: one of an epoch below the producer's is refused
(``InvalidProducerEpoch``: a coordinator's marker of a fenced epoch); one of a higher
epoch moves the producer there with no batches, so its next batch starts at sequence 0
(a coordinator bumps the epoch to fence a producer whose transaction it aborts).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from .errors import StorageError

__all__ = [
    "BATCHES_KEPT",
    "DuplicateSequence",
    "InvalidProducerEpoch",
    "OutOfOrderSequence",
    "ProducerBatch",
    "ProducerStateError",
    "ProducerStateTable",
    "UnknownProducerId",
    "last_sequence",
]

#: Batches remembered per producer: Kafka's, which bounds an idempotent producer's
#: requests in flight (max.in.flight.requests.per.connection <= 5).
BATCHES_KEPT = 5
_SEQUENCE_SPAN = 1 << 31


def last_sequence(base_sequence: int, record_count: int) -> int:
    """The sequence number of a batch's last record (wrapping past 2**31 - 1).
    ``record_count``: the records a producer sent; for a sparse batch (a clean left gaps
    inside) its offset span, last_offset_delta + 1: a record's sequence is the base
    sequence plus its offset delta, as in Kafka."""
    return (base_sequence + record_count - 1) % _SEQUENCE_SPAN


class ProducerBatch(NamedTuple):
    """One appended batch of a producer: its sequences and where it sits in the log."""

    producer_epoch: int
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


class ProducerStateError(StorageError, ValueError):
    """A batch the producer state refuses (or, for a duplicate, does not append again)."""


class DuplicateSequence(ProducerStateError):
    """The batch was appended before: ``original`` says where."""

    def __init__(self, producer_id: int, original: ProducerBatch) -> None:
        super().__init__(
            f"producer {producer_id} epoch {original.producer_epoch} sequences "
            f"{original.first_sequence}-{original.last_sequence} are already at offsets "
            f"{original.first_offset}-{original.last_offset}"
        )
        self.original = original


class OutOfOrderSequence(ProducerStateError):
    """A gap (or a step back) in a producer's sequence numbers."""


class UnknownProducerId(ProducerStateError):
    """A producer this partition holds nothing of sent a sequence other than 0, and the
    log no longer starts at offset 0: its earlier batches may have been deleted."""


class InvalidProducerEpoch(ProducerStateError):
    """A batch of an epoch the producer has already moved past (a fenced producer)."""


@dataclass(slots=True)
class _Producer:
    epoch: int
    batches: deque[ProducerBatch] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))


class ProducerStateTable:
    """Producer id -> its latest epoch and last batches, as the log holds them."""

    def __init__(
        self, batches: Iterable[tuple[int, ProducerBatch]] = (), *, complete: bool = True
    ) -> None:
        """``complete``: ``batches`` are every producer batch since the partition's first
        offset (no retention has deleted any), so a producer it lacks never wrote here."""
        self._producers: dict[int, _Producer] = {}
        self.complete = complete
        for producer_id, batch in batches:
            self.apply(producer_id, batch)

    def __len__(self) -> int:
        return len(self._producers)

    def last_batch(self, producer_id: int) -> ProducerBatch | None:
        entry = self._producers.get(producer_id)
        return entry.batches[-1] if entry is not None and entry.batches else None

    def kept_batch_offsets(self) -> set[int]:
        """The first offsets of every batch the table remembers (what a clean of the log
        keeps whole, so the table rebuilt from the log after it is this one)."""
        return {b.first_offset for entry in self._producers.values() for b in entry.batches}

    def check(self, producer_id: int, producer_epoch: int, first: int, last: int) -> None:
        """Raise the ``ProducerStateError`` the batch meets, if any (see the module)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            if first == 0:
                return
            if self.complete:
                raise OutOfOrderSequence(
                    f"producer {producer_id} epoch {producer_epoch} sent sequence {first}, "
                    "but this partition holds none of its batches: its earlier ones come first"
                )
            raise UnknownProducerId(
                f"producer {producer_id} epoch {producer_epoch} sent sequence {first}, but "
                "this partition holds none of its batches (retention may have deleted them)"
            )
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"producer {producer_id} epoch {producer_epoch} is fenced: "
                f"the partition has epoch {entry.epoch}"
            )
        if producer_epoch > entry.epoch or not entry.batches:
            if first != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id} starts epoch {producer_epoch} at sequence "
                    f"{first}, not 0"
                )
            return
        for batch in entry.batches:
            if batch.first_sequence == first and batch.last_sequence == last:
                raise DuplicateSequence(producer_id, batch)
        if entry.batches:
            expected = (entry.batches[-1].last_sequence + 1) % _SEQUENCE_SPAN
            if first != expected:
                raise OutOfOrderSequence(
                    f"producer {producer_id} epoch {producer_epoch} sent sequence {first}, "
                    f"expected {expected}"
                )

    def check_marker(self, producer_id: int, producer_epoch: int) -> None:
        """Raise ``InvalidProducerEpoch`` for a marker of an epoch the producer left."""
        entry = self._producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"transaction marker of producer {producer_id} epoch {producer_epoch} is "
                f"fenced: the partition has epoch {entry.epoch}"
            )

    def apply_marker(self, producer_id: int, producer_epoch: int) -> None:
        """Record an appended marker: the producer is in its epoch from here."""
        entry = self._producers.get(producer_id)
        if entry is None or producer_epoch > entry.epoch:
            self._producers[producer_id] = _Producer(producer_epoch)

    def apply(self, producer_id: int, batch: ProducerBatch) -> None:
        """Record an appended batch (no checks: a follower copies what its leader
        appended, and a rebuild replays the log)."""
        entry = self._producers.get(producer_id)
        if entry is None or batch.producer_epoch > entry.epoch:
            entry = self._producers[producer_id] = _Producer(batch.producer_epoch)
        entry.batches.append(batch)
