"""The node's quorum-state journal: one append-only file, one fsync per write, replay with
last-entry-wins, torn tails cut, damage refused, compaction."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quorumlog.replica.storage import (
    CorruptCheckpointError,
    QuorumJournal,
    QuorumState,
    StorageError,
    UnsupportedFormatError,
)
from quorumlog.replica.storage.quorum_journal import MAGIC, QUORUM_JOURNAL_FILE

from tests.support.figures import assert_numbers
from tests.support.spies import record_calls


def state(epoch: int, leader: int = -1, voted: int = -1, **extra: object) -> QuorumState:
    return QuorumState(
        leader_epoch=epoch, leader_id=leader, voted_id=voted, voters=(1, 2, 3), extra=extra
    )


def reopen(path: Path) -> dict[tuple[str, int], QuorumState]:
    j = QuorumJournal(str(path))
    try:
        return j.states()
    finally:
        j.close()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[QuorumJournal]:
    j = QuorumJournal(str(tmp_path))
    yield j
    j.close()


def test_round_trip_of_many_keys(tmp_path: Path, journal: QuorumJournal) -> None:
    states = {
        (f"topic-{i % 7}", i): QuorumState(
            leader_epoch=i,
            leader_id=i % 3,
            voted_id=(i + 1) % 3 if i % 2 else -1,
            voters=tuple(range(i % 5)),
            extra={"n": i, "s": "é"} if i % 3 == 0 else {},
        )
        for i in range(2000)
    }
    journal.write_many(states.items())
    assert journal.states() == states
    journal.close()
    assert reopen(tmp_path) == states
    assert sorted(p.name for p in tmp_path.iterdir()) == [QUORUM_JOURNAL_FILE]


def test_the_last_write_of_a_key_wins(tmp_path: Path, journal: QuorumJournal) -> None:
    journal.write_many([(("a", 0), state(1)), (("b", 0), state(1)), (("a", 0), state(2, 1, 1))])
    journal.write(("b", 0), state(5, voted=2))
    journal.write(("a", 0), state(3))
    expected = {("a", 0): state(3), ("b", 0): state(5, voted=2)}
    assert journal.states() == expected
    journal.close()
    assert reopen(tmp_path) == expected


def test_a_forgotten_key_stays_forgotten(tmp_path: Path, journal: QuorumJournal) -> None:
    journal.write_many([(("a", 0), state(1)), (("a", 1), state(1))])
    journal.forget(("a", 0))
    size = journal.size
    journal.forget(("never", 0))  # nothing to forget: nothing written
    assert journal.size == size
    assert journal.states() == {("a", 1): state(1)}
    journal.close()
    assert reopen(tmp_path) == {("a", 1): state(1)}
    j = QuorumJournal(str(tmp_path))
    j.write(("a", 0), state(7))  # a topic created again under the same name
    j.close()
    assert reopen(tmp_path) == {("a", 1): state(1), ("a", 0): state(7)}


def test_compaction_keeps_the_live_states_and_shrinks_the_file(tmp_path: Path) -> None:
    j = QuorumJournal(str(tmp_path), compact_ratio=4, compact_min_bytes=8192)
    keys = [("t", p) for p in range(10)]
    j.write_many((k, state(0)) for k in keys)
    j.write_many([(("gone", 0), state(9))])
    j.forget(("gone", 0))
    for epoch in range(1, 200):
        compactions = j.compactions
        j.write_many((k, state(epoch, leader=k[1] % 3)) for k in keys)
        if j.compactions > compactions:
            assert j.size < 1000  # the ten live states, one frame
        assert j.size <= 8192
    assert j.compactions >= 2
    expected = {k: state(199, leader=k[1] % 3) for k in keys}
    assert j.states() == expected
    j.close()
    on_disk = (tmp_path / QUORUM_JOURNAL_FILE).read_bytes()
    assert b"gone" not in on_disk  # the tombstone and the state it removed are dropped
    assert reopen(tmp_path) == expected
    # Writes after a compaction append to the new file.
    j = QuorumJournal(str(tmp_path), compact_ratio=4, compact_min_bytes=8192)
    j.write(("t", 0), state(500))
    j.close()
    assert reopen(tmp_path) == {**expected, ("t", 0): state(500)}
    assert not (tmp_path / (QUORUM_JOURNAL_FILE + ".tmp")).exists()


def test_a_compaction_cut_short_leaves_the_old_file(tmp_path: Path) -> None:
    j = QuorumJournal(str(tmp_path))
    j.write(("a", 0), state(3))
    j.close()
    # A crash before the rename: the temp file is the partial new one; the old one stands.
    (tmp_path / (QUORUM_JOURNAL_FILE + ".tmp")).write_bytes(b"QLQJ\x00")
    assert reopen(tmp_path) == {("a", 0): state(3)}
    assert not (tmp_path / (QUORUM_JOURNAL_FILE + ".tmp")).exists()


def _two_writes(directory: Path) -> tuple[int, int, dict[tuple[str, int], QuorumState]]:
    """A first write (the state to fall back to) and a second one; their boundary and the
    file's length."""
    j = QuorumJournal(str(directory))
    first = {("a", 0): state(1), ("b", 0): state(1, voted=2)}
    j.write_many(first.items())
    boundary = j.size
    j.write_many([(("a", 0), state(2, voted=1)), (("c", 0), state(2)), (("b", 0), state(3))])
    end = j.size
    j.close()
    return boundary, end, first


def test_a_torn_last_write_falls_back_to_the_state_before_it(tmp_path: Path) -> None:
    original = tmp_path / "original"
    boundary, end, first = _two_writes(original)
    data = (original / QUORUM_JOURNAL_FILE).read_bytes()
    for cut in range(boundary, end):
        d = tmp_path / f"cut-{cut}"
        d.mkdir()
        (d / QUORUM_JOURNAL_FILE).write_bytes(data[:cut])
        assert reopen(d) == first, f"cut at {cut}"
        assert (d / QUORUM_JOURNAL_FILE).stat().st_size == boundary, f"cut at {cut}"
        # And the journal goes on from there.
        j = QuorumJournal(str(d))
        j.write(("z", 0), state(4))
        j.close()
        assert reopen(d) == {**first, ("z", 0): state(4)}
        shutil.rmtree(d)


@pytest.mark.parametrize("tail", [b"\x00" * 4096, b"\xff" * 13, MAGIC + b"\x05\x00\x00\x00junk"])
def test_garbage_after_the_last_write_is_a_torn_tail(tmp_path: Path, tail: bytes) -> None:
    boundary, end, first = _two_writes(tmp_path)
    j = QuorumJournal(str(tmp_path))
    expected = j.states()
    j.close()
    with open(tmp_path / QUORUM_JOURNAL_FILE, "ab") as fh:
        fh.write(tail)
    assert reopen(tmp_path) == expected
    assert (tmp_path / QUORUM_JOURNAL_FILE).stat().st_size == end


def test_damage_before_a_valid_write_is_refused_naming_the_file(tmp_path: Path) -> None:
    original = tmp_path / "original"
    boundary, end, _ = _two_writes(original)
    data = (original / QUORUM_JOURNAL_FILE).read_bytes()
    for position in range(boundary):  # every byte of the first frame
        d = tmp_path / f"flip-{position}"
        d.mkdir()
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        (d / QUORUM_JOURNAL_FILE).write_bytes(bytes(damaged))
        with pytest.raises(CorruptCheckpointError, match=r"quorum-journal at position 0"):
            QuorumJournal(str(d))
        assert (d / QUORUM_JOURNAL_FILE).read_bytes() == bytes(damaged)  # nothing cut
        shutil.rmtree(d)


def _set_length(path: Path, frame_at: int, length: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, frame_at + 4, length)
    path.write_bytes(bytes(data))


def test_a_length_past_the_end_is_a_torn_tail_only_in_the_last_frame(tmp_path: Path) -> None:
    boundary, end, first = _two_writes(tmp_path)
    path = tmp_path / QUORUM_JOURNAL_FILE
    original = path.read_bytes()
    _set_length(path, boundary, 0xFFFF_FFF0)
    tracemalloc.start()
    try:
        assert reopen(tmp_path) == first
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the length was not believed
    assert path.stat().st_size == boundary

    path.write_bytes(original)
    _set_length(path, 0, 0xFFFF_FFF0)
    with pytest.raises(CorruptCheckpointError, match="quorum-journal at position 0.*length"):
        QuorumJournal(str(tmp_path))
    assert path.read_bytes()[4:8] == b"\xf0\xff\xff\xff"


def test_a_newer_format_is_refused_and_left_alone(tmp_path: Path) -> None:
    payload = struct.pack("<BI", 2, 0)
    length = struct.pack("<I", len(payload))
    frame = MAGIC + length + struct.pack("<I", crc32c(payload, crc32c(length))) + payload
    (tmp_path / QUORUM_JOURNAL_FILE).write_bytes(frame)
    with pytest.raises(UnsupportedFormatError, match="quorum-journal.*version 2"):
        QuorumJournal(str(tmp_path))
    assert (tmp_path / QUORUM_JOURNAL_FILE).read_bytes() == frame


def test_a_frame_that_passes_its_crc_but_does_not_decode_is_damage(tmp_path: Path) -> None:
    payload = struct.pack("<BI", 1, 3)  # three entries announced, none there
    length = struct.pack("<I", len(payload))
    frame = MAGIC + length + struct.pack("<I", crc32c(payload, crc32c(length))) + payload
    (tmp_path / QUORUM_JOURNAL_FILE).write_bytes(frame)
    with pytest.raises(CorruptCheckpointError, match="quorum-journal at position 0"):
        QuorumJournal(str(tmp_path))


def test_one_fsync_per_write_however_many_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = QuorumJournal(str(tmp_path))  # creating the file fsyncs its directory once
    calls = record_calls(monkeypatch, os, "fsync", "fdatasync")
    j.write_many((("t", p), state(1, voted=1)) for p in range(10_000))
    assert len(calls) == 1
    j.write_many((("t", p), state(2)) for p in range(0, 10_000, 2))
    j.forget_many(("t", p) for p in range(100))
    assert len(calls) == 3
    j.write_many([])  # nothing to write: no fsync
    assert len(calls) == 3
    j.close()


def test_a_failed_write_is_cut_off_and_the_journal_goes_on(tmp_path: Path) -> None:
    """A write that hits the file-size limit (a real EFBIG from the kernel) leaves no
    partial frame behind, so what follows is not mistaken for damage."""
    j = QuorumJournal(str(tmp_path))
    j.write(("a", 0), state(1))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (j.size + 64, hard))
    try:
        with pytest.raises(OSError):
            j.write_many((("b", p), state(2)) for p in range(100))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert j.states() == {("a", 0): state(1)}
    assert (tmp_path / QUORUM_JOURNAL_FILE).stat().st_size == j.size  # no partial frame
    j.write(("c", 0), state(3))
    j.close()
    assert reopen(tmp_path) == {("a", 0): state(1), ("c", 0): state(3)}


def test_a_closed_journal_refuses_writes(tmp_path: Path) -> None:
    j = QuorumJournal(str(tmp_path))
    j.close()
    with pytest.raises(StorageError, match="closed"):
        j.write(("a", 0), state(1))


def test_perf_storage_times_quorum_states(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quorumlog.replica.perf import storage as perf

    assert perf.main(["--mb", "1", "--json", "--quorum-states", "20", "--dir", str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["quorum_states"]
    assert figures["states"] == 20
    assert_numbers(figures, "journal_write_s", "per_file_writes_s")


def test_perf_storage_times_what_retention_holds_its_caller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quorumlog.replica.perf import storage as perf

    assert perf.main(["--mb", "40", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])["retention"]
    assert figures["segments"] >= 3  # 40 MiB in 10 MiB segments, the active one kept
    assert_numbers(figures, "inline_hold_ms", "background_hold_ms")
    assert any(line.startswith("retention deleting ") for line in lines[:-1])


_key = st.tuples(st.sampled_from(["a", "b", "topic.é"]), st.integers(0, 3))
_state = st.builds(
    QuorumState,
    leader_epoch=st.integers(0, 2**40),
    leader_id=st.integers(-1, 5),
    voted_id=st.integers(-1, 5),
    voters=st.lists(st.integers(0, 2**31 - 1), max_size=5).map(tuple),
    extra=st.dictionaries(st.text(max_size=5), st.integers(-(2**40), 2**40), max_size=2),
)
_op = st.one_of(
    st.tuples(st.just("write"), st.lists(st.tuples(_key, _state), min_size=1, max_size=6)),
    st.tuples(st.just("forget"), st.lists(_key, min_size=1, max_size=3)),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_op, min_size=1, max_size=15), cut=st.floats(0, 1))
def test_replay_matches_the_model_and_a_cut_falls_back_to_an_earlier_write(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, list[Any]]], cut: float
) -> None:
    """Random writes and forgets with a small compaction threshold: the journal reopens to
    the model. Cut anywhere after the last compaction, it reopens to the model as it was
    after the last write that ends at or before the cut, and is truncated there."""
    d = tmp_path_factory.mktemp("journal")
    j = QuorumJournal(str(d), compact_ratio=2, compact_min_bytes=300)
    model: dict[tuple[str, int], QuorumState] = {}
    ends: list[tuple[int, dict[tuple[str, int], QuorumState]]] = [(0, {})]
    for kind, items in ops:
        compactions = j.compactions
        if kind == "write":
            j.write_many(items)
            model.update(items)
        else:
            j.forget_many(items)
            for key in items:
                model.pop(key, None)
        assert j.states() == model
        if j.compactions > compactions:
            ends = []  # the file is now one frame of the live states
        ends.append((j.size, dict(model)))
    j.close()
    assert reopen(d) == model
    data = (d / QUORUM_JOURNAL_FILE).read_bytes()
    start = ends[0][0]
    at = start + int(cut * (len(data) - start))
    (d / QUORUM_JOURNAL_FILE).write_bytes(data[:at])
    size, states = max((e for e in ends if e[0] <= at), key=lambda e: e[0])
    assert reopen(d) == states
    assert (d / QUORUM_JOURNAL_FILE).stat().st_size == size
