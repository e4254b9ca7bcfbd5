"""Topic admin and client errors: each names the thing and carries its error code."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import (
    BootstrapUnreachableError,
    QuorumLogError,
    TopicExistsError,
    UnknownTopicError,
)
from quorumlog.replica.node.cluster import LocalCluster, free_ports
from quorumlog.replica.node.config import MAX_TOPIC_PARTITIONS
from quorumlog.replica.node.metadata import METADATA_TOPIC
from quorumlog.replica.protocol import ApiKey, ErrorCode
from quorumlog.replica.protocol import messages as m

from tests.support.cluster import node_request
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def test_duplicate_topic(cluster: LocalCluster) -> None:
    cluster.create_topic("dup", 2)
    with pytest.raises(TopicExistsError) as exc:
        cluster.client.create_topic("dup", 2)
    assert exc.value.error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert "TOPIC_ALREADY_EXISTS" in str(exc.value) and "'dup' already exists" in str(exc.value)
    # The existing topic is untouched.
    assert sorted(cluster.client.wait_for_leaders("dup").partitions) == [0, 1]


@pytest.mark.parametrize("name", ["", "bad name", "x" * 201, "a/b", "__internal", "naïve"])
def test_invalid_topic_name(cluster: LocalCluster, name: str) -> None:
    with pytest.raises(QuorumLogError) as exc:
        cluster.client.create_topic(name, 1)
    assert exc.value.error_code == ErrorCode.INVALID_TOPIC
    assert repr(name) in str(exc.value) or "reserved" in str(exc.value)
    assert name not in cluster.client.list_topics()


def test_replication_factor_above_node_count(cluster: LocalCluster) -> None:
    with pytest.raises(QuorumLogError) as exc:
        cluster.client.create_topic("too-wide", 1, replication_factor=4)
    assert exc.value.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert "1..3" in str(exc.value) and "4" in str(exc.value)
    assert "too-wide" not in cluster.client.list_topics()


@pytest.mark.parametrize("partitions", [0, -1, MAX_TOPIC_PARTITIONS + 1])
def test_invalid_partition_count(cluster: LocalCluster, partitions: int) -> None:
    with pytest.raises(QuorumLogError) as exc:
        cluster.client.create_topic("bad-parts", partitions)
    assert exc.value.error_code == ErrorCode.INVALID_PARTITIONS
    assert str(partitions) in str(exc.value)


def test_unknown_topic(cluster: LocalCluster) -> None:
    with pytest.raises(UnknownTopicError, match="no-such-topic"):
        cluster.client.metadata(["no-such-topic"])
    with pytest.raises(UnknownTopicError):
        cluster.client.partition_metadata("no-such-topic", 0, refresh=True)
    cluster.create_topic("one-part", 1)
    with pytest.raises(UnknownTopicError, match="no partition 5"):
        cluster.client.partition_metadata("one-part", 5, refresh=True)


def test_delete_topic_then_unknown(cluster: LocalCluster) -> None:
    cluster.create_topic("short-lived", 1)
    cluster.produce("short-lived", 0, [b"x"])
    cluster.client.delete_topic("short-lived")

    def gone() -> bool:
        # Followers apply the delete when they next learn the metadata HWM; until then a
        # node (list_topics asks any one, metadata merges all) may still list the topic.
        if "short-lived" in cluster.client.list_topics():
            return False
        try:
            cluster.client.metadata(["short-lived"])
        except UnknownTopicError:
            return True
        return False

    wait_until(gone, 10, "every node to forget short-lived")
    with pytest.raises(UnknownTopicError):
        cluster.client.delete_topic("short-lived")
    # The name can be used again, with fresh offsets.
    cluster.create_topic("short-lived", 1)
    assert cluster.client.list_offsets("short-lived", 0, "earliest").offset == 0


def test_unreachable_bootstrap_names_the_address() -> None:
    (port,) = free_ports(1)
    with Client(f"127.0.0.1:{port}", request_timeout_ms=1000) as c:
        with pytest.raises(BootstrapUnreachableError) as exc:
            c.metadata()
    assert f"127.0.0.1:{port}" in str(exc.value)
    assert exc.value.error_code == ErrorCode.NETWORK_EXCEPTION


@pytest.mark.parametrize("bootstrap", ["", "nohost", "host:port", ","])
def test_malformed_bootstrap(bootstrap: str) -> None:
    with pytest.raises(ValueError, match="bootstrap"):
        Client(bootstrap)


def test_list_topics_unreachable_bootstrap() -> None:
    (port,) = free_ports(1)
    with Client(f"127.0.0.1:{port}", request_timeout_ms=300) as c:
        with pytest.raises(BootstrapUnreachableError, match=f"127.0.0.1:{port}"):
            c.list_topics()


def test_create_and_delete_survive_a_retry_after_a_timed_out_attempt(
    cluster: LocalCluster,
) -> None:
    """Attempts shorter than a metadata commit: the first attempt times out after the
    controller got the request, the retry finds the topic created (or deleted) by it."""
    with Client(cluster.bootstrap, attempt_timeout_ms=15, request_timeout_ms=30000) as client:
        for i in range(5):
            client.create_topic(f"slow{i}", 2)
            assert sorted(cluster.client.wait_for_leaders(f"slow{i}").partitions) == [0, 1]
        for i in range(5):
            client.delete_topic(f"slow{i}")


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException | None]]:
    """A thread (not started) that makes ``call``, and the list its outcome goes to: None,
    or what it raised (the test's verdict)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    return threading.Thread(target=run), outcome


def test_a_create_retried_while_its_first_attempt_is_being_committed_succeeds(
    tmp_path: Path,
) -> None:
    """The controller's followers stopped: its metadata record cannot commit, the client's
    attempts time out and are retried while the first create is still pending. A retry
    asking the same waits for that create's answer (before, it was refused with
    TOPIC_ALREADY_EXISTS for a topic no node showed, and the call failed); the call
    succeeds once the followers are back. A different ask is still refused."""
    with LocalCluster(3, tmp_path) as c:
        c.client.refresh_nodes()
        controller = c.client._controller_id  # the metadata leader
        followers = [n for n in c.procs if n != controller]
        with Client(
            c.bootstrap, attempt_timeout_ms=300, retry_backoff_ms=50, request_timeout_ms=30000
        ) as client:
            thread, outcome = _in_thread(lambda: client.create_topic("pending", 2))
            for n in followers:
                c.pause(n)
            try:
                thread.start()
                time.sleep(1.0)  # ~3 attempts, each timed out or waiting on the first
                assert not outcome, outcome  # nothing answered while nothing can commit
                with pytest.raises(TopicExistsError):
                    c.client.create_topic("pending", 3)  # another ask: refused at once
            finally:
                for n in followers:
                    c.resume(n)
            thread.join(30)
            assert outcome == [None]
            assert sorted(client.wait_for_leaders("pending").partitions) == [0, 1]


def _metadata_high_watermark(c: LocalCluster, node: int) -> int:
    quorum = node_request(
        c,
        node,
        ApiKey.DESCRIBE_QUORUM,
        m.DescribeQuorumRequest(topic=METADATA_TOPIC, partition=0),
        m.DescribeQuorumResponse,
    )
    return quorum.high_watermark


def test_a_new_metadata_leader_decides_a_create_on_the_records_it_inherits(
    tmp_path: Path,
) -> None:
    """The metadata leader writes a create it cannot commit (its followers stopped), is
    killed and restarted, and leads again after an unclean election: its log holds that
    record, which its new epoch will commit, but no topic applied from it (as a leader
    of an ordinary election may inherit records of an earlier epoch). A create of the
    same name with another ask is decided once that record is committed: refused, the
    topic keeping the first ask's two partitions. Before, the leader decided on the
    topics it had applied, found none and wrote a second record, and once both
    committed the second's replicas replaced the first's: three partitions."""
    with LocalCluster(3, tmp_path) as c:
        c.client.create_topic("before", 1)  # the leader's epoch is committed
        controller = c.client._controller_id  # the metadata leader
        followers = [n for n in c.procs if n != controller]
        with Client(
            c.bootstrap, attempt_timeout_ms=300, retry_backoff_ms=50, request_timeout_ms=30000
        ) as second:
            thread, outcome = _in_thread(lambda: second.create_topic("twice", 3))
            for n in followers:
                c.pause(n)
            try:
                # Asking the leader only: the create reaches it at once, not after a
                # stopped node's attempt timed out.
                leader = f"{c.host}:{c.ports[controller]}"
                with Client(leader, attempt_timeout_ms=300, request_timeout_ms=1000) as first:
                    with pytest.raises(QuorumLogError):
                        first.create_topic("twice", 2)
                quorum = node_request(
                    c,
                    controller,
                    ApiKey.DESCRIBE_QUORUM,
                    m.DescribeQuorumRequest(topic=METADATA_TOPIC, partition=0),
                    m.DescribeQuorumResponse,
                )
                (own,) = [v for v in quorum.voters if v.replica_id == controller]
                assert own.end_offset > quorum.high_watermark  # written, never committed
                c.restart(controller)  # kill -9: the create's handler is gone, its record kept
                wait_until(
                    lambda: c.client.force_leader(METADATA_TOPIC, 0, controller, confirm=True),
                    30,
                    "an unclean election of the restarted metadata leader",
                )
                thread.start()
                time.sleep(1.0)  # ~3 attempts, each waiting for the inherited record
                assert not outcome, outcome  # nothing decided while it cannot commit
                # One follower back: the leader and it commit the inherited record. Both
                # back at once, their election timers (run out while stopped) could make
                # one of them lead an ordinary epoch below the forced one before either
                # heard of it, and commit there the create the forced leader must refuse:
                # the loss an unclean election allows, not what this test is about.
                c.resume(followers[0])
                wait_until(
                    lambda: _metadata_high_watermark(c, controller) >= own.end_offset,
                    30,
                    "the inherited record committed by the leader and one follower",
                )
            finally:
                for n in followers:
                    c.resume(n)
            thread.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], TopicExistsError), outcome
        assert sorted(c.client.wait_for_leaders("twice").partitions) == [0, 1]
