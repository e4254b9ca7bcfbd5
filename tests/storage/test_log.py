from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from quorumlog.replica.storage import (
    HEADER_SIZE,
    RECORD_SCHEMA,
    UNDEFINED_EPOCH,
    AppendInfo,
    CorruptLogError,
    CorruptRecordError,
    EpochEndOffset,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    batches_to_table,
    decode_leader_change,
    encode_arrow,
    encode_batch,
    encode_control_batch,
    iter_batches,
)
from quorumlog.replica.storage.records import _frame, _known_schema_prefix

from .helpers import client_batch, crash, follower_batch, read_all_values, summary, values_for

SMALL = LogConfig(segment_bytes=4000, index_interval_bytes=1500)


def fill(log: Log, batches: int, epoch: int, count: int = 2) -> None:
    for _ in range(batches):
        log.append_as_leader(client_batch(log.end_offset, count), epoch)


def test_conforms_to_replica_log(tmp_path: Path) -> None:
    from quorumlog.replica.raft.log import ReplicaLog

    log: ReplicaLog = Log(str(tmp_path))
    assert log.end_offset == 0 and log.last_epoch() == UNDEFINED_EPOCH


def test_leader_append_assigns_offsets_and_epochs(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    info = log.append_as_leader(client_batch(0, 3) + client_batch(0, 2), 1)
    assert info == AppendInfo(0, 4, 5)
    assert log.append_control(2, 7, [7, 8, 9], 100) == AppendInfo(5, 5, 1)
    fill(log, 10, 2)
    assert log.end_offset == 26 and len(log.segment_base_offsets) > 1
    assert log.last_epoch() == 2
    assert [(e.epoch, e.offset) for e in log.epoch_cache.entries] == [(1, 0), (2, 5)]
    assert log.end_offset_for(1) == EpochEndOffset(1, 5)
    assert log.end_offset_for(2) == EpochEndOffset(2, 26)
    assert [log.epoch_at(o) for o in (-1, 0, 4, 5, 25, 26)] == [-1, 1, 1, 2, 2, -1]
    data = log.read(5, 1)
    assert summary(data) == [(5, 1, 2)]
    assert decode_leader_change(data).voters == [7, 8, 9]
    assert read_all_values(log) == values_for(0, 3) + values_for(0, 2) + [
        v for b in range(6, 26, 2) for v in values_for(b, 2)
    ]


def test_leader_rejects_bad_input_without_writing(tmp_path: Path) -> None:
    log = Log(str(tmp_path))
    fill(log, 1, 3)
    good = client_batch(0, 2)
    bad = bytearray(good)
    bad[-9] ^= 1
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(good + bytes(bad), 3)
    with pytest.raises(CorruptRecordError, match="control"):
        log.append_as_leader(encode_control_batch(1, [1], 0), 3)
    with pytest.raises(ValueError, match="below the latest epoch"):
        log.append_as_leader(good, 2)
    with pytest.raises(ValueError):
        log.append_as_leader(b"", 3)
    assert log.end_offset == 2 and log.size_bytes == len(log.read(0, 1 << 20))


def reframed(payload: bytes, rows: int) -> bytes:
    """A client batch around ``payload`` with a valid header and CRC: only the Arrow
    checks can tell it from a good one."""
    return _frame(
        pa.py_buffer(payload),
        record_count=rows,
        max_timestamp=0,
        base_offset=0,
        leader_epoch=UNDEFINED_EPOCH,
        flags=0,
        producer=None,
    )


def arrow_of(batch: bytes) -> bytes:
    return batch[HEADER_SIZE:]


def test_leader_refuses_arrow_payloads_a_reader_would_trip_over(tmp_path: Path) -> None:
    """The CRC says only that the client's bytes arrived as sent; the leader also checks
    what they say. A value offset past the batch's data (valid CRC) was accepted before,
    and readers then returned bytes from past the batch (memory of the reading process)."""
    log = Log(str(tmp_path))
    good = encode_arrow(pa.table({"value": pa.array([b"aaaaa", b"bbbbb", b"ccccc"])}))
    payload = bytearray(arrow_of(good))
    at = payload.index(struct.pack("<4i", 0, 5, 10, 15))
    payload[at : at + 16] = struct.pack("<4i", 0, 5, 10, 100_000)
    with pytest.raises(CorruptRecordError, match="out of bounds"):
        log.append_as_leader(reframed(bytes(payload), 3), 1)
    with pytest.raises(CorruptRecordError, match="holds 3 rows, header says 4"):
        log.append_as_leader(reframed(arrow_of(good), 4), 1)
    other = pa.table({"value": pa.array([1, 2, 3])})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, other.schema) as writer:
        writer.write_table(other)
    with pytest.raises(CorruptRecordError, match="has schema"):
        log.append_as_leader(reframed(sink.getvalue().to_pybytes(), 3), 1)
    with pytest.raises(CorruptRecordError, match="unreadable Arrow payload"):
        log.append_as_leader(reframed(arrow_of(good)[:-64], 3), 1)
    with pytest.raises(CorruptRecordError, match="starts with a record batch"):
        schema_length = len(RECORD_SCHEMA.serialize())
        log.append_as_leader(reframed(arrow_of(good)[schema_length:], 3), 1)
    assert log.end_offset == 0 and log.size_bytes == 0
    log.append_as_leader(good, 1)  # the untouched batch is fine
    assert log.end_offset == 3


def test_a_known_schema_is_compared_byte_for_byte(tmp_path: Path) -> None:
    """Once a schema message is known to be RECORD_SCHEMA's, the leader skips decoding
    it when a payload opens with the same bytes; other bytes are decoded as before (a
    renamed column of the same length is refused)."""
    log = Log(str(tmp_path))
    good = encode_arrow(pa.table({"value": pa.array([b"aaaaa", b"bbbbb", b"ccccc"])}))
    log.append_as_leader(good, 1)
    schema_length = len(RECORD_SCHEMA.serialize())
    assert _known_schema_prefix(memoryview(arrow_of(good))) == (schema_length, RECORD_SCHEMA)
    renamed = bytearray(arrow_of(good))
    at = renamed.index(b"value")
    renamed[at : at + 5] = b"valuf"
    assert _known_schema_prefix(memoryview(renamed)) == (0, None)
    with pytest.raises(CorruptRecordError, match="has schema"):
        log.append_as_leader(reframed(bytes(renamed), 3), 1)
    log.append_as_leader(good, 1)
    assert log.end_offset == 6


def test_follower_append_validates_offsets(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    assert log.append_as_follower(b"") is None
    data = follower_batch(0, 2, 1) + follower_batch(2, 3, 1) + follower_batch(5, 1, 4)
    assert log.append_as_follower(data) == AppendInfo(0, 5, 6)
    assert [(e.epoch, e.offset) for e in log.epoch_cache.entries] == [(1, 0), (4, 5)]
    assert log.read(0, 1 << 20) == data  # byte for byte
    with pytest.raises(ValueError, match="expected 6"):
        log.append_as_follower(follower_batch(4, 1, 4))  # overlaps what it holds
    with pytest.raises(ValueError, match="below the latest epoch"):
        log.append_as_follower(follower_batch(6, 1, 3))
    assert log.end_offset == 6


def test_read_bounds(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 12, 1, count=3)  # batches at 0, 3, 6, ...
    one = len(log.read(0, 1))
    assert summary(log.read(4, 1)) == [(3, 3, 1)]  # offset inside a batch: whole batch
    assert summary(log.read(3, one * 2)) == [(3, 3, 1), (6, 3, 1)]
    assert summary(log.read(3, one * 2 - 1)) == [(3, 3, 1)]
    assert summary(log.read(3, 1 << 20, max_offset=9)) == [(3, 3, 1), (6, 3, 1)]
    assert summary(log.read(3, 1 << 20, max_offset=8)) == [(3, 3, 1), (6, 3, 1)]
    assert summary(log.read(3, 1 << 20, max_offset=7)) == [(3, 3, 1), (6, 3, 1)]
    assert summary(log.read(3, 1 << 20, max_offset=6)) == [(3, 3, 1)]
    assert log.read(3, 1 << 20, max_offset=3) == b""
    assert log.read(log.end_offset, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.end_offset + 1, 100)
    # From the file, a read stays within one segment (from the tail it need not); the
    # batches after it are read by the next call.
    everything = b""
    offset = 0
    while offset < log.end_offset:
        chunk = log.read(offset, 1 << 20)
        everything += chunk
        offset = list(iter_batches(chunk))[-1].next_offset
    assert [b for b, _, _ in summary(everything)] == list(range(0, 36, 3))


def test_truncate_inside_batch_removes_whole_batch(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 4, 1, count=3)
    fill(log, 8, 2, count=3)
    log.flush()
    log.truncate_to(14)  # inside batch [12, 15)
    assert log.end_offset == 12 and log.durable_end_offset == 12
    assert [(e.epoch, e.offset) for e in log.epoch_cache.entries] == [(1, 0)]
    log.truncate_to(12)  # no-op at the end
    assert log.end_offset == 12
    fill(log, 1, 5, count=3)
    assert log.last_epoch() == 5 and log.end_offset == 15
    log.close()
    reopened = Log(str(tmp_path), SMALL)
    assert reopened.end_offset == 15
    assert [(e.epoch, e.offset) for e in reopened.epoch_cache.entries] == [(1, 0), (5, 12)]
    reopened.truncate_to(0)
    assert reopened.end_offset == 0 and reopened.epoch_cache.entries == []


def test_truncate_below_start_restarts_log(tmp_path: Path) -> None:
    log = Log(str(tmp_path), LogConfig(segment_bytes=3000, retention_bytes=3000))
    fill(log, 12, 1)
    assert log.apply_retention() > 0
    start = log.start_offset
    assert start > 0
    log.truncate_to(start - 1)
    assert (log.start_offset, log.end_offset) == (start - 1, start - 1)
    fill(log, 1, 2)
    assert log.read(start - 1, 100)


def test_retention_by_size_and_age(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=3000, retention_bytes=7000, retention_ms=1000)
    log = Log(str(tmp_path), config)
    for i in range(20):
        log.append_as_leader(encode_batch([b"x"], timestamps=[i * 100]), 1 if i < 10 else 2)
    segments = len(log.segment_base_offsets)
    assert log.apply_retention(now_ms=0, max_offset=0) == 0  # nothing below the HWM
    deleted = log.apply_retention(now_ms=0)  # nothing expired: size only
    assert deleted > 0 and log.size_bytes >= 7000
    assert len(log.segment_base_offsets) == segments - deleted
    start = log.start_offset
    assert log.epoch_cache.entries[0].offset == start
    assert log.epoch_at(start - 1) == UNDEFINED_EPOCH
    with pytest.raises(OffsetOutOfRangeError):
        log.read(start - 1, 100)
    remaining = len(log.segment_base_offsets)
    assert log.apply_retention(now_ms=10**12) == remaining - 1
    assert log.segment_base_offsets == [log.start_offset]  # active segment stays
    assert [(e.epoch, e.offset) for e in log.epoch_cache.entries] == [(2, log.start_offset)]
    log.close()
    assert Log(str(tmp_path), config).start_offset == log.start_offset


def test_a_deleted_segments_last_descriptor_goes_to_close_deleted(tmp_path: Path) -> None:
    """With ``close_deleted``, retention and truncation unlink a segment but hand over a
    descriptor that still holds its file, so that whoever closes it (a node: a thread of
    its own) pays for freeing the pages, not the caller."""
    held: list[int] = []
    log = Log(
        str(tmp_path),
        LogConfig(segment_bytes=3000, retention_bytes=3000),
        close_deleted=held.append,
    )
    fill(log, 12, 1)
    bases = log.segment_base_offsets
    deleted = log.apply_retention()
    assert deleted > 0 and len(held) == deleted
    try:
        for fd, base in zip(held, bases, strict=False):
            assert os.fstat(fd).st_nlink == 0  # unlinked, still open
            assert os.fstat(fd).st_size > 0
            assert not os.path.exists(os.path.join(str(tmp_path), f"{base:020d}.log"))
        log.truncate_to(log.segment_base_offsets[-1] - 1)  # deletes the active segment
        assert len(held) == deleted + 1 and os.fstat(held[-1]).st_nlink == 0
    finally:
        for fd in held:
            os.close(fd)
    log.close()


def test_segment_roll_by_time(tmp_path: Path) -> None:
    log = Log(str(tmp_path), LogConfig(segment_ms=0))
    fill(log, 3, 1)
    assert log.segment_base_offsets == [0, 2, 4]


def test_group_commit_flush_from_another_thread(tmp_path: Path) -> None:
    log = Log(str(tmp_path), LogConfig(segment_bytes=50_000))
    stop = threading.Event()
    durable_seen: list[int] = []
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                durable_seen.append(log.flush())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for _ in range(300):
            log.append_as_leader(client_batch(0, 5), 1)
            assert log.durable_end_offset <= log.end_offset
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert durable_seen == sorted(durable_seen)
    assert log.flush() == log.end_offset == 1500
    crash(log, keep_unflushed=0)
    reopened = Log(str(tmp_path), LogConfig(segment_bytes=50_000))
    assert reopened.end_offset == 1500
    assert read_all_values(reopened) == [v for b in range(0, 1500, 5) for v in values_for(0, 5)]


def test_clean_reopen_trusts_indexes(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 20, 1)
    fill(log, 5, 2)
    log.close()
    names = sorted(os.listdir(tmp_path))
    assert ".clean-shutdown" in names and any(n.endswith(".index") for n in names)
    reopened = Log(str(tmp_path), SMALL)
    assert reopened.end_offset == 50 and reopened.last_epoch() == 2
    assert ".clean-shutdown" not in os.listdir(tmp_path)
    # A corrupt index is rebuilt by scanning its segment.
    reopened.close()
    index = sorted(p for p in tmp_path.iterdir() if p.suffix == ".index")[0]
    index.write_bytes(b"garbage!" * 3)
    again = Log(str(tmp_path), SMALL)
    assert again.end_offset == 50
    assert summary(again.read(7, 1)) == [(6, 2, 1)]


def test_unclean_shutdown_drops_epoch_entries_past_log_end(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 3, 1)
    log.flush()
    fill(log, 3, 2)
    log.flush()  # checkpoint now has (2, 6)
    crash(log)
    seg = sorted(p for p in tmp_path.iterdir() if p.suffix == ".log")[-1]
    size = seg.stat().st_size
    # Lose the epoch-2 batches (as if they were never written back).
    first_epoch2 = next(h for h in iter_batches(seg.read_bytes()) if h.leader_epoch == 2)
    os.truncate(seg, first_epoch2.position)
    assert first_epoch2.position < size
    reopened = Log(str(tmp_path), SMALL)
    assert reopened.end_offset == 6 and reopened.last_epoch() == 1
    assert "1 0\n" in (tmp_path / "leader-epoch-checkpoint").read_text()
    assert "2 6" not in (tmp_path / "leader-epoch-checkpoint").read_text()


def test_missing_or_corrupt_checkpoint_is_rebuilt_from_headers(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 5, 1)
    fill(log, 5, 3)
    log.append_control(4, 1, [1], 0)
    log.close()
    (tmp_path / "leader-epoch-checkpoint").write_text("0\n2\n1 0\n")
    reopened = Log(str(tmp_path), SMALL)
    assert [(e.epoch, e.offset) for e in reopened.epoch_cache.entries] == [
        (1, 0),
        (3, 10),
        (4, 20),
    ]
    reopened.close()
    (tmp_path / "leader-epoch-checkpoint").unlink()
    assert Log(str(tmp_path), SMALL).last_epoch() == 4


def test_mid_segment_corruption_is_an_error_naming_file_and_offset(tmp_path: Path) -> None:
    log = Log(str(tmp_path))
    fill(log, 6, 1, count=2)
    log.flush()
    crash(log)
    seg = tmp_path / f"{0:020d}.log"
    headers = list(iter_batches(seg.read_bytes()))
    data = bytearray(seg.read_bytes())
    data[headers[2].position + 100] ^= 0xFF  # payload of the batch at offset 4
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as info:
        Log(str(tmp_path))
    assert str(seg) in str(info.value) and "offset 4" in str(info.value)
    assert info.value.offset == 4 and info.value.position == headers[2].position
    repaired = Log(str(tmp_path), repair=True)
    assert repaired.end_offset == 4


def test_torn_tail_is_truncated(tmp_path: Path) -> None:
    log = Log(str(tmp_path))
    fill(log, 4, 1)
    crash(log)
    seg = tmp_path / f"{0:020d}.log"
    data = seg.read_bytes()
    seg.write_bytes(data[:-10])
    reopened = Log(str(tmp_path))
    assert reopened.end_offset == 6
    fill(reopened, 1, 1)
    assert read_all_values(reopened) == [v for b in range(0, 8, 2) for v in values_for(b, 2)]


def test_closed_log_rejects_calls(tmp_path: Path) -> None:
    log = Log(str(tmp_path))
    log.close()
    log.close()
    with pytest.raises(Exception, match="closed"):
        log.append_as_leader(client_batch(0, 1), 1)


def test_large_batches_and_table_reads(tmp_path: Path) -> None:
    log = Log(str(tmp_path))
    big = encode_batch([b"y" * 100] * 10_000)
    for _ in range(3):
        log.append_as_leader(big, 1)
    table = batches_to_table(log.read(0, 1))
    assert table.num_rows == 10_000
    table = batches_to_table(log.read(15_000, 3 * len(big)))
    assert table.column("offset").to_pylist() == list(range(10_000, 30_000))


def test_a_new_log_makes_its_directory_and_file_with_its_first_write(tmp_path: Path) -> None:
    """Thousands of partitions nobody produced to cost no directory, file or descriptor:
    a new log is made on disk by its first write, and one closed before that leaves
    nothing behind."""
    d = tmp_path / "t-0"
    log = Log(str(d), SMALL)
    assert not d.exists()
    assert (log.end_offset, log.durable_end_offset, log.read(0, 100)) == (0, 0, b"")
    assert log.flush() == 0 and log.scrub(1 << 20) is None
    log.truncate_to(0)
    log.close()
    assert not d.exists()
    with Log(str(d), SMALL) as log:
        fill(log, 3, 1)
        assert d.is_dir() and log.flush() == 6
    with Log(str(d), SMALL) as log:
        assert read_all_values(log) == [v for b in range(0, 6, 2) for v in values_for(b, 2)]
    # A mark of lost data is a write too.
    marked = Log(str(tmp_path / "t-1"))
    marked.mark_catch_up(5)
    marked.close()
    with Log(str(tmp_path / "t-1")) as marked:
        assert marked.catch_up_offset == 5
