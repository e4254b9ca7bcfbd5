"""Replica plans for the node lifecycle: decommission a node, even out replica counts and
preferred leaders, change a topic's replication factor. Pure functions of the cluster's
assignments (topic -> replicas per partition) and its nodes; each returns the moves a
reassignment then carries out (``Client.reassign``), one list per topic, only for the
partitions whose replicas change.

Load is the number of replicas a node holds (every partition of every topic counts the
same); ties go to the lower node id, so a plan is the same wherever it is computed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["Plan", "decommission_plan", "even_leaders", "rebalance_plan", "replication_factor_plan"]

Assignments = Mapping[str, Sequence[Sequence[int]]]
#: topic -> partition -> its new replicas (the first: preferred leader).
Plan = dict[str, dict[int, list[int]]]


def _load(assignments: Assignments, nodes: Iterable[int]) -> Counter[int]:
    load: Counter[int] = Counter(dict.fromkeys(nodes, 0))
    for parts in assignments.values():
        for replicas in parts:
            load.update(replicas)
    return load


def _least_loaded(load: Counter[int], candidates: Iterable[int]) -> int | None:
    ranked = sorted(candidates, key=lambda n: (load[n], n))
    return ranked[0] if ranked else None


def _set(plan: Plan, topic: str, partition: int, before: Sequence[int], after: list[int]) -> None:
    if list(before) != after:
        plan.setdefault(topic, {})[partition] = after


def decommission_plan(
    assignments: Assignments, nodes: Iterable[int], leaving: int, into: int | None = None
) -> Plan:
    """Every replica on ``leaving`` moves to the least loaded other node not already a
    replica of that partition (its place in the list kept, so a preferred replica is
    replaced by the preferred one); each partition keeps its replica count. ``into``:
    to that node only (a lost node replaced by a new one). ValueError when a partition
    has nowhere to go (as many replicas as remaining nodes)."""
    others = sorted(set(nodes) - {leaving}) if into is None else [into]
    load = _load(assignments, others)
    plan: Plan = {}
    for topic in sorted(assignments):
        for p, replicas in enumerate(assignments[topic]):
            if leaving not in replicas:
                continue
            dest = _least_loaded(load, (n for n in others if n not in replicas))
            if dest is None:
                raise ValueError(
                    f"{topic}/{p} has {len(replicas)} replicas and only {len(others)} other "
                    f"nodes: node {leaving} cannot leave without lowering its replication "
                    "factor"
                )
            load[dest] += 1
            _set(plan, topic, p, replicas, [dest if n == leaving else n for n in replicas])
    return plan


def rebalance_plan(assignments: Assignments, nodes: Iterable[int]) -> Plan:
    """Even out the replica counts of ``nodes`` (within one of each other), moving a
    replica from the most to the least loaded node at a time, then the preferred
    leaders (the first replica of each partition) the same way among each partition's
    replicas: nodes that joined take their share of both."""
    ids = sorted(set(nodes))
    current = {t: [list(r) for r in parts] for t, parts in assignments.items()}
    load = _load(current, ids)
    for _ in range(sum(len(p) for p in current.values()) * 4):
        heavy = max(ids, key=lambda n: (load[n], -n))
        light = min(ids, key=lambda n: (load[n], n))
        if load[heavy] - load[light] <= 1:
            break
        moved = False
        for topic in sorted(current):
            for replicas in current[topic]:
                if heavy in replicas and light not in replicas:
                    replicas[replicas.index(heavy)] = light
                    load[heavy] -= 1
                    load[light] += 1
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    even_leaders(current, ids)
    plan: Plan = {}
    for topic in sorted(current):
        for p, replicas in enumerate(current[topic]):
            _set(plan, topic, p, assignments[topic][p], replicas)
    return plan


def even_leaders(current: dict[str, list[list[int]]], ids: list[int]) -> None:
    """Reorder replicas so each node is first (preferred leader) about equally often."""
    firsts: Counter[int] = Counter(dict.fromkeys(ids, 0))
    for parts in current.values():
        firsts.update(r[0] for r in parts if r)
    for _ in range(sum(len(p) for p in current.values()) * 2):
        heavy = max(ids, key=lambda n: (firsts[n], -n))
        changed = False
        for topic in sorted(current):
            for replicas in current[topic]:
                if not replicas or replicas[0] != heavy:
                    continue
                light = min(replicas, key=lambda n: (firsts[n], n))
                if firsts[heavy] - firsts[light] > 1:
                    replicas.remove(light)
                    replicas.insert(0, light)
                    firsts[heavy] -= 1
                    firsts[light] += 1
                    changed = True
                    break
            if changed:
                break
        if not changed:
            return


def replication_factor_plan(
    assignments: Assignments, nodes: Iterable[int], topic: str, factor: int
) -> Plan:
    """Every partition of ``topic`` to ``factor`` replicas: the least loaded nodes not
    holding it join (at the end), or the most loaded replicas other than the preferred
    one leave."""
    ids = sorted(set(nodes))
    if not 1 <= factor <= len(ids):
        raise ValueError(f"replication factor must be 1..{len(ids)} (the nodes), got {factor}")
    if topic not in assignments:
        raise ValueError(f"unknown topic {topic!r}")
    load = _load(assignments, ids)
    plan: Plan = {}
    for p, before in enumerate(assignments[topic]):
        replicas = list(before)
        while len(replicas) < factor:
            dest = _least_loaded(load, (n for n in ids if n not in replicas))
            assert dest is not None  # factor <= len(ids)
            replicas.append(dest)
            load[dest] += 1
        while len(replicas) > factor:
            drop = max(replicas[1:], key=lambda n: (load[n], n))
            replicas.remove(drop)
            load[drop] -= 1
        _set(plan, topic, p, before, replicas)
    return plan
