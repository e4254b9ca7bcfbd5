"""Produce: one partition's batches (``produce``), or many partitions' at once, pipelined
per leader (``produce_many``, or ``produce_send`` then ``produce_wait``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import defaults
from ..protocol import DEFAULT_MAX_FRAME_BYTES, ApiKey, ErrorCode, max_batch_bytes
from ..protocol import messages as m
from .base import _server_wait_ms
from .connection import Connection
from .errors import OutOfOrderSequenceError, RecordTooLargeError, RequestTimeoutError
from .metadata import PartitionMetadata
from .routing import RequestRouting

# Requests a produce_many has in flight on one connection: what a node reads ahead of its
# answers.
PIPELINE = defaults.CONNECTION_MAX_IN_FLIGHT
# Bytes of records one ProduceMany frame of produce_many carries at most (more make another
# frame): what one Produce may carry, so a node that takes the largest batch takes these.
PRODUCE_MANY_BYTES = defaults.MAX_MESSAGE_BYTES


class ProduceResult(NamedTuple):
    topic: str
    partition: int
    base_offset: int
    last_offset: int
    leader_epoch: int


class ProduceCall:
    """A ``produce_many`` sent in part (``Client.produce_send``), for
    ``Client.produce_wait``: its items, each one's result so far, each leader's frames
    (lists of item indexes), and the turn in flight (its frames, connections and the
    errors of those that could not be sent)."""

    __slots__ = ("items", "acks", "deadline", "results", "per_node", "part", "sent", "unsent")

    def __init__(self, items: Sequence[tuple[str, int, bytes]], acks: int, deadline: float):
        self.items = items
        self.acks = acks
        self.deadline = deadline
        self.results: list[ProduceResult | Exception | None] = [None] * len(items)
        self.per_node: dict[tuple[str, int], list[list[int]]] = {}
        self.part: dict[tuple[str, int], list[list[int]]] = {}
        self.sent: dict[tuple[str, int], tuple[Connection, list[int]]] = {}
        self.unsent: dict[tuple[str, int], list[Any]] = {}


def check_batch_size(topic: str, partition: int, records: bytes, limit: int) -> None:
    """Raise RecordTooLargeError if ``records`` holds a batch over ``limit`` (the topic's
    max.message.bytes; 0: unknown) or cannot fit one frame at all. Only headers are read,
    and only when the whole is over the limit."""
    ceiling = max_batch_bytes(DEFAULT_MAX_FRAME_BYTES)
    if len(records) > ceiling:
        raise RecordTooLargeError(
            f"MESSAGE_TOO_LARGE: {len(records)} bytes of records to {topic}/{partition} exceed "
            f"the {ceiling} bytes one produce request can carry"
        )
    if limit <= 0 or len(records) <= limit:
        return
    from ..storage.errors import CorruptRecordError
    from ..storage.records import iter_batches

    try:
        for h in iter_batches(records):
            if h.size > limit:
                raise RecordTooLargeError(
                    f"MESSAGE_TOO_LARGE: record batch of {h.size} bytes to {topic}/{partition} "
                    f"exceeds the topic's max.message.bytes {limit}"
                )
    except CorruptRecordError:
        return  # malformed input: the node answers for it


class ProduceCalls(RequestRouting):
    """Appends to partitions' leaders, and the idempotent producer's identity."""

    def check_size(self, topic: str, partition: int, records: bytes) -> None:
        """Raise RecordTooLargeError if ``records`` would be refused for its size by the
        partition's max.message.bytes as this client last learnt it (asking no node)."""
        pm = self._leaders.get((topic, partition))
        check_batch_size(topic, partition, records, pm.max_message_bytes if pm else 0)

    def init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        """A new idempotent producer identity (id, epoch 0), or, naming the current one,
        the next epoch of that id (which fences the older epoch)."""
        resp = self._admin(
            ApiKey.INIT_PRODUCER_ID,
            m.InitProducerIdRequest(producer_id=producer_id, producer_epoch=producer_epoch),
            m.InitProducerIdResponse,
        )
        return resp.producer_id, resp.producer_epoch

    def produce(
        self,
        topic: str,
        partition: int,
        records: bytes,
        *,
        acks: int = m.ACKS_QUORUM,
        timeout_ms: int | None = None,
    ) -> ProduceResult:
        """Append encoded batches (see ``quorumlog.replica.storage.records``). An attempt
        that timed out or lost its connection may have appended them; the retry sends the
        same bytes, so a batch with producer fields (``Producer``, idempotent) is appended
        once: the leader answers a retry with the first append's offsets. Without them a
        retry may append the records twice. With acks=quorum the leader waits for the
        quorum within the attempt (its REQUEST_TIMED_OUT is retried). OUT_OF_ORDER_SEQUENCE
        is retried too: a deposed leader that missed the previous batch answers it, and
        the current leader then finds the retry in order, or a duplicate."""
        t = timeout_ms if timeout_ms is not None else self.request_timeout_ms
        sent = 0

        def request(pm: PartitionMetadata, attempt_s: float) -> m.ProduceRequest:
            nonlocal sent
            # Checked per attempt against the limit of the metadata it routes by; raised
            # out of _leader_call at once, as no retry can make the batch fit.
            check_batch_size(topic, partition, records, pm.max_message_bytes)
            sent += 1
            return m.ProduceRequest(
                topic=topic,
                partition=partition,
                acks=acks,
                timeout_ms=max(1, _server_wait_ms(attempt_s)),
                records=records,
            )

        try:
            resp = self._leader_call(
                topic,
                partition,
                ApiKey.PRODUCE,
                request,
                m.ProduceResponse,
                fenced_to_caller=False,
                timeout_ms=t,
                also_retriable=(OutOfOrderSequenceError,),
            )
        except RequestTimeoutError as exc:
            if not sent:
                raise
            raise RequestTimeoutError(
                f"{exc}. The records may have been appended anyway (an attempt that timed "
                "out or lost its connection can still commit)"
            ) from None
        return ProduceResult(
            topic, partition, resp.base_offset, resp.last_offset, resp.leader_epoch
        )

    def produce_many(
        self,
        items: Sequence[tuple[str, int, bytes]],
        *,
        acks: int = m.ACKS_QUORUM,
        timeout_ms: int | None = None,
    ) -> list[ProduceResult | Exception]:
        """Append encoded batches to several partitions at once, ``items`` of (topic,
        partition, records): one ProduceMany request per leader and topic (as Kafka's
        ProduceRequest; more past PRODUCE_MANY_BYTES), every leader's sent on its
        connection (up to PIPELINE each) before any answer is read, so batches for many
        partitions wait one round trip and cost the node one frame, not one each. An item
        whose first attempt fails (an error answer, of the item or of its whole frame, a
        leader change, a lost connection) is then sent alone by ``produce``, with its
        retries and errors. Returns, in the order of ``items``, each one's ProduceResult or
        the error ``produce`` raised for it.
        A partition's items are appended in the order given when their first attempts
        succeed (the requests of a pipeline are appended in order), but an item that is
        retried alone goes after the others: give a partition several items only if a
        later one is refused while an earlier one is missing (an idempotent producer's
        numbered batches: OUT_OF_ORDER_SEQUENCE, retried in turn). The call returns
        when every item has: a node that does not answer holds it up for an attempt
        timeout (``Producer`` sends one node's batches per call, so that a hung node holds
        up only its own partitions)."""
        return self.produce_wait(self.produce_send(items, acks=acks, timeout_ms=timeout_ms))

    def produce_send(
        self,
        items: Sequence[tuple[str, int, bytes]],
        *,
        acks: int = m.ACKS_QUORUM,
        timeout_ms: int | None = None,
    ) -> ProduceCall:
        """The first half of ``produce_many``: its requests sent (the first PIPELINE
        frames of each leader), no answer read. ``produce_wait`` reads them and does the
        rest. Calls sent one after another on this client and waited for in the same
        order keep a pipeline on each leader's connection: the node appends the second
        while the first waits for its quorum."""
        t = timeout_ms if timeout_ms is not None else self.request_timeout_ms
        call = ProduceCall(items, acks, time.monotonic() + t / 1000)
        filling: dict[tuple[tuple[str, int], str], tuple[list[int], int]] = {}  # and bytes
        for i, (topic, partition, records) in enumerate(items):
            try:
                pm = self.partition_metadata(
                    topic, partition, timeout_s=self._attempt_s(call.deadline)
                )
                check_batch_size(topic, partition, records, pm.max_message_bytes)
            except RecordTooLargeError as exc:
                call.results[i] = exc  # no retry makes it fit
                continue
            except Exception:
                continue  # left to produce()
            addr = self._nodes.get(pm.leader_id) if pm.leader_id >= 0 else None
            if addr is not None and not self._suspected(addr):
                chunk, size = filling.get((addr, topic), ([], PRODUCE_MANY_BYTES))
                if size + len(records) > PRODUCE_MANY_BYTES:  # one topic a frame
                    chunk, size = [], 0
                    call.per_node.setdefault(addr, []).append(chunk)
                chunk.append(i)
                filling[(addr, topic)] = (chunk, size + len(records))
        self._produce_turn(call, 0)
        return call

    def produce_wait(self, call: ProduceCall) -> list[ProduceResult | Exception]:
        """The second half of ``produce_many``: the answers of ``call`` read (and its
        further turns sent and read), then each item whose first attempt failed sent
        alone by ``produce``; each item's ProduceResult or error, in order."""
        items = call.items
        turns = max(map(len, call.per_node.values()), default=0)
        for turn in range(0, turns, PIPELINE):
            if turn:
                self._produce_turn(call, turn)
            answers = self._pipeline_receive(call.sent, m.ProduceManyResponse, call.unsent)
            for addr, chunks in call.part.items():
                for chunk, many in zip(chunks, answers[addr], strict=True):
                    if not isinstance(many, m.ProduceManyResponse) or len(many.answers) != len(
                        chunk
                    ):
                        continue  # an error of the whole frame: each item goes again alone
                    for i, resp in zip(chunk, many.answers, strict=True):
                        if resp.error == ErrorCode.NONE:
                            call.results[i] = ProduceResult(
                                items[i][0],
                                items[i][1],
                                resp.base_offset,
                                resp.last_offset,
                                resp.leader_epoch,
                            )
                        elif resp.error == ErrorCode.NOT_LEADER:
                            cached = self._leaders.get((items[i][0], items[i][1]))
                            if cached is not None:
                                self._moved(cached, resp)  # its retry goes to the leader named
        results = call.results
        for i, (topic, partition, records) in enumerate(items):
            if results[i] is None:
                left_ms = max(1, int((call.deadline - time.monotonic()) * 1000))
                try:
                    results[i] = self.produce(
                        topic, partition, records, acks=call.acks, timeout_ms=left_ms
                    )
                except Exception as exc:
                    results[i] = exc
        out = [r for r in results if r is not None]
        assert len(out) == len(items)
        return out

    def _produce_turn(self, call: ProduceCall, turn: int) -> None:
        """Send the frames of ``call``'s turn (up to PIPELINE a leader, from ``turn``)."""
        items = call.items
        part = {addr: chunks[turn : turn + PIPELINE] for addr, chunks in call.per_node.items()}
        call.part = {addr: chunks for addr, chunks in part.items() if chunks}
        attempt_s = self._attempt_s(call.deadline)
        server_ms = max(1, _server_wait_ms(attempt_s))
        batches = {
            addr: [
                m.ProduceManyRequest(
                    topic=items[chunk[0]][0],
                    partitions=[items[i][1] for i in chunk],
                    sizes=[len(items[i][2]) for i in chunk],
                    acks=call.acks,
                    timeout_ms=server_ms,
                    records=b"".join(items[i][2] for i in chunk),
                )
                for chunk in chunks
            ]
            for addr, chunks in call.part.items()
        }
        call.unsent, call.sent = self._pipeline_send(batches, ApiKey.PRODUCE_MANY, attempt_s)
