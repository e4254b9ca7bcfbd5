"""A transactional producer's side of Kafka's transactions (KIP-98), for ``Producer``.

The producer's id and epoch come from the coordinator of its transactional id
(InitProducerId, which bumps the epoch and so fences any earlier producer of the id, and
aborts a transaction it left open). A transaction is begun locally; before a batch goes
to a partition new to the transaction, the partition is added to it at the coordinator
(AddPartitionsToTxn, durable there before the batch is sent, so that a crash leaves the
coordinator knowing every partition to end). ``send_offsets`` adds a group's offsets
(AddOffsetsToTxn, then TxnOffsetCommit to the group's coordinator): they count when the
transaction commits. The end is EndTxn: the coordinator answers once its decision is
durable and writes the commit or abort markers itself.

A batch that fails inside the transaction (its outcome unknown) makes the transaction
abortable only: ``commit`` refuses, and ``abort`` bumps the epoch (InitProducerId naming
the current one, KIP-360) rather than ending with it, so a late copy of that batch is
fenced. A fenced producer (another took the id) fails every later call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from ..kafka import messages as km
from ..kafka.coordinators import GROUP_KEY_TYPE, OFFSETS_TOPIC, TXN_KEY_TYPE, TXN_STATE_TOPIC
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from .coordinators import kafka_error
from .errors import (
    InvalidProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
)

if TYPE_CHECKING:
    from .client import Client

#: The Kafka versions the native client speaks to the coordinators.
#: Why a transactional producer refuses a record outside ``begin()`` ... ``commit()``.
NOT_IN_TRANSACTION = "a transactional producer sends only after begin()"
_INIT_V = 4  # the first with PRODUCER_FENCED (KIP-588)
_TXN_V = 3

Partition = tuple[str, int]


def _first_error(answer: Message, topics: str, partitions: str, code: str) -> int:
    """The first non-zero per-partition error code of an answer (0: none)."""
    for t in answer[topics]:
        for p in t[partitions]:
            if p[code]:
                return int(p[code])
    return 0


def _top_error(answer: Message) -> int:
    return int(answer["error_code"])


class Transactions:
    """One transactional id's state in a producer: its identity, whether a transaction is
    open, the partitions and groups added to it, and why it can no longer commit.
    Thread-safe: the producer's senders add partitions while the application calls
    ``begin``/``commit``/``abort``."""

    def __init__(self, client: Client, transactional_id: str, timeout_ms: int) -> None:
        if not transactional_id:
            raise ValueError("transactional_id must be a non-empty string")
        if timeout_ms <= 0:
            raise ValueError(f"transaction_timeout_ms must be positive, got {timeout_ms}")
        self._client = client.clone()  # its own connections, used under the lock
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.identity: tuple[int, int] | None = None
        self.open = False
        self._added: set[Partition] = set()
        self._groups: set[str] = set()
        self._failure: BaseException | None = None  # a batch failed: abort only
        self._fatal: BaseException | None = None  # fenced: nothing more
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ the coordinator
    def _call(
        self,
        api: KafkaApi,
        error_of: Callable[[Message], int],
        *,
        group: str = "",
        version: int = _TXN_V,
        **fields: object,
    ) -> Message:
        """A request of ``api`` (its defaults with ``fields``) to the transaction
        coordinator (or, with ``group``, that group's); the answer, or its error raised
        (a fenced producer's for good)."""
        topic, key, key_type = (
            (OFFSETS_TOPIC, group, GROUP_KEY_TYPE)
            if group
            else (TXN_STATE_TOPIC, self.transactional_id, TXN_KEY_TYPE)
        )
        body = api.default_request(version)
        body.update(fields)
        answer = self._client.coordinator_call(topic, key, key_type, api, version, body, error_of)
        error = kafka_error(error_of(answer), f"{api.name} for transactional id {key!r}")
        if isinstance(error, InvalidProducerEpochError):
            self._fatal = error
        if error is not None:
            raise error
        return answer

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise ProducerFencedError(
                f"transactional id {self.transactional_id!r}: this producer was fenced "
                f"({self._fatal}); make a new one"
            )

    def init(self) -> tuple[int, int]:
        """InitProducerId: this id's producer id and a new epoch (fencing earlier
        producers of it, aborting a transaction they left open)."""
        with self._lock:
            self._check_usable()
            pid, epoch = self.identity or (-1, -1)
            answer = self._call(
                km.INIT_PRODUCER_ID,
                _top_error,
                version=_INIT_V,
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.timeout_ms,
                producer_id=pid,
                producer_epoch=epoch,
            )
            self.identity = (answer["producer_id"], answer["producer_epoch"])
            self.open, self._failure = False, None
            self._added.clear()
            self._groups.clear()
            return self.identity

    def begin(self) -> None:
        with self._lock:
            self._check_usable()
            if self.open:
                raise TransactionStateError("begin(): a transaction is open already")
            if self.identity is None:
                self.init()
            self.open, self._failure = True, None
            self._added.clear()
            self._groups.clear()

    def current_identity(self) -> tuple[int, int]:
        """The identity batches are sent with (only inside a transaction)."""
        with self._lock:
            self._check_usable()
            if not self.open or self.identity is None:
                raise TransactionStateError(NOT_IN_TRANSACTION)
            return self.identity

    def add(self, partitions: Iterable[Partition]) -> None:
        """Before sending to them: the partitions not yet in the transaction are added
        to it at the coordinator."""
        with self._lock:
            pid, epoch = self.current_identity()
            new = sorted(set(partitions) - self._added)
            if not new:
                return
            if self._failure is not None:
                raise TransactionAbortableError(f"the transaction must abort: {self._failure}")
            by_topic: dict[str, list[int]] = {}
            for topic, p in new:
                by_topic.setdefault(topic, []).append(p)
            self._call(
                km.ADD_PARTITIONS_TO_TXN,
                lambda a: _first_error(
                    a,
                    "results_by_topic_v3_and_below",
                    "results_by_partition",
                    "partition_error_code",
                ),
                v3_and_below_transactional_id=self.transactional_id,
                v3_and_below_producer_id=pid,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[{"name": t, "partitions": ps} for t, ps in by_topic.items()],
            )
            self._added.update(new)

    def failed(self, error: BaseException) -> None:
        """A batch of the open transaction failed (its outcome unknown)."""
        with self._lock:
            if isinstance(error, InvalidProducerEpochError):
                self._fatal = self._fatal or error
            if self.open and self._failure is None:
                self._failure = error

    def send_offsets(self, offsets: Mapping[Partition, int], group_id: str) -> None:
        """The group's offsets (the next offset to read, per partition), committed with
        the transaction."""
        with self._lock:
            pid, epoch = self.current_identity()
            if self._failure is not None:
                raise TransactionAbortableError(f"the transaction must abort: {self._failure}")
            if group_id not in self._groups:
                # The group's offsets partition joins the transaction: the offsets topic
                # must exist first (a group coordinator's first use creates it).
                self._client.coordinator_partitions(OFFSETS_TOPIC, group_id, GROUP_KEY_TYPE)
                self._call(
                    km.ADD_OFFSETS_TO_TXN,
                    _top_error,
                    transactional_id=self.transactional_id,
                    producer_id=pid,
                    producer_epoch=epoch,
                    group_id=group_id,
                )
                self._groups.add(group_id)
            by_topic: dict[str, list[Message]] = {}
            for (topic, p), offset in sorted(offsets.items()):
                by_topic.setdefault(topic, []).append(
                    {
                        "partition_index": p,
                        "committed_offset": offset,
                        "committed_leader_epoch": -1,
                        "committed_metadata": "",
                    }
                )
            self._call(
                km.TXN_OFFSET_COMMIT,
                lambda a: _first_error(a, "topics", "partitions", "error_code"),
                group=group_id,
                transactional_id=self.transactional_id,
                group_id=group_id,
                producer_id=pid,
                producer_epoch=epoch,
                topics=[{"name": t, "partitions": ps} for t, ps in by_topic.items()],
            )

    def end(self, commit: bool) -> None:
        """EndTxn (after the producer flushed): answered once the decision is durable.
        A commit of a transaction a batch failed in is refused (abort it); an abort
        after such a failure bumps the epoch instead (InitProducerId), fencing the
        failed batch should a copy of it still arrive."""
        with self._lock:
            self._check_usable()
            if not self.open or self.identity is None:
                raise TransactionStateError(
                    f"{'commit' if commit else 'abort'}(): no transaction is open"
                )
            if commit and self._failure is not None:
                raise TransactionAbortableError(
                    f"the transaction cannot commit, a batch of it failed: {self._failure}; "
                    "abort() it"
                )
            if not commit and self._failure is not None:
                self.init()
                return
            if self._added or self._groups:
                # Should it fail (a timeout: the decision may be durable or not), the
                # transaction stays open: the same call again ends it (a retried EndTxn
                # of a transaction ended so succeeds), or abort() does.
                self._call(
                    km.END_TXN,
                    _top_error,
                    transactional_id=self.transactional_id,
                    producer_id=self.identity[0],
                    producer_epoch=self.identity[1],
                    committed=commit,
                )
            self.open = False
            self._added.clear()
            self._groups.clear()

    def close(self) -> None:
        self._client.close()
