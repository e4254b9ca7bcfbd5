"""``quorumlog perf produce --nodes N`` at a tiny size: the embedded cluster has N nodes,
each leads a partition when there are as many partitions, and the final JSON line says
so beside the rate (what scaling with nodes on one machine is measured by)."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.perf import produce as perf_produce

from tests.support.figures import assert_numbers

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_every_node_of_the_embedded_cluster_leads(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--nodes", "4", "--partitions", "4", "--records", "4000", "--batch-records", "500"]
    rc = perf_produce.main([*argv, "--latency-samples", "5", "--producers", "1"])
    *lines, last = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(last)
    assert rc == 0 and figures["bench"] == "produce"
    assert figures["nodes"] == 4 and len(figures["peak_rss_mb"]) == 4
    assert figures["nodes_leading"] == 4 and figures["replication_factor"] == 3
    assert figures["records"] == 4000
    assert_numbers(figures, "records_per_s")
    assert "4 nodes, 4 of them leading, 3 replicas" in lines[0]
