"""The node lifecycle's replica plans (``client.balance``): pure functions of the
assignments, checked on the properties an operator relies on."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from quorumlog.replica.client.balance import (
    decommission_plan,
    rack_problems,
    rebalance_plan,
    replication_factor_plan,
)
from quorumlog.replica.node.metadata import assign_replicas


def applied(assignments: dict[str, list[list[int]]], plan: dict[str, dict[int, list[int]]]):
    out = {t: [list(r) for r in parts] for t, parts in assignments.items()}
    for topic, parts in plan.items():
        for p, replicas in parts.items():
            out[topic][p] = replicas
    return out


def counts(assignments: dict[str, list[list[int]]], nodes: list[int]) -> Counter[int]:
    c: Counter[int] = Counter(dict.fromkeys(nodes, 0))
    for parts in assignments.values():
        for r in parts:
            c.update(r)
    return c


def test_decommission_moves_every_replica_off_the_node_keeping_counts_even() -> None:
    nodes = [1, 2, 3, 4, 5]
    before = {"a": assign_replicas("a", 64, 3, nodes), "b": assign_replicas("b", 7, 2, nodes)}
    plan = decommission_plan(before, nodes, 1)
    after = applied(before, plan)
    assert all(1 not in r for parts in after.values() for r in parts)
    for t in before:
        assert [len(r) for r in after[t]] == [len(r) for r in before[t]]
        assert all(len(set(r)) == len(r) for r in after[t])
        # Only the partitions node 1 held moved, and in each only node 1's place.
        for p, r in enumerate(before[t]):
            kept = [(i, n) for i, n in enumerate(r) if n != 1]
            assert [(i, after[t][p][i]) for i, _ in kept] == kept
            assert (p in plan.get(t, {})) == (1 in r)
    load = counts(after, [2, 3, 4, 5])
    assert max(load.values()) - min(load.values()) <= 1


def test_a_lost_node_is_replaced_by_one_new_node_in_place() -> None:
    nodes = [1, 2, 3, 4]
    before = {"a": assign_replicas("a", 16, 3, nodes)}
    plan = decommission_plan(before, [*nodes, 6], 2, into=6)
    after = applied(before, plan)
    for p, r in enumerate(before["a"]):
        assert after["a"][p] == [6 if n == 2 else n for n in r]  # same place, same leader slot
    assert set(plan["a"]) == {p for p, r in enumerate(before["a"]) if 2 in r}


def test_decommission_refuses_when_a_partition_would_have_nowhere_to_go() -> None:
    with pytest.raises(ValueError, match="cannot leave"):
        decommission_plan({"t": [[1, 2, 3]]}, [1, 2, 3], 2)


def test_rebalance_gives_new_nodes_their_share_of_replicas_and_leaders() -> None:
    before = {"t": assign_replicas("t", 60, 3, [1, 2, 3])}
    nodes = [1, 2, 3, 4, 5]
    after = applied(before, rebalance_plan(before, nodes))
    load = counts(after, nodes)
    assert max(load.values()) - min(load.values()) <= 1
    firsts = Counter(r[0] for r in after["t"])
    assert set(firsts) == set(nodes)
    assert max(firsts.values()) - min(firsts.values()) <= 1
    assert all(len(set(r)) == 3 for r in after["t"])
    # A balanced cluster needs no move.
    assert rebalance_plan(after, nodes) == {}


def test_replication_factor_grows_and_shrinks_on_the_least_and_most_loaded() -> None:
    nodes = [1, 2, 3, 4]
    before = {"t": assign_replicas("t", 8, 2, nodes)}
    up = applied(before, replication_factor_plan(before, nodes, "t", 3))
    assert all(len(set(r)) == 3 for r in up["t"])
    assert [r[:2] for r in up["t"]] == before["t"]  # existing replicas stay, in order
    down = applied(up, replication_factor_plan(up, nodes, "t", 1))
    assert [r for r in down["t"]] == [[r[0]] for r in before["t"]]  # the preferred stays
    with pytest.raises(ValueError, match="1..4"):
        replication_factor_plan(before, nodes, "t", 5)


# ---------------------------------------------------------------- racks


def rack_spread(assignments: dict[str, list[list[int]]], racks: dict[int, str]) -> list[int]:
    """The number of distinct racks of each partition's replicas, over every topic."""
    return [len({racks[n] for n in r}) for parts in assignments.values() for r in parts]


@st.composite
def racked_layouts(draw: st.DrawFn) -> tuple[dict[int, str], int]:
    """Nodes (ids 1..n) spread over racks (each rack one node at least), and a
    replication factor no larger than the racks."""
    rack_count = draw(st.integers(1, 4))
    extra = draw(st.lists(st.integers(0, rack_count - 1), max_size=6))
    members = [*range(rack_count), *extra]
    order = draw(st.permutations(members))
    racks = {i + 1: f"r{r}" for i, r in enumerate(order)}
    rf = draw(st.integers(1, rack_count))
    return racks, rf


@settings(max_examples=150, deadline=None)
@given(racked_layouts(), st.integers(1, 24), st.sampled_from(["a", "orders", "x.y"]))
@example(({1: "r0", 2: "r0", 3: "r1", 4: "r1"}, 2), 8, "t")
def test_every_plan_keeps_replicas_on_distinct_racks(
    layout: tuple[dict[int, str], int], partitions: int, name: str
) -> None:
    racks, rf = layout
    nodes = sorted(racks)
    created = {name: assign_replicas(name, partitions, rf, nodes, racks)}
    assert all(len(set(r)) == rf for r in created[name])
    assert rack_spread(created, racks) == [rf] * partitions
    assert rack_problems(created, nodes, racks) == []
    # Leaders spread over the nodes as evenly as the partition count allows.
    firsts = Counter(r[0] for r in created[name])
    assert max(firsts.values()) - min(firsts.get(n, 0) for n in nodes) <= 1

    rebalanced = applied(created, rebalance_plan(created, nodes, racks))
    assert rack_spread(rebalanced, racks) == [rf] * partitions

    for leaving in nodes:
        rest = {n: r for n, r in racks.items() if n != leaving}
        if len(set(rest.values())) < rf:
            continue  # the racks left cannot keep rf replicas apart
        after = applied(created, decommission_plan(created, nodes, leaving, racks=racks))
        assert all(leaving not in r for r in after[name])
        assert rack_spread(after, racks) == [rf] * partitions
        again = applied(after, rebalance_plan(after, list(rest), racks))
        assert rack_spread(again, racks) == [rf] * partitions
        assert all(leaving not in r for r in again[name])

    rack_count = len(set(racks.values()))
    for factor in range(1, rack_count + 1):
        changed = applied(created, replication_factor_plan(created, nodes, name, factor, racks))
        assert rack_spread(changed, racks) == [factor] * partitions


def test_rebalance_moves_replicas_sharing_a_rack_apart() -> None:
    """Racks given to a cluster placed without them: rebalance spreads each partition over
    them (and says nothing is left to warn of)."""
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    before = {"t": [[1, 2], [3, 4], [1, 3], [2, 4]]}
    assert len(rack_problems(before, racks, racks)) == 1
    after = applied(before, rebalance_plan(before, list(racks), racks))
    assert rack_spread(after, racks) == [2, 2, 2, 2]
    assert rack_problems(after, racks, racks) == []
    assert [r for r in after["t"][2:]] == [[1, 3], [2, 4]]  # those already apart stay


def test_a_placement_that_cannot_keep_racks_apart_says_so() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    wide = {"w": assign_replicas("w", 4, 3, [1, 2, 3, 4], racks)}
    # Both racks hold a replica of every partition: as far apart as two racks allow.
    assert rack_spread(wide, racks) == [2] * 4
    (problem,) = rack_problems(wide, racks, racks)
    assert "replication factor 3 over 2 rack(s) (a, b)" in problem
    # Replacing a lost node by one of the same rack as a partition's other replica.
    narrow = {"n": [[1, 3]]}
    after = applied(narrow, decommission_plan(narrow, [1, 2, 3, 4], 1, into=4, racks=racks))
    assert after == {"n": [[4, 3]]}
    (problem,) = rack_problems(after, [2, 3, 4], racks)
    assert "n: 1 partition(s) have two replicas in one rack" in problem


def test_nodes_without_a_rack_are_placed_as_without_racks() -> None:
    nodes = [1, 2, 3, 4, 5]
    assert assign_replicas("t", 20, 3, nodes, {}) == assign_replicas("t", 20, 3, nodes)
    before = {"t": assign_replicas("t", 20, 3, nodes)}
    assert rebalance_plan(before, nodes, {}) == rebalance_plan(before, nodes)
    assert rack_problems(before, nodes, {}) == []
    # A rackless node among racked ones is a rack of its own.
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    mixed = {"m": assign_replicas("m", 10, 3, nodes, racks)}
    assert all(5 in r for r in mixed["m"])
