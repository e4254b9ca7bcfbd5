"""How ``make test`` spreads the suite over pytest-xdist workers (``-n 2 --dist loadfile``).

Each test module is one unit of work, run whole on one worker, in collection order (the
chaos campaigns and the Spark jobs, the longest, come early; the fast codec and storage
modules fill the end): a module-scoped cluster or other fixture is made once, as in a
serial run. Modules whose Spark jobs run in local-cluster mode (a driver and two
executors, each a JVM) share one unit, so that two such jobs never run at once on a small
machine. (xdist's own ``--dist loadgroup`` does not group under pytest 9, which no longer
names a test by the attribute that xdist rewrites: hence a scope function of our own.)"""

from __future__ import annotations

from typing import Any

#: The modules whose Spark jobs run in local-cluster mode, and the unit they share.
LOCAL_CLUSTER_MODULES = (
    "tests/connector/test_sink_exactly_once.py",
    "tests/connector_delta/test_distributed.py",
)
LOCAL_CLUSTER_UNIT = "spark-local-cluster"


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's path, or a shared unit's name."""
    module = nodeid.split("::", 1)[0]
    return LOCAL_CLUSTER_UNIT if module in LOCAL_CLUSTER_MODULES else module


def make_scheduler(config: Any, log: Any) -> Any:
    """xdist's file scheduling with :func:`unit_of` as its scope, in collection order."""
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class ModuleScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # collection order, not the most tests first
    return ModuleScheduling(config, log)
