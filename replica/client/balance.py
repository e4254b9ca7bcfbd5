"""Replica placement and the plans of the node lifecycle: where a new topic's replicas go
(``rack_aware_assignment``), decommission a node, even out replica counts and preferred
leaders, change a topic's replication factor. Pure functions of the cluster's
assignments (topic -> replicas per partition), its nodes and their racks; each plan
returns the moves a reassignment then carries out (``Client.reassign``), one list per
topic, only for the partitions whose replicas change.

Racks (``serve --rack``, Kafka's broker.rack) are failure domains: a partition's
replicas go to distinct racks while there are at least as many racks as replicas, and
spread over as many racks as there are otherwise. A node without a rack is a rack of its
own, so a cluster without racks is placed exactly as before racks existed.
``rack_problems`` says which partitions a placement left on fewer racks than it could.

Load is the number of replicas a node holds (every partition of every topic counts the
same); ties go to the lower node id, so a plan is the same wherever it is computed."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "Plan",
    "Racks",
    "decommission_plan",
    "even_leaders",
    "rack_aware_assignment",
    "rack_problems",
    "rebalance_plan",
    "replication_factor_plan",
]

Assignments = Mapping[str, Sequence[Sequence[int]]]
#: topic -> partition -> its new replicas (the first: preferred leader).
Plan = dict[str, dict[int, list[int]]]
#: node -> its rack; a node not in it has none (a rack of its own).
Racks = Mapping[int, str]
#: A rack as placement compares them: a named rack, or a rackless node's own.
_RackKey = tuple[str, int]

NO_RACKS: Racks = {}


def _rack(racks: Racks, node: int) -> _RackKey:
    rack = racks.get(node)
    return (rack, -1) if rack is not None else ("", node)


def _rack_count(racks: Racks, nodes: Iterable[int]) -> int:
    return len({_rack(racks, n) for n in nodes})


def _sharing(racks: Racks, node: int, others: Iterable[int]) -> int:
    """How many of ``others`` stand in ``node``'s rack."""
    key = _rack(racks, node)
    return sum(_rack(racks, o) == key for o in others)


def _load(assignments: Assignments, nodes: Iterable[int]) -> Counter[int]:
    load: Counter[int] = Counter(dict.fromkeys(nodes, 0))
    for parts in assignments.values():
        for replicas in parts:
            load.update(replicas)
    return load


def _best(
    load: Counter[int], candidates: Iterable[int], kept: Sequence[int], racks: Racks
) -> int | None:
    """The candidate to join ``kept``: one of a rack ``kept`` has fewest replicas in
    (none, while there is such a rack), the least loaded of those."""
    ranked = sorted(candidates, key=lambda n: (_sharing(racks, n, kept), load[n], n))
    return ranked[0] if ranked else None


def _set(plan: Plan, topic: str, partition: int, before: Sequence[int], after: list[int]) -> None:
    if list(before) != after:
        plan.setdefault(topic, {})[partition] = after


def rack_aware_assignment(
    name: str, partitions: int, replication_factor: int, nodes: Sequence[int], racks: Racks
) -> list[list[int]]:
    """Kafka's rack-aware assignment, in its idea: the nodes listed rack by rack in turn
    (the first of each rack, then the second of each, ...), the preferred replicas
    round-robin over that list from a per-topic start (so leaders spread over nodes and
    racks), and each follower the next node of the list, at a shift that grows each
    round, whose rack holds none of the partition's replicas yet, until every rack holds
    one; then the next node not holding it."""
    by_rack: dict[_RackKey, list[int]] = {}
    for n in sorted(nodes):
        by_rack.setdefault(_rack(racks, n), []).append(n)
    members = [by_rack[k] for k in sorted(by_rack)]
    arranged = [m[i] for i in range(max(map(len, members))) for m in members if i < len(m)]
    n, rack_count = len(arranged), len(members)
    start = zlib.crc32(name.encode()) % n
    # A partition's replicas follow from its first node and its shift (modulo the other
    # nodes): at most n * (n - 1) lists to work out, however many partitions.
    known: dict[tuple[int, int], list[int]] = {}
    out = []
    for p in range(partitions):
        first = (start + p) % n
        shift = (p // n) * rack_count % max(1, n - 1)
        replicas = known.get((first, shift))
        if replicas is None:
            replicas = known[first, shift] = _followed(
                arranged, first, shift, replication_factor, racks, rack_count
            )
        out.append(list(replicas))
    return out


def _followed(
    arranged: list[int],
    first: int,
    shift: int,
    replication_factor: int,
    racks: Racks,
    rack_count: int,
) -> list[int]:
    """The replicas of a partition whose first is ``arranged[first]``: two passes over the
    other nodes from ``shift`` on, a node of a new rack each while there is one, then any."""
    n = len(arranged)
    replicas = [arranged[first]]
    used = {_rack(racks, arranged[first])}
    for k in range(2 * (n - 1)):
        if len(replicas) >= replication_factor:
            break
        node = arranged[(first + 1 + (shift + k) % (n - 1)) % n]
        key = _rack(racks, node)
        if node in replicas or (key in used and len(used) < rack_count):
            continue
        replicas.append(node)
        used.add(key)
    return replicas


def rack_problems(
    assignments: Assignments, nodes: Iterable[int], racks: Racks, topics: Iterable[str] = ()
) -> list[str]:
    """One line per topic (of ``topics``, default all) with partitions whose replicas
    stand on fewer racks than they could (than their count, or than the racks of
    ``nodes`` when there are fewer): what a placement could not honour. Empty without
    racks, or when every partition is spread as far as the racks allow."""
    if not racks:
        return []
    ids = sorted(set(nodes))
    rack_count = _rack_count(racks, ids)
    names = sorted(topics) if topics else sorted(assignments)
    spread: dict[tuple[int, ...], bool] = {}  # per replica list: on as many racks as it can

    def apart(replicas: Sequence[int]) -> bool:
        key = tuple(replicas)
        if key not in spread:
            spread[key] = _rack_count(racks, key) >= min(len(key), rack_count)
        return spread[key]

    out = []
    for topic in names:
        short = [p for p, replicas in enumerate(assignments.get(topic, ())) if not apart(replicas)]
        if short:
            shown = ", ".join(map(str, short[:10])) + (", ..." if len(short) > 10 else "")
            out.append(
                f"{topic}: {len(short)} partition(s) have two replicas in one rack though "
                f"the racks could keep them apart (partitions {shown})"
            )
        rfs = sorted({len(r) for r in assignments.get(topic, ())})
        if rfs and rfs[-1] > rack_count:
            named = sorted({r for n, r in racks.items() if n in ids})
            rackless = [n for n in ids if n not in racks]
            where = ", ".join(named) + (f", and nodes {rackless} without one" if rackless else "")
            out.append(
                f"{topic}: replication factor {rfs[-1]} over {rack_count} rack(s) ({where}): "
                "some replicas of each partition share a rack, so losing one rack can lose "
                "a majority"
            )
    return out


def decommission_plan(
    assignments: Assignments,
    nodes: Iterable[int],
    leaving: int,
    into: int | None = None,
    racks: Racks = NO_RACKS,
) -> Plan:
    """Every replica on ``leaving`` moves to the least loaded other node not already a
    replica of that partition, in a rack the partition's other replicas are not in while
    there is one (its place in the list kept, so a preferred replica is replaced by the
    preferred one); each partition keeps its replica count. ``into``: to that node only
    (a lost node replaced by a new one). ValueError when a partition has nowhere to go
    (as many replicas as remaining nodes)."""
    others = sorted(set(nodes) - {leaving}) if into is None else [into]
    load = _load(assignments, others)
    plan: Plan = {}
    for topic in sorted(assignments):
        for p, replicas in enumerate(assignments[topic]):
            if leaving not in replicas:
                continue
            kept = [n for n in replicas if n != leaving]
            dest = _best(load, (n for n in others if n not in replicas), kept, racks)
            if dest is None:
                raise ValueError(
                    f"{topic}/{p} has {len(replicas)} replicas and only {len(others)} other "
                    f"nodes: node {leaving} cannot leave without lowering its replication "
                    "factor"
                )
            load[dest] += 1
            _set(plan, topic, p, replicas, [dest if n == leaving else n for n in replicas])
    return plan


def _spread_racks(
    current: dict[str, list[list[int]]], ids: list[int], load: Counter[int], racks: Racks
) -> None:
    """Partitions with replicas sharing a rack while another rack holds none of them: the
    most loaded of the sharing replicas moves to the least loaded node of such a rack."""
    rack_count = _rack_count(racks, ids)
    for topic in sorted(current):
        for replicas in current[topic]:
            for _ in range(len(replicas)):
                if _rack_count(racks, replicas) >= min(len(replicas), rack_count):
                    break
                used = {_rack(racks, n) for n in replicas}
                dest = _best(load, (n for n in ids if _rack(racks, n) not in used), (), racks)
                sharing = [n for n in replicas if _sharing(racks, n, replicas) > 1]
                if dest is None or not sharing:
                    break
                leave = max(sharing, key=lambda n: (load[n], n))
                replicas[replicas.index(leave)] = dest
                load[leave] -= 1
                load[dest] += 1


def rebalance_plan(assignments: Assignments, nodes: Iterable[int], racks: Racks = NO_RACKS) -> Plan:
    """First spread every partition over as many racks as it can stand in (replicas that
    share a rack while another holds none move there); then even out the replica counts
    of ``nodes`` (within one of each other where the racks allow), moving a replica from
    the most to a less loaded node at a time, never onto fewer racks; then the preferred
    leaders (the first replica of each partition) the same way among each partition's
    replicas: nodes that joined take their share of both."""
    ids = sorted(set(nodes))
    current = {t: [list(r) for r in parts] for t, parts in assignments.items()}
    load = _load(current, ids)
    _spread_racks(current, ids, load, racks)
    for _ in range(sum(len(p) for p in current.values()) * 4):
        heavy = max(ids, key=lambda n: (load[n], -n))
        lights = sorted((n for n in ids if load[heavy] - load[n] > 1), key=lambda n: (load[n], n))
        light = _move_one(current, heavy, lights, racks)
        if light is None:
            break
        load[heavy] -= 1
        load[light] += 1
    even_leaders(current, ids)
    plan: Plan = {}
    for topic in sorted(current):
        for p, replicas in enumerate(current[topic]):
            _set(plan, topic, p, assignments[topic][p], replicas)
    return plan


def _move_one(
    current: dict[str, list[list[int]]], heavy: int, lights: list[int], racks: Racks
) -> int | None:
    """Move one replica of ``heavy`` to the first of ``lights`` that can take one without
    its partition standing on fewer racks: that node, None if none can."""
    for light in lights:
        for topic in sorted(current):
            for replicas in current[topic]:
                if heavy not in replicas or light in replicas:
                    continue
                others = [n for n in replicas if n != heavy]
                if _sharing(racks, light, others) > _sharing(racks, heavy, others):
                    continue
                replicas[replicas.index(heavy)] = light
                return light
    return None


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
    assignments: Assignments,
    nodes: Iterable[int],
    topic: str,
    factor: int,
    racks: Racks = NO_RACKS,
) -> Plan:
    """Every partition of ``topic`` to ``factor`` replicas: the least loaded nodes not
    holding it join (at the end), from racks it is not in while there are such; or
    replicas other than the preferred one leave, those sharing a rack first, then the
    most loaded."""
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
            dest = _best(load, (n for n in ids if n not in replicas), replicas, racks)
            assert dest is not None  # factor <= len(ids)
            replicas.append(dest)
            load[dest] += 1
        while len(replicas) > factor:
            drop = max(replicas[1:], key=lambda n: (_sharing(racks, n, replicas) > 1, load[n], n))
            replicas.remove(drop)
            load[drop] -= 1
        _set(plan, topic, p, before, replicas)
    return plan
