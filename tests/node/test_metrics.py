"""A 3-node cluster's Prometheus endpoints (``serve --metrics-listen``), scraped and parsed
with prometheus-client's parser while records are produced: under-replicated partitions
rise when a follower is killed and return to 0 after its restart, a consumer group's lag
rises and falls with its commits, and the flush and quorum-state write histograms
count. Also: where the endpoint may listen, and what it answers besides /metrics."""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.security import TlsFiles

from tests.support.cluster import ELECTION_BOUND_S
from tests.support.config import node_config
from tests.support.metrics import Scrape, cluster_total, scrape, value
from tests.support.waits import TRANSIENT, wait_until

UNDER_REPLICATED = "quorumlog_partitions_under_replicated"
GROUP_LAG = "quorumlog_consumer_group_lag_records"


@pytest.fixture(scope="module")
def metrics_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("metrics"), kafka=True, metrics=True) as c:
        yield c


def _produce(c: LocalCluster, topic: str, partition: int, n: int = 5) -> bool:
    """One batch of ``n`` records; False if the cluster could not take it just now."""
    try:
        c.produce(topic, partition, [b"m" * 64] * n, timeout_ms=2000)
    except TRANSIENT:
        return False
    return True


def test_metrics_listen_must_be_loopback_without_tls(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--metrics-listen 0.0.0.0 is not a loopback address"):
        node_config(tmp_path, metrics_listen=("0.0.0.0", 9100))
    node_config(tmp_path, metrics_listen=("127.0.0.1", 9100))
    tls = TlsFiles("cert.pem", "key.pem", "ca.pem")
    node_config(tmp_path, metrics_listen=("0.0.0.0", 9100), tls=tls)


@pytest.mark.cluster
def test_endpoint_answers_metrics_only(metrics_cluster: LocalCluster) -> None:
    url = metrics_cluster.metrics_urls[1]
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain;")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url.replace("/metrics", "/nothing"), timeout=5)
    assert err.value.code == 404
    found = scrape(url)
    assert value(found, "quorumlog_node_info", node="1") == 1
    # prometheus-client's process collector: CPU, RSS, open files.
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert value(found, name) > 0, name
    assert "quorumlog_topic_partitions_hosted" in found


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_follower_killed_and_restarted(metrics_cluster: LocalCluster) -> None:
    c = metrics_cluster
    c.create_topic("ur", 3)
    leader = c.wait_for_leader("ur", 0)
    # Not the metadata leader either (its failover is not what this is about).
    controller = [
        n
        for n, url in c.metrics_urls.items()
        if value(scrape(url), "quorumlog_topic_partitions_led", topic="__cluster_metadata")
    ]
    victim = next(n for n in sorted(c.ports) if n not in (leader, *controller))
    url = c.metrics_urls[leader]
    before = scrape(url)
    flushes = value(before, "quorumlog_log_flush_duration_seconds_count")
    wait_until(
        lambda: _produce(c, "ur", 0) and cluster_total(c, UNDER_REPLICATED) == 0,
        ELECTION_BOUND_S,
        "no partition under-replicated before the kill",
        interval=0.1,
    )

    # The leader's own flush may end after the produce's answer (a follower's made the
    # quorum): wait for it rather than race it.
    def flushed() -> Scrape | None:
        found = scrape(url)
        return (
            found if value(found, "quorumlog_log_flush_duration_seconds_count") > flushes else None
        )

    after = wait_until(flushed, ELECTION_BOUND_S, "a flush on the leader", interval=0.1)
    assert value(after, "quorumlog_quorum_state_write_duration_seconds_count") > 0
    assert value(after, "quorumlog_topic_records_in_total", topic="ur") >= 5
    assert value(after, "quorumlog_requests_total", listener="native", api="PRODUCE") >= 1

    c.kill(victim)
    try:
        wait_until(
            lambda: _produce(c, "ur", 0) and cluster_total(c, UNDER_REPLICATED) > 0,
            ELECTION_BOUND_S,
            f"under-replicated partitions after node {victim} was killed",
            interval=0.1,
        )
        wait_until(
            lambda: value(scrape(url), "quorumlog_peer_up", peer=str(victim)) == 0,
            ELECTION_BOUND_S,
            f"node {leader} to see node {victim} down",
            interval=0.1,
        )
    finally:
        c.start_node(victim)
    wait_until(
        lambda: _produce(c, "ur", 0) and cluster_total(c, UNDER_REPLICATED) == 0,
        2 * ELECTION_BOUND_S,
        f"no partition under-replicated after node {victim} restarted",
        interval=0.2,
    )
    assert value(scrape(url), "quorumlog_peer_up", peer=str(victim)) == 1


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_consumer_group_lag_rises_and_falls(metrics_cluster: LocalCluster) -> None:
    c = metrics_cluster
    c.create_topic("lag", 2)
    for p in (0, 1):
        c.produce("lag", p, [b"r"] * 10)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": c.kafka_bootstrap, "group.id": "g-lag", "enable.auto.commit": False}
    )
    try:

        def commit(offsets: dict[int, int]) -> None:
            consumer.commit(
                offsets=[confluent_kafka.TopicPartition("lag", p, o) for p, o in offsets.items()],
                asynchronous=False,
            )

        def lag_is(n: int) -> bool:
            return cluster_total(c, GROUP_LAG, group="g-lag", topic="lag") == n

        def ends() -> dict[int, int]:
            # Offsets count the leader-change record each partition's log starts with.
            return {p: c.client.list_offsets("lag", p, "latest").offset for p in (0, 1)}

        first = ends()
        commit({0: 0, 1: 0})
        wait_until(lambda: lag_is(sum(first.values())), ELECTION_BOUND_S, "lag", interval=0.1)
        c.produce("lag", 0, [b"r"] * 5)
        wait_until(lambda: lag_is(sum(first.values()) + 5), ELECTION_BOUND_S, "more lag")
        last = ends()
        commit(last)
        wait_until(lambda: lag_is(0), ELECTION_BOUND_S, "no lag", interval=0.1)
        committed = "quorumlog_consumer_group_committed_offset"
        assert cluster_total(c, committed, group="g-lag", topic="lag") == sum(last.values())
    finally:
        consumer.close()


@pytest.mark.cluster
def test_a_node_with_tls_serves_its_metrics_over_https(tmp_path: Path) -> None:
    """The node's own certificate; `quorumlog top --tls-ca` reads it."""
    with LocalCluster(1, tmp_path, secure=True, metrics=True) as c:
        url = c.metrics_urls[1]
        assert url.startswith("https://")
        context = ssl.create_default_context(cafile=c.ca_file)
        with urllib.request.urlopen(url, timeout=10, context=context) as resp:
            assert b"quorumlog_partitions_hosted" in resp.read()
        with pytest.raises((OSError, http.client.HTTPException)):  # no plaintext answer
            urllib.request.urlopen(url.replace("https://", "http://"), timeout=10)
