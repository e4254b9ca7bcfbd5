"""Idempotent producers: the producer state (``storage.producers``) and how the on-disk
log keeps it: checked on leader appends, fed by follower appends, rebuilt after a
truncation and on open."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest
from quorumlog.replica.storage import (
    CorruptDataError,
    CorruptRecordError,
    Log,
    LogConfig,
    Producer,
    UnsupportedFormatError,
    encode_batch,
    iter_batches,
    parse_header,
)
from quorumlog.replica.storage.producers import (
    BATCHES_KEPT,
    DuplicateSequence,
    InvalidProducerEpoch,
    OutOfOrderSequence,
    ProducerBatch,
    ProducerStateTable,
    UnknownProducerId,
    last_sequence,
)

PID = 7_000_000_001


def batch(first: int, count: int = 2, *, epoch: int = 0, pid: int = PID) -> bytes:
    values = [f"s{first + i}".encode() for i in range(count)]
    return encode_batch(values, producer=Producer(pid, epoch, first))


# ---------------------------------------------------------------------- the table


def test_an_unknown_producer_starts_at_sequence_zero_and_is_refused_past_a_gap() -> None:
    ProducerStateTable().check(PID, 3, 0, 4)  # a new producer, or a new epoch
    # Its batch 0-40 is not here (lost with a deposed leader's tail): 41 must wait for it.
    with pytest.raises(OutOfOrderSequence, match="earlier ones come first"):
        ProducerStateTable().check(PID, 3, 41, 42)
    # Retention may have deleted its batches: not a gap, but it cannot be told from one.
    with pytest.raises(UnknownProducerId, match="retention"):
        ProducerStateTable(complete=False).check(PID, 3, 41, 42)


def test_a_retried_batch_is_a_duplicate_naming_its_offsets() -> None:
    table = ProducerStateTable([(PID, ProducerBatch(0, 0, 1, 10, 11))])
    with pytest.raises(DuplicateSequence) as exc:
        table.check(PID, 0, 0, 1)
    assert exc.value.original == ProducerBatch(0, 0, 1, 10, 11)


def test_sequences_must_follow_on_within_an_epoch() -> None:
    table = ProducerStateTable([(PID, ProducerBatch(0, 0, 1, 10, 11))])
    table.check(PID, 0, 2, 5)
    with pytest.raises(OutOfOrderSequence):
        table.check(PID, 0, 3, 5)  # a gap: sequence 2 is missing
    with pytest.raises(OutOfOrderSequence):
        table.check(PID, 0, 1, 2)  # overlaps what was written, not a retry of it


def test_an_older_epoch_is_fenced_and_a_new_epoch_starts_at_zero() -> None:
    table = ProducerStateTable([(PID, ProducerBatch(2, 0, 1, 10, 11))])
    with pytest.raises(InvalidProducerEpoch):
        table.check(PID, 1, 2, 3)
    with pytest.raises(OutOfOrderSequence):
        table.check(PID, 3, 2, 3)
    table.check(PID, 3, 0, 0)
    table.apply(PID, ProducerBatch(3, 0, 0, 12, 12))
    with pytest.raises(InvalidProducerEpoch):
        table.check(PID, 2, 2, 3)  # the old epoch's retry after the bump


def test_sequences_wrap_past_int32_max() -> None:
    top = (1 << 31) - 1
    assert last_sequence(top - 1, 3) == 0
    table = ProducerStateTable([(PID, ProducerBatch(0, top - 1, top, 0, 1))])
    table.check(PID, 0, 0, 4)


def test_only_the_last_batches_are_remembered() -> None:
    table = ProducerStateTable()
    for i in range(BATCHES_KEPT + 1):
        table.apply(PID, ProducerBatch(0, i, i, i, i))
    with pytest.raises(DuplicateSequence):
        table.check(PID, 0, 1, 1)
    with pytest.raises(OutOfOrderSequence):
        table.check(PID, 0, 0, 0)  # too old to tell: refused, never appended twice


# ---------------------------------------------------------------------- the format


def test_producer_fields_survive_restamping_and_are_checked(tmp_path: Path) -> None:
    raw = batch(5, 3, epoch=2)
    header = parse_header(raw)
    assert header.producer == Producer(PID, 2, 5)
    with Log(str(tmp_path)) as log:
        log.append_as_leader(batch(0, 5, epoch=2), 4)  # sequences 0-4 first
        log.append_as_leader(raw, 4)
        stored = list(iter_batches(log.read(0, 1 << 20)))[-1]
    assert (stored.producer, stored.leader_epoch, stored.base_offset) == (header.producer, 4, 5)
    assert parse_header(encode_batch([b"x"])).producer is None
    with pytest.raises(ValueError):
        encode_batch([b"x"], producer=Producer(PID, -1, 0))


def test_a_header_with_half_the_producer_fields_is_insane() -> None:
    raw = bytearray(batch(0))
    raw[44:48] = (-1).to_bytes(4, "little", signed=True)  # base_sequence gone, id kept
    raw[4:8] = struct.pack("<I", zlib.crc32(raw[8:64]))
    with pytest.raises(CorruptRecordError, match="insane"):
        parse_header(bytes(raw))


# ---------------------------------------------------------------------- the log


def test_the_log_appends_a_retried_batch_once(tmp_path: Path) -> None:
    with Log(str(tmp_path)) as log:
        log.append_as_leader(encode_batch([b"other"]), 1)
        first = log.append_as_leader(batch(0), 1)
        with pytest.raises(DuplicateSequence) as exc:
            log.append_as_leader(batch(0), 1)
        assert (exc.value.original.first_offset, exc.value.original.last_offset) == (1, 2)
        with pytest.raises(OutOfOrderSequence):
            log.append_as_leader(batch(5), 1)
        log.append_as_leader(batch(2), 1)
        assert log.end_offset == 5 and first.first_offset == 1


def test_an_idempotent_batch_travels_alone(tmp_path: Path) -> None:
    with Log(str(tmp_path)) as log:
        with pytest.raises(CorruptRecordError, match="alone"):
            log.append_as_leader(encode_batch([b"a"]) + batch(0), 1)
        assert log.end_offset == 0


def test_the_state_is_rebuilt_on_open_and_from_follower_appends(tmp_path: Path) -> None:
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    with Log(str(leader), LogConfig(segment_bytes=2000)) as log:
        for i in range(0, 20, 2):
            log.append_as_leader(batch(i), 1)
        copied, offset = b"", 0
        while offset < log.end_offset:  # a read stops at a segment's end
            chunk = log.read(offset, 1 << 20)
            copied += chunk
            offset = list(iter_batches(chunk))[-1].next_offset
        assert len(log.segment_base_offsets) > 1
    with Log(str(leader)) as log:
        with pytest.raises(DuplicateSequence):
            log.append_as_leader(batch(18), 2)
    with Log(str(follower)) as log:
        log.producer_state()  # built (empty) before the copies arrive: appends feed it
        log.append_as_follower(copied)
        with pytest.raises(DuplicateSequence) as exc:
            log.append_as_leader(batch(18), 2)  # the follower became leader
        assert exc.value.original.first_offset == 18


def test_truncation_forgets_the_batches_it_removes(tmp_path: Path) -> None:
    with Log(str(tmp_path)) as log:
        log.append_as_leader(batch(0), 1)
        log.append_as_leader(batch(2), 1)
        log.producer_state()
        log.truncate_to(2)  # the second batch was never committed
        info = log.append_as_leader(batch(2), 2)  # its retry goes in again
        assert info.first_offset == 2


def test_a_batch_past_a_truncated_one_is_refused_until_the_truncated_one_is_back(
    tmp_path: Path,
) -> None:
    """A leader appended batch 0 and was deposed; its successor never had it. The
    producer's next batch (sent before batch 0's retry) must not go in first: a client
    would take batch 0 as written when batch 2 is acknowledged."""
    with Log(str(tmp_path)) as log:
        log.append_as_leader(batch(0), 1)
        log.producer_state()
        log.truncate_to(0)
        with pytest.raises(OutOfOrderSequence):
            log.append_as_leader(batch(2), 2)
        assert log.append_as_leader(batch(0), 2).first_offset == 0  # the retry
        assert log.append_as_leader(batch(2), 2).first_offset == 2


def test_after_retention_an_unknown_producer_past_zero_is_unknown(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=600, retention_bytes=600)
    with Log(str(tmp_path), config) as log:
        for i in range(0, 40, 2):
            log.append_as_leader(batch(i), 1)
        assert log.apply_retention() > 0 and log.start_offset > 0
    with Log(str(tmp_path), config) as log:  # rebuilt from what retention left
        with pytest.raises(UnknownProducerId):
            log.append_as_leader(batch(7, pid=PID + 1), 2)
        log.append_as_leader(batch(0, epoch=1, pid=PID + 1), 2)  # its next epoch goes in


def test_a_log_in_the_old_format_is_refused_untouched(tmp_path: Path) -> None:
    with Log(str(tmp_path)) as log:
        log.append_as_leader(batch(0), 1)
        path = os.path.join(str(tmp_path), f"{0:020d}.log")
    raw = bytearray(Path(path).read_bytes())
    raw[0:4] = b"QLB\x01"  # a format-1 header: its CRC covers bytes [8, 48)
    struct.pack_into("<I", raw, 4, zlib.crc32(raw[8:48]))
    Path(path).write_bytes(raw)
    with pytest.raises(UnsupportedFormatError, match="format 1"):
        Log(str(tmp_path))
    assert Path(path).read_bytes() == raw


def test_a_magic_byte_flipped_to_the_old_format_is_damage_not_an_old_log(tmp_path: Path) -> None:
    with Log(str(tmp_path)) as log:
        log.append_as_leader(batch(0), 1)
        path = os.path.join(str(tmp_path), f"{0:020d}.log")
    raw = bytearray(Path(path).read_bytes())
    raw[3] ^= 0x03  # b"QLB\x02" -> b"QLB\x01", the header CRC left as it was
    Path(path).write_bytes(raw)
    with pytest.raises(CorruptRecordError):
        parse_header(bytes(raw))


def test_damage_met_while_building_the_state_is_reported_as_corruption(tmp_path: Path) -> None:
    with Log(str(tmp_path)) as log:
        for i in range(0, 6, 2):
            log.append_as_leader(batch(i), 1)
        second = list(iter_batches(log.read(0, 1 << 20)))[1]
        path = os.path.join(str(tmp_path), f"{0:020d}.log")
    raw = bytearray(Path(path).read_bytes())
    raw[second.position + 20] ^= 0xFF  # its record count: the header CRC no longer matches
    Path(path).write_bytes(raw)
    with Log(str(tmp_path)) as log:  # a clean shutdown: opened without a scan
        with pytest.raises(CorruptDataError) as exc:
            log.append_as_leader(batch(6), 1)
        assert exc.value.offset == second.base_offset
        assert log.end_offset == 6  # nothing appended
