"""examples/monitoring: every query of the Grafana dashboard and of the alerting rules
names metrics a node serves (read from a real node's endpoint, per-partition series and
the Kafka listener on), and the scrape configuration points Prometheus at /metrics."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from quorumlog.replica.node.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "examples" / "monitoring"
# A PromQL identifier that is a metric name (functions, keywords and labels are
# filtered out below: only names with our prefixes, or the process collector's).
NAME = re.compile(r"\b((?:quorumlog|process)_[a-zA-Z0-9_]+)\b")
# Suffixes a family's samples carry, by type.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            else:
                yield from _exprs(v)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every metric family one node's endpoint serves: its name as documented (a
    counter's with ``_total``) -> its type."""
    with LocalCluster(
        1,
        tmp_path_factory.mktemp("monitoring"),
        kafka=True,
        metrics=True,
        node_args=["--metrics-per-partition"],
    ) as c:
        with urllib.request.urlopen(c.metrics_urls[1], timeout=10) as resp:
            text = resp.read().decode()
    return {
        f.name + ("_total" if f.type == "counter" else ""): f.type
        for f in text_string_to_metric_families(text)
    }


@pytest.fixture(scope="module")
def served(families: dict[str, str]) -> set[str]:
    """Every sample name the endpoint serves, samples present or not."""
    names: set[str] = set()
    for name, kind in families.items():
        base = name.removesuffix("_total") if kind == "counter" else name
        names.update(base + s for s in SUFFIXES.get(kind, ("",)))
    return names


@pytest.mark.cluster
def test_every_dashboard_query_names_a_served_metric(served: set[str]) -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = list(_exprs(dashboard["panels"]))
    assert len(exprs) >= 20
    for expr in exprs:
        names = NAME.findall(expr)
        assert names, f"query names no metric: {expr}"
        missing = [n for n in names if n not in served]
        assert not missing, f"{expr}: {missing} not served"


@pytest.mark.cluster
def test_every_alert_names_a_served_metric(served: set[str]) -> None:
    text = (MONITORING / "quorumlog-alerts.yml").read_text()
    exprs = re.findall(r"^\s*expr:\s*(.+)$", text, re.M)
    assert exprs
    for expr in exprs:
        # ``up`` is Prometheus' own series for each target.
        names = NAME.findall(expr) or re.findall(r"\bup\b", expr)
        assert names, expr
        assert not [n for n in names if n != "up" and n not in served], expr


def test_scrape_config_names_the_endpoint() -> None:
    text = (MONITORING / "prometheus.yml").read_text()
    assert "metrics_path: /metrics" in text and "job_name: quorumlog" in text
    assert "quorumlog-alerts.yml" in text


@pytest.mark.cluster
def test_docs_name_every_served_metric_and_no_other(
    families: dict[str, str], served: set[str]
) -> None:
    text = (ROOT / "docs" / "monitoring.md").read_text()
    documented = set(re.findall(r"\b(?:quorumlog|process)_[a-z_]+[a-z]\b", text))
    ours = {n for n in families if n.startswith("quorumlog_")}
    assert not ours - documented, f"served but not documented: {sorted(ours - documented)}"
    unknown = documented - served - set(families)
    assert not unknown, f"documented, not served: {unknown}"
