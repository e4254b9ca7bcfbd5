"""Fixtures every test folder may use, from their one home (tests/support): one real
local SparkSession per test session, one 3-node cluster per test module."""

from __future__ import annotations

from tests.support.cluster import cluster
from tests.support.spark import spark

__all__ = ["cluster", "spark"]
