"""``quorumlog top``: one frame (``--once``) of a running cluster's metrics endpoints names
every node and topic; the percentile arithmetic; a node that does not answer is down."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from quorumlog.replica.cli.top import Scrape, quantile, render
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def metrics_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("top"), metrics=True) as c:
        yield c


def test_quantile_interpolates_within_a_bucket() -> None:
    buckets = [(0.001, 0.0), (0.01, 50.0), (0.1, 100.0), (math.inf, 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.99, buckets) == pytest.approx(0.01 + 0.09 * 49 / 50)
    assert quantile(0.99, [(0.1, 0.0), (math.inf, 0.0)]) is None
    # Past the highest finite bound: that bound (as Prometheus' histogram_quantile).
    assert quantile(0.99, [(0.1, 1.0), (math.inf, 10.0)]) == 0.1


def test_a_node_that_does_not_answer_is_down() -> None:
    url = "http://127.0.0.1:1/metrics"
    frame = render([Scrape(url, 0.0, error="refused")], None)
    assert "0 of 1 nodes up" in frame
    assert "127.0.0.1:1" in frame and "down" in frame
    # Named by the id it answered with before.
    before = Scrape(url, 0.0, {"quorumlog_node_info": [({"node": "7", "cluster": "c"}, 1.0)]})
    (row,) = [
        ln
        for ln in render([Scrape(url, 1.0, error="refused")], [before]).splitlines()
        if "down" in ln
    ]
    assert row.split()[:3] == ["7", "127.0.0.1:1", "down"]


@pytest.mark.cluster
def test_once_names_every_node_and_topic(metrics_cluster: LocalCluster) -> None:
    c = metrics_cluster
    for topic, partitions in (("alpha", 3), ("beta", 2)):
        c.create_topic(topic, partitions)
        c.produce(topic, 0, [b"v"] * 10)
    endpoints = ",".join(u.split("//")[1].split("/")[0] for u in c.metrics_urls.values())
    proc = run_cli("top", "-b", endpoints, "--once", "--interval", "0.2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "quorumlog top: 3 of 3 nodes up"
    node_rows = {line.split()[0] for line in lines if line.split()[2:3] == ["up"]}
    assert node_rows == {"1", "2", "3"}, proc.stdout
    topics = {line.split()[0] for line in lines if line.split()}
    assert {"alpha", "beta"} <= topics, proc.stdout
    assert "\x1b" not in proc.stdout  # --once is for scripts: no screen control
