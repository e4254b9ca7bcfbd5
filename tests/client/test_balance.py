"""The node lifecycle's replica plans (``client.balance``): pure functions of the
assignments, checked on the properties an operator relies on."""

from __future__ import annotations

from collections import Counter

import pytest
from quorumlog.replica.client.balance import (
    decommission_plan,
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
