"""The Kafka listener's Produce path: every partition's batches of the Produce requests
handled in one turn of the event loop appended together (``Api.produce_started``: one
driver step, one flush, one replication round), and a partition's plain batches of those
requests merged into one stored batch. A partition with ``APPENDS_IN_FLIGHT`` turns'
appends not yet answered has the batches of its next requests wait, merging, until one
is; each append's requests are answered when its own answer comes.

Why merge: a producer under a backlog (librdkafka, keyed records over many partitions,
its default linger of 5 ms) sends thousands of small requests, each carrying a few
records for each of a few dozen partitions. What a node spends goes by the batch (the
append, the replicas' copies, their checks), so small batches held it to a fraction of
its rate with big ones, answers came later, and the producer's batches stayed small.
Merged, the batches a node appends grow with the backlog instead. Only plain batches
merge (no producer id, not transactional: an idempotent producer's sequence numbers
name its batches), of one compression, and only while the merged batch stays well under
the topic's max.message.bytes; on a compacted topic a batch holding a record without a
key stays alone (its refusal is its own). Offsets are those the batches would have had
appended one after another, so each is answered with its own base offset."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..constants import UNKNOWN
from ..kafka.columnar import KafkaColumns, decode_frame, decode_joined, with_records
from ..kafka.convert import kafka_to_quorumlog
from ..kafka.errors import KafkaError
from ..kafka.records import KafkaRecordBatch, check_produced, check_produced_fields, read_frame
from ..kafka.schema import Message
from ..kafka.wire import KafkaDecodeError
from ..node.api import Api
from ..node.topic_configs import is_compacted, stored_compression
from ..protocol import messages as m
from ..storage.records import encode_arrow
from .errors import kafka_error

log = logging.getLogger(__name__)

#: The Kafka record bytes one turn appends at most (a request larger than this alone is
#: appended alone): the rest wait for the next turn. Read ahead, a backlog of thousands
#: of requests decoded and appended in one turn held the event loop for seconds on a
#: loaded machine, and its followers, their fetches unanswered, elected new leaders. A
#: turn's batches are decoded in one pass, so 1 MiB (about 7,000 records of 100 B) holds
#: the loop for tens of ms; 256 KiB turns gave a backlog's appends fewer records each.
TURN_BYTES = 1 << 20

#: A merged batch holds at most this many bytes of Kafka records, and at most this share
#: of the topic's max.message.bytes (stored as Arrow it takes a little more room).
MERGE_MAX_BYTES = 1 << 20
MERGE_MAX_SHARE = 4

#: A partition's appends in flight at most: the turns of the loop that handed the driver
#: its batches and are not yet answered. The batches of its next requests wait, merged,
#: until one is. librdkafka sends a request a partition, a few dozen records each under
#: a backlog, and what a node spends goes by the batch it appends: appended as each turn
#: of the loop came, a turn's few requests a partition made a batch. Held back while a
#: partition has a turn out, they merge into batches that grow with the backlog (batches
#: that cannot merge, an idempotent producer's, go together in the next turn). Per
#: partition, so that one whose appends wait (its quorum is slow) holds back none of the
#: others. perf kafka --partitions 64 --keyed, the page cache dropped before each run:
#: held back while two were out, 301,578 records/s at 4.12 s of node CPU a million
#: (median of 3) against 240,274 at 5.74 s appending every turn; while one is out, the
#: nodes spent 2-17% less than with two in each of 6 interleaved pairs (medians 290,000
#: against 272,000 records/s). One partition's librdkafka loop and 8 partitions' batches
#: ran as fast either way (within the runs' spread).
APPENDS_IN_FLIGHT = 1


#: A produced batch read but not decoded: its fields, its records' bytes, their count.
_Frame = tuple[KafkaRecordBatch, bytes, int]


@dataclass(slots=True)
class _Share:
    """One partition's batches of one request, and the answer it waits for. Its batches
    are decoded with the turn's (``batches`` None until then), where a partition's
    records must be read before the turn (a compacted topic's keys), at once."""

    index: int
    frames: list[_Frame]
    codecs: list[str | None]  # each batch's stored compression
    answer: asyncio.Future[Message]
    rows: int = 0  # its records
    batches: list[KafkaColumns] | None = None


@dataclass(slots=True)
class _Append:
    """One native Produce of a turn: one share's batches as they came, or plain batches
    of several shares merged."""

    topic: str
    partition: int
    acks: int
    timeout_ms: int
    codec: str | None
    mergeable: bool
    limit: int  # Kafka record bytes it may hold at most
    size: int  # Kafka record bytes it holds
    shares: list[_Share] = field(default_factory=list)
    # Its partition's appends handed to the driver in the same turn, not yet answered
    # (one of that partition's ``APPENDS_IN_FLIGHT``), shared by them.
    unit: list[int] = field(default_factory=lambda: [1])
    # its shares' records, decoded with the turn's (a mergeable append's only)
    joined: pa.RecordBatch | None = None


class ProduceAppender:
    """Appends the partition shares of the Produce requests of one turn of the loop."""

    def __init__(self, api: Api) -> None:
        self.api = api
        # The appends not handed to the driver yet, by partition, in order (a new share
        # merges into its partition's last), and each partition's appends in flight.
        self._queued: dict[tuple[str, int], list[_Append]] = {}
        self._in_flight: dict[tuple[str, int], int] = {}
        self._scheduled = False  # an append of the queued is due in the next loop turn
        self._turn_bytes = 0  # the Kafka record bytes let in since the last append
        # Requests waiting for room in a turn, first come first served (a connection's
        # requests are appended in the order they came), and those let in but not yet
        # taken (none may pass them).
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._let_in = 0

    async def produce(self, body: Message, acks: int) -> list[Message]:
        """Every partition's answer of the Produce ``body`` (in its order): appended with
        the other requests of this turn, ``acks`` the native acks."""
        size = sum(
            len(pd["records"] or b"") for t in body["topic_data"] for pd in t["partition_data"]
        )
        await self._admit(size)
        answers: list[Message | asyncio.Future[Message]] = []
        for t in body["topic_data"]:
            for pd in t["partition_data"]:
                answers.append(self._take(t["name"], pd, acks, body["timeout_ms"]))
        if not self._scheduled:
            self._next_turn()  # no append is due to free the turn's room: free it now
        return [a if isinstance(a, dict) else await a for a in answers]

    async def _admit(self, size: int) -> None:
        """Until this turn has room for ``size`` bytes more (a turn with none takes any),
        after every request that waited before."""
        if not self._waiting and not self._let_in and self._fits(size):
            self._turn_bytes += size
            return
        room = asyncio.get_running_loop().create_future()
        self._waiting.append((size, room))
        try:
            await room
        except asyncio.CancelledError:
            if room.done() and not room.cancelled():
                self._let_in -= 1  # let in, then cancelled: the next may go
                if not self._scheduled:
                    self._next_turn()
            raise
        self._let_in -= 1

    def _fits(self, size: int) -> bool:
        return not self._turn_bytes or self._turn_bytes + size <= TURN_BYTES

    def _next_turn(self) -> None:
        """A new turn's room: the requests waiting for it let in, in order, as they fit."""
        self._turn_bytes = 0
        while self._waiting:
            size, room = self._waiting[0]
            if room.done():  # its request was cancelled
                self._waiting.popleft()
                continue
            if not self._fits(size):
                break
            self._waiting.popleft()
            self._turn_bytes += size
            self._let_in += 1
            room.set_result(None)

    def _take(
        self, topic: str, pd: Message, acks: int, timeout_ms: int
    ) -> Message | asyncio.Future[Message]:
        index = pd["index"]
        assigned = self.api.controller.state.topics.get(topic)
        configs = assigned.configs if assigned is not None else {}
        compacted = is_compacted(self.api._topic_policy(topic))
        try:
            frames = _frames(pd["records"] or b"")
            codecs = [stored_compression(configs, b.compression) for b, _, _ in frames]
            batches = [_decoded(frame) for frame in frames] if compacted else None
        except (KafkaDecodeError, ValueError) as exc:
            return _refused(index, exc)
        if not frames:
            return partition_produced(index, int(KafkaError.INVALID_REQUEST), UNKNOWN, "empty")
        loop = asyncio.get_running_loop()
        codec = codecs[0]
        share = _Share(index, frames, codecs, loop.create_future(), batches=batches)
        share.rows = sum(count for _, _, count in frames)
        size = sum(b.size for b, _, _ in frames)
        mergeable = (
            codecs.count(codec) == len(codecs)
            and all(b.producer_id < 0 and not b.is_transactional for b, _, _ in frames)
            and not (batches is not None and _keyless(batches))
        )
        key = (topic, index)
        queue = self._queued.setdefault(key, [])
        last = queue[-1] if queue else None
        if (
            mergeable
            and last is not None
            and last.mergeable
            and (last.acks, last.codec) == (acks, codec)
            and last.size + size <= last.limit
        ):
            last.shares.append(share)
            last.size += size
            last.timeout_ms = min(last.timeout_ms, timeout_ms)
            return share.answer
        limit = min(
            MERGE_MAX_BYTES, self.api.controller.max_message_bytes(topic) // MERGE_MAX_SHARE
        )
        append = _Append(topic, index, acks, timeout_ms, codec, mergeable, limit, size, [share])
        queue.append(append)
        if self._in_flight.get(key, 0) < APPENDS_IN_FLIGHT:
            self._schedule()
        return share.answer

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._append_turn)

    def _append_turn(self) -> None:
        """Hand the driver, together, the queued appends of the partitions with fewer
        than ``APPENDS_IN_FLIGHT`` out, in the order they were queued, up to
        ``TURN_BYTES`` (the rest in the next turn)."""
        self._scheduled = False
        self._next_turn()
        turn: list[_Append] = []
        size = 0
        for key, queue in list(self._queued.items()):
            if self._in_flight.get(key, 0) >= APPENDS_IN_FLIGHT:
                continue
            if turn and size + queue[0].size > TURN_BYTES:
                self._schedule()
                continue
            # All of the partition's queued appends, up to the turn's bytes: one of its
            # appends in flight (several when batches cannot merge: an idempotent
            # producer's requests in flight are appended together).
            unit = [0]
            while queue and (not unit[0] or size + queue[0].size <= TURN_BYTES):
                a = queue.pop(0)
                a.unit = unit
                unit[0] += 1
                turn.append(a)
                size += a.size
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            if queue:
                self._schedule()
            else:
                del self._queued[key]
        if turn:
            self._append(turn)

    def _append(self, turn: list[_Append]) -> None:
        """The turn's batches decoded in one pass and handed to the driver in one step;
        each append's shares answered when its own answer comes."""
        appended: list[_Append] = []
        try:
            requests: list[m.ProduceRequest] = []
            for a in _decode_turn(turn):
                try:
                    records = _stored(a)
                except (KafkaDecodeError, ValueError, pa.ArrowException) as exc:
                    error = getattr(exc, "error_code", KafkaError.CORRUPT_MESSAGE)
                    for s in a.shares:
                        _answer(s, partition_produced(s.index, int(error), UNKNOWN, str(exc)))
                    continue
                appended.append(a)
                requests.append(
                    m.ProduceRequest(
                        topic=a.topic,
                        partition=a.partition,
                        acks=a.acks,
                        timeout_ms=a.timeout_ms,
                        records=records,
                    )
                )
            answers = self.api.produce_started(requests)
        except BaseException as exc:
            # Whatever failed, no share is left unanswered: its request fails (and the
            # listener closes its connection, as for any request that cannot be answered).
            for a in turn:
                _fail(a, exc)
                self._done(a)
            if not isinstance(exc, Exception):
                raise
            return
        handed = {id(a) for a in appended}
        for a in turn:
            if id(a) not in handed:
                self._done(a)  # every share refused before the driver
        for a, answer in zip(appended, answers, strict=True):
            answer.add_done_callback(functools.partial(self._answered, a))

    def _answered(self, a: _Append, answer: asyncio.Future[Any]) -> None:
        self._done(a)
        failed = asyncio.CancelledError() if answer.cancelled() else answer.exception()
        if failed is not None:
            _fail(a, failed)
            return
        resp = answer.result()
        code = kafka_error(resp.error)
        base = getattr(resp, "base_offset", UNKNOWN)
        for s in a.shares:
            _answer(s, partition_produced(s.index, code, base, resp.error_message))
            if code == 0:
                base += s.rows

    def _done(self, a: _Append) -> None:
        """``a`` is answered (or refused): once the appends handed over with it are too,
        its partition has one append fewer in flight, and its next may go."""
        a.unit[0] -= 1
        if a.unit[0]:
            return
        key = (a.topic, a.partition)
        left = self._in_flight.get(key, 0) - 1
        if left > 0:
            self._in_flight[key] = left
        else:
            self._in_flight.pop(key, None)
        if key in self._queued:
            self._schedule()


def _fail(a: _Append, exc: BaseException) -> None:
    for s in a.shares:
        if not s.answer.done():
            s.answer.set_exception(exc)


def _frames(records: bytes) -> list[_Frame]:
    """The batches of a partition's ``records``, each framing, CRC and header checked
    (``check_produced_fields``), records not yet decoded."""
    frames = []
    position = 0
    while position < len(records):
        batch, data, count = read_frame(records, position)
        check_produced_fields(batch, count)
        frames.append((batch, data, count))
        position += batch.size
    return frames


def _decoded(frame: _Frame) -> KafkaColumns:
    """A batch decoded alone, and checked as a producer's (KafkaDecodeError if not one)."""
    batch = decode_frame(*frame)
    check_produced(batch)
    return batch


def _keyless(batches: list[KafkaColumns]) -> bool:
    return any(b.records.column("key").null_count for b in batches)


def _refused(index: int, exc: Exception) -> Message:
    """A partition's answer for batches that cannot be appended: CORRUPT_MESSAGE, or what
    the fault is in Kafka's words (INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE: errors a
    client does not retry)."""
    error = exc.error_code if isinstance(exc, KafkaDecodeError) else KafkaError.CORRUPT_MESSAGE
    return partition_produced(index, int(error), UNKNOWN, str(exc))


def _decode_turn(turn: list[_Append]) -> list[_Append]:
    """The turn's batches not yet decoded, decoded in one pass (``decode_joined``: what a
    batch costs to decode is mostly per call, and a backlog's are small); where that
    cannot answer, each share's batches alone, a share that is refused answered so. The
    appends left with shares to append."""
    pending = [s for a in turn for s in a.shares if s.batches is None]
    joined = decode_joined([(b.base_timestamp, d, c) for s in pending for b, d, c in s.frames])
    if joined is not None:
        row = 0
        for a in turn:
            if a.mergeable and all(s.batches is None for s in a.shares):
                # No share decoded before: stored as the joined records' slice
                # (``_stored``), its shares need no batch of their own.
                first = row
                for s in a.shares:
                    s.batches = []
                    row += s.rows
                a.joined = joined.slice(first, row - first)
                continue
            for s in a.shares:
                if s.batches is not None:
                    continue
                s.batches = []
                for batch, _, count in s.frames:
                    s.batches.append(with_records(batch, joined.slice(row, count)))
                    row += count
        return turn
    for s in pending:
        try:
            s.batches = [_decoded(frame) for frame in s.frames]
        except (KafkaDecodeError, ValueError) as exc:
            _answer(s, _refused(s.index, exc))
    left = []
    for a in turn:
        a.shares = [s for s in a.shares if not s.answer.done()]
        if a.shares:
            left.append(a)
    return left


def _stored(a: _Append) -> bytes:
    """The stored batches of an append: its shares' plain batches merged into one (the
    turn's decoded records' slice, when they were decoded together), or each batch as it
    came."""
    if a.mergeable and a.joined is not None:
        return encode_arrow(a.joined, compression=a.codec)
    batches = [b for s in a.shares for b in s.batches or ()]
    if a.mergeable and len(batches) > 1:
        table = pa.Table.from_batches([b.records for b in batches])
        return encode_arrow(table, compression=a.codec)
    return b"".join(
        kafka_to_quorumlog(b, compression=codec)
        for s in a.shares
        for b, codec in zip(s.batches or (), s.codecs, strict=True)
    )


def _answer(share: _Share, answer: Message) -> None:
    if not share.answer.done():
        share.answer.set_result(answer)


def partition_produced(index: int, error: int, base_offset: int, message: str) -> Message:
    """One partition's entry of a Produce answer."""
    return {
        "index": index,
        "error_code": error,
        "base_offset": base_offset if error == 0 else -1,
        "log_append_time_ms": -1,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message or None,
    }


__all__ = ["ProduceAppender", "partition_produced"]
