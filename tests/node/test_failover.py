"""Crash and graceful failover on fresh clusters: kill -9 of a leader loses no
acknowledged record; SIGTERM hands leadership over at once (EndQuorumEpoch); a follower
with an unacknowledged tail truncates it through the DivergingEpoch answer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from quorumlog.replica import defaults
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.perf.failover import trial as failover_trial
from quorumlog.replica.storage.records import encode_batch

from tests.support.cluster import (
    FETCH_TIMEOUT_S,
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

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_kill9_leader_loses_no_acknowledged_record(tmp_path: Path) -> None:
    topic = "crash"
    with LocalCluster(3, tmp_path) as c:
        old_leader, old_epoch = create_and_find_leader(c, topic)
        acked = produce_batches(c, topic, 8, 40, "before")  # 320 records in 8 batches
        assert len(acked) == 320

        t0 = time.monotonic()
        c.kill(old_leader)
        others = [n for n in c.ports if n != old_leader]
        new_leader, new_epoch = find_leader(c, topic, 0, others, min_epoch=old_epoch + 1)
        failover_s = time.monotonic() - t0
        print(f"\nkill -9 failover: new leader {new_leader} in {failover_s:.3f}s")
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


def test_sigterm_leader_hands_over_quickly(tmp_path: Path) -> None:
    topic = "graceful"
    with LocalCluster(3, tmp_path) as c:
        leader, epoch = create_and_find_leader(c, topic)
        acked = produce_batches(c, topic, 3, 30, "g")
        others = [n for n in c.ports if n != leader]
        wait_caught_up(c, leader, topic, 0, others)

        t0 = time.monotonic()
        c.terminate(leader)  # SIGTERM: EndQuorumEpoch to the followers, then exit
        new_leader, new_epoch = find_leader(
            c, topic, 0, others, min_epoch=epoch + 1, timeout_s=10, interval_s=0.005
        )
        handover_s = time.monotonic() - t0
        print(f"\nSIGTERM handover: node {leader} -> {new_leader} in {handover_s * 1000:.0f} ms")
        # Without EndQuorumEpoch a follower would wait out its fetch timeout (800 ms) and an
        # election timeout (>= 400 ms) first.
        assert handover_s < 1.0, f"handover took {handover_s:.3f}s"
        assert handover_s < FETCH_TIMEOUT_S + 0.4
        assert "shutting down gracefully" in c.tail(leader, 200)
        assert c.procs[leader].returncode == 0
        wait_hwm(c, topic, acked[-1][0] + 1)
        assert read_all(c.client, topic, 0) == acked


def test_a_leader_killed_right_after_a_restart_is_replaced_at_once(tmp_path: Path) -> None:
    """``quorumlog perf failover``'s trial: each kill -9 of the leader comes as soon as
    the node killed before it is back. The survivors must not wait for the restarted
    node (ranked first, it may not follow the leader yet: ``PeerLiveness.settled``), nor
    lose their votes to it on a link still backing off (``PeerLink.heard_from``): each
    failover took 0.5-1.1 s in one trial of four or more without either; ~0.1-0.2 s
    with both. The first kill only sets the scene: it follows no restart, and it hits a
    partition seconds old whose third replica may not follow its leader yet (616 ms in
    one suite run).

    Known slow path, not fixed yet: the first trial after that scene (its restarted node
    led the partition's first epoch) took 0.9-1.06 s in about one suite run of six, under
    load, and never alone: the restarted node learnt the current epoch ~450 ms after its
    restart and did not stand on its hint. That trial is bounded by a fetch timeout plus
    an election timeout (what a failover without any hint takes); the four after it keep
    the 0.6 s bound."""
    payload = encode_batch([b"x"])
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("restarts", 1)
        failover_trial(c, "restarts", False, payload)
        first = failover_trial(c, "restarts", False, payload)
        took = [failover_trial(c, "restarts", False, payload) for _ in range(4)]
    print("\nkill -9 -> acknowledged produce:", [f"{t * 1000:.0f} ms" for t in [first, *took]])
    assert first < FETCH_TIMEOUT_S + defaults.QUORUM_ELECTION_TIMEOUT_MS / 1000, first
    assert max(took) < 0.6, took


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
