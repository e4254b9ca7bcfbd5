"""The producer's batching without a cluster: an in-memory client that appends what the
senders send. ``send`` and ``send_many`` keep each partition's order (keyed records
included, hashed a column at a time), a record's future names its offset (the batch's base
plus its index), on_delivery runs once per record, keyless records stay on one partition
per batch (KIP-480), and batches close at their limits."""

from __future__ import annotations

import threading
import time
from array import array
from collections import Counter, defaultdict
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pytest
from quorumlog.replica import defaults
from quorumlog.replica.client import OutOfOrderSequenceError, ProduceResult, RecordTooLargeError
from quorumlog.replica.client.batches import RECORD_OVERHEAD, record_sizes
from quorumlog.replica.client.partitioner import murmur2
from quorumlog.replica.client.producer import (
    SENDER_WINDOW,
    ManyFuture,
    Producer,
    RecordFuture,
    RecordMetadata,
)
from quorumlog.replica.storage.producers import BATCHES_KEPT
from quorumlog.replica.storage.records import (
    RECORD_SCHEMA,
    batches_to_table,
    iter_batches,
    null_array,
)

from tests.support.waits import wait_until


class _Meta:
    def __init__(self, n: int) -> None:
        self.partitions = dict.fromkeys(range(n))


class MemoryClient:
    """What the producer needs of a Client, appending to lists: every partition led by
    node 1, each batch given the partition's next offsets, an idempotent producer's
    batches checked for their sequence as a leader does. ``hold``: while clear, produce
    calls wait (a partition with a batch in flight). ``limit``: max.message.bytes.
    ``calls``: each call's (topic, partition) items (``produce_send``, answered by
    ``produce_wait``); ``most_flying``: the most batches of a partition in flight;
    ``most_calls``: the most calls in flight."""

    def __init__(self, partitions: dict[str, int], limit: int = 0) -> None:
        self.partitions = partitions
        self.limit = limit
        self.logs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        self.batches: list[tuple[str, int, int]] = []  # topic, partition, records
        self.calls: list[list[tuple[str, int]]] = []
        self.flying: Counter[tuple[str, int]] = Counter()  # batches sent, not yet answered
        self.most_flying = 0
        self.calls_flying = self.most_calls = 0  # calls sent and not yet waited for
        # (topic, partition) -> (producer id, epoch, next sequence)
        self.sequences: dict[tuple[str, int], tuple[int, int, int]] = {}
        self.lock = threading.Lock()
        self.hold = threading.Event()
        self.hold.set()

    def clone(self) -> MemoryClient:
        return self

    def close(self) -> None:
        pass

    def metadata(self, topics: list[str]) -> dict[str, _Meta]:
        return {t: _Meta(self.partitions[t]) for t in topics}

    def cached_leader(self, topic: str, partition: int) -> int:
        return 1

    def stored_compression(self, topic: str, partition: int) -> None:
        return None  # no topic asks for compressed batches

    def init_producer_id(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        return (7, 0) if producer_id < 0 else (producer_id, epoch + 1)

    def check_size(self, topic: str, partition: int, records: bytes) -> None:
        if self.limit and len(records) > self.limit:
            raise RecordTooLargeError(f"{len(records)} > {self.limit}")

    def produce_send(
        self, items: list[tuple[str, int, bytes]], acks: int = -1
    ) -> list[tuple[str, int, bytes]]:
        with self.lock:
            self.calls.append([(topic, partition) for topic, partition, _ in items])
            self.flying.update((topic, partition) for topic, partition, _ in items)
            self.most_flying = max(self.most_flying, *self.flying.values())
            self.calls_flying += 1
            self.most_calls = max(self.most_calls, self.calls_flying)
        return items

    def produce_wait(self, items: list[tuple[str, int, bytes]]) -> list[Any]:
        self.hold.wait(30)
        out: list[Any] = []
        with self.lock:
            self.flying.subtract((topic, partition) for topic, partition, _ in items)
            self.calls_flying -= 1
            for topic, partition, records in items:
                if self.limit and len(records) > self.limit:
                    out.append(RecordTooLargeError(f"{len(records)} > {self.limit}"))
                    continue
                (header,) = iter_batches(records)
                if header.producer is not None:
                    pid, epoch, first = header.producer
                    known = self.sequences.get((topic, partition))
                    expected = known[2] if known is not None and known[:2] == (pid, epoch) else 0
                    if first != expected:
                        out.append(OutOfOrderSequenceError(f"{first}, not {expected}"))
                        continue
                    self.sequences[(topic, partition)] = (
                        pid,
                        epoch,
                        first + header.record_count,
                    )
                table = batches_to_table(records)
                log = self.logs[(topic, partition)]
                base = len(log)
                log.extend(table.select(["key", "value", "timestamp", "headers"]).to_pylist())
                self.batches.append((topic, partition, header.record_count))
                out.append(ProduceResult(topic, partition, base, len(log) - 1, 3))
        return out


def _producer(client: MemoryClient, **kw: Any) -> Producer:
    return Producer(client, **kw)  # type: ignore[arg-type]


def test_a_records_future_names_its_offset_and_on_delivery_runs_once() -> None:
    client = MemoryClient({"t": 2})
    called: list[tuple[BaseException | None, RecordMetadata | None]] = []
    with _producer(client, linger_ms=60_000, max_batch_records=7) as producer:
        futures = [
            producer.send(
                "t",
                b"v%d" % i,
                partition=i % 2,
                on_delivery=lambda err, meta: called.append((err, meta)),
            )
            for i in range(30)
        ]
        assert isinstance(futures[0], RecordFuture)
        producer.flush(30)
    for i, future in enumerate(futures):
        meta = future.result(0)
        assert future.done() and future.exception(0) is None
        assert (meta.topic, meta.partition, meta.leader_epoch) == ("t", i % 2, 3)
        assert client.logs[("t", i % 2)][meta.offset]["value"] == b"v%d" % i
    assert sorted(m for _, m in called if m) == sorted(f.result() for f in futures)
    assert all(err is None for err, _ in called) and len(called) == 30
    # Batches closed at 7 records: partition 0 has 15 records, 7 + 7 + 1.
    assert sorted(n for t, p, n in client.batches if p == 0) == [1, 7, 7]


def test_keys_headers_and_timestamps_reach_the_log() -> None:
    client = MemoryClient({"t": 1})
    with _producer(client) as producer:
        before = int(time.time() * 1000)
        producer.send("t", b"a", partition=0)
        producer.send("t", b"b", key=b"k", partition=0, headers=[("h", b"1")])
        producer.send("t", None, partition=0, timestamp_ms=1_700_000_000_123)
        producer.flush(30)
        after = int(time.time() * 1000)
    a, b, c = client.logs[("t", 0)]
    assert (a["key"], a["value"], a["headers"]) == (None, b"a", None)
    assert (b["key"], b["value"], b["headers"]) == (b"k", b"b", [{"key": "h", "value": b"1"}])
    assert before <= int(a["timestamp"].timestamp() * 1000) <= after
    assert c["value"] is None and int(c["timestamp"].timestamp() * 1000) == 1_700_000_000_123


def test_keyed_records_go_where_murmur2_puts_them_in_order() -> None:
    client = MemoryClient({"t": 5})
    keys = [b"key-%d" % (i % 37) for i in range(500)]
    with _producer(client, max_batch_records=64) as producer:
        futures = [producer.send("t", b"%d" % i, key=k) for i, k in enumerate(keys)]
        producer.flush(30)
    for i, (key, future) in enumerate(zip(keys, futures, strict=True)):
        meta = future.result(0)
        assert meta.partition == (murmur2(key) & 0x7FFFFFFF) % 5
        assert client.logs[("t", meta.partition)][meta.offset]["value"] == b"%d" % i
    for p in range(5):  # each partition's records in the order sent
        values = [int(r["value"]) for r in client.logs[("t", p)]]
        assert values == sorted(values)


def test_consistent_random_hashes_by_crc32_and_an_empty_key_is_keyless() -> None:
    import zlib

    client = MemoryClient({"t": 7})
    with _producer(client, partitioner="consistent_random") as producer:
        keyed = [producer.send("t", b"v", key=b"k%d" % i) for i in range(50)]
        empty = [producer.send("t", b"v", key=b"") for _ in range(20)]
        producer.flush(30)
    assert [f.result().partition for f in keyed] == [zlib.crc32(b"k%d" % i) % 7 for i in range(50)]
    assert len({f.result().partition for f in empty}) == 1  # sticky, as without a key
    with pytest.raises(ValueError, match="partitioner"):
        _producer(client, partitioner="murmur2")


def test_keyless_records_stick_to_a_partition_per_batch() -> None:
    client = MemoryClient({"t": 8})
    with _producer(client, linger_ms=60_000, max_batch_records=50) as producer:
        futures = [producer.send("t", b"v%d" % i) for i in range(400)]
        producer.flush(30)
    partitions = [f.result().partition for f in futures]
    runs = [partitions[i : i + 50] for i in range(0, 400, 50)]
    assert all(len(set(run)) == 1 for run in runs)  # one partition a batch
    assert all(a[0] != b[0] for a, b in zip(runs, runs[1:], strict=False))  # then another
    assert sorted(n for _, _, n in client.batches) == [50] * 8


@pytest.mark.parametrize("call", ["send", "send_many"])
def test_keyless_records_move_on_when_the_sticky_batch_fills_mid_call(call: str) -> None:
    client = MemoryClient({"t": 4})
    with _producer(client, linger_ms=60_000, max_batch_records=10) as producer:
        first = [producer.send("t", b"a") for _ in range(7)]
        if call == "send":
            rest = [producer.send("t", b"b") for _ in range(6)]
        else:
            many = producer.send_many("t", [b"b"] * 6)
        producer.flush(30)
    metas = [f.result(0) for f in rest] if call == "send" else many.result(0)
    sticky = first[0].result(0).partition
    assert {f.result(0).partition for f in first} == {sticky}
    # three fill the sticky batch to 10 and close it; the other three go to the next one
    assert [m.partition for m in metas[:3]] == [sticky] * 3
    assert len({m.partition for m in metas[3:]}) == 1 and metas[3].partition != sticky
    assert [m.offset for m in metas] == [7, 8, 9, 0, 1, 2]
    assert sorted(n for _, _, n in client.batches) == [3, 10]
    assert_sticky_runs(client, metas, 10)


def test_named_partitions_and_keys_mixed_keep_each_partitions_order() -> None:
    client = MemoryClient({"t": 3})
    sent: dict[int, list[bytes]] = defaultdict(list)
    with _producer(client, max_batch_records=10) as producer:
        futures = []
        for i in range(300):
            value = b"%d" % i
            if i % 3 == 0:
                futures.append(producer.send("t", value, partition=i % 2))
            elif i % 3 == 1:
                futures.append(producer.send("t", value, key=b"k%d" % (i % 11)))
            else:
                futures.append(producer.send("t", value))
        producer.flush(30)
    for i, future in enumerate(futures):
        sent[future.result().partition].append(b"%d" % i)
    for p in range(3):
        assert [r["value"] for r in client.logs[("t", p)]] == sent[p]


def assert_sticky_runs(client: MemoryClient, metas: list[RecordMetadata], limit: int) -> None:
    """The keyless records of one call, as KIP-480 places them: on the sticky partition,
    at consecutive offsets, until its batch closes, then on the next one. Within one call
    no linger closes a batch (the call holds the producer's lock), so every run but the
    last ends a batch that is full (``limit`` records), wherever the earlier records and
    lingers had left the sticky batch's fill."""
    runs: list[list[RecordMetadata]] = []
    for meta in metas:
        if runs and runs[-1][-1].partition == meta.partition:
            runs[-1].append(meta)
        else:
            runs.append([meta])
    for run in runs:
        assert [m.offset for m in run] == list(range(run[0].offset, run[0].offset + len(run)))
    for run, after in zip(runs, runs[1:], strict=False):
        sizes = [n for _, p, n in client.batches if p == run[-1].partition]
        full_ends = {end for end, n in zip(accumulate(sizes), sizes, strict=True) if n == limit}
        assert run[-1].offset + 1 in full_ends
        assert after[0].partition != run[-1].partition


def test_send_many_partitions_like_send_and_lists_each_records_place() -> None:
    client = MemoryClient({"t": 4})
    values = [b"v%d" % i for i in range(2500)]
    keys = [b"key-%d" % (i % 97) if i % 5 else None for i in range(2500)]
    with _producer(client, max_batch_records=300) as producer:
        one = producer.send_many("t", values, partition=2)
        keyed = producer.send_many("t", values, keys=keys)
        keyless = producer.send_many("t", values[:10])
        producer.flush(30)
    assert isinstance(one, ManyFuture) and len(one) == 2500 and one.done()
    metas = one.result(0)
    assert [m.partition for m in metas] == [2] * 2500
    assert [m.offset for m in metas] == list(range(2500))
    placed = keyed.result(0)
    for i, meta in enumerate(placed):
        row = client.logs[("t", meta.partition)][meta.offset]
        assert (row["key"], row["value"]) == (keys[i], values[i])
        if keys[i] is not None:
            assert meta.partition == (murmur2(keys[i]) & 0x7FFFFFFF) % 4  # type: ignore[arg-type]
    assert_sticky_runs(client, keyless.result(0), 300)
    assert max(n for _, _, n in client.batches) <= 300
    with pytest.raises(ValueError, match="keys"):
        producer.send_many("t", values, keys=keys[:3])
    assert producer.send_many("t", []).result(0) == []


def test_send_many_waits_for_buffer_room_then_raises() -> None:
    client = MemoryClient({"t": 1})
    client.hold.clear()  # nothing is answered: the buffer stays full
    producer = _producer(client, linger_ms=0, buffer_bytes=50_000, max_block_ms=300)
    try:
        # it raises only once its max_block_ms has passed without room, and says so
        with pytest.raises(TimeoutError, match=r"buffer full .* for 0\.3 s"):
            producer.send_many("t", [b"x" * 100] * 5000, partition=0)
    finally:
        client.hold.set()
        producer.close(30)


def test_a_batch_over_the_limit_is_split_and_a_record_alone_over_it_fails() -> None:
    client = MemoryClient({"t": 1}, limit=2000)
    with _producer(client, linger_ms=60_000) as producer:
        small = [producer.send("t", b"%04d" % i * 50, partition=0) for i in range(20)]
        huge = producer.send("t", b"x" * 5000, partition=0)
        with pytest.raises(RecordTooLargeError):
            producer.flush(30)
    assert [f.result(0).offset for f in small] == list(range(20))
    assert isinstance(huge.exception(0), RecordTooLargeError)
    with pytest.raises(RecordTooLargeError):
        huge.result(0)


def _held_backlog(client: MemoryClient, producer: Producer, values: list[bytes]) -> None:
    """A first batch of partition 0 (10 records) goes out and is held in flight while
    ``values`` fill more of the partition's batches; then the backlog is let go and
    flushed."""
    client.hold.clear()
    for _ in range(10):
        producer.send("t", b"first", partition=0)
    wait_until(lambda: client.calls, 10, "the first batch in flight")
    for value in values:
        producer.send("t", value, partition=0)
    client.hold.set()
    producer.flush(30)


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_partitions_backlog_goes_in_calls_in_flight_together_in_order(
    idempotent: bool,
) -> None:
    """An idempotent producer's sender sends a partition's ready batches several to a
    call, and a second call before the first is answered (SENDER_WINDOW), numbered one
    after another, never more in flight than PRODUCER_PARTITION_IN_FLIGHT; without
    idempotence (a retry could reorder them) one batch at a time."""
    client = MemoryClient({"t": 1})
    values = [b"%03d" % i for i in range(90)]
    with _producer(client, linger_ms=60_000, max_batch_records=10, idempotent=idempotent) as p:
        _held_backlog(client, p, values)
    assert [r["value"] for r in client.logs[("t", 0)]] == [b"first"] * 10 + values
    per_call = max(len(call) for call in client.calls)
    if idempotent:
        assert per_call == -(-defaults.PRODUCER_PARTITION_IN_FLIGHT // SENDER_WINDOW) > 1
        assert client.most_flying == defaults.PRODUCER_PARTITION_IN_FLIGHT
        assert client.most_calls == SENDER_WINDOW > 1
    else:
        assert per_call == client.most_flying == client.most_calls == 1
    assert defaults.PRODUCER_PARTITION_IN_FLIGHT <= BATCHES_KEPT


def test_a_batch_too_large_in_a_backlog_is_split_before_the_batches_after_it() -> None:
    """Of a partition's batches sent together, one over max.message.bytes is held back
    with those after it: its halves go first, then the rest, each numbered in turn."""
    client = MemoryClient({"t": 1}, limit=2000)
    big = [b"B%03d" % i * 100 for i in range(10)]  # ~4 KB a batch of 10: over the limit
    small = [b"s%03d" % i for i in range(20)]
    with _producer(client, linger_ms=60_000, max_batch_records=10) as p:
        _held_backlog(client, p, [*big, *small])
    assert [r["value"] for r in client.logs[("t", 0)]] == [b"first"] * 10 + big + small
    sizes = [n for _, _, n in client.batches]  # the big batch went in pieces, first
    assert sizes[0] == 10 and sizes[-2:] == [10, 10] and len(sizes) > 4
    assert sum(sizes[1:-2]) == 10


def test_futures_wait_and_call_back_when_done() -> None:
    client = MemoryClient({"t": 3})
    client.hold.clear()
    producer = _producer(client, linger_ms=0)
    try:
        plain = producer.send("t", b"a", partition=0)
        keyed = producer.send("t", b"b", key=b"k")
        many = producer.send_many("t", [b"c", b"d"], keys=[b"x", b"y"])
        seen: list[object] = []
        for future in (plain, keyed, many):
            future.add_done_callback(seen.append)
        with pytest.raises(TimeoutError):
            plain.result(0.05)
        assert not plain.done() and not plain.cancel() and not many.done()
        client.hold.set()
        assert plain.result(10).partition == 0
        assert keyed.result(10).partition == (murmur2(b"k") & 0x7FFFFFFF) % 3
        assert [m.partition for m in many.result(10)] == [
            (murmur2(k) & 0x7FFFFFFF) % 3 for k in (b"x", b"y")
        ]
        wait_until(lambda: len(seen) == 3, 10, "the done callbacks")
        assert Counter(map(type, seen)) == {RecordFuture: 2, ManyFuture: 1}
        late: list[object] = []
        plain.add_done_callback(late.append)  # already done: called at once
        assert late == [plain]
    finally:
        client.hold.set()
        producer.close(30)


def test_a_linger_sends_a_batch_that_never_fills() -> None:
    client = MemoryClient({"t": 64})
    with _producer(client, linger_ms=20) as producer:
        future = producer.send("t", b"lonely", key=b"k")  # never answered if never sent
        assert future.result(10).partition == (murmur2(b"k") & 0x7FFFFFFF) % 64


def test_send_batch_goes_after_what_was_sent_before() -> None:
    client = MemoryClient({"t": 2})
    with _producer(client, linger_ms=60_000) as producer:
        first = producer.send("t", b"first", key=b"k")
        table_future = producer.send_batch(
            "t", first_partition := (murmur2(b"k") & 0x7FFFFFFF) % 2, pa.table({"value": [b"t"]})
        )
        producer.flush(30)
    assert table_future.result(0).base_offset == first.result(0).offset + 1
    assert [r["value"] for r in client.logs[("t", first_partition)]] == [b"first", b"t"]


def test_record_sizes_count_key_and_value_bytes_of_a_slice_and_nulls_as_none() -> None:
    # Sizes come from the offsets as they are: a sliced column's own rows, and a null
    # whose slot spans bytes (Arrow allows it) counts as no bytes.
    value = pa.Array.from_buffers(
        pa.binary(),
        4,
        [
            pa.py_buffer(bytes([0b1101])),
            pa.py_buffer(array("i", [0, 2, 7, 8, 11])),
            pa.py_buffer(b"abcdefghijk"),
        ],
        null_count=1,
    )
    key = pa.array([b"k", None, b"kkk", None], pa.binary())
    chunk = pa.RecordBatch.from_arrays(
        [
            key,
            value,
            pa.array([1, 2, 3, 4], pa.timestamp("ms")),
            null_array(4, RECORD_SCHEMA.field("headers").type),
        ],
        schema=RECORD_SCHEMA,
    )
    overhead = RECORD_OVERHEAD
    assert record_sizes(chunk).tolist() == [overhead + 3, overhead, overhead + 4, overhead + 3]
    assert record_sizes(chunk.slice(1, 2)).tolist() == [overhead, overhead + 4]


class _BreakingClient(MemoryClient):
    """A MemoryClient whose ``broken`` method raises once, as a fault of the sender's own
    (a bug, or a connection left half-read) rather than an answer would."""

    def __init__(self, broken: str) -> None:
        super().__init__({"t": 1})
        self.broken = broken

    def _fault(self, name: str) -> None:
        if self.broken == name:
            self.broken = ""
            raise RuntimeError(f"{name} broke")

    def produce_send(
        self, items: list[tuple[str, int, bytes]], acks: int = -1
    ) -> list[tuple[str, int, bytes]]:
        self._fault("produce_send")
        return super().produce_send(items, acks)

    def produce_wait(self, items: list[tuple[str, int, bytes]]) -> list[Any]:
        self._fault("produce_wait")
        return super().produce_wait(items)


@pytest.mark.parametrize("broken", ["produce_send", "produce_wait"])
def test_a_sender_that_fails_answers_its_batches_with_the_error_and_sending_goes_on(
    broken: str,
) -> None:
    client = _BreakingClient(broken)
    called: list[BaseException | None] = []
    with _producer(client, linger_ms=0) as producer:
        lost = producer.send("t", b"lost", partition=0, on_delivery=lambda e, m: called.append(e))
        # answered with the error, not left to flush's timeout (which raises TimeoutError)
        with pytest.raises(RuntimeError, match=f"{broken} broke"):
            producer.flush(30)
        with pytest.raises(RuntimeError, match=f"{broken} broke"):
            lost.result(0)
        assert [type(e) for e in called] == [RuntimeError]
        later = [producer.send("t", b"later", partition=0) for _ in range(3)]
        producer.flush(30)
    assert [f.result(0).offset for f in later] == [0, 1, 2]
    assert [r["value"] for r in client.logs[("t", 0)]] == [b"later"] * 3
