from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from quorumlog.connector.offsets import TopicPartition
from quorumlog.connector.planning import split_budget

A, B, C = (TopicPartition("t", i) for i in range(3))


def test_everything_fits() -> None:
    assert split_budget({A: 0, B: 5}, {A: 10, B: 8}, 100) == {A: 10, B: 8}


def test_proportional_to_available() -> None:
    assert split_budget({A: 0, B: 0}, {A: 300, B: 100}, 100) == {A: 75, B: 25}
    assert split_budget({A: 10, B: 0, C: 7}, {A: 10, B: 90, C: 37}, 12) == {A: 10, B: 9, C: 10}


def test_remainder_goes_to_largest_fractions() -> None:
    got = split_budget({A: 0, B: 0, C: 0}, {A: 10, B: 10, C: 10}, 10)
    assert sum(got.values()) == 10 and all(3 <= v <= 4 for v in got.values())


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=6),
    st.integers(1, 3000),
)
def test_budget_properties(ranges: list[tuple[int, int]], limit: int) -> None:
    tps = [TopicPartition("t", i) for i in range(len(ranges))]
    starts = {tp: s for tp, (s, _) in zip(tps, ranges, strict=True)}
    ends = {tp: s + n for tp, (s, n) in zip(tps, ranges, strict=True)}
    got = split_budget(starts, ends, limit)
    assert all(starts[tp] <= got[tp] <= ends[tp] for tp in tps)
    taken = sum(got[tp] - starts[tp] for tp in tps)
    available = sum(ends[tp] - starts[tp] for tp in tps)
    assert taken == min(limit, available)


def test_split_ranges_min_partitions_proportional() -> None:
    from quorumlog.connector.planning import piece_bounds, split_ranges

    assert split_ranges({A: 1000}, 8, None) == {A: 8}
    assert split_ranges({A: 300, B: 100, C: 0}, 8, None) == {A: 6, B: 2, C: 1}
    assert split_ranges({A: 3}, 8, None) == {A: 3}  # never more tasks than offsets
    assert split_ranges({A: 100, B: 100}, 2, None) == {A: 1, B: 1}  # already enough
    assert piece_bounds(10, 20, 3) == [10, 13, 16, 20]


def test_split_ranges_max_records_then_min_partitions() -> None:
    from quorumlog.connector.planning import split_ranges

    assert split_ranges({A: 1000, B: 10}, None, 300) == {A: 4, B: 1}
    # both: about the larger of the two counts
    assert split_ranges({A: 1000}, 8, 300) == {A: 8}
    assert split_ranges({A: 1000}, 2, 300) == {A: 4}
