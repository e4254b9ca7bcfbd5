"""The compaction rules (``storage.compaction``): cleanable end, when to clean, survivors."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.storage.compaction import (
    capped_end,
    cleanable_end,
    dirty_ratio,
    should_clean,
    survivors,
)

DAY = 86_400_000


def keep(
    keys: list[bytes | None],
    values: list[bytes | None],
    *,
    offsets: list[int] | None = None,
    stamps: list[int] | None = None,
    end: int = 1 << 62,
    now: int = 1000,
    retention: int = DAY,
    aborted: list[bool] | None = None,
    pinned: list[bool] | None = None,
) -> list[int]:
    offsets = offsets if offsets is not None else list(range(len(keys)))
    mask = survivors(
        pa.array(offsets, pa.int64()),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(stamps if stamps is not None else [now] * len(keys), pa.int64()),
        cleanable_end=end,
        now_ms=now,
        delete_retention_ms=retention,
        aborted=None if aborted is None else pa.array(aborted, pa.bool_()),
        pinned=None if pinned is None else pa.array(pinned, pa.bool_()),
    )
    return pc.filter(pa.array(offsets, pa.int64()), mask).to_pylist()


def test_the_latest_record_of_each_key_survives() -> None:
    assert keep([b"a", b"b", b"a", b"c", b"b"], [b"1", b"2", b"3", b"4", b"5"]) == [2, 3, 4]


def test_records_at_or_above_the_cleanable_end_are_kept_and_shadow_nothing() -> None:
    # a@0 is shadowed by a@1 (below the end); a@2 is above the end: it does not count.
    assert keep([b"a", b"a", b"a"], [b"1", b"2", b"3"], end=2) == [1, 2]


def test_a_tombstone_stays_until_older_than_delete_retention_then_goes() -> None:
    keys, values = [b"a", b"a", b"b"], [b"1", None, b"2"]
    fresh = keep(keys, values, stamps=[0, 900, 0], now=1000, retention=500)
    assert fresh == [1, 2]  # the tombstone is 100 ms old: kept, the value it deletes not
    old = keep(keys, values, stamps=[0, 400, 0], now=1000, retention=500)
    assert old == [2]  # 600 ms old: gone with everything it deleted


def test_aborted_records_never_shadow_a_committed_value_and_go() -> None:
    keys, values = [b"a", b"a", b"a"], [b"1", b"aborted", b"aborted-too"]
    assert keep(keys, values, aborted=[False, True, True]) == [0]


def test_pinned_records_and_keyless_ones_are_kept() -> None:
    keys: list[bytes | None] = [b"a", None, b"a", b"a"]
    assert keep(keys, [b"1", b"x", b"2", b"3"], pinned=[False, False, True, False]) == [1, 2, 3]


def test_an_expired_tombstone_stays_while_a_pinned_value_of_its_key_is_kept() -> None:
    # a@0 is pinned (a producer's remembered batch): dropping the expired tombstone a@1
    # would make that value a's latest again (found by the simulator, seed 9).
    keys, values = [b"a", b"a", b"b"], [b"1", None, b"2"]
    stamps = [0, 400, 0]
    assert keep(keys, values, stamps=stamps, retention=500, pinned=[True, False, False]) == [
        0,
        1,
        2,
    ]
    # An aborted pinned record is no value a reader sees: the tombstone goes.
    pinned_aborted = keep(
        keys,
        values,
        stamps=stamps,
        retention=500,
        pinned=[True, False, False],
        aborted=[True, False, False],
    )
    assert pinned_aborted == [0, 2]


def test_offsets_keep_their_gaps() -> None:
    assert keep([b"a", b"b", b"a"], [b"1", b"2", b"3"], offsets=[10, 15, 40]) == [15, 40]


def test_cleanable_end_stops_at_the_active_segment_hwm_lso_and_lag() -> None:
    bases, stamps = [0, 10, 20, 30], [100, 200, 300, 400]
    common = {"now_ms": 1000, "min_compaction_lag_ms": 0}
    assert cleanable_end(bases, stamps, high_watermark=99, last_stable_offset=None, **common) == 30
    assert cleanable_end(bases, stamps, high_watermark=25, last_stable_offset=None, **common) == 20
    assert cleanable_end(bases, stamps, high_watermark=99, last_stable_offset=19, **common) == 10
    lagged = cleanable_end(
        bases,
        stamps,
        high_watermark=99,
        last_stable_offset=None,
        now_ms=1000,
        min_compaction_lag_ms=850,
    )
    assert lagged == 10  # the second segment's newest record is 800 ms old: too young
    assert cleanable_end([0], [5], high_watermark=99, last_stable_offset=None, **common) == 0


def test_a_round_takes_at_most_max_dirty_bytes_of_uncleaned_segments() -> None:
    bases, sizes = [0, 10, 20, 30, 40], [100, 100, 100, 100, 5]
    assert capped_end(bases, sizes, 40, cleaned_end=0, max_dirty_bytes=250) == 20
    assert capped_end(bases, sizes, 40, cleaned_end=0, max_dirty_bytes=50) == 10  # one
    assert capped_end(bases, sizes, 40, cleaned_end=20, max_dirty_bytes=150) == 30
    assert capped_end(bases, sizes, 40, cleaned_end=0, max_dirty_bytes=1000) == 40


def test_should_clean_by_dirty_ratio_or_max_lag() -> None:
    assert dirty_ratio(0, 0) == 0.0
    assert dirty_ratio(100, 300) == 0.75
    base = {"oldest_dirty_timestamp": 900, "now_ms": 1000, "max_compaction_lag_ms": None}
    assert should_clean(clean_bytes=100, dirty_bytes=100, min_cleanable_dirty_ratio=0.5, **base)
    assert not should_clean(clean_bytes=300, dirty_bytes=100, min_cleanable_dirty_ratio=0.5, **base)
    assert not should_clean(clean_bytes=0, dirty_bytes=0, min_cleanable_dirty_ratio=0.0, **base)
    assert should_clean(
        clean_bytes=300,
        dirty_bytes=100,
        min_cleanable_dirty_ratio=0.5,
        oldest_dirty_timestamp=100,
        now_ms=1000,
        max_compaction_lag_ms=500,
    )


records = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"b", b"c", b"d", None]),
        st.one_of(st.none(), st.binary(max_size=3)),
        st.integers(1, 5),  # the gap before the record
        st.booleans(),  # aborted
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(records, st.integers(0, 400))
def test_survivors_are_the_last_live_record_of_each_key(
    recs: list[tuple[bytes | None, bytes | None, int, bool]], end: int
) -> None:
    offsets, at = [], 0
    for _key, _value, gap, _ab in recs:
        at += gap
        offsets.append(at)
    keys = [r[0] for r in recs]
    values = [r[1] for r in recs]
    aborted = [r[3] for r in recs]
    kept = keep(keys, values, offsets=offsets, end=end, aborted=aborted, retention=DAY)
    # A model, record at a time: the last committed record of each key below the end.
    last: dict[bytes, int] = {}
    for key, offset, ab in zip(keys, offsets, aborted, strict=True):
        if key is not None and offset < end and not ab:
            last[key] = offset
    expected = [
        offset
        for key, offset, ab in zip(keys, offsets, aborted, strict=True)
        if offset >= end or (not ab and (key is None or last.get(key) == offset))
    ]
    assert kept == expected
    assert kept == sorted(kept)  # ascending, never renumbered: the gaps stay gaps
    assert set(kept) <= set(offsets)
