"""The voter sets a log holds (KIP-853's VotersRecord): appended as control batches,
kept in ``voters-checkpoint``, and right after truncation, retention, restarts, crashes
and a lost checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

from quorumlog.replica.storage import Log, LogConfig
from quorumlog.replica.storage.records import VOTERS_KEY, decode_control
from quorumlog.replica.storage.voters_cache import VOTERS_FILE

from .helpers import client_batch, crash

SMALL = LogConfig(segment_bytes=4000, index_interval_bytes=1500)


def fill(log: Log, batches: int, epoch: int) -> None:
    for _ in range(batches):
        log.append_as_leader(client_batch(log.end_offset, 2), epoch)


def test_a_voters_record_sets_the_voters_from_its_offset(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    assert log.voters is None and log.voters_offset == -1
    log.append_control(1, 1, [1, 2, 3], 0)
    fill(log, 2, 1)
    info = log.append_voters(1, 1, [1, 2, 3, 4], 0)
    assert log.voters == (1, 2, 3, 4) and log.voters_offset == info.first_offset
    assert log.voters_before is None
    log.append_voters(1, 1, [2, 3, 4], 0)
    assert log.voters == (2, 3, 4) and log.voters_before == (1, 2, 3, 4)
    record = decode_control(log.read(info.first_offset, 1 << 20))
    assert record.key == VOTERS_KEY and record.voters == [1, 2, 3, 4]
    log.close()
    reopened = Log(str(tmp_path), SMALL)
    assert reopened.voters == (2, 3, 4) and reopened.voters_before == (1, 2, 3, 4)


def test_a_follower_takes_the_voters_from_the_batches_it_appends(tmp_path: Path) -> None:
    leader = Log(str(tmp_path / "leader"), SMALL)
    leader.append_control(1, 1, [1, 2, 3], 0)
    fill(leader, 3, 1)
    at = leader.append_voters(1, 1, [1, 2, 3, 4], 0).first_offset
    fill(leader, 3, 1)
    follower = Log(str(tmp_path / "follower"), SMALL)
    follower.append_as_follower(leader.read(0, 1 << 20))
    assert follower.end_offset == leader.end_offset
    assert follower.voters == (1, 2, 3, 4) and follower.voters_offset == at


def test_truncation_below_the_record_restores_the_voters_before(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    fill(log, 3, 1)
    first = log.append_voters(1, 1, [1, 2, 3, 4], 0).first_offset
    fill(log, 3, 1)
    second = log.append_voters(1, 1, [2, 3, 4], 0).first_offset
    log.truncate_to(second)
    assert log.voters == (1, 2, 3, 4)
    log.truncate_to(first)
    assert log.voters is None
    log.close()
    assert Log(str(tmp_path), SMALL).voters is None


def test_retention_keeps_the_voter_set_in_force(tmp_path: Path) -> None:
    log = Log(str(tmp_path), LogConfig(segment_bytes=1500, retention_bytes=1))
    log.append_voters(1, 1, [1, 2], 0)
    log.append_voters(1, 1, [1, 2, 3], 0)
    fill(log, 30, 1)
    log.flush()
    log.apply_retention(int(time.time() * 1000), max_offset=log.end_offset)
    assert log.start_offset > 2
    assert log.voters == (1, 2, 3)
    assert log.voters_cache.entries == [(1, (1, 2, 3))]


def test_a_lost_unflushed_record_is_gone_after_a_crash(tmp_path: Path) -> None:
    """The checkpoint names the record before the segment holds it: a power loss that
    takes the record leaves the checkpoint naming an offset past the log's end, which
    recovery drops."""
    log = Log(str(tmp_path), SMALL)
    fill(log, 2, 1)
    log.flush()
    log.append_voters(1, 1, [1, 2, 3, 4], 0)
    assert "1 2 3 4" in (tmp_path / VOTERS_FILE).read_text()
    crash(log, keep_unflushed=0)
    reopened = Log(str(tmp_path), SMALL)
    assert reopened.end_offset == 4 and reopened.voters is None


def test_recovery_finds_a_record_the_checkpoint_lacks(tmp_path: Path) -> None:
    """Past the recovery point recovery reads every batch: a voters record there (its
    truncation undone by a crash, or its checkpoint lost) is back in the checkpoint."""
    log = Log(str(tmp_path), SMALL)
    fill(log, 2, 1)
    log.flush()
    log.append_voters(1, 1, [1, 2, 3, 4], 0)
    fill(log, 2, 1)
    crash(log)
    (tmp_path / VOTERS_FILE).unlink()
    reopened = Log(str(tmp_path), SMALL)
    assert reopened.voters == (1, 2, 3, 4) and reopened.voters_offset == 4


def test_a_corrupt_checkpoint_is_rebuilt_from_the_control_batches(tmp_path: Path) -> None:
    log = Log(str(tmp_path), SMALL)
    log.append_voters(1, 1, [1, 2], 0)
    fill(log, 30, 1)  # several segments, all trusted on reopen
    log.append_voters(1, 1, [1, 2, 3], 0)
    fill(log, 3, 1)
    log.close()
    (tmp_path / VOTERS_FILE).write_text("garbage\n")
    reopened = Log(str(tmp_path), SMALL)
    assert len(reopened.segment_base_offsets) > 2
    assert reopened.voters == (1, 2, 3) and reopened.voters_before == (1, 2)
