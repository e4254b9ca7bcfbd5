"""Latent corruption: CRC on every read, the recovery point, the scrub, and the
catch-up mark a repair leaves (issue 12, item 3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from quorumlog.replica.storage import (
    CorruptDataError,
    Log,
    LogConfig,
    iter_batches,
)
from quorumlog.replica.storage.errors import CorruptLogError
from quorumlog.replica.storage.log import CATCH_UP_FILE, RECOVERY_POINT_FILE

from .helpers import client_batch, crash, read_everything

SMALL = LogConfig(segment_bytes=4000, index_interval_bytes=1500)


def fill(log: Log, batches: int, epoch: int = 1, count: int = 2) -> None:
    for _ in range(batches):
        log.append_as_leader(client_batch(log.end_offset, count), epoch)


def segment_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".log")


def flip(seg: Path, batch_index: int, at: int) -> tuple[int, int]:
    """Flip one byte ``at`` bytes into batch ``batch_index`` of ``seg``; returns that
    batch's (base offset, position)."""
    headers = list(iter_batches(seg.read_bytes()))
    h = headers[batch_index]
    with open(seg, "r+b") as fh:
        fh.seek(h.position + at)
        byte = fh.read(1)
        fh.seek(h.position + at)
        fh.write(bytes([byte[0] ^ 0x5A]))
    return h.base_offset, h.position


def sealed_log(tmp_path: Path) -> Log:
    log = Log(str(tmp_path), SMALL)
    fill(log, 40)
    log.close()
    assert len(segment_files(tmp_path)) >= 3
    return Log(str(tmp_path), SMALL)


@pytest.mark.parametrize("at", [10, 60, 200], ids=["header", "payload-start", "payload"])
def test_read_never_serves_a_damaged_batch(tmp_path: Path, at: int) -> None:
    sealed_log(tmp_path).close()
    seg = segment_files(tmp_path)[1]
    damaged, position = flip(seg, 1, at)
    log = Log(str(tmp_path), SMALL)  # a clean restart trusts the indexed segment
    first = int(seg.name[:-4])
    # A read from before the damage stops at the last intact batch.
    prefix = log.read(first, 1 << 20)
    assert [h.next_offset for h in iter_batches(prefix)][-1] == damaged
    # A read of the damaged batch itself raises, naming file, offset and position.
    for offset in (damaged, damaged + 1):
        with pytest.raises(CorruptDataError) as info:
            log.read(offset, 1 << 20)
        assert info.value.offset == damaged and info.value.position == position
        assert info.value.path == str(seg) and str(seg) in str(info.value)
    # Reads elsewhere are unaffected.
    assert log.read(0, 1 << 20) and log.read(log.end_offset - 2, 1 << 20)


def test_truncate_corrupt_marks_catch_up_until_caught_up(tmp_path: Path) -> None:
    log = sealed_log(tmp_path)
    end = log.end_offset
    seg = segment_files(tmp_path)[1]
    damaged, _ = flip(seg, 1, 10)  # a header: truncation must still find the batch
    with pytest.raises(CorruptDataError):
        log.read(damaged, 1 << 20)
    log.truncate_corrupt(damaged)
    assert log.end_offset == damaged and log.catch_up_offset == end
    assert (tmp_path / CATCH_UP_FILE).read_text() == f"0\n{end}\n"
    # The mark survives a crash and a reopen.
    crash(log)
    log = Log(str(tmp_path), SMALL)
    assert log.catch_up_offset == end
    # Re-fetched data below the mark does not clear it; reaching it durably does.
    fill(log, (end - damaged) // 2 - 1)
    log.flush()
    assert log.catch_up_offset == end
    fill(log, 1)
    log.flush()
    assert log.catch_up_offset == -1 and not (tmp_path / CATCH_UP_FILE).exists()
    assert read_everything(log)


def test_unclean_shutdown_scans_every_segment_past_the_recovery_point(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 10)
    log.flush()  # rolls were flushed: the recovery point moved up
    point = log.recovery_point
    assert 0 < point <= log.end_offset
    assert (tmp_path / RECOVERY_POINT_FILE).read_text() == f"0\n{point}\n"
    fill(log, 30)  # more segments, sealed but never flushed with a recovery point
    log.flush()
    crash(log)
    # Pretend the latest recovery point write was lost: segments past the old one have
    # valid indexes, and still must be scanned.
    (tmp_path / RECOVERY_POINT_FILE).write_text(f"0\n{point}\n")
    past = [p for p in segment_files(tmp_path) if int(p.name[:-4]) >= point]
    assert len(past) >= 3
    damaged, _ = flip(past[1], 1, 200)  # a sealed segment, not the last
    log = Log(str(tmp_path), SMALL, repair=True)
    assert log.end_offset == damaged
    assert log.catch_up_offset > damaged  # it reached further before: catch up first
    assert log.recovery_point == damaged


def test_clean_shutdown_records_the_log_end_as_recovery_point(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 12)
    log.close()
    assert Log(str(tmp_path), SMALL).recovery_point == 24


def test_truncation_lowers_the_recovery_point(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 40)
    log.flush()
    assert log.recovery_point > 10
    log.truncate_to(10)
    assert log.recovery_point == 10
    assert (tmp_path / RECOVERY_POINT_FILE).read_text() == "0\n10\n"


def test_scrub_finds_damage_in_sealed_segments_within_its_budget(tmp_path: Path) -> None:
    log = sealed_log(tmp_path)
    sealed_bytes = sum(p.stat().st_size for p in segment_files(tmp_path)[:-1])
    # A clean pass: bounded per call, ends after about sealed_bytes / budget calls.
    budget = 1000
    calls = 0
    while log.scrub_passes == 0:
        assert log.scrub(budget) is None
        calls += 1
        assert calls <= sealed_bytes // 500 + 5
    assert calls >= sealed_bytes // (budget + 400)
    seg = segment_files(tmp_path)[1]
    damaged, position = flip(seg, 2, 300)
    found = None
    for _ in range(sealed_bytes // 500 + 5):
        found = log.scrub(budget)
        if found is not None:
            break
    assert found is not None and found.offset == damaged and found.position == position
    assert found.path == str(seg)
    assert log.scrub(budget) is not None  # stays there until repaired
    log.truncate_corrupt(damaged)
    assert log.scrub(budget) is None


def test_scrub_reads_at_most_about_its_budget(tmp_path: Path) -> None:
    log = sealed_log(tmp_path)
    calls = []
    real_pread = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        calls.append(n)
        return real_pread(fd, n, offset)

    os.pread = counting  # type: ignore[assignment]
    try:
        log.scrub(3000)
        assert 0 < sum(calls) <= 3000
        calls.clear()
        log.scrub(100)
    finally:
        os.pread = real_pread  # type: ignore[assignment]
    # One whole batch (1072 bytes here) when a batch is larger than the budget.
    assert sum(calls) <= 100 + 1072


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=255))
@example(where=5280, xor=1)  # a batch's magic byte: the open itself refuses the segment
def test_any_flipped_byte_is_never_served(
    tmp_path_factory: pytest.TempPathFactory, where: int, xor: int
) -> None:
    directory = tmp_path_factory.mktemp("flip")
    log = Log(str(directory), SMALL)
    fill(log, 12)
    log.close()
    seg = segment_files(directory)[0]
    data = bytearray(seg.read_bytes())
    where %= len(data)
    damaged = next(h for h in iter_batches(bytes(data)) if h.position <= where < h.end)
    data[where] ^= xor
    seg.write_bytes(bytes(data))
    try:
        log = Log(str(directory), SMALL)
    except CorruptLogError as exc:
        # Found at open (without repair, the node's mode, the open refuses): nothing served.
        assert str(damaged.base_offset) in str(exc) or seg.name in str(exc)
        return
    offset = 0
    while offset < log.end_offset:
        try:
            chunk = log.read(offset, 1 << 20)
        except CorruptDataError as exc:
            # Reported where the damage starts (a damaged header can hide the batches
            # after it up to the next index entry).
            assert exc.offset == damaged.base_offset <= offset
            if offset > damaged.base_offset:
                break
            offset = damaged.next_offset  # read on past the damage
            continue
        served = list(iter_batches(chunk, verify_crc=True))  # raises if any is damaged
        offset = served[-1].next_offset
