"""``quorumlog perf partitions`` at tiny sizes: every phase runs and its figures are sane."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from quorumlog.replica.cli.main import PERF
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.perf import partitions as perf_partitions
from quorumlog.replica.perf.util import Progress, cpu_seconds
from quorumlog.replica.protocol import messages as m

from tests.support.figures import assert_numbers, is_number

KEYS = {
    "partitions",
    "nodes",
    "idle_seconds",
    "all_led_s",
    "idle_cpu_pct",
    "idle_cpu_pct_max",
    "idle_elections",
    "idle_epoch_increase",
    "leaders_per_node",
    "failover_max_s",
    "failover_median_s",
    "produce_rec_per_s",
}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], dict[str, Any]]:
    rc = perf_partitions.main(list(argv))
    lines = capsys.readouterr().out.strip().splitlines()
    return rc, lines[:-1], json.loads(lines[-1])


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_perf_partitions_tiny(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert PERF["partitions"] == "partitions"
    rc, human, fig = _run(
        capsys,
        *("--partitions", "6", "--idle-seconds", "2", "--produce-seconds", "2"),
        *("--settle-seconds", "0", "--balance-timeout", "0", "--data-dir", str(tmp_path)),
    )
    assert rc == 0, fig.get("error")
    assert KEYS <= fig.keys() and "error" not in fig
    assert fig["partitions"] == 6 and fig["nodes"] == 3 and fig["idle_seconds"] == 2
    assert isinstance(fig["all_led_s"], float)  # a figure, reported (its time is not judged)
    assert len(fig["idle_cpu_pct"]) == 3 and all(is_number(c) for c in fig["idle_cpu_pct"])
    assert fig["idle_cpu_pct_max"] == max(fig["idle_cpu_pct"])
    assert fig["idle_elections"] >= 0 and fig["idle_epoch_increase"] >= fig["idle_elections"]
    assert len(fig["leaders_per_node"]) == 3 and sum(fig["leaders_per_node"]) == 6
    # The victim led the most partitions, so at least 2 of 6; every one was re-led.
    assert fig["failover_partitions"] >= 2 and fig["failover_unled"] == 0
    assert_numbers(fig, "failover_median_s", "failover_max_s")
    assert fig["failover_median_s"] <= fig["failover_max_s"]
    assert sum(fig["leaders_per_node_after_restart"]) == 6
    assert fig["produce_mode"] == "threads"
    assert fig["produce_partitions"] == 6
    assert_numbers(
        fig,
        "produce_rec_per_s",
        "produce_node_cpu_us_per_record",
        "produce_client_cpu_us_per_record",
        "produce_machine_busy_pct",
        "metadata_partition_ms",
        "metadata_topic_ms",
    )
    # One human line per phase, printed before the JSON line.
    phases = ("all led after", "idle ", "metadata refresh", "kill -9 of node", "restarted")
    for phase in (*phases, "produce: "):
        assert any(phase in line for line in human), (phase, human)


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_perf_partitions_producer_processes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, human, fig = _run(
        capsys,
        *("--partitions", "2", "--idle-seconds", "1", "--settle-seconds", "0"),
        *("--balance-timeout", "0"),
        *("--skip-failover", "--producer-mode", "processes", "--producers", "2"),
        *("--produce-seconds", "1", "--data-dir", str(tmp_path), "--json"),
    )
    assert rc == 0, fig.get("error")
    assert human == []  # --json: the JSON line only
    assert fig["failover_max_s"] is None and "failover_victim" not in fig
    assert fig["produce_mode"] == "processes" and fig["produce_records"] > 0
    assert_numbers(fig, "produce_client_cpu_pct")
    # Producing time ends when the producers stop producing, not when their processes exit.
    assert isinstance(fig["produce_seconds"], float)  # reported, not judged


def test_cpu_seconds_counts_this_process() -> None:
    # Read from the same CPU-time clock as process_time, around its span: at least as much.
    before = cpu_seconds(os.getpid())
    t = time.process_time()
    for _ in range(10_000_000):
        if time.process_time() - t >= 0.1:
            break
    burned = time.process_time() - t
    assert cpu_seconds(os.getpid()) - before >= burned


def test_progress_heartbeat_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    quiet = Progress(10, "quiet")
    quiet.update(5, "nothing")
    beating = Progress(10, "phase", heartbeat_s=0)
    beating.update(5, "5/10 led")
    err = capsys.readouterr().err
    assert "quiet" not in err
    assert err.startswith("phase: ") and err.rstrip().endswith("5/10 led")


def _answer(node: int, parts: list[tuple[int, int, bool]], topic: str = "t") -> m.MetadataResponse:
    """Node ``node``'s Metadata answer: (leader id, epoch, is_local_leader) per partition."""
    infos = [
        m.PartitionInfo(
            error=0,
            partition=i,
            leader_id=leader,
            leader_epoch=epoch,
            replicas=[1, 2, 3],
            high_watermark=0,
            log_start_offset=0,
            is_local_leader=local,
        )
        for i, (leader, epoch, local) in enumerate(parts)
    ]
    return m.MetadataResponse(
        error=0,
        error_message="",
        cluster_id="c",
        node_id=node,
        controller_id=1,
        nodes=[],
        topics=[m.TopicInfo(error=0, name=topic, partitions=infos)],
    )


@pytest.mark.cluster
def test_a_poll_of_some_partitions_views_only_those(tmp_path: Path) -> None:
    """The failover's polls ask for the partitions still waiting, not the topic; so do
    the polls waiting for all led after a create, once the nodes know the topic, and a
    poll of the whole topic confirms the end."""
    with LocalCluster(3, tmp_path) as c:
        c.client.create_topic(perf_partitions.TOPIC, 4)  # elections begin a timeout later
        viewer = perf_partitions.ClusterView(c, perf_partitions.TOPIC)
        asked: list[tuple[list[int] | None, list[int]]] = []
        poll = viewer.poll

        def recorded(nodes: Any, partitions: list[int] | None = None) -> perf_partitions.View:
            view = poll(nodes, partitions)
            asked.append((partitions, sorted(view.leaders)))
            return view

        viewer.poll = recorded  # type: ignore[method-assign]
        try:
            led, whole = perf_partitions._wait_all_led(c, viewer, 4, time.monotonic(), 30, "led")
            assert led is not None and sorted(whole.leaders) == [0, 1, 2, 3]
            assert asked[-1] == (None, [0, 1, 2, 3])  # the confirmation
            some_polls = [i for i, (parts, _) in enumerate(asked) if parts is not None]
            assert some_polls, asked
            for i in some_polls:  # only what the poll before did not see led
                before, seen = asked[i - 1]
                assert asked[i][0] == [p for p in (before or range(4)) if p not in seen]
            viewer.poll = poll  # type: ignore[method-assign]
            some = viewer.poll([1, 2, 3], [3, 1])
            assert sorted(some.leaders) == [1, 3] and some.answered == [1, 2, 3]
        finally:
            viewer.close()


def test_merge_views_counts_a_leader_only_in_the_newest_epoch() -> None:
    view = perf_partitions.merge_views(
        "t",
        {
            # p0: node 1 leads in epoch 3. p1: node 1 still thinks it leads in epoch 2, node 2
            # has started epoch 3 (no leader yet). p2: nobody leads. p3: node 2 leads in 5,
            # node 3 still claims epoch 4.
            1: _answer(1, [(1, 3, True), (1, 2, True), (-1, 1, False), (2, 5, False)]),
            2: _answer(2, [(1, 3, False), (-1, 3, False), (-1, 1, False), (2, 5, True)]),
            3: _answer(3, [(1, 3, False), (1, 2, False), (-1, 1, False), (3, 4, True)]),
        },
    )
    assert view.partitions == 4 and view.answered == [1, 2, 3]
    assert view.epochs == {0: 3, 1: 3, 2: 1, 3: 5}
    assert view.leaders == {0: (1, 3), 3: (2, 5)}
    assert view.leaders_per_node([1, 2, 3]) == [1, 1, 0]
    # Every partition's preferred replica is node 1 (replicas [1, 2, 3]): p3 is off it.
    assert view.preferred == {0: 1, 1: 1, 2: 1, 3: 1}
    assert view.off_preferred() == [3]


def test_balanced_means_every_partition_led_and_each_node_within_10_percent() -> None:
    def view(counts: list[int]) -> perf_partitions.View:
        leaders = [node for node, n in zip([1, 2, 3], counts, strict=True) for _ in range(n)]
        return perf_partitions.View(leaders={p: (node, 1) for p, node in enumerate(leaders)})

    assert view([34, 33, 33]).balanced([1, 2, 3], 100)
    assert view([36, 33, 31]).balanced([1, 2, 3], 100)  # 10% of 33.3 is 3.3
    assert not view([38, 33, 29]).balanced([1, 2, 3], 100)
    assert not view([33, 33, 33]).balanced([1, 2, 3], 100)  # one partition unled
    assert view([2, 1, 3]).balanced([1, 2, 3], 6)  # small topics: within one partition
    assert not view([4, 1, 1]).balanced([1, 2, 3], 6)


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_perf_partitions_metrics_listen(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every node serves its metrics, scraped during the idle window: the scrape's latency
    is a figure (metrics_scrape_ms)."""
    rc, human, fig = _run(
        capsys,
        *("--partitions", "4", "--idle-seconds", "2.5", "--settle-seconds", "0"),
        *("--balance-timeout", "0", "--skip-failover", "--skip-produce"),
        *("--metrics-listen", "--scrape-seconds", "1", "--data-dir", str(tmp_path)),
    )
    assert rc == 0, fig.get("error")
    # A scrape of each of the 3 nodes at the window's start, and at least once more.
    assert fig["metrics_scrapes"] >= 6 and fig["metrics_scrapes"] % 3 == 0
    assert_numbers(fig, "metrics_scrape_ms", "metrics_scrape_ms_max", "metrics_scan_ms")
    assert fig["metrics_scrape_ms"] <= fig["metrics_scrape_ms_max"]
    # The node's own scan of its replicas, a part of a scrape's latency.
    assert fig["metrics_scan_ms"] <= fig["metrics_scrape_ms_max"]
    assert fig["metrics_series"] > 50
    assert any("metrics scrapes, median" in line for line in human), human


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_perf_partitions_topics_one_after_another_probed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--topics 3: three topics created one after another, each once the one before is
    led, while the prober asks every node for the Metadata of a one-partition topic."""
    rc, human, fig = _run(
        capsys,
        *("--partitions", "5", "--topics", "3", "--idle-seconds", "1", "--settle-seconds", "0"),
        *("--balance-timeout", "0", "--skip-failover", "--skip-produce"),
        *("--data-dir", str(tmp_path)),
    )
    assert rc == 0, fig.get("error")
    assert fig["topics"] == 3 and len(fig["create_s_per_topic"]) == 3
    assert all(s is not None for s in fig["all_led_s_per_topic"])
    assert fig["all_led_s"] == fig["all_led_s_per_topic"][-1]
    assert fig["led_total"] == 15
    # Every node asked at least once before the first create, and every answer timed.
    assert fig["probes"] >= 3 and fig["probe_failures"] == 0
    assert_numbers(fig, "probe_ms_p50", "probe_ms_p99", "probe_ms_max")
    assert fig["probe_ms_p50"] <= fig["probe_ms_p99"] <= fig["probe_ms_max"]
    for i, name in enumerate(("partitions", "partitions-1", "partitions-2")):
        assert any(line.startswith(f"topic {i + 1}/3 ({name}, 5 partitions)") for line in human)
    assert any(line.startswith("metadata probe ('probe'") for line in human), human
