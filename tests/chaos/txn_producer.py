"""Transactional producers (KIP-98) for the chaos campaign, and the read_committed read
of the log the checker gets.

Each producer thread has a stable ``transactional.id`` and runs transactions of a few
records over the topic's partitions, one every 100-300 ms, a quarter of them aborted on
purpose; it logs every transaction with the outcome it was told (``Transaction``). A
fatal error (fenced, or any error the transaction cannot go on after) makes it drop the
producer and create a new one (``init_transactions`` again, which also ends whatever the
old one left open). Every record's value is unique: ``<tag>-t<producer>-<txn>-<index>``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from quorumlog.replica.client import Client

from tests.support.waits import wait_until

from .checker import ABORTED, COMMITTED, UNKNOWN, Record, Transaction, TxnRecord

log = logging.getLogger(__name__)

TRANSACTION_TIMEOUT_MS = 10_000
# One call of init/commit/abort: a fault lasts 1.5-4 s, then a new leader is elected.
CALL_TIMEOUT_S = 10.0
# Retriable commit/abort errors (a timeout, a coordinator moving) are retried this often.
CALL_ATTEMPTS = 3


class _LibrdkafkaLog:
    """librdkafka's own log (connection refused, broker down, ...) at DEBUG: the faults
    make it loud, and the calls' errors say what matters."""

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        log.debug(msg, *args)


class TxnProducer(threading.Thread):
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        tag: str,
        index: int,
        seed: int,
        *,
        abort_ratio: float = 0.25,
        max_transactions: int = 100_000,
        max_s: float = 3600.0,
    ) -> None:
        super().__init__(daemon=True, name=f"chaos-txn-producer-{index}")
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.tag = tag
        self.index = index
        self.transactional_id = f"chaos-{tag}-{index}"
        self.rng = random.Random(seed * 1000 + index)
        self.abort_ratio = abort_ratio
        self.max_transactions = max_transactions
        self.max_s = max_s
        self.stop_event = threading.Event()
        self.transactions: list[Transaction] = []
        self.producers_created = 0
        self.error: BaseException | None = None
        self._delivered: dict[bytes, tuple[int, int]] = {}

    def run(self) -> None:
        deadline = time.monotonic() + self.max_s
        producer: confluent_kafka.Producer | None = None
        try:
            for number in range(self.max_transactions):
                if self.stop_event.is_set() or time.monotonic() >= deadline:
                    return
                if producer is None:
                    producer = self._create()
                    if producer is None:
                        self.stop_event.wait(0.5)
                        continue
                txn, healthy = self._transaction(producer, number)
                if txn is not None:
                    self.transactions.append(txn)
                if not healthy:
                    _discard(producer)
                    producer = None
                self.stop_event.wait(self.rng.uniform(0.1, 0.3))
        except BaseException as exc:  # surfaced by the campaign
            log.exception("%s crashed", self.name)
            self.error = exc
        finally:
            if producer is not None:
                _discard(producer)

    def _create(self) -> confluent_kafka.Producer | None:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "linger.ms": 5,
                "logger": _LibrdkafkaLog(),
            }
        )
        try:
            producer.init_transactions(CALL_TIMEOUT_S)
        except KafkaException as exc:
            log.info("%s: init_transactions: %s", self.transactional_id, exc)
            _discard(producer)
            return None
        self.producers_created += 1
        return producer

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            epoch = msg.leader_epoch()
            self._delivered[msg.value()] = (msg.offset(), -1 if epoch is None else epoch)

    def _transaction(
        self, producer: confluent_kafka.Producer, number: int
    ) -> tuple[Transaction | None, bool]:
        """One transaction; (what it was, whether the producer can go on)."""
        first = self.rng.randrange(self.partitions)
        sent = [
            ((first + i) % self.partitions, f"{self.tag}-t{self.index}-{number}-{i}".encode())
            for i in range(self.rng.randint(2, 4))
        ]
        abort = self.rng.random() < self.abort_ratio
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            log.info("%s: begin_transaction: %s", self.transactional_id, exc)
            return None, False  # nothing sent
        committing = False
        try:
            try:
                for p, value in sent:
                    producer.produce(self.topic, value, partition=p, on_delivery=self._on_delivery)
                # Sent before the decision, so aborted records reach the log too.
                producer.flush(CALL_TIMEOUT_S)
            except (KafkaException, BufferError) as exc:
                log.info("%s: produce: %s", self.transactional_id, exc)
                abort = True
            if abort:
                healthy = self._call(producer.abort_transaction, "abort")
                return self._record(number, ABORTED, sent, producer), healthy
            committing = True
            outcome, healthy = self._commit(producer)
            return self._record(number, outcome, sent, producer), healthy
        except (KafkaException, SystemError) as exc:
            # A fatal error (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER once an unclean election
            # lost records) surfaces from whichever call serves the callbacks next, as a
            # SystemError when that is a delivery callback.
            log.info("%s: %r", self.transactional_id, exc)
            outcome = UNKNOWN if committing else ABORTED
            return self._record(number, outcome, sent, producer), False

    def _commit(self, producer: confluent_kafka.Producer) -> tuple[str, bool]:
        for _ in range(CALL_ATTEMPTS):
            try:
                producer.commit_transaction(CALL_TIMEOUT_S)
                return COMMITTED, True
            except KafkaException as exc:
                err = exc.args[0]
                log.info("%s: commit_transaction: %s", self.transactional_id, err)
                if err.txn_requires_abort():
                    # The commit did not happen; the abort tells it for sure.
                    if self._call(producer.abort_transaction, "abort after commit"):
                        return ABORTED, True
                    return UNKNOWN, False
                if err.fatal() or not err.retriable():
                    return UNKNOWN, False
        return UNKNOWN, False

    def _call(self, call: Any, what: str) -> bool:
        """abort_transaction, retried while it fails retriably: whether it returned."""
        for _ in range(CALL_ATTEMPTS):
            try:
                call(CALL_TIMEOUT_S)
                return True
            except KafkaException as exc:
                err = exc.args[0]
                log.info("%s: %s: %s", self.transactional_id, what, err)
                if err.fatal() or not err.retriable():
                    return False
        return False

    def _record(
        self,
        number: int,
        outcome: str,
        sent: list[tuple[int, bytes]],
        producer: confluent_kafka.Producer,
    ) -> Transaction:
        try:
            producer.poll(0)  # delivery reports not served yet
        except KafkaException:  # a fenced producer raises its fatal error here too
            log.debug("%s: poll", self.transactional_id, exc_info=True)
        records = []
        for p, value in sent:
            offset, epoch = self._delivered.pop(value, (-1, -1))
            records.append(TxnRecord(p, value, offset, epoch))
        return Transaction(self.index, number, outcome, tuple(records))


def _discard(producer: confluent_kafka.Producer) -> None:
    """Drop a producer without waiting for what it still holds (its transaction, if any,
    ends by its timeout or by the next producer's init_transactions)."""
    try:
        producer.purge()
        producer.flush(0)
    except (KafkaException, RuntimeError):
        log.debug("discarding a producer", exc_info=True)


# ---- the final read ------------------------------------------------------------------
def wait_stable(client: Client, topic: str, partitions: int, timeout_s: float) -> None:
    """Until every partition's last stable offset is its high watermark: no transaction
    is open (an abandoned one is aborted by its timeout)."""

    def stable() -> bool:
        return all(
            client.list_offsets(topic, p, "latest", isolation="read_committed").offset
            == client.list_offsets(topic, p, "latest").offset
            for p in range(partitions)
        )

    wait_until(stable, timeout_s, "no open transaction in any partition", interval=0.2)


def read_committed(client: Client, topic: str, partition: int) -> list[Record]:
    """Every user record a read_committed reader sees, to the last stable offset."""
    out: list[Record] = []
    offset = 0
    for _ in range(100_000):
        res = client.fetch(topic, partition, offset, max_bytes=1 << 20, isolation="read_committed")
        end = res.last_stable_offset if res.last_stable_offset >= 0 else res.high_watermark
        if offset >= end:
            return out
        table = res.to_arrow(start_offset=offset, end_offset=end)
        out.extend(
            (o, e, v or b"")
            for o, e, v in zip(
                table.column("offset").to_pylist(),
                table.column("leaderEpoch").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            )
        )
        last = res.last_offset_and_epoch()
        assert last is not None, f"empty read_committed fetch at {offset} below {end}"
        offset = min(last.offset + 1, end)
    raise AssertionError("read_committed did not reach the last stable offset")
