"""The node's background scrub over many hosted replicas: each run looks at a bounded
number of them (an idle node of thousands pays for a few hundred looks a second), and
the replicas take turns, so damage in any of them is found within a round."""

from __future__ import annotations

import math
import random
from pathlib import Path

from quorumlog.replica.driver import Driver, Limits, Ready
from quorumlog.replica.node.datadir import DataDir
from quorumlog.replica.node.maintenance import SCRUB_VISITS, Maintenance
from quorumlog.replica.node.partitions import PartitionManager
from quorumlog.replica.raft import QuorumConfig
from quorumlog.replica.storage import Log

from tests.storage.test_corruption import SMALL, fill, flip, segment_files

REPLICAS = 2 * SCRUB_VISITS - 12


def test_the_scrub_looks_at_a_bounded_number_of_replicas_and_they_take_turns(
    tmp_path: Path,
) -> None:
    datadir = DataDir(tmp_path, "c", 1)
    last = ("t", REPLICAS - 1)
    # The last replica opened holds sealed segments, one of them damaged.
    damaged_dir = tmp_path / f"{last[0]}-{last[1]}"
    sealed = Log(str(damaged_dir), SMALL)
    fill(sealed, 40)
    sealed.close()
    damaged, _ = flip(segment_files(damaged_dir)[1], 1, 200)

    executed: list[Ready] = []
    driver = Driver(1, "c", QuorumConfig(), Limits(1 << 20, 5000), random.Random(1))
    pm = PartitionManager(1, datadir, SMALL, driver, executed.append, lambda: 0)
    for i in range(REPLICAS):
        pm.open("t", i, [1], Ready())
    upkeep = Maintenance(SMALL, 1 << 40, driver, pm, executed.append, lambda: 0)

    looks = []
    for _ in range(math.ceil(REPLICAS / SCRUB_VISITS) + 1):
        looks.append(upkeep.scrub())
        if pm.files[last].log.end_offset == damaged:
            break
    assert looks[0] == SCRUB_VISITS, looks  # idle replicas are looked at, boundedly
    assert all(n <= SCRUB_VISITS for n in looks), looks
    assert pm.files[last].log.end_offset == damaged, looks  # found and cut in round one
    assert len(looks) == 2
    pm.close_all()
