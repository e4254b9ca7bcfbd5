"""Gray failure: the leader an existing Client talks to hangs (SIGSTOP: a stalled VM, a
long GC, a hung disk). Each attempt has its own timeout inside the call's deadline, the
hung connection is dropped, metadata comes from the nodes that answer, and the retry goes
to the new leader: producing (acks=quorum) and fetching go on while it stays stopped
(how soon, the issue's bar of 3 s, is printed as a figure, not judged)."""

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
def test_existing_client_produces_and_fetches_after_leader_sigstop(
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
            # Both answered by the new leader while the old one stays stopped, within the
            # 15 s joins: their 30 s request timeout could not have (the 3 s bar is
            # the figure printed above; a loaded machine stretches it, so it is not judged).
            assert produce.result.leader_epoch > first.leader_epoch
            assert [r["value"] for r in fetch.result][:1] == [b"after"], fetch.result
            # It keeps going: later calls go to the new leader, whose metadata both clients
            # now hold, and need none again (no attempt failed on the way).
            new_leader = producer.partition_metadata(TOPIC, 0).leader_id
            assert new_leader != leader
            assert consumer.partition_metadata(TOPIC, 0).leader_id == new_leader
            for i in range(5):
                producer.produce(TOPIC, 0, encode_batch([f"more{i}".encode()]))
                consumer.fetch(TOPIC, 0, end)
            assert producer.partition_metadata(TOPIC, 0).leader_id == new_leader
            assert consumer.partition_metadata(TOPIC, 0).leader_id == new_leader
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
            with pytest.raises(RequestTimeoutError, match="may have been appended") as info:
                client.produce(TOPIC, 0, encode_batch([b"no-quorum"]))
        finally:
            for n in followers:
                c.resume(n)
    # raised once the call's deadline had passed (the retry loop's check), as it says
    assert "PRODUCE on hung/0 did not succeed within 3000 ms" in str(info.value)
    c.wait_for_leader(TOPIC, 0)


def test_a_call_waiting_for_a_new_leader_asks_again_every_few_hundred_ms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After its attempts so far (a timed-out one costs 1.5 s), a call that finds no leader
    it can use (LEADER_NOT_AVAILABLE: an election running, or its leader suspected) backs
    off at the second step, 0.16-0.24 s, not the exponential's 0.8-1.2 s: it answers
    within ~0.25 s of the election instead of up to 1.2 s later. No node is contacted."""
    client = Client("127.0.0.1:1")
    for attempt in range(10):
        assert client.backoff_s(attempt, waiting_for_leader=True) <= 0.24
    assert client.backoff_s(4) >= 0.8  # other failures still back off exponentially
    # The retry loop itself: 9 asks find no leader, the 10th finds one. Every pause it
    # chose between them was the leader-waiting one (recorded as chosen, still slept).
    pauses: list[tuple[int, bool, float]] = []
    real_backoff_s = client.backoff_s

    def recording(attempt: int, *, waiting_for_leader: bool = False) -> float:
        pause = real_backoff_s(attempt, waiting_for_leader=waiting_for_leader)
        pauses.append((attempt, waiting_for_leader, pause))
        return pause

    monkeypatch.setattr(client, "backoff_s", recording)
    asked: list[int] = []

    def attempt(deadline: float) -> str:
        asked.append(len(asked))
        if len(asked) < 10:
            raise LeaderNotAvailableError("an election is running")
        return "led"

    assert client._retrying("a lookup", 60_000, attempt, (LeaderNotAvailableError,)) == "led"
    print(f"\npauses between asks: {[round(p, 3) for _, _, p in pauses]}")
    assert len(asked) == 10 and [a for a, _, _ in pauses] == list(range(9))
    assert all(waiting and pause <= 0.24 for _, waiting, pause in pauses), pauses
