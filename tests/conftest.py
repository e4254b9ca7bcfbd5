"""Fixtures every test folder may use, from their one home (tests/support): one real
local SparkSession per test session, one 3-node cluster per test module. A failed
test's report carries the tail of each node log of the clusters it used. A session that
will run the simulator's CI seed sweep runs it in the background, from the first test
past the chaos campaigns (tests/sim/background.py); under pytest-xdist, the controller
runs it for its workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.sim import background as sim_sweep
from tests.support import scheduling
from tests.support.cluster import cluster, cluster_log_sections
from tests.support.spark import spark

__all__ = ["cluster", "spark"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    if report.failed and call.when == "call":
        report.sections.extend(cluster_log_sections(funcargs))


def pytest_configure(config: pytest.Config) -> None:
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: the controller runs the sweep
        sim_sweep.run_elsewhere(workerinput.get(sim_sweep.WORKER_INPUT))


def pytest_collection_finish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        sim_sweep.plan(item.nodeid for item in session.items)


def pytest_runtest_logstart(nodeid: str) -> None:
    # Where the session's tests run and, under xdist, in the controller as each starts.
    sim_sweep.before_test(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[sim_sweep.WORKER_INPUT] = str(sim_sweep.directory_for_workers())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    sim_sweep.plan(ids)


def pytest_sessionfinish(session: pytest.Session) -> None:
    sim_sweep.stop()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    # --dist loadfile: one unit per module, local-cluster Spark modules sharing one
    # (tests/support/scheduling.py); any other mode is xdist's own.
    if config.getvalue("dist") == "loadfile":
        return scheduling.make_scheduler(config, log)
    return None
