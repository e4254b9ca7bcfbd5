"""Metadata of thousands of partitions is built a slice at a time (``Api.partition_infos``),
the event loop running between slices: a node answering many clients' refreshes at once
(as when leadership moves) still runs its tick and heartbeats, other peers' frames and
other requests within a slice of each answer. Built whole, each answer held the loop for
as long as it took (~50 ms at 10,000 partitions), and a dozen of them stalled a node
long enough for its peers to take it for silent. A real Api and Driver; the driver hosts
none of the partitions, so each is answered UNKNOWN, as a node that hosts no replica."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from quorumlog.replica.constants import UNKNOWN
from quorumlog.replica.driver import Driver, Limits
from quorumlog.replica.node.api import METADATA_SLICE, Api
from quorumlog.replica.raft import QuorumConfig

from tests.support.config import node_config

SLICES = 4


class _NoController:
    """The controller's request handlers (topic and membership changes) and the topic
    changes' forwarder, unused here."""

    def __getattr__(self, name: str) -> None:
        return None


def test_a_metadata_answer_lets_the_loop_run_between_slices(tmp_path: Path) -> None:
    driver = Driver(1, "c", QuorumConfig(), Limits(1 << 20, 5000), random.Random(1))
    controller = _NoController()
    api = Api(node_config(tmp_path), driver, controller, controller, None, None)  # type: ignore[arg-type]
    n = SLICES * METADATA_SLICE
    assignments = [[1, 2, 3]] * n

    async def run() -> tuple[int, list[int]]:
        turns = 0
        building = True

        async def other_work() -> None:  # what the loop runs meanwhile: a turn each
            nonlocal turns
            while building:
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        infos = await api.partition_infos("t", assignments)
        building = False
        await other
        return turns, [i.partition for i in infos if i.leader_id == UNKNOWN]

    turns, unknown = asyncio.run(run())
    only = asyncio.run(api.partition_infos("t", assignments, [5, 1, 5, -1, n, n + 7]))
    assert [i.partition for i in only] == [1, 5]  # those asked for that exist, in order
    assert unknown == list(range(n))  # every partition, in order
    # The other work ran between the slices (at its first turn, and once per slice after).
    assert turns >= SLICES, turns
