"""How a producer's batches are numbered and sent: its identity (producer id and epoch)
and each partition's next sequence number (idempotence), or, with a transactional id,
the identity and partitions of its open transaction (``transactions``). ``Producer``
takes this from ``ProducerIdentity``; the accumulating and the sender threads are its
own (``producer``, ``accumulator``).

Idempotence: the producer takes an id and epoch from the cluster (InitProducerId) and
numbers each partition's records; a resent batch carries the same numbers, and the leader
appends it once. A batch that fails for good leaves its numbers in doubt: the next batch
moves to the next epoch of the id (sequences start again at 0), so later batches are not
refused for the gap. Inside a transaction such a failure makes the transaction abortable
instead (``Transactions.failed``), and its batches are flagged transactional."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

from ..storage.producers import last_sequence
from ..storage.records import Producer as ProducerFields
from ..storage.records import encode_arrow
from .accumulator import Accumulator
from .batches import _Batch
from .client import Client, ProduceCall, ProduceResult
from .errors import InvalidProducerEpochError, RecordTooLargeError, UnknownProducerIdError
from .transactions import Transactions

#: ``encode(producer fields or None, transactional)`` -> one batch's records.
Encoder = Callable[[ProducerFields | None, bool], bytes]
_SEQUENCES = 1 << 31


class _NotSent(Exception):
    """A batch held back: an earlier batch of its partition was too large to send."""


_NOT_SENT = _NotSent()


class _Started(NamedTuple):
    """Entries sent by ``_send_entries``: the results known already (failed before
    sending, or _NOT_SENT), the indexes of those sent, and their call."""

    entries: list[tuple[str, int, Encoder, int]]
    results: list[ProduceResult | Exception | None]
    sent: list[int]
    call: ProduceCall | None
    renewed: bool

    @property
    def held(self) -> bool:
        return any(r is _NOT_SENT for r in self.results)


class ProducerIdentity(Accumulator):
    """The numbering and sending of a producer's batches (see the module), over the
    accumulator of its records."""

    __slots__ = ("_identity", "_renew", "_sequences", "_identity_lock", "_txn")

    acks: int
    idempotent: bool
    _identity: tuple[int, int] | None
    _renew: bool
    _sequences: dict[tuple[str, int], tuple[tuple[int, int], int]]
    _identity_lock: threading.Lock
    _txn: Transactions | None

    def _append_many(
        self, client: Client, entries: list[tuple[str, int, Encoder, int]]
    ) -> list[ProduceResult | Exception]:
        """``_send_entries`` then ``_wait_entries``: each entry's result, in order."""
        return self._wait_entries(client, self._send_entries(client, entries))

    def _send_entries(
        self, client: Client, entries: list[tuple[str, int, Encoder, int]], renewed: bool = False
    ) -> _Started:
        """Entries of (topic, partition, ``encode``, record count), a partition's in the
        order they are to be appended (after its batches in flight, which this sender
        sent), sent together under this producer's identity, each partition's numbered
        on from its next sequence (which moves on as they are sent, so a call sent
        before the last one's answers follows it). A batch that cannot be encoded, or a
        producer that gets no identity, fails without being sent. A batch over the
        topic's max.message.bytes (as the client knows it) is not sent, nor are its
        partition's after it: they are _NOT_SENT, for the caller to send once it has
        split the large one (sent with it, they would be refused for the gap)."""
        results: list[ProduceResult | Exception | None] = [None] * len(entries)
        identity: tuple[int, int] | None = None
        txn = self._txn
        if self.idempotent:
            try:
                identity = self._current_identity(client)
                if txn is not None:
                    txn.add({(topic, partition) for topic, partition, _, _ in entries})
            except Exception as exc:
                if txn is not None:
                    txn.failed(exc)
                return _Started(entries, [exc] * len(entries), [], None, renewed)
        items: list[tuple[str, int, bytes]] = []
        sent: list[int] = []
        held: set[tuple[str, int]] = set()  # partitions with a batch too large in this call
        for i, (topic, partition, encode, count) in enumerate(entries):
            key = (topic, partition)
            if key in held:
                results[i] = _NOT_SENT
                continue
            first = 0
            if identity is not None:
                known, first = self._sequences.get(key, (identity, 0))
                first = 0 if known != identity else first  # a new epoch starts at 0
            try:
                fields = None if identity is None else ProducerFields(*identity, first)
                records = encode(fields, txn is not None)
                client.check_size(topic, partition, records)
            except RecordTooLargeError as exc:
                results[i] = exc
                held.add(key)
                continue
            except Exception as exc:
                results[i] = exc
                continue
            if identity is not None:
                self._sequences[key] = (identity, (last_sequence(first, count) + 1) % _SEQUENCES)
            items.append((topic, partition, records))
            sent.append(i)
        call = client.produce_send(items, acks=self.acks) if items else None
        return _Started(entries, results, sent, call, renewed)

    def _wait_entries(self, client: Client, started: _Started) -> list[ProduceResult | Exception]:
        """The answers of ``_send_entries``' call: each entry's ProduceResult or error, in
        order. A batch that failed leaves its sequence numbers in doubt (or skipped): the
        next batch moves to the next epoch of the producer id. One refused as
        UNKNOWN_PRODUCER_ID (its partition no longer holds this producer's batches) was
        not appended: it is sent once more under the next epoch, from sequence 0."""
        results = started.results
        entries = started.entries
        unknown: list[int] = []
        answers = [] if started.call is None else client.produce_wait(started.call)
        for i, result in zip(started.sent, answers, strict=True):
            results[i] = result
            if not isinstance(result, Exception) or not self.idempotent:
                continue
            if self._txn is not None:
                self._txn.failed(result)  # the transaction can only abort now
                continue
            if isinstance(result, UnknownProducerIdError) and not started.renewed:
                unknown.append(i)
            if not isinstance(result, InvalidProducerEpochError):  # fenced: stays so
                self._renew = True  # appended or not, unknown: the next batch moves epoch
        if unknown:
            again = self._send_entries(client, [entries[i] for i in unknown], renewed=True)
            for i, result in zip(unknown, self._wait_entries(client, again), strict=True):
                results[i] = result
        out = [r for r in results if r is not None]
        assert len(out) == len(entries)
        return out

    def _current_identity(self, client: Client) -> tuple[int, int]:
        if self._txn is not None:
            return self._txn.current_identity()  # the transaction coordinator's
        with self._identity_lock:
            if self._identity is None or self._renew:
                self._identity = client.init_producer_id(*(self._identity or (-1, -1)))
                self._renew = False
            return self._identity


def _stored_codec(client: Client, batch: _Batch) -> str | None:
    """How ``batch``'s topic stores batches (its compression.type): the producer
    compresses them so."""
    return client.stored_compression(batch.topic, batch.partition)


def _encoder(
    batch: _Batch, start: int = 0, end: int | None = None, *, compression: str | None = None
) -> Encoder:
    """``encode(producer fields or None, transactional)`` -> the record batch of ``batch`` (its rows from
    ``start`` to ``end``, or its Arrow table as is), its Arrow IPC buffers compressed with
    ``compression`` (None, "lz4", "zstd"). The Arrow record batch is built on the first
    call, in a sender."""
    table = batch.table
    if table is not None:
        return lambda fields, txn: encode_arrow(
            table, producer=fields, compression=compression, transactional=txn
        )

    def encode(fields: ProducerFields | None, transactional: bool) -> bytes:
        records = batch.build()
        if start or end is not None:
            records = records.slice(start, (records.num_rows if end is None else end) - start)
        return encode_arrow(
            records, producer=fields, compression=compression, transactional=transactional
        )

    return encode
