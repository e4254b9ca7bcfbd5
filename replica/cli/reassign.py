"""``quorumlog partition reassign``: move partitions' replicas online, watch the moves,
cancel them; and the node lifecycle built on it: ``quorumlog cluster decommission``,
``rebalance``, ``add-voter`` and ``remove-voter``, and ``topic alter
--replication-factor`` (their plans come from ``client.balance``, which keeps a
partition's replicas on distinct racks where it can; each says where it could not).

A plan file is Kafka's reassignment JSON (what ``kafka-reassign-partitions`` reads)::

    {"version": 1,
     "partitions": [{"topic": "events", "partition": 0, "replicas": [2, 4, 5]}]}

Each partition's first replica becomes its preferred leader. ``--status`` reads, for each
partition of the plan (or the one named; without ``--replicas``, its target is what the
metadata assigns it), its voters from its leader (DescribeQuorum) and prints how far
each move is: the new replica copying, those waiting their turn, the leader's throttle,
with a progress bar on a terminal; ``--wait`` repeats that until every
move is done (or ``--timeout-s``). ``--throttle`` sets every node's catch-up throttle in
the cluster's metadata, for the moves under way too (alone, it changes only that).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple, TextIO

__all__ = [
    "Move",
    "add_cluster_parsers",
    "add_parser",
    "apply_plan",
    "load_plan",
    "rack_report",
    "move_status",
    "throttle_rate",
]


class Move(NamedTuple):
    topic: str
    partition: int
    replicas: list[int]


class MoveStatus(NamedTuple):
    move: Move
    voters: list[int]  # the partition's voters now (its leader's view); [] unknown
    done: bool
    detail: str
    throttle: int | None = None  # the leader's node's catch-up bytes/s (0: none); unknown


def load_plan(path: str) -> list[Move]:
    """The moves of a plan file (Kafka's reassignment JSON); ValueError names what is
    wrong in it."""
    try:
        doc = json.loads(Path(path).read_text())
        rows = doc["partitions"]
        moves = [
            Move(str(r["topic"]), int(r["partition"]), [int(x) for x in r["replicas"]])
            for r in rows
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: not a reassignment plan ({exc!r}); expected "
            '{"version": 1, "partitions": [{"topic": T, "partition": P, "replicas": [..]}]}'
        ) from exc
    if not moves:
        raise ValueError(f"{path}: the plan moves no partition")
    return moves


def _moves(args: argparse.Namespace) -> list[Move]:
    if args.plan:
        return load_plan(args.plan)
    if args.topic is None or args.partition is None:
        raise ValueError("give --plan FILE, or --topic and --partition (and --replicas)")
    if args.replicas is None and not (args.status or args.cancel):
        raise ValueError("--replicas N,N,... is required to move a partition")
    replicas = [int(x) for x in args.replicas.split(",")] if args.replicas else []
    return [Move(args.topic, args.partition, replicas)]


def move_status(client: Any, moves: list[Move]) -> list[MoveStatus]:
    """How far each move is: done when the partition's voters are its new replicas; else
    which replicas are still to join (the one copying now and its lag, those waiting
    their turn, those not fetching yet) or still to leave."""
    out = []
    for mv in moves:
        try:
            q = client.describe_quorum(mv.topic, mv.partition)
        except Exception as exc:  # no leader right now: say so, and go on
            out.append(MoveStatus(mv, [], False, f"no leader ({exc})"))
            continue
        voters = sorted(v.replica_id for v in q.voters)
        target = mv.replicas
        done = voters == sorted(target)
        if done:
            detail = "done"
        else:
            lags = {o.replica_id: o.lag for o in q.observers}
            joining = [_joining(r, lags, q.copying) for r in target if r not in voters]
            leaving = [r for r in voters if r not in target]
            parts = []
            if joining:
                parts.append("joining " + ", ".join(joining))
            if leaving:
                parts.append(f"leaving {leaving}")
            detail = "; ".join(parts)
        out.append(MoveStatus(mv, voters, done, detail, q.catch_up_bytes_per_s))
    return out


def _joining(replica: int, lags: dict[int, int], copying: int) -> str:
    if replica not in lags:
        return f"{replica} (not fetching yet)"
    if replica == copying:
        return f"{replica} (copying, lag {lags[replica]})"
    return f"{replica} (waits its turn to copy, lag {lags[replica]})"


def throttle_text(rate: int | None) -> str:
    """A catch-up throttle as ``--status`` and ``--throttle`` say it (None: each
    node's own)."""
    if rate is None:
        return "each node's own"
    return f"{rate:,} bytes/s a node" if rate else "none (unthrottled)"


def _with_targets(client: Any, moves: list[Move]) -> list[Move]:
    """Moves given without ``--replicas`` (``--status`` of one partition) take the
    replicas the cluster's metadata assigns it: the target of its move under way."""
    if all(mv.replicas for mv in moves):
        return moves
    topics = client.metadata(sorted({mv.topic for mv in moves if not mv.replicas}))
    return [
        mv
        if mv.replicas
        else mv._replace(replicas=list(topics[mv.topic].partitions[mv.partition].replicas))
        for mv in moves
    ]


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total} moved"


def print_status(rows: list[MoveStatus], stream: TextIO) -> None:
    for row in rows:
        mv = row.move
        print(
            f"{mv.topic}/{mv.partition}: voters {row.voters} -> {mv.replicas}: {row.detail}",
            file=stream,
        )
    rates = sorted({r.throttle for r in rows if not r.done and r.throttle is not None})
    if rates:
        shown = ", ".join(throttle_text(rate) for rate in rates)
        print(f"catch-up throttle at the leaders: {shown}", file=stream)
    done = sum(r.done for r in rows)
    if stream.isatty():
        print(_bar(done, len(rows)), file=stream)
    else:
        print(f"{done}/{len(rows)} moved", file=stream)


def cluster_view(client: Any) -> tuple[dict[str, list[list[int]]], list[int]]:
    """Every topic's replicas per partition, and the ids of the cluster's nodes that take
    replicas (which every node's Metadata answer names; decommissioned ones left out)."""
    meta = client.metadata()
    assignments = {
        name: [list(t.partitions[p].replicas) for p in sorted(t.partitions)]
        for name, t in meta.items()
    }
    retired = set(client.retired_node_ids)
    return assignments, [n for n in client.node_ids if n not in retired]


def rack_report(
    client: Any,
    assignments: dict[str, list[list[int]]],
    plan: dict[str, dict[int, list[int]]],
    nodes: list[int],
    topics: list[str] | None = None,
) -> None:
    """Say what the cluster will look like against its racks once ``plan`` is carried
    out: the partitions (of ``topics``, default all) whose replicas will still share a
    rack though the racks could keep them apart, or more replicas than racks."""
    from ..client.balance import rack_problems

    after = {t: [list(r) for r in parts] for t, parts in assignments.items()}
    for topic, parts in plan.items():
        for p, replicas in parts.items():
            after[topic][p] = replicas
    for line in rack_problems(after, nodes, client.node_racks, topics or ()):
        print(f"rack warning: {line}")


def apply_plan(
    client: Any, plan: dict[str, dict[int, list[int]]], *, wait: bool, timeout_s: float
) -> bool:
    """Start every move of ``plan``; with ``wait``, until all are done (True) or the
    time is up (False), a progress bar on a terminal."""
    for topic, parts in sorted(plan.items()):
        client.reassign(topic, parts)
    moves = [Move(t, p, r) for t, parts in sorted(plan.items()) for p, r in sorted(parts.items())]
    print(f"moving {len(moves)} partition(s)")
    if not wait or not moves:
        return True
    rows = wait_moves(client, moves, timeout_s)
    done = sum(r.done for r in rows)
    if done < len(rows):
        print_status([r for r in rows if not r.done], sys.stdout)
    print(f"{done}/{len(rows)} moved", flush=True)
    return done == len(rows)


def wait_moves(client: Any, moves: list[Move], timeout_s: float) -> list[MoveStatus]:
    """``move_status`` once a second until every move is done or ``timeout_s`` passed
    (a progress bar on a terminal meanwhile); the last status."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = move_status(client, moves)
        if all(r.done for r in rows) or time.monotonic() > deadline:
            return rows
        if sys.stdout.isatty():
            print(_bar(sum(r.done for r in rows), len(rows)), end="\r", flush=True)
        time.sleep(1.0)


def cmd_decommission(args: argparse.Namespace) -> int:
    from ..client.balance import decommission_plan
    from .main import _client

    with _client(args) as c:
        assignments, nodes = cluster_view(c)
        if args.node not in c.node_ids:
            print(
                f"quorumlog cluster decommission: no node {args.node} in {c.node_ids}",
                file=sys.stderr,
            )
            return 2
        into = args.replace_with
        if into is not None and into not in nodes:
            print(
                f"quorumlog cluster decommission: --replace-with {into} is not a node that "
                f"takes replicas ({nodes})",
                file=sys.stderr,
            )
            return 2
        c.retire_node(args.node)  # first: nothing new is placed on it from now on
        print(f"node {args.node} retired: it takes no new replicas")
        try:
            plan = decommission_plan(
                assignments, [*nodes, args.node], args.node, into, c.node_racks
            )
        except ValueError as exc:
            print(f"quorumlog cluster decommission: {exc}", file=sys.stderr)
            return 2
        rack_report(c, assignments, plan, [n for n in nodes if n != args.node])
        if not apply_plan(c, plan, wait=True, timeout_s=args.timeout_s):
            return 1
        try:
            voters = c.change_voter(args.node, add=False)
            print(f"node {args.node} leaves the metadata quorum: voters -> {voters}")
        except Exception as exc:  # not a voter: nothing to remove
            print(f"node {args.node} stays out of the metadata quorum ({exc})")
    print(f"node {args.node} holds no replica any more: it can be stopped")
    return 0


def cmd_rebalance(args: argparse.Namespace) -> int:
    from ..client.balance import rebalance_plan
    from .main import _client

    with _client(args) as c:
        assignments, nodes = cluster_view(c)
        plan = rebalance_plan(assignments, nodes, c.node_racks)
        rack_report(c, assignments, plan, nodes)
        return 0 if apply_plan(c, plan, wait=args.wait, timeout_s=args.timeout_s) else 1


def cmd_recommission(args: argparse.Namespace) -> int:
    from .main import _client

    with _client(args) as c:
        c.retire_node(args.node, retired=False)
    print(
        f"node {args.node} takes new replicas again (`quorumlog cluster rebalance` gives it some)"
    )
    return 0


def cmd_change_voter(args: argparse.Namespace) -> int:
    from .main import _client

    with _client(args) as c:
        voters = c.change_voter(args.node, add=args.action == "add-voter")
    print(f"metadata quorum voters -> {voters}")
    return 0


def alter_replication_factor(client: Any, topic: str, factor: int, timeout_s: float) -> bool:
    """``topic alter T --replication-factor R``: move every partition to R replicas."""
    from ..client.balance import replication_factor_plan

    assignments, nodes = cluster_view(client)
    plan = replication_factor_plan(assignments, nodes, topic, factor, client.node_racks)
    rack_report(client, assignments, plan, nodes, [topic])
    return apply_plan(client, plan, wait=True, timeout_s=timeout_s)


_UNITS = {
    "": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
}


def throttle_rate(text: str) -> int | None:
    """``--throttle``'s value: bytes per second (``16MiB``, ``512k``, ``0`` for none), or
    None for ``default`` (each node's own --catch-up-bytes-per-second)."""
    value = text.strip().lower()
    if value == "default":
        return None
    digits = value.rstrip("abcdefghijklmnopqrstuvwxyz/")
    unit = value[len(digits) :].removesuffix("/s")
    if not digits.isdigit() or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give bytes per second (e.g. 52428800, 50MiB, 512k, 0 for none) or 'default'"
        )
    return int(digits) * _UNITS[unit]


def cmd_reassign(args: argparse.Namespace) -> int:
    from .main import _client

    only_throttle = args.throttle is not None and args.plan is None and args.topic is None
    try:
        rate = None if args.throttle is None else throttle_rate(args.throttle)
        moves = [] if only_throttle else _moves(args)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        print(f"quorumlog partition reassign: {exc}", file=sys.stderr)
        return 2
    with _client(args) as c:
        if args.throttle is not None:
            c.set_catch_up_throttle(rate)
            print(f"catch-up throttle: {throttle_text(rate)} (moves under way included)")
            if only_throttle:
                return 0
        if args.status:
            moves = _with_targets(c, moves)
            rows = wait_moves(c, moves, args.timeout_s) if args.wait else move_status(c, moves)
            print_status(rows, sys.stdout)
            return 0 if all(r.done for r in rows) or not args.wait else 1
        by_topic: dict[str, dict[int, list[int]]] = defaultdict(dict)
        if args.cancel:
            # A move already done is not undone: only those still under way go back.
            for row in move_status(c, moves):
                if not row.done:
                    by_topic[row.move.topic][row.move.partition] = row.move.replicas
        else:
            for mv in moves:
                by_topic[mv.topic][mv.partition] = mv.replicas
            c.refresh_nodes()
            if c.node_racks:  # an operator's own plan: moved as asked, said if off-rack
                assignments, nodes = cluster_view(c)
                rack_report(c, assignments, dict(by_topic), nodes, sorted(by_topic))
        for topic, parts in sorted(by_topic.items()):
            c.reassign(topic, parts, cancel=args.cancel)
    verb = "cancelled" if args.cancel else "started"
    count = sum(len(p) for p in by_topic.values())
    print(f"reassignment {verb} for {count} partition(s); watch it with --status")
    return 0


def add_parser(psub: Any, add_bootstrap: Any) -> None:
    """The ``partition reassign`` subcommand, under ``quorumlog partition``."""
    ra = psub.add_parser(
        "reassign",
        help="move partitions' replicas online (one partition, or a plan file)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ra.add_argument("--topic", default=None)
    ra.add_argument("--partition", type=int, default=None)
    ra.add_argument("--replicas", default=None, help="the new replicas: N,N,... (first: preferred)")
    ra.add_argument("--plan", default=None, help="a plan file (Kafka's reassignment JSON)")
    ra.add_argument("--status", action="store_true", help="how far each move is")
    ra.add_argument("--wait", action="store_true", help="with --status: until every move is done")
    ra.add_argument("--timeout-s", type=float, default=600.0, help="with --wait: give up after")
    ra.add_argument(
        "--cancel", action="store_true", help="move those still under way back where they were"
    )
    ra.add_argument(
        "--throttle",
        default=None,
        metavar="RATE",
        help="bytes per second each node's leaders send the replicas moves add (e.g. 50MiB; "
        "0: unthrottled; 'default': each node's --catch-up-bytes-per-second), for every "
        "node at once, the moves under way included; alone, it changes only the throttle",
    )
    add_bootstrap(ra)
    ra.set_defaults(func=cmd_reassign)


def add_cluster_parsers(csub: Any, add_bootstrap: Any) -> None:
    """``quorumlog cluster decommission | rebalance | recommission | add-voter |
    remove-voter``."""
    dc = csub.add_parser(
        "decommission",
        help="move every replica off a node (to the least loaded), then take it out of "
        "the metadata quorum",
    )
    dc.add_argument("--node", type=int, required=True)
    dc.add_argument(
        "--replace-with",
        type=int,
        metavar="NODE",
        help="move every replica to this node instead (a lost node replaced by a new one)",
    )
    dc.add_argument("--timeout-s", type=float, default=1800.0)
    add_bootstrap(dc)
    dc.set_defaults(func=cmd_decommission)
    rb = csub.add_parser(
        "rebalance", help="even out replica counts and preferred leaders over the nodes"
    )
    rb.add_argument("--wait", action="store_true", help="until every move is done")
    rb.add_argument("--timeout-s", type=float, default=1800.0)
    add_bootstrap(rb)
    rb.set_defaults(func=cmd_rebalance)
    rc = csub.add_parser("recommission", help="let a decommissioned node take new replicas again")
    rc.add_argument("--node", type=int, required=True)
    add_bootstrap(rc)
    rc.set_defaults(func=cmd_recommission)
    for action, text in (("add-voter", "make a node"), ("remove-voter", "stop a node being")):
        cv = csub.add_parser(action, help=f"{text} a voter of the metadata quorum")
        cv.add_argument("--node", type=int, required=True)
        add_bootstrap(cv)
        cv.set_defaults(func=cmd_change_voter)
