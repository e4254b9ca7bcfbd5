"""Many partitions without a stall (issue 65): a topic change costs what it changes, not
what the node already holds, and a big one runs in slices with the event loop's other
work between them; a topic may have more than 10,000 partitions."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from pathlib import Path
from typing import Any

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.driver import Driver, Limits, Ready
from quorumlog.replica.node.cleaner import LogCleaner
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.config import MAX_TOPIC_PARTITIONS, partitions_problem
from quorumlog.replica.node.datadir import DataDir
from quorumlog.replica.node.metadata import MetadataState, TopicAssignment
from quorumlog.replica.node.node import GC_THRESHOLDS, settle_gc
from quorumlog.replica.node.partitions import OPEN_CHUNK, PartitionManager
from quorumlog.replica.perf.probe import MetadataProber
from quorumlog.replica.raft import QuorumConfig
from quorumlog.replica.storage import LogConfig
from quorumlog.replica.storage.records import encode_batch

VOTERS = [1, 2, 3]
# Bounds every wait on the event loop below (turns, not time).
MAX_TURNS = 100_000
THREAD_WAIT_S = 60.0


def manager(path: Path, settled: list[int] | None = None) -> PartitionManager:
    """``settled``: counts the calls of the manager's ``settle_gc``."""
    driver = Driver(1, "c", QuorumConfig(), Limits(1 << 20, 5000), random.Random(1))

    def execute(ready: Ready) -> None:
        pm.persist_all(ready.persist)

    def settle() -> None:
        assert settled is not None
        settled.append(len(pm.files))

    pm = PartitionManager(
        1,
        DataDir(path, "c", 1),
        LogConfig(),
        driver,
        execute,
        lambda: 0,
        settle_gc=None if settled is None else settle,
    )
    return pm


def topic(name: str, partitions: int) -> TopicAssignment:
    return TopicAssignment(name, [list(VOTERS) for _ in range(partitions)])


def opened(pm: PartitionManager, name: str) -> int:
    return sum(1 for t, _ in pm.files if t == name)


async def _turns_until(cond: object, counter: list[int]) -> None:
    """Yield to the loop until ``cond()``, counting the turns in ``counter``; past
    ``MAX_TURNS`` (work waiting on a worker thread, a slow disk) the turns are spaced out,
    for at most ``THREAD_WAIT_S``."""
    assert callable(cond)
    deadline = time.monotonic() + THREAD_WAIT_S
    for turn in range(MAX_TURNS + int(THREAD_WAIT_S / 0.005)):
        if cond():
            return
        counter[0] += 1
        await asyncio.sleep(0 if turn < MAX_TURNS else 0.005)
        if turn >= MAX_TURNS and time.monotonic() > deadline:
            break
    raise AssertionError("not done within the turns allowed")


def test_a_big_topic_opens_in_slices_with_the_loop_turning_between(tmp_path: Path) -> None:
    n = 4 * OPEN_CHUNK + 10
    pm = manager(tmp_path)
    state = MetadataState(topics={"big": topic("big", n)})

    async def main() -> tuple[int, list[int]]:
        pm.reconcile(state, ["big"])
        right_after = opened(pm, "big")  # what reconcile did before returning
        turns = [0]
        await _turns_until(lambda: opened(pm, "big") == n, turns)
        return right_after, turns

    right_after, turns = asyncio.run(main())
    assert right_after == 0  # a big change is the task's, from the next turn
    assert opened(pm, "big") == n
    assert pm.slices >= n // OPEN_CHUNK + 1 and pm.slice_max <= OPEN_CHUNK
    # The loop ran other work (this test's turns) between the slices.
    assert turns[0] >= pm.slices - 1
    pm.close_all()


def test_each_slice_is_followed_by_a_pause_as_long_as_itself(tmp_path: Path) -> None:
    """The opens take at most half of the loop's time: between two slices the loop is
    left to its other work at least as long as the first took, so that a create's turns
    stay short. Timed with the monotonic clock both ways: the
    pause is a lower bound that a loaded machine only lengthens."""
    n = 4 * OPEN_CHUNK + 10
    pm = manager(tmp_path)
    spans: list[tuple[float, float]] = []
    open_slice = pm._open_slice

    def timed(*args: Any, **kwargs: Any) -> int:
        began = time.monotonic()
        try:
            return open_slice(*args, **kwargs)
        finally:
            spans.append((began, time.monotonic()))

    pm._open_slice = timed  # type: ignore[method-assign]
    state = MetadataState(topics={"big": topic("big", n)})

    async def main() -> None:
        pm.reconcile(state, ["big"])
        await _turns_until(lambda: opened(pm, "big") == n, [0])

    asyncio.run(main())
    assert opened(pm, "big") == n and len(spans) >= n // OPEN_CHUNK + 1
    for (start, end), (following, _) in zip(spans, spans[1:], strict=False):
        assert following - end >= end - start - 1e-4, spans
    pm.close_all()


def test_a_small_change_is_done_at_once(tmp_path: Path) -> None:
    pm = manager(tmp_path)

    async def main() -> int:
        pm.reconcile(MetadataState(topics={"small": topic("small", 3)}), ["small"])
        return opened(pm, "small")

    assert asyncio.run(main()) == 3  # as before: a created topic's replicas open with it
    pm.close_all()


def test_a_change_looks_only_at_the_topics_it_changes(tmp_path: Path) -> None:
    pm = manager(tmp_path)
    state = MetadataState(topics={"big": topic("big", 2000)})
    pm.reconcile(state)  # no loop: all of it here
    assert opened(pm, "big") == 2000
    state.topics["small"] = topic("small", 3)
    looked = pm.examined
    pm.reconcile(state, ["small"])
    assert opened(pm, "small") == 3
    assert pm.examined - looked == 3  # not the 2,000 replicas already open
    pm.close_all()


def test_a_deleted_big_topic_goes_in_slices(tmp_path: Path) -> None:
    n = 2 * OPEN_CHUNK + 5
    pm = manager(tmp_path)
    state = MetadataState(topics={"big": topic("big", n), "kept": topic("kept", 1)})
    pm.reconcile(state)
    for p in (0, n - 1):  # two of them written: they have directories
        pm.files[("big", p)].log.append_as_leader(encode_batch([b"v"]), 1)
    assert (tmp_path / "big-0").is_dir()
    del state.topics["big"]
    state.deleted.add("big")
    slices = pm.slices

    async def main() -> None:
        pm.reconcile(state, ["big"])
        await _turns_until(lambda: opened(pm, "big") == 0 and not pm._changed, [0])
        await _turns_until(lambda: pm._reconciler is None or pm._reconciler.done(), [0])

    asyncio.run(main())
    assert sorted(pm.files) == [("kept", 0)]
    assert pm.slices - slices >= 3 and pm.slice_max <= OPEN_CHUNK
    assert not (tmp_path / "big-0").exists() and not (tmp_path / f"big-{n - 1}").exists()
    assert sorted(pm.journal.states()) in ([], [("kept", 0)])
    assert pm.datadir.trash.wait(30)
    pm.close_all()


def test_the_collector_is_settled_once_a_big_topic_is_open(tmp_path: Path) -> None:
    """Thousands of replicas opened: the node takes their objects out of the collector's
    full scans (``node.settle_gc``), once they are all open; not for a small topic."""
    settled: list[int] = []
    pm = manager(tmp_path, settled)
    n = 2 * OPEN_CHUNK + 1
    state = MetadataState(topics={"small": topic("small", 3)})

    async def main() -> None:
        pm.reconcile(state, ["small"])
        assert settled == []
        state.topics["big"] = topic("big", n)
        pm.reconcile(state, ["big"])
        await _turns_until(lambda: opened(pm, "big") == n, [0])
        await _turns_until(lambda: pm._reconciler is None or pm._reconciler.done(), [0])

    asyncio.run(main())
    assert settled == [n + 3]
    pm.close_all()


def test_a_big_topic_opens_with_the_collectors_young_generations_small(tmp_path: Path) -> None:
    """With a node's collector thresholds, opening thousands of replicas and settling
    the collector after never has a collection of the young generations look at more
    than 100,000 objects (each look holds the event loop: a million took 140-200 ms)."""
    young_max = 100_000
    pm = manager(tmp_path)
    pm.settle_gc = settle_gc  # the node's: the young collected, then all of it frozen
    looked: list[int] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] < 2:
            looked.append(sum(len(gc.get_objects(g)) for g in range(info["generation"] + 1)))

    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    gc.callbacks.append(on_gc)
    try:
        pm.reconcile(MetadataState(topics={"big": topic("big", 12_000)}))
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*before)
        gc.unfreeze()
    assert looked  # collections ran while it opened
    assert max(looked) <= young_max
    pm.close_all()


def test_the_cleaner_looks_only_at_compacted_replicas(tmp_path: Path) -> None:
    """The log cleaner's check (about once a second) looks at the replicas of compacted
    topics only: 2,000 replicas of a topic that does not compact cost it nothing."""
    pm = manager(tmp_path)
    state = MetadataState(
        topics={
            "big": topic("big", 2000),
            "kept": TopicAssignment("kept", [list(VOTERS)] * 3, {"cleanup.policy": "compact"}),
        }
    )
    pm.reconcile(state)  # no loop: all of it here
    assert len(pm.files) == 2003
    cleaner = LogCleaner(pm.driver, pm, 0)

    async def check() -> None:
        cleaner.run()

    asyncio.run(check())
    assert cleaner.examined == 3
    assert sorted(key for key, _ in pm.compacted()) == [("kept", p) for p in range(3)]
    pm.close_all()


def test_a_topic_may_have_more_than_10000_partitions() -> None:
    assert partitions_problem(10_001) is None
    assert partitions_problem(MAX_TOPIC_PARTITIONS) is None
    assert partitions_problem(MAX_TOPIC_PARTITIONS + 1) is not None
    assert partitions_problem(0) is not None


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_topic_of_10001_partitions_is_created(tmp_path: Path) -> None:
    with LocalCluster(1, tmp_path, log_level="WARNING") as c:
        with Client(c.bootstrap, request_timeout_ms=120_000, attempt_timeout_ms=30_000) as client:
            client.create_topic("wide", 10_001, 1)
            meta = client.metadata(["wide"])["wide"]
            assert len(meta.partitions) == 10_001


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_small_metadata_is_answered_while_thousands_of_partitions_are_created(
    tmp_path: Path,
) -> None:
    """Topics of 1,500 partitions created one after another on 3 nodes while a prober
    asks every node for a one-partition topic every 0.2 s: every probe is answered and
    every partition gets a leader (how fast is ``quorumlog perf partitions``'s figure)."""
    topics = [f"many-{i}" for i in range(3)]
    with LocalCluster(3, tmp_path, log_level="WARNING") as c:
        c.create_topic("probe", 1, 3, timeout_s=60)
        prober = MetadataProber([(c.host, c.ports[i]) for i in sorted(c.procs)], "probe")
        try:
            with Client(
                c.bootstrap, request_timeout_ms=120_000, attempt_timeout_ms=30_000
            ) as client:
                for name in topics:
                    client.create_topic(name, 1500, 3)
                    client.wait_for_leaders(name, 180_000)
        finally:
            probed = prober.stop()
        assert probed.failures == 0
        assert len(probed.times_ms) >= 3  # every node, at least once before the creates
        with Client(c.bootstrap, request_timeout_ms=120_000, attempt_timeout_ms=30_000) as client:
            for name in topics:
                meta = client.metadata([name])[name]
                assert len(meta.partitions) == 1500
                assert all(p.leader_id >= 0 for p in meta.partitions.values())
