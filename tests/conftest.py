"""Fixtures every test folder may use, from their one home (tests/support): one real
local SparkSession per test session, one 3-node cluster per test module. A failed
test's report carries the tail of each node log of the clusters it used. A session that
will run the simulator's CI seed sweep runs it in the background, from the first test
past the chaos campaigns (tests/sim/background.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.sim import background as sim_sweep
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


def pytest_collection_finish(session: pytest.Session) -> None:
    sim_sweep.plan(item.nodeid for item in session.items)


def pytest_runtest_setup(item: pytest.Item) -> None:
    sim_sweep.before_test(item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    sim_sweep.stop()
