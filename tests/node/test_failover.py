"""Crash and graceful failover on fresh clusters: kill -9 of a leader loses no
acknowledged record; SIGTERM hands leadership over to ranked successors
(EndQuorumEpoch); a follower with an unacknowledged tail truncates it through the
DivergingEpoch answer. How long a failover takes is ``quorumlog perf failover``'s."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.perf.failover import trial as failover_trial
from quorumlog.replica.storage.records import encode_batch

from tests.support.cluster import (
    assert_replicas_identical,
    assert_tail_truncated,
    copy_log_dir,
    create_and_find_leader,
    find_leader,
    freeze_and_stop,
    produce_batches,
    produce_direct,
    read_all,
    read_log_dir,
    replica_logs,
    uncommitted_tail,
    wait_caught_up,
    wait_hwm,
)
from tests.support.waits import log_text

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_kill9_leader_loses_no_acknowledged_record(tmp_path: Path) -> None:
    topic = "crash"
    with LocalCluster(3, tmp_path) as c:
        old_leader, old_epoch = create_and_find_leader(c, topic)
        acked = produce_batches(c, topic, 8, 40, "before")  # 320 records in 8 batches
        assert len(acked) == 320

        c.kill(old_leader)
        others = [n for n in c.ports if n != old_leader]
        new_leader, new_epoch = find_leader(c, topic, 0, others, min_epoch=old_epoch + 1)
        assert new_epoch > old_epoch

        # A new leader's high watermark moves once it commits its first entry of its own
        # epoch (KIP-595). Until then it answers readers OFFSET_NOT_AVAILABLE, which the
        # client retries, never its stale HWM: read at once, every acknowledged record is
        # there.
        assert read_all(c.client, topic, 0) == acked
        after = produce_batches(c, topic, 3, 20, "after")
        assert {e for _, e, _ in after} == {new_epoch}
        assert after[0][0] > acked[-1][0]

        # The killed node restarts (Resigned in its old epoch), follows and catches up.
        c.start_node(old_leader)
        wait_caught_up(c, new_leader, topic, 0, c.ports)
        view = find_leader(c, topic, 0, [new_leader], min_epoch=new_epoch)
        assert view == (new_leader, new_epoch)
        assert read_all(c.client, topic, 0) == acked + after
        freeze_and_stop(c)

    logs = replica_logs(c, topic, 0)
    same = assert_replicas_identical(logs)
    assert same.user_records() == acked + after


def test_sigterm_leader_hands_over(tmp_path: Path) -> None:
    """SIGTERM: the leader resigns its epoch naming its followers as ranked successors
    (EndQuorumEpoch), exits cleanly, and one of them leads the next epoch with every
    acknowledged record. How soon is ``quorumlog perf failover``'s SIGTERM figure; the
    successors' ranks and waits are tests/raft/test_replication.py's."""
    topic = "graceful"
    with LocalCluster(3, tmp_path) as c:
        leader, epoch = create_and_find_leader(c, topic)
        acked = produce_batches(c, topic, 3, 30, "g")
        others = [n for n in c.ports if n != leader]
        wait_caught_up(c, leader, topic, 0, others)

        c.terminate(leader, timeout_s=60)  # SIGTERM: EndQuorumEpoch to the followers, then exit
        new_leader, new_epoch = find_leader(c, topic, 0, others, min_epoch=epoch + 1)
        assert new_epoch > epoch
        log = log_text(c, leader)
        resigned = re.search(
            rf"{topic}/0 \S+: replica {leader} resigns epoch {epoch} \(successors \((\d+), (\d+)\)\)",
            log,
        )
        assert resigned is not None, c.tail(leader, 200)
        assert sorted(int(n) for n in resigned.groups()) == sorted(others)
        assert log.index("shutting down gracefully") < resigned.start()
        assert f"node {leader} stopped" in log
        assert c.procs[leader].returncode == 0
        wait_hwm(c, topic, acked[-1][0] + 1)
        assert read_all(c.client, topic, 0) == acked


def test_a_leader_killed_right_after_a_restart_is_replaced(tmp_path: Path) -> None:
    """``quorumlog perf failover``'s trial: each kill -9 of the leader comes as soon as
    the node killed before it is back. The survivors must not wait for the restarted
    node (ranked first, it may not follow the leader yet: ``PeerLiveness.settled``), nor
    lose their votes to it on a link still backing off (``PeerLink.heard_from``). Here
    each trial's produce after the kill is acknowledged by a new leader, in a later
    epoch than the one before the kill, and no acknowledged record is lost; those two
    decisions are checked step by step in tests/driver/test_quiescence.py and
    tests/node/test_peer_link.py, and how long each failover takes (0.1-0.2 s with
    both, 0.5-1.1 s without either) is ``quorumlog perf failover``'s kill -9 figure."""
    payload = encode_batch([b"x"])
    trials = 6  # the first only sets the scene: it follows no restart
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("restarts", 1)
        for _ in range(trials):
            failover_trial(c, "restarts", False, payload)  # one produce before, one after
        records = read_all(c.client, "restarts", 0)
    assert [v for _, _, v in records] == [b"x"] * (2 * trials)
    epochs = [e for _, e, _ in records]
    for k in range(trials):
        assert epochs[2 * k + 1] > epochs[2 * k], (k, epochs)


def test_follower_truncates_diverged_tail_after_kill9(tmp_path: Path) -> None:
    """The leader appends a tail with acks=leader while its followers are stopped, is
    killed -9, the followers elect a new leader and write over those offsets; the old
    leader restarts, gets a DivergingEpoch on its first fetch and truncates the tail."""
    topic = "diverge"
    with LocalCluster(3, tmp_path) as c:
        leader, epoch = create_and_find_leader(c, topic)
        followers = [n for n in c.ports if n != leader]
        acked = produce_batches(c, topic, 2, 25, "acked")
        wait_caught_up(c, leader, topic, 0, followers)

        leak, tail = uncommitted_tail(c, leader, topic, epoch)
        c.kill(leader)
        # The tail reached the old leader's files (kill -9 keeps what was written).
        dead_copy = read_log_dir(copy_log_dir(c, leader, topic, 0, tmp_path))
        assert dead_copy.user_records()[-len(leak + tail) :] == leak + tail

        for f in followers:
            c.resume(f)
        new_leader, new_epoch = find_leader(c, topic, 0, followers, min_epoch=epoch + 1)
        after = produce_direct(c, new_leader, topic, 3, 10, "new")
        # The new epoch reuses the tail's offsets: the logs really diverge.
        assert after[0][0] <= tail[-1][0]

        c.start_node(leader)
        same = assert_tail_truncated(
            c, new_leader, topic, new_epoch, acked=acked, leak=leak, tail=tail, after=after
        )
    print(f"\nleaked batch replicated: {same.user_records() != acked + after}")
