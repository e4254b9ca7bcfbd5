"""Fixtures every test folder may use, from their one home (tests/support): one real
local SparkSession per test session, one 3-node cluster per test module. A failed
test's report carries the tail of each node log of the clusters it used."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

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
