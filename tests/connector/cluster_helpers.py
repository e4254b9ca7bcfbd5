"""Helpers for connector tests against real node processes (``LocalCluster``): the log as
the leader holds it, and fault scenarios (clean failover, unclean election with
truncation). No fakes: every fact comes from the running cluster. Waits and retries are
tests/support's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumlog.replica.client import Client
from quorumlog.replica.storage.records import iter_batches
from quorumlog.replica.storage.types import OffsetAndEpoch

from tests.support.waits import retry, wait_until


def values(n: int, prefix: str = "v") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


@dataclass(frozen=True)
class Entry:
    """One record of the log as its leader holds it (control records included)."""

    offset: int
    epoch: int
    control: bool


def log_entries(c: Any, topic: str, partition: int) -> list[Entry]:
    """Every committed record of ``topic/partition`` from its leader, with epochs."""
    out: list[Entry] = []
    with Client(c.bootstrap, request_timeout_ms=10_000) as client:
        pos = client.list_offsets(topic, partition, "earliest").offset
        hwm = client.list_offsets(topic, partition, "latest").offset
        while pos < hwm:
            res = client.fetch(topic, partition, pos)
            progressed = False
            for b in iter_batches(res.records):
                for o in range(b.base_offset, b.last_offset + 1):
                    if pos <= o < min(hwm, res.high_watermark):
                        out.append(Entry(o, b.leader_epoch, b.is_control))
                        pos = o + 1
                        progressed = True
            assert progressed, f"no progress reading {topic}/{partition} at {pos}"
    return out


def end_position(c: Any, topic: str, partition: int) -> dict[str, int]:
    """The high watermark and the epoch of the record before it (the reader's offset JSON
    for 'latest'), read from the log itself."""
    entries = log_entries(c, topic, partition)
    if not entries:
        return {"offset": 0, "epoch": -1}
    return {"offset": entries[-1].offset + 1, "epoch": entries[-1].epoch}


def wait_replicated(c: Any, topic: str, partition: int, timeout: float = 30.0) -> int:
    """Until every voter of the partition has the leader's whole log (so a fault injected
    next starts from a known state); returns the leader."""

    def caught_up() -> int | None:
        q = c.client.describe_quorum(topic, partition)
        leo = c.client.list_offsets(topic, partition, "latest").offset
        ends = [v.end_offset for v in q.voters if v.replica_id != q.leader_id]
        if q.high_watermark == leo and ends and all(e >= leo for e in ends):
            return int(q.leader_id)
        return None

    return int(wait_until(caught_up, timeout, f"{topic}/{partition} fully replicated"))


def wait_settled(c: Any, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """Until every partition of ``topic`` has a leader that committed in its own epoch (its
    control record is below the high watermark; an empty log's leader writes none until
    it is produced to); returns partition -> leader epoch."""

    def settled() -> dict[int, int] | None:
        out = {}
        for p, pm in c.client.metadata([topic])[topic].partitions.items():
            if pm.leader_id < 0 or not c.is_running(pm.leader_id):
                return None
            latest = c.client.list_offsets(topic, p, "latest")
            if latest.offset > 0 and latest.epoch != pm.leader_epoch:
                return None
            out[p] = pm.leader_epoch
        return out

    return dict(wait_until(settled, timeout, f"every partition of {topic} led and committed"))


def move_leader(
    c: Any, topic: str, partition: int, *, graceful: bool, only_this_partition: bool = False
) -> int:
    """A failover that loses nothing; returns the partition's new leader epoch (which starts
    with a control record). Every node runs again afterwards.

    Default: stop the leader (SIGTERM if ``graceful``, else kill -9), wait for another to
    lead, restart it; other partitions it led move too. ``only_this_partition``: once every
    replica holds the whole log, force a follower to lead this partition (an election that
    loses nothing, since that follower has every record)."""
    before = wait_settled(c, topic)[partition]
    leader = c.wait_for_leader(topic, partition)
    if only_this_partition:
        leader = wait_replicated(c, topic, partition)
        follower = min(n for n in c.ports if n != leader)
        retry(lambda: c.force_leader(topic, partition, follower))
    else:
        (c.terminate if graceful else c.kill)(leader)
        c.wait_for_leader(topic, partition, not_node=leader)
        c.start_node(leader)
        c.wait_ready()
    epoch = wait_settled(c, topic)[partition]
    assert epoch > before, (before, epoch)
    return epoch


@dataclass(frozen=True)
class Truncation:
    """The outcome of ``unclean_election``."""

    lost: list[OffsetAndEpoch]  # acknowledged (acks=quorum) records written before it
    position: tuple[int, int]  # a consumer's position after them: (offset, epoch)
    divergence: int  # first offset of the forced leader's epoch: where the logs part
    new_epoch: int  # the forced leader's epoch
    forced: int  # the node forced to lead


def unclean_election(
    c: Any,
    topic: str,
    partition: int,
    lost_values: list[bytes | None],
    *,
    before_force: Any = None,
    lost_keys: list[bytes | None] | None = None,
) -> Truncation:
    """Acknowledged records ``lost_values`` are truncated away: a follower is paused, the
    records are written to the other two, the leader is killed and the other follower
    paused, the lagging follower is forced to lead (unclean election), and the others come
    back as its followers (tests/node/test_force_leader.py's recipe).

    ``before_force`` (optional) runs after the records are acknowledged, before anything is
    killed (to read them, plan a batch...). A record ``b"absorbed"`` is written just before
    ``lost_values``; the forced leader may hold it (its parked fetch can carry it) or not, so
    the divergence is ``lost[0].offset - 1`` or ``lost[0].offset``, read from the new log.
    With ``lost_keys`` (a keyed topic) the lost records carry them, and ``b"absorbed"``
    has the key ``b"absorbed"``."""
    leader = wait_replicated(c, topic, partition)
    lagging, other = [n for n in sorted(c.ports) if n != leader]
    c.pause(lagging)
    try:
        # answers the fetch the paused follower had parked (it may take this record with
        # it), then it hears nothing more
        c.produce(topic, partition, [b"absorbed"], None if lost_keys is None else [b"absorbed"])
        lost = c.produce(topic, partition, lost_values, lost_keys)
        if before_force is not None:
            before_force()
    finally:
        # The majority goes: the leader dies, the other follower stops (paused, not killed:
        # resumed, it follows the forced leader, which leads until a majority has followed).
        c.kill(leader)
        c.pause(other)
        c.resume(lagging)
    try:
        new_epoch = retry(lambda: c.force_leader(topic, partition, lagging))
    finally:
        c.resume(other)
    c.start_node(leader)
    c.wait_ready()

    # the forced leader's HWM moves once a majority holds its epoch's first record
    def committed() -> bool:
        pm = c.client.partition_metadata(topic, partition, refresh=True)
        return bool(
            pm.leader_epoch == new_epoch
            and pm.leader_id == lagging
            and c.client.list_offsets(topic, partition, "latest").epoch == new_epoch
        )

    try:
        wait_until(committed, 30, f"{topic}/{partition} committing in the forced epoch {new_epoch}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(c, topic, partition)}") from None
    starts = [e.offset for e in log_entries(c, topic, partition) if e.epoch == new_epoch]
    divergence = starts[0]
    assert lost[0].offset - 1 <= divergence <= lost[0].offset, (lost, divergence)
    last = lost[-1]
    return Truncation(lost, (last.offset + 1, last.epoch), divergence, new_epoch, lagging)


def diagnose(c: Any, topic: str, partition: int) -> str:
    """What the cluster says about a partition, and each node's log tail (for failures)."""
    out = []
    for what, fn in (
        ("metadata", lambda: c.client.metadata([topic])),
        ("describe", lambda: c.describe(topic, partition)),
        ("latest", lambda: c.client.list_offsets(topic, partition, "latest")),
    ):
        try:
            out.append(f"{what}: {fn()}")
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            out.append(f"{what}: {type(exc).__name__}: {exc}")
    for n in sorted(c.ports):
        out.append(f"--- node {n} (running={c.is_running(n)}):\n{c.tail(n, 25)}")
    return "\n".join(out)


def checkpoint_ends(checkpoint: Path, topic: str, partition: int) -> list[int]:
    """The end offset of ``topic/partition`` of every micro-batch a streaming query's
    checkpoint planned (its offset log, ``offsets/<batch id>``), in batch order."""
    entries = [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    ends = []
    for entry in sorted(entries, key=lambda p: int(p.name)):
        source_offsets = json.loads(entry.read_text().strip().splitlines()[-1])
        ends.append(int(source_offsets[topic][str(partition)]["offset"]))
    return ends
