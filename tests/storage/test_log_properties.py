"""Random operation sequences against an in-memory model, and crash/corruption tests
that cut and flip bytes of the files and check recovery keeps the longest valid prefix
and never invents data."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from quorumlog.replica.storage import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    CorruptLogError,
    EpochEndOffset,
    Log,
    LogConfig,
    batches_to_table,
    encode_batch,
    iter_batches,
)
from quorumlog.replica.storage.tail import TailBudget

from .helpers import crash

# `make test` draws this many random operation sequences per variant; set
# QUORUMLOG_STORAGE_EXAMPLES for a longer run (e.g. 1000).
EXAMPLES = int(os.environ.get("QUORUMLOG_STORAGE_EXAMPLES", "35"))
CONFIG = LogConfig(segment_bytes=3000, index_interval_bytes=1500, retention_bytes=8000)


def gen_values(gen: int, base: int, count: int) -> list[bytes]:
    return [b"g%d-o%d" % (gen, base + i) for i in range(count)]


@dataclass
class ModelBatch:
    base: int
    count: int
    epoch: int
    gen: int  # which write produced it, so resurrected stale data is caught
    control: bool = False


@dataclass
class Model:
    start: int = 0
    batches: list[ModelBatch] = field(default_factory=list)
    epoch: int = 0
    gen: int = 0

    @property
    def end(self) -> int:
        return self.batches[-1].base + self.batches[-1].count if self.batches else self.start

    def entries(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for b in self.batches:
            if not out or b.epoch > out[-1][0]:
                out.append((b.epoch, b.base))
        return out

    def truncate(self, end: int) -> None:
        self.batches = [b for b in self.batches if b.base < end]
        assert self.end == end, "truncation point is a batch boundary"

    def end_offset_for(self, epoch: int) -> EpochEndOffset:
        entries = self.entries()
        if not entries or epoch < 0 or epoch > entries[-1][0]:
            return EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        if epoch == entries[-1][0]:
            return EpochEndOffset(epoch, self.end)
        higher = next(i for i, (e, _) in enumerate(entries) if e > epoch)
        if higher == 0:
            return EpochEndOffset(epoch, entries[0][1])
        return EpochEndOffset(entries[higher - 1][0], entries[higher][1])


def check(log: Log, model: Model, max_bytes: int) -> None:
    assert (log.start_offset, log.end_offset) == (model.start, model.end)
    assert log.durable_end_offset <= log.end_offset
    assert [(e.epoch, e.offset) for e in log.epoch_cache.entries] == model.entries()
    assert log.last_epoch() == (model.entries()[-1][0] if model.batches else UNDEFINED_EPOCH)
    for epoch in range(-1, model.epoch + 2):
        assert log.end_offset_for(epoch) == model.end_offset_for(epoch), epoch
    for i, batch in enumerate(model.batches):
        for offset in {batch.base, batch.base + batch.count - 1}:
            assert log.epoch_at(offset) == batch.epoch
            data = log.read(offset, max_bytes)
            got = [(h.base_offset, h.record_count, h.leader_epoch) for h in iter_batches(data)]
            want = [(b.base, b.count, b.epoch) for b in model.batches[i : i + len(got)]]
            assert got and got == want, (offset, got, want)
            if max_bytes >= 1 << 20:
                assert len(got) >= 1
            table = batches_to_table(data, include_control=True)
            expected_values: list[bytes] = []
            for b in model.batches[i : i + len(got)]:
                expected_values += [b"LC"] if b.control else gen_values(b.gen, b.base, b.count)
            values = [
                b"LC" if k == b"LeaderChange" else v
                for k, v in zip(
                    table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True
                )
            ]
            assert values == expected_values
    assert log.epoch_at(model.end) == UNDEFINED_EPOCH


op = st.one_of(
    st.tuples(st.just("leader"), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("follower"), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("control"), st.just(1), st.booleans()),
    st.tuples(st.just("truncate"), st.floats(0, 1), st.just(False)),
    st.tuples(st.just("retention"), st.just(0), st.just(False)),
    st.tuples(st.just("flush"), st.just(0), st.just(False)),
    st.tuples(st.just("reopen"), st.just(0), st.just(False)),
    st.tuples(st.just("crash"), st.integers(0, 4000), st.just(False)),
)


# Reads served by the file alone (budget 0), by a tail that keeps dropping its oldest
# batches (a budget of a few batches), and by the default tail.
@pytest.mark.parametrize("tail_limit", [0, 2500, None], ids=["no-tail", "tiny-tail", "tail"])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(op, min_size=1, max_size=25), max_bytes=st.sampled_from([1, 2500, 1 << 20]))
# Three control batches roll three segments, none flushed; a power loss keeps the later
# segments' files but not the first one's bytes: recovery refused the gap (issue 37).
@example(ops=[("control", 1, False)] * 3 + [("crash", 0, False)], max_bytes=1)
def test_random_operations_match_model(
    tail_limit: int | None, ops: list[tuple[str, float, bool]], max_bytes: int
) -> None:
    directory = tempfile.mkdtemp(prefix="qlprop")
    tail = None if tail_limit is None else TailBudget(tail_limit)
    try:
        log = Log(directory, CONFIG, tail=tail)
        model = Model()
        for name, arg, bump in ops:
            model.epoch += bump
            if name in ("leader", "follower"):
                count = int(arg)
                model.gen += 1
                base = log.end_offset
                if name == "leader":
                    epoch = max(model.epoch, log.last_epoch(), 0)
                    data = encode_batch(gen_values(model.gen, base, count))
                    log.append_as_leader(data, epoch)
                else:
                    epoch = max(model.epoch, log.last_epoch(), 0)
                    data = encode_batch(
                        gen_values(model.gen, base, count), base_offset=base, leader_epoch=epoch
                    )
                    log.append_as_follower(data)
                model.epoch = epoch
                model.batches.append(ModelBatch(base, count, epoch, model.gen))
            elif name == "control":
                epoch = max(model.epoch, log.last_epoch(), 0)
                model.epoch = epoch
                model.batches.append(ModelBatch(log.end_offset, 1, epoch, 0, control=True))
                log.append_control(epoch, 1, [1, 2, 3], 0)
            elif name == "truncate":
                target = model.start + int(arg * (model.end - model.start))
                log.truncate_to(target)
                model.truncate(log.end_offset)
                assert log.end_offset <= target
            elif name == "retention":
                log.apply_retention()
                assert log.start_offset >= model.start
                model.start = log.start_offset
                model.batches = [b for b in model.batches if b.base >= model.start]
                if model.batches:
                    assert model.batches[0].base == model.start
            elif name == "flush":
                assert log.flush() == log.end_offset
            elif name == "reopen":
                log.close()
                log = Log(directory, CONFIG, tail=tail)
            else:
                durable, before = log.durable_end_offset, log.end_offset
                crash(log, keep_unflushed=int(arg))
                log = Log(directory, CONFIG, tail=tail)
                assert durable <= log.end_offset <= before
                model.truncate(log.end_offset)
            check(log, model, max_bytes)
        log.close()
    finally:
        shutil.rmtree(directory)


def build(directory: str, batches: int, flush_every: int = 3) -> tuple[Log, list[int]]:
    """A log of ``batches`` batches (1-3 records, epochs rising) with periodic flushes."""
    log = Log(directory, LogConfig(segment_bytes=6000))
    for i in range(batches):
        log.append_as_leader(encode_batch(gen_values(0, log.end_offset, 1 + i % 3)), 1 + i // 4)
        if i % flush_every == 0:
            log.flush()
    return log, [b for b in range(log.end_offset)]


def last_segment(directory: str) -> Path:
    return sorted(Path(directory).glob("*.log"))[-1]


@settings(max_examples=30, deadline=None)
@given(batches=st.integers(1, 14), cut=st.floats(0, 1), clean=st.booleans())
def test_cut_segment_recovers_longest_valid_prefix(batches: int, cut: float, clean: bool) -> None:
    directory = tempfile.mkdtemp(prefix="qlcut")
    try:
        log, _ = build(directory, batches)
        full = log.read(log.start_offset, 1 << 30)  # (first segment only is fine below)
        if clean:
            log.close()
        else:
            crash(log)
        seg = last_segment(directory)
        data = seg.read_bytes()
        at = int(cut * len(data))
        seg.write_bytes(data[:at])
        headers = list(iter_batches(data))
        kept = [h for h in headers if h.end <= at]
        seg_base = int(seg.name[:20])
        expected_end = kept[-1].next_offset if kept else seg_base
        reopened = Log(directory, LogConfig(segment_bytes=6000))
        assert reopened.end_offset == expected_end
        table = batches_to_table(
            b"".join(reopened.read(o, 1 << 30) for o in _segment_starts(reopened))
        )
        assert table.column("offset").to_pylist() == list(range(expected_end))
        for o, v in zip(
            table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True
        ):
            assert v == b"g0-o%d" % o  # never invented
        assert all(e.offset < expected_end for e in reopened.epoch_cache.entries)
        assert full
        reopened.close()
    finally:
        shutil.rmtree(directory)


def _segment_starts(log: Log) -> list[int]:
    return [b for b in log.segment_base_offsets if b < log.end_offset]


@settings(max_examples=30, deadline=None)
@given(
    batches=st.integers(2, 8),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), min_size=1, max_size=4),
    from_fraction=st.floats(0, 0.9),
)
def test_flipped_tail_bytes(
    batches: int, flips: list[tuple[float, int]], from_fraction: float
) -> None:
    directory = tempfile.mkdtemp(prefix="qlflip")
    try:
        log = Log(directory)  # one segment
        for i in range(batches):
            log.append_as_leader(encode_batch(gen_values(0, log.end_offset, 1 + i % 3)), 1)
        crash(log)
        seg = last_segment(directory)
        data = bytearray(seg.read_bytes())
        headers = list(iter_batches(bytes(data)))
        lo = int(from_fraction * len(data))
        positions = sorted({lo + int(f * (len(data) - lo - 1)) for f, _ in flips})
        for (_, xor), pos in zip(flips, positions, strict=False):
            data[pos] ^= xor
        seg.write_bytes(bytes(data))
        damaged = [h for h in headers if any(h.position <= p < h.end for p in positions)]
        first_bad = damaged[0]
        intact_after = any(h.position > first_bad.position and h not in damaged for h in headers)
        if intact_after:
            with pytest.raises(CorruptLogError) as info:
                Log(directory)
            assert info.value.offset == first_bad.base_offset
            assert str(seg) in str(info.value)
        repaired = Log(directory, repair=True)
        assert repaired.end_offset == first_bad.base_offset
        if repaired.end_offset:
            table = batches_to_table(repaired.read(0, 1 << 30))
            assert table.column("value").to_pylist() == [
                b"g0-o%d" % o for o in range(first_bad.base_offset)
            ]
        repaired.close()
        if not intact_after:
            assert Log(directory).end_offset == first_bad.base_offset
    finally:
        shutil.rmtree(directory)


@settings(max_examples=25, deadline=None)
@given(batches=st.integers(1, 12), cut=st.floats(0, 1), garbage=st.booleans())
def test_cut_or_garbled_checkpoint_is_rebuilt(batches: int, cut: float, garbage: bool) -> None:
    directory = tempfile.mkdtemp(prefix="qlckpt")
    try:
        log, _ = build(directory, batches)
        log.close()
        expected = [(e.epoch, e.offset) for e in log.epoch_cache.entries]
        path = os.path.join(directory, "leader-epoch-checkpoint")
        with open(path, "rb") as fh:
            raw = fh.read()
        mangled = raw[: int(cut * len(raw))]
        if garbage:
            mangled += b"\x00zz"
        with open(path, "wb") as fh:
            fh.write(mangled)
        reopened = Log(directory, LogConfig(segment_bytes=6000))
        assert [(e.epoch, e.offset) for e in reopened.epoch_cache.entries] == expected
        reopened.close()
    finally:
        shutil.rmtree(directory)
