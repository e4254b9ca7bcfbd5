"""Gray failure: the leader an existing Client talks to hangs (SIGSTOP: a stalled VM, a
long GC, a hung disk). Each attempt has its own timeout inside the call's deadline, the
hung connection is dropped, metadata comes from the nodes that answer, and the retry goes
to the new leader: producing (acks=quorum) and fetching go on within 3 s."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from quorumlog.replica.client import Client, RequestTimeoutError
from quorumlog.replica.client.errors import LeaderNotAvailableError
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage.records import encode_batch

from tests.support.waits import retry

TOPIC = "hung"
BAR_S = 3.0  # the bar: within 3 s of the leader being SIGSTOPped


class _Timed(threading.Thread):
    """Runs ``fn`` once; records when it returned (or what it raised)."""

    def __init__(self, fn: Any) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done_at: float | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.done_at = time.monotonic()


@pytest.fixture(scope="module")
def cluster(cluster: LocalCluster) -> LocalCluster:
    """The module's cluster (tests/support) with TOPIC; every test leaves every node running."""
    cluster.create_topic(TOPIC, 1)
    return cluster


@pytest.mark.cluster
def test_existing_client_produces_and_fetches_within_3s_of_leader_sigstop(
    cluster: LocalCluster,
) -> None:
    c = cluster
    # Two long-lived clients with default settings, both connected to the leader.
    with Client(c.bootstrap) as producer, Client(c.bootstrap) as consumer:
        first = producer.produce(TOPIC, 0, encode_batch([b"before"]))
        end = first.last_offset + 1
        assert consumer.fetch(TOPIC, 0, first.base_offset).records
        leader = producer.partition_metadata(TOPIC, 0).leader_id
        assert consumer.partition_metadata(TOPIC, 0).leader_id == leader
        leader_addr = producer._nodes[leader]
        hung_conn = producer._conns[leader_addr]
        c.pause(leader)
        paused_at = time.monotonic()
        try:
            # Both calls start while the old leader is hung and the cached metadata still
            # names it: the first attempt of each goes to the hung socket.
            produce = _Timed(lambda: producer.produce(TOPIC, 0, encode_batch([b"after"])))
            first_answer: list[float] = []

            def consume() -> list[dict[str, Any]]:
                """Long polls from ``end`` until a user record arrives (the new leader's
                control record comes first)."""
                pos = end
                for _ in range(100):
                    res = consumer.fetch(TOPIC, 0, pos, max_wait_ms=5000)
                    first_answer.append(time.monotonic())
                    rows: list[dict[str, Any]] = res.to_arrow(start_offset=pos).to_pylist()
                    if rows:
                        return rows
                    last = res.last_offset_and_epoch()
                    if last is not None:
                        pos = last.offset + 1
                raise AssertionError("no user record after 100 fetches")

            fetch = _Timed(consume)
            produce.start()
            fetch.start()
            produce.join(15)
            fetch.join(15)
            assert produce.done_at is not None, "produce still blocked 15 s after SIGSTOP"
            assert fetch.done_at is not None, "fetch still blocked 15 s after SIGSTOP"
            assert produce.error is None, produce.error
            assert fetch.error is None, fetch.error
            produce_gap = produce.done_at - paused_at
            fetch_gap = fetch.done_at - paused_at
            print(
                f"after SIGSTOP: produce acknowledged in {produce_gap:.2f} s, first fetch "
                f"answer in {first_answer[0] - paused_at:.2f} s, the new record fetched "
                f"in {fetch_gap:.2f} s"
            )
            assert produce.result.leader_epoch > first.leader_epoch
            assert [r["value"] for r in fetch.result][:1] == [b"after"], fetch.result
            assert produce_gap < BAR_S, f"produce recovered {produce_gap:.2f} s after SIGSTOP"
            assert fetch_gap < BAR_S, f"fetch recovered {fetch_gap:.2f} s after SIGSTOP"
            # It keeps going: later calls go to the new leader at once.
            t0 = time.monotonic()
            for i in range(5):
                producer.produce(TOPIC, 0, encode_batch([f"more{i}".encode()]))
                consumer.fetch(TOPIC, 0, end)
            assert time.monotonic() - t0 < BAR_S
        finally:
            c.resume(leader)
        # The connection that timed out was closed, never reused: once the old leader
        # wakes it answers the produce it had queued into a closed socket, and a new
        # connection to it gets the answer to its own request.
        assert hung_conn.closed
        versions = retry(lambda: producer.api_versions(leader), 30)
        assert versions.error == 0 and versions.node_id == leader and versions.apis
        assert producer._conns[leader_addr] is not hung_conn


@pytest.mark.cluster
def test_produce_without_a_quorum_fails_at_its_deadline_saying_it_may_have_appended(
    cluster: LocalCluster,
) -> None:
    """Both followers hung: each attempt's quorum wait fits in the attempt, retries go on
    until the call's deadline, and the error says the records may have been appended."""
    c = cluster
    leader = c.wait_for_leader(TOPIC, 0)
    followers = [n for n in c.ports if n != leader]
    with Client(c.bootstrap, request_timeout_ms=3000) as client:
        client.produce(TOPIC, 0, encode_batch([b"with-quorum"]))
        for n in followers:
            c.pause(n)
        try:
            t0 = time.monotonic()
            with pytest.raises(RequestTimeoutError, match="may have been appended") as info:
                client.produce(TOPIC, 0, encode_batch([b"no-quorum"]))
            took = time.monotonic() - t0
        finally:
            for n in followers:
                c.resume(n)
    assert 3.0 <= took < 3.0 + 1.5 + 1.0, took  # the deadline, plus at most one attempt
    assert "PRODUCE on hung/0" in str(info.value)
    c.wait_for_leader(TOPIC, 0)


def test_a_call_waiting_for_a_new_leader_asks_again_every_few_hundred_ms() -> None:
    """After its attempts so far (a timed-out one costs 1.5 s), a call that finds no leader
    it can use (LEADER_NOT_AVAILABLE: an election running, or its leader suspected) backs
    off at the second step, 0.16-0.24 s, not the exponential's 0.8-1.2 s: it answers
    within ~0.25 s of the election instead of up to 1.2 s later. No node is contacted."""
    client = Client("127.0.0.1:1")
    for attempt in range(10):
        assert client.backoff_s(attempt, waiting_for_leader=True) <= 0.24
    assert client.backoff_s(4) >= 0.8  # other failures still back off exponentially
    started = time.monotonic()
    elected_at = started + 1.9  # between the exponential's 4th retry (<=1.8 s) and 5th (>=2 s)
    asked: list[float] = []

    def attempt(deadline: float) -> str:
        asked.append(time.monotonic() - started)
        if time.monotonic() < elected_at:
            raise LeaderNotAvailableError("an election is running")
        return "led"

    assert client._retrying("a lookup", 10_000, attempt, (LeaderNotAvailableError,)) == "led"
    late = time.monotonic() - elected_at
    print(f"\nanswered {late * 1000:.0f} ms after the election; asked at {asked}")
    assert late < 0.3
    assert len(asked) >= 9  # every ~0.2 s for 1.9 s
