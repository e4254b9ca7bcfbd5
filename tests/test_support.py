"""The shared test helpers (tests/support) keep their promises: waits are bounded and
return what they waited for, retries stop at their deadline, hand-made frames read back, and xdist's workers are
given whole modules."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace

import pytest
from quorumlog.replica.client.errors import QuorumLogError
from quorumlog.replica.protocol import FrameError
from quorumlog.replica.protocol import messages as m

from tests.support import messages
from tests.support.scheduling import LOCAL_CLUSTER_MODULES, LOCAL_CLUSTER_UNIT, unit_of
from tests.support.spark import REPO
from tests.support.spies import record_calls
from tests.support.waits import retry, wait_until
from tests.support.wire import read_frame, request_frame


def test_wait_until_is_bounded() -> None:
    polls: list[int] = []
    with pytest.raises(AssertionError, match="never"):
        wait_until(lambda: polls.append(1), 0.1, "never")  # None: never true
    # bounded in polls as well as in time (a count a loaded machine cannot stretch)
    assert 1 <= len(polls) <= int(0.1 / 0.02) + 100


def test_wait_until_returns_the_value_and_shows_the_last_transient_error() -> None:
    calls: list[int] = []

    def third_time() -> str | None:
        calls.append(1)
        if len(calls) == 1:
            raise QuorumLogError("electing")
        return "ready" if len(calls) >= 3 else None

    assert wait_until(third_time, 5, "the third call", interval=0.001) == "ready"

    def failing() -> None:
        raise OSError("refused")

    with pytest.raises(AssertionError, match=r"a node \(last error: refused\)"):
        wait_until(failing, 0.05, "a node", interval=0.001)


def test_wait_until_lets_other_errors_through() -> None:
    def broken() -> None:
        raise KeyError("a bug, not a transient state")

    with pytest.raises(KeyError):
        wait_until(broken, 5, "never")


def test_retry_retries_transient_errors_until_its_deadline() -> None:
    attempts: list[int] = []

    def flaky() -> int:
        attempts.append(1)
        if len(attempts) < 3:
            raise QuorumLogError("not leader")
        return 7

    assert retry(flaky, 5, interval=0.001) == 7 and len(attempts) == 3

    calls: list[int] = []

    def down() -> int:
        calls.append(1)
        raise ConnectionRefusedError("down")

    with pytest.raises(ConnectionRefusedError):
        retry(down, 0.05, interval=0.001)
    # gave up with the last error, within its poll budget and one last go
    assert 1 <= len(calls) <= int(0.05 / 0.001) + 101


def test_a_frame_made_by_hand_reads_back_and_a_cut_one_does_not() -> None:
    wire = request_frame(m.ApiKey.METADATA, m.MetadataRequest(topics=["t"]), correlation_id=9)
    frame = read_frame(wire)
    assert (frame.api_key, frame.correlation_id, frame.client_id) == (m.ApiKey.METADATA, 9, "test")
    with pytest.raises(FrameError):
        read_frame(wire[:-1])
    with pytest.raises(FrameError):
        read_frame(wire + b"\x00")


def test_message_factories_build_the_default_scene_and_take_any_field() -> None:
    leader_to_follower = (messages.CLUSTER, 1, 2)
    for make in (messages.vote_request, messages.begin_quorum_epoch, messages.end_quorum_epoch):
        msg = make()
        assert (msg.cluster_id, msg.src, msg.dst) == leader_to_follower
    resp = messages.fetch_response(leader_epoch=4, diverging_epoch=(1, 5), request_id=3)
    assert (resp.cluster_id, resp.src, resp.dst, resp.error) == (*leader_to_follower, 0)
    assert (resp.leader_epoch, resp.diverging_epoch, resp.request_id) == (4, (1, 5), 3)
    assert messages.vote_response().vote_granted and messages.vote_response().dst == 1
    fetch = messages.fetch_request(fetch_offset=9)
    assert (fetch.replica_id, fetch.dst, fetch.fetch_offset, fetch.catching_up) == (2, 1, 9, False)
    assert messages.consumer_fetch().current_leader_epoch == m.NO_EPOCH
    with pytest.raises(TypeError):
        messages.fetch_request(fetch_ofset=9)  # a misspelt field is refused, not ignored


def test_record_calls_records_each_first_argument_and_still_makes_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner = SimpleNamespace(double=lambda x: 2 * x, add=lambda x, y: x + y)
    calls = record_calls(monkeypatch, owner, "double", "add")
    assert owner.double(3) == 6
    assert owner.add(4, 5) == 9
    assert calls == [3, 4]
    monkeypatch.undo()
    assert owner.double(7) == 14
    assert calls == [3, 4]


def test_a_test_s_unit_of_work_is_its_module_or_the_local_cluster_unit() -> None:
    assert unit_of("tests/raft/test_log.py::test_append[3]") == "tests/raft/test_log.py"
    assert unit_of("tests/raft/test_log.py::TestX::test_y") == "tests/raft/test_log.py"
    assert len(LOCAL_CLUSTER_MODULES) >= 2
    for module in LOCAL_CLUSTER_MODULES:
        assert unit_of(f"{module}::test_x") == LOCAL_CLUSTER_UNIT
        # Still where it was, and still running Spark in local-cluster mode (itself or
        # through the driver script it starts).
        text = (REPO / module).read_text()
        assert "local-cluster" in text, module


@pytest.mark.cluster  # starts pytest workers
def test_xdist_runs_each_module_whole_on_one_worker() -> None:
    modules = ["tests/raft/test_corruption.py", "tests/protocol/test_scram.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-v", "-p",
         "no:cacheprovider", *modules],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The suite's own scheduler (tests/support/scheduling.py), not xdist's LoadFileScheduling.
    assert "scheduling tests via ModuleScheduling" in done.stdout, done.stdout[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module in re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", done.stdout):
        workers[module].add(worker)
    assert sorted(workers) == sorted(modules), done.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
