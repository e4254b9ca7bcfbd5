"""The catch-up mark with an unknown floor (a data directory that replaced a lost one):
persisted, replaced by a known floor, cleared once the durable end reaches it."""

from __future__ import annotations

from pathlib import Path

from quorumlog.replica.storage import CATCH_UP_UNKNOWN, Log
from quorumlog.replica.storage.log import CATCH_UP_FILE

from .helpers import client_batch, crash


def test_an_unknown_floor_survives_a_crash_until_a_known_floor_is_reached(tmp_path: Path) -> None:
    log = Log(str(tmp_path))
    log.mark_catch_up(CATCH_UP_UNKNOWN)
    assert log.catch_up_offset == CATCH_UP_UNKNOWN
    log.append_as_leader(client_batch(0, 10), 1)
    log.flush()
    assert log.catch_up_offset == CATCH_UP_UNKNOWN  # never reached
    crash(log)
    log = Log(str(tmp_path))
    assert log.catch_up_offset == CATCH_UP_UNKNOWN and log.end_offset == 10
    # A leader tells the floor: above the durable end, it stays (and survives a reopen).
    log.mark_catch_up(15)
    assert log.catch_up_offset == 15
    crash(log)
    log = Log(str(tmp_path))
    assert log.catch_up_offset == 15
    log.mark_catch_up(CATCH_UP_UNKNOWN)  # replaced again: unknown again
    assert log.catch_up_offset == CATCH_UP_UNKNOWN
    log.mark_catch_up(12)
    log.mark_catch_up(11)  # a known floor only rises
    assert log.catch_up_offset == 12
    log.append_as_leader(client_batch(10, 5), 1)
    log.flush()
    assert log.catch_up_offset == -1 and not (tmp_path / CATCH_UP_FILE).exists()
    log.close()


def test_a_floor_already_reached_clears_at_once(tmp_path: Path) -> None:
    log = Log(str(tmp_path))
    log.append_as_leader(client_batch(0, 10), 1)
    log.flush()
    log.mark_catch_up(CATCH_UP_UNKNOWN)
    log.mark_catch_up(10)
    assert log.catch_up_offset == -1 and not (tmp_path / CATCH_UP_FILE).exists()
    log.close()
