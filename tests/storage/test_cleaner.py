"""The log cleaner (``storage.cleaner``): a compacted log keeps the latest record of each
key with its offset, reads and follower copies cope with the gaps, producer state and
the epoch cache are those of the uncleaned log, and a swap a crash interrupts is
finished or undone by recovery."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from quorumlog.replica.storage import Log, LogConfig, batches_to_table, encode_batch, iter_batches
from quorumlog.replica.storage.cleaner import CLEANED_SUFFIX, SWAP_FILE
from quorumlog.replica.storage.records import BatchHeader, Producer, TxnMarker

from .helpers import crash, read_everything

COMPACT = LogConfig(segment_bytes=4096, cleanup_policy="compact", delete_retention_ms=1000)
NOW = 10_000_000


def put(lg: Log, pairs: list[tuple[bytes, bytes | None]], stamp: int = NOW, **kw: object) -> None:
    lg.append_as_leader(
        encode_batch(
            [v for _, v in pairs], keys=[k for k, _ in pairs], timestamps=[stamp] * len(pairs), **kw
        ),  # type: ignore[arg-type]
        1,
    )


def contents(lg: Log, start: int | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every data record, reading batch by batch from the start."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = lg.start_offset if start is None else start
    while offset < lg.end_offset:
        data = lg.read(offset, 1 << 16)
        if not data:
            break
        table = batches_to_table(data)
        out.extend(
            zip(
                table.column("offset").to_pylist(),
                table.column("key").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            )
        )
        offset = list(iter_batches(data))[-1].next_offset
    return out


def batch_bases(lg: Log) -> set[int]:
    bases: set[int] = set()
    offset = lg.start_offset
    for _ in range(10_000):
        if offset >= lg.end_offset:
            break
        batches = list(iter_batches(lg.read(offset, 1 << 20)))
        bases.update(h.base_offset for h in batches)
        offset = batches[-1].next_offset
    return bases


def latest(
    records: list[tuple[int, bytes | None, bytes | None]],
) -> dict[bytes | None, bytes | None]:
    last: dict[bytes | None, bytes | None] = {}
    for _offset, key, value in records:
        last[key] = value
    return {k: v for k, v in last.items() if v is not None}


def fill(lg: Log, rounds: int = 30, keys: int = 7) -> None:
    for r in range(rounds):
        put(lg, [(b"k%d" % ((r * 3 + i) % keys), b"v%d-%d" % (r, i)) for i in range(5)])
        if r % 9 == 8:
            put(lg, [(b"k%d" % (r % keys), None)])  # a tombstone


def test_a_clean_keeps_the_latest_value_of_each_key_at_its_offset(tmp_path: Path) -> None:
    lg = Log(str(tmp_path / "p"), COMPACT)
    fill(lg)
    lg.flush()
    before = contents(lg)
    size_before = lg.size_bytes
    stats = lg.clean(high_watermark=lg.end_offset, now_ms=NOW)
    assert stats is not None and stats.records_kept < stats.records_read
    after = contents(lg)
    assert latest(after) == latest(before)
    offsets = [o for o, _, _ in after]
    assert offsets == sorted(offsets) and set(offsets) <= {o for o, _, _ in before}
    cleaned = [r for r in after if r[0] < stats.cleanable_end]
    keys = [k for _, k, _ in cleaned]
    assert len(keys) == len(set(keys))  # one record per key below the cleanable end
    assert lg.size_bytes < size_before
    assert lg.cleaned_end == stats.cleanable_end
    # The same after a restart, whether clean or not.
    lg.close()
    lg = Log(str(tmp_path / "p"), COMPACT)
    assert contents(lg) == after
    assert not [n for n in os.listdir(tmp_path / "p") if n.endswith(CLEANED_SUFFIX)]


def test_the_scrub_verifies_a_cleaned_log_whole_even_mid_pass(tmp_path: Path) -> None:
    lg = Log(str(tmp_path / "p"), COMPACT)
    for r in range(6):  # the first segment keeps one record of each batch
        put(lg, [(b"keep%d" % r, b"v"), (b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")])
    fill(lg)
    lg.flush()
    assert lg.scrub(1500) is None  # a pass part done: its cursor is inside a segment
    assert lg.clean(high_watermark=lg.end_offset, now_ms=NOW) is not None
    passes = lg.scrub_passes
    for _ in range(100):
        assert lg.scrub(5000) is None
        if lg.scrub_passes > passes:
            break
    assert lg.scrub_passes > passes


def test_reads_from_inside_a_gap_start_at_the_batch_holding_it_or_the_next(
    tmp_path: Path,
) -> None:
    """A read from a gap gives whole batches from the one whose offsets span it (a
    sparse batch the clean wrote) or else the next: its records from the gap on are
    exactly those the log holds past it."""
    lg = Log(str(tmp_path / "p"), COMPACT)
    fill(lg)
    lg.flush()
    assert lg.clean(high_watermark=lg.end_offset, now_ms=NOW) is not None
    records = contents(lg)
    kept = [o for o, _, _ in records]
    gaps = [o for o in range(kept[0], kept[-1]) if o not in kept]
    assert gaps
    for offset in gaps[:50]:
        first = next(iter_batches(lg.read(offset, 1 << 16)))
        assert first.base_offset < offset < first.last_offset or first.base_offset > offset
        got = contents(lg, start=offset)
        assert [r for r in got if r[0] > offset] == [r for r in records if r[0] > offset]
    # max_offset inside a gap: no batch starting at or past it.
    some_gap = gaps[len(gaps) // 2]
    data = lg.read(lg.start_offset, 1 << 20, max_offset=some_gap)
    assert all(h.base_offset < some_gap for h in iter_batches(data))


def test_a_follower_copies_a_cleaned_log_and_recovers_it(tmp_path: Path) -> None:
    leader = Log(str(tmp_path / "l"), COMPACT)
    fill(leader)
    leader.flush()
    assert leader.clean(high_watermark=leader.end_offset, now_ms=NOW) is not None
    follower = Log(str(tmp_path / "f"), COMPACT)
    while follower.end_offset < leader.end_offset:
        follower.append_as_follower(leader.read(follower.end_offset, 1000))
    assert contents(follower) == contents(leader)
    assert follower.cleaned_end > 0
    follower.flush()
    crash(follower)
    again = Log(str(tmp_path / "f"), COMPACT)
    assert contents(again) == contents(leader)


def test_truncating_a_cleaned_log_keeps_the_epoch_cache(tmp_path: Path) -> None:
    plain = Log(str(tmp_path / "plain"), COMPACT)
    cleaned = Log(str(tmp_path / "cleaned"), COMPACT)
    for epoch in (1, 2, 3):
        for lg in (plain, cleaned):
            for r in range(10):
                lg.append_as_leader(
                    encode_batch([b"v%d" % r], keys=[b"k%d" % (r % 3)], timestamps=[NOW]), epoch
                )
    for lg in (plain, cleaned):
        lg.flush()
    assert cleaned.clean(high_watermark=cleaned.end_offset, now_ms=NOW) is not None
    for epoch in (0, 1, 2, 3, 4):
        assert cleaned.end_offset_for(epoch) == plain.end_offset_for(epoch)
    for offset in (25, 17, 12, 3):
        plain.truncate_to(offset)
        cleaned.truncate_to(offset)
        assert cleaned.end_offset == plain.end_offset == offset
        for epoch in (0, 1, 2, 3, 4):
            assert cleaned.end_offset_for(epoch) == plain.end_offset_for(epoch)
        # What the cleaned log holds below the truncation, the plain one holds too.
        assert set(contents(cleaned)) <= set(contents(plain))


def test_producer_state_and_aborted_transactions_survive_a_clean(tmp_path: Path) -> None:
    lg = Log(str(tmp_path / "p"), COMPACT)
    seq = 0
    for r in range(12):
        put(lg, [(b"k%d" % (r % 2), b"committed-%d" % r)], producer=Producer(7, 0, seq))
        seq += 1
    # A transaction that writes k0 and aborts: it never shadows k0's committed value.
    put(lg, [(b"k0", b"aborted")], producer=Producer(9, 0, 0), transactional=True)
    lg.append_markers([TxnMarker(9, 0, False, 0)], 1, NOW)
    for r in range(40):
        put(lg, [(b"filler%d" % (r % 3), b"x" * 200)])
    lg.flush()
    state_before = lg.producer_state().last_batch(7)
    assert lg.clean(high_watermark=lg.end_offset, now_ms=NOW) is not None
    committed = latest([r for r in contents(lg)])
    assert committed[b"k0"] in (b"committed-10", b"aborted")  # read_uncommitted may see it
    aborted = [(a.producer_id, a.first_offset) for a in lg.transactions().aborted]
    visible = batches_to_table(read_everything(lg), aborted=aborted)
    got = {
        k: v
        for k, v in zip(
            visible.column("key").to_pylist(), visible.column("value").to_pylist(), strict=True
        )
    }
    assert got[b"k0"] == b"committed-10"
    lg.close()
    again = Log(str(tmp_path / "p"), COMPACT)
    assert again.producer_state().last_batch(7) == state_before
    assert [a.producer_id for a in again.transactions().aborted] == [9]


def test_a_clean_never_touches_the_active_segment_or_past_the_high_watermark(
    tmp_path: Path,
) -> None:
    lg = Log(str(tmp_path / "p"), COMPACT)
    fill(lg)
    lg.flush()
    before = contents(lg)
    bases = lg.segment_base_offsets
    hwm = bases[3] + 1  # inside the fourth segment: the first three are cleanable
    stats = lg.clean(high_watermark=hwm, now_ms=NOW)
    assert stats is not None
    assert stats.cleanable_end == bases[3]
    assert stats.cleanable_end <= hwm
    after = contents(lg)
    assert [r for r in after if r[0] >= stats.cleanable_end] == [
        r for r in before if r[0] >= stats.cleanable_end
    ]
    assert len(after) < len(before)


def test_segments_cleaned_small_share_one_output_segment(tmp_path: Path) -> None:
    """The cleaner groups source segments by what they keep, not by what they held: full
    segments of a few keys clean to one small segment, not one each (else a log whose
    writes stop after a clean of two or more segments keeps that many, with nothing dirty
    left to make another clean due)."""
    lg = Log(str(tmp_path / "p"), COMPACT)
    fill(lg, rounds=60, keys=3)
    lg.flush()
    sealed = len(lg.segment_base_offsets) - 1
    assert sealed >= 4
    stats = lg.clean(high_watermark=lg.end_offset, now_ms=NOW)
    assert stats is not None and stats.segments == sealed
    assert len(lg.segment_base_offsets) == 2  # the cleaned one, and the active one
    # Written again: the next clean merges the cleaned segment with the newly cleaned.
    fill(lg, rounds=60, keys=3)
    lg.flush()
    before = contents(lg)
    assert lg.clean(high_watermark=lg.end_offset, now_ms=NOW) is not None
    assert len(lg.segment_base_offsets) == 2
    assert latest(contents(lg)) == latest(before)


def test_recovery_finishes_a_swap_with_its_manifest_and_undoes_one_without(tmp_path: Path) -> None:
    for committed in (False, True):
        directory = str(tmp_path / f"p{committed}")
        lg = Log(directory, COMPACT)
        fill(lg)
        lg.flush()
        before = contents(lg)
        end = lg.clean_point(lg.end_offset, None, NOW)
        aborted, pinned = lg.clean_inputs()
        plan = lg.prepare_clean(end, NOW, aborted=aborted, pinned=pinned)
        assert plan is not None
        if committed:  # the swap's steps up to its commit point
            lg._set_cleaned_end(end)
            lines = ["0"] + [" ".join(str(s.base_offset) for s in g.sources) for g in plan.groups]
            with open(os.path.join(directory, SWAP_FILE), "w") as fh:
                fh.write("\n".join(lines) + "\n")
        lg.close()  # the process stops before (or at) the swap's commit point
        again = Log(directory, COMPACT)
        after = contents(again)
        assert latest(after) == latest(before)
        if committed:
            assert len(after) < len(before)
        else:
            assert after == before
        assert not [
            n for n in os.listdir(directory) if n.endswith(CLEANED_SUFFIX) or n == SWAP_FILE
        ]


def test_a_clean_prepared_before_a_truncation_is_dropped(tmp_path: Path) -> None:
    """A truncation cuts a segment in place (the same object) and appends then seal it
    again: the plan read it whole and must not bring back what was cut."""
    lg = Log(str(tmp_path / "p"), COMPACT)
    fill(lg)
    lg.flush()
    end = lg.clean_point(lg.end_offset, None, NOW)
    aborted, pinned = lg.clean_inputs()
    plan = lg.prepare_clean(end, NOW, aborted=aborted, pinned=pinned)
    assert plan is not None
    cut = lg.segment_base_offsets[-2] + 2  # inside the last segment the plan cleaned
    lg.truncate_to(cut)
    fill(lg, rounds=20)  # a new branch, rolling past the cut segment again
    lg.flush()
    now = contents(lg)
    assert lg.swap_clean(plan) is None
    assert contents(lg) == now
    assert not [n for n in os.listdir(tmp_path / "p") if n.endswith(CLEANED_SUFFIX)]


def test_retention_deletes_nothing_under_a_compact_only_policy(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=4096, cleanup_policy="compact", retention_bytes=1)
    lg = Log(str(tmp_path / "p"), config)
    fill(lg)
    assert len(lg.segment_base_offsets) > 2
    assert lg.apply_retention() == 0
    both = LogConfig(segment_bytes=4096, cleanup_policy="compact,delete", retention_bytes=1)
    lg.close()
    lg = Log(str(tmp_path / "p"), both)
    assert lg.apply_retention() > 0


def test_a_follower_ending_inside_a_leader_batch_takes_the_batch_from_its_end(
    tmp_path: Path,
) -> None:
    """A follower's own clean cut a batch into runs, then a repair truncated its log at a
    run's first offset: the leader (uncleaned) holds that batch whole, starting below the
    follower's end. The follower takes the batch's records from its end on; refusing the
    batch left it fetching the same batch for ever (found by the simulator)."""
    leader = Log(str(tmp_path / "l"), COMPACT)
    fill(leader)
    leader.flush()
    follower = Log(str(tmp_path / "f"), COMPACT)
    while follower.end_offset < leader.end_offset:
        follower.append_as_follower(leader.read(follower.end_offset, 1000))
    follower.flush()
    stats = follower.clean(high_watermark=follower.end_offset, now_ms=NOW)
    assert stats is not None
    inside = sorted(batch_bases(follower) - batch_bases(leader))
    assert inside, "the clean kept no run starting inside a leader batch"
    assert inside[-1] < stats.cleanable_end
    cut = inside[-1]
    follower.truncate_to(cut)
    assert follower.end_offset == cut
    for _ in range(100):
        if follower.end_offset >= leader.end_offset:
            break
        follower.append_as_follower(leader.read(follower.end_offset, 1000))
    assert follower.end_offset == leader.end_offset
    expected = [r for r in contents(leader) if r[0] >= cut]
    assert [r for r in contents(follower) if r[0] >= cut] == expected
    follower.flush()
    crash(follower)
    again = Log(str(tmp_path / "f"), COMPACT)
    assert [r for r in contents(again) if r[0] >= cut] == expected


def test_scattered_survivors_become_a_few_sparse_batches(tmp_path: Path) -> None:
    """Keys written at random and most overwritten later: the survivors of the first
    segments lie scattered, one or two a batch. The clean packs those of consecutive
    batches into one sparse batch (up to its size bound), not a batch each; a producer's
    batches are never merged, with each other or with others."""
    config = LogConfig(segment_bytes=64 << 10, cleanup_policy="compact")
    lg = Log(str(tmp_path / "p"), config)
    rng = np.random.default_rng(7)
    keys = rng.permutation(2000)
    for start in range(0, 2000, 10):  # 200 batches of 10 distinct keys
        put(lg, [(b"key-%d" % k, b"first" * 10) for k in keys[start : start + 10]])
        if start == 1000:  # two producers' batches among them, their keys never rewritten
            for pid in (5, 6):
                put(
                    lg,
                    [(b"p%d-%d" % (pid, i), b"p") for i in range(4)],
                    producer=Producer(pid, 0, 0),
                )
    rewritten = set(rng.choice(2000, 1800, replace=False).tolist())
    for start in range(0, 2000, 100):
        chunk = [k for k in range(start, start + 100) if k in rewritten]
        put(lg, [(b"key-%d" % k, b"second") for k in chunk])
    lg.flush()
    before = contents(lg)
    stats = lg.clean(high_watermark=lg.end_offset, now_ms=NOW)
    assert stats is not None
    after = contents(lg)
    assert latest(after) == latest(before)
    assert set(after) <= set(before)
    cleaned = [h for h in _headers(lg) if h.next_offset <= stats.cleanable_end]
    first_round = [h for h in cleaned if h.producer is None and h.base_offset < 2008]
    survivors = sum(h.record_count for h in first_round)
    assert survivors >= 150  # about 200 keys of the first round were not rewritten
    # One batch or so per segment of the first round, not one per survivor or per source batch.
    assert len(first_round) <= 12
    assert any(h.is_sparse for h in first_round)
    producers = [h for h in cleaned if h.producer is not None]
    assert sorted((h.producer_id, h.record_count) for h in producers) == [(5, 4), (6, 4)]


def _headers(lg: Log) -> list[BatchHeader]:
    return list(iter_batches(read_everything(lg)))


def test_a_producer_s_older_batch_partly_kept_stays_apart_with_its_sequences(
    tmp_path: Path,
) -> None:
    """Two producers' batches interleaved, every other record of each later rewritten:
    a batch older than the producer's remembered ones keeps its survivors as a sparse
    batch of its own (never merged with another's or its producer's next), its base
    sequence that of its first kept record, so each record's sequence is still base
    sequence + offset delta."""
    lg = Log(str(tmp_path / "p"), COMPACT)
    sequences: dict[int, tuple[int, int]] = {}  # offset -> (producer, sequence)
    for n in range(8):
        for pid in (5, 6):
            base = lg.end_offset
            put(
                lg,
                [(b"p%d-%d-%d" % (pid, n, i), b"v") for i in range(4)],
                producer=Producer(pid, 0, 4 * n),
            )
            sequences.update({base + i: (pid, 4 * n + i) for i in range(4)})
    for n in range(8):
        for pid in (5, 6):
            put(lg, [(b"p%d-%d-%d" % (pid, n, i), b"w") for i in (1, 3)])
    put(lg, [(b"filler", b"x" * 3000)])  # the rewrites out of the active segment
    lg.flush()
    assert lg.clean(high_watermark=lg.end_offset, now_ms=NOW) is not None
    producer_batches = [h for h in _headers(lg) if h.producer is not None]
    sparse = [h for h in producer_batches if h.is_sparse]
    assert len(sparse) >= 4  # the batches older than each producer's remembered five
    table = batches_to_table(read_everything(lg))
    offsets = set(table.column("offset").to_pylist())
    for h in producer_batches:
        assert h.record_count <= 4
        held = sorted(o for o in offsets if h.base_offset <= o <= h.last_offset)
        assert held[0] == h.base_offset and held[-1] == h.last_offset
        for o in held:
            assert sequences[o] == (h.producer_id, h.base_sequence + o - h.base_offset)
    for h in sparse:
        assert h.record_count == 2 and h.last_offset_delta == 2  # records 0 and 2 of 4
