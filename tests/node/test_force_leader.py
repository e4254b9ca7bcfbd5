"""Unclean leader election: force-leader on a replica that missed committed records
makes it lead a new epoch; the others follow it and truncate committed data, and
OffsetsForLeaderEpoch reports the divergence point (KIP-320's truncation detection)."""

from __future__ import annotations

from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey, ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import UNCLEAN_EPOCH_GAP

from tests.support.cluster import (
    assert_replicas_identical,
    create_and_find_leader,
    find_leader,
    freeze_and_stop,
    local_view,
    node_request,
    produce_batches,
    produce_direct,
    produce_to,
    read_all,
    replica_logs,
    wait_caught_up,
    wait_hwm,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_force_leader_on_minority_truncates_committed_records(tmp_path: Path) -> None:
    topic = "unclean"
    with LocalCluster(3, tmp_path) as c:
        leader, old_epoch = create_and_find_leader(c, topic)
        minority, other = [n for n in c.ports if n != leader]
        base = produce_batches(c, topic, 2, 10, "base")
        wait_caught_up(c, leader, topic, 0, [minority, other])

        c.pause(minority)
        committed = produce_direct(c, leader, topic, 4, 10, "committed")  # leader + other
        old_end = committed[-1][0] + 1
        # The majority is lost: the leader dies, the other follower stops answering.
        c.kill(leader)
        c.pause(other)
        c.resume(minority)

        forced_epoch = c.force_leader(topic, 0, minority)
        # Far above any epoch an ordinary election among the unreachable voters can reach.
        assert forced_epoch >= old_epoch + UNCLEAN_EPOCH_GAP
        view = local_view(c, minority, topic, 0)
        assert view is not None and view.is_local_leader and view.leader_epoch == forced_epoch
        # Where the minority's copy of the old epoch ends: the divergence point. (The first
        # committed batch may have reached it through a fetch parked before the pause.)
        answer = node_request(
            c,
            minority,
            ApiKey.OFFSETS_FOR_LEADER_EPOCH,
            m.OffsetsForLeaderEpochRequest(
                topic=topic, partition=0, current_leader_epoch=forced_epoch, leader_epoch=old_epoch
            ),
            m.OffsetsForLeaderEpochResponse,
        )
        assert answer.error == 0 and answer.leader_epoch == old_epoch
        divergence = answer.end_offset
        assert divergence in (committed[0][0], committed[10][0]), (divergence, committed[0])
        assert divergence < old_end

        # The others return and follow the forced leader's higher epoch, truncating.
        c.resume(other)
        c.start_node(leader)
        new = produce_direct(c, minority, topic, 2, 10, "new", timeout_ms=20000)
        assert {e for _, e, _ in new} == {forced_epoch}
        wait_caught_up(c, minority, topic, 0, c.ports)
        assert find_leader(c, topic, 0, c.ports) == (minority, forced_epoch)

        # KIP-320: a consumer positioned at the old committed end (epoch old_epoch) asks
        # for the end of that epoch and learns it was truncated at the divergence point.
        ans = c.client.offsets_for_leader_epoch(
            topic, 0, old_epoch, current_leader_epoch=forced_epoch
        )
        assert tuple(ans) == (old_epoch, divergence)
        assert ans.end_offset < old_end
        kept = [r for r in committed if r[0] < divergence]
        wait_hwm(c, topic, new[-1][0] + 1)
        assert read_all(c.client, topic, 0) == base + kept + new
        # The replicas that held the committed records say so (an unclean election).
        warnings = [
            n for n in (leader, other) if "committed records were truncated" in c.tail(n, 400)
        ]
        assert warnings, "no replica reported truncating committed records"
        freeze_and_stop(c)

    same = assert_replicas_identical(replica_logs(c, topic, 0))
    assert same.user_records() == base + kept + new
    assert dict(same.epochs)[forced_epoch] == divergence


def test_force_leader_then_majority_restarts_no_split_brain(tmp_path: Path) -> None:
    """The majority is killed, the survivor is forced to lead, then both dead replicas
    restart at once. Whoever ends up leading (the forced leader resigns by check-quorum
    if no voter fetches within 1.5 x fetch timeout), no epoch may have two leaders: all
    replicas converge to one log. Before the node passed UNCLEAN_EPOCH_GAP, a restarted
    replica could win an ordinary election in the forced epoch itself (split brain)."""
    topic = "unclean2"
    with LocalCluster(3, tmp_path) as c:
        leader, old_epoch = create_and_find_leader(c, topic)
        minority, other = [n for n in c.ports if n != leader]
        produce_batches(c, topic, 1, 10, "base")
        wait_caught_up(c, leader, topic, 0, [minority, other])
        c.pause(minority)
        for b in range(3):
            assert produce_to(c, leader, topic, 0, [f"c-{b}".encode()] * 10).error == 0
        c.kill(leader)
        c.kill(other)
        c.resume(minority)
        forced_epoch = c.force_leader(topic, 0, minority)
        assert forced_epoch >= old_epoch + UNCLEAN_EPOCH_GAP
        c.start_node(leader)
        c.start_node(other)
        winner, epoch = find_leader(c, topic, 0, c.ports, min_epoch=forced_epoch)
        r = produce_to(c, winner, topic, 0, [b"after"], timeout_ms=20000)
        if r.error != 0:  # leadership may still move once; then it settles
            winner, epoch = find_leader(c, topic, 0, c.ports, min_epoch=epoch + 1)
            r = produce_to(c, winner, topic, 0, [b"after"], timeout_ms=20000)
        assert r.error == 0, r
        wait_caught_up(c, winner, topic, 0, c.ports)
        print(
            f"\nforced leader {minority} (epoch {forced_epoch}); final leader {winner} (epoch {epoch})"
        )
        freeze_and_stop(c)
    logs = replica_logs(c, topic, 0)
    same = assert_replicas_identical(logs)
    epochs = [e for e, _ in same.epochs]
    assert epochs == sorted(set(epochs))


def test_force_leader_refuses_without_confirm(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic("careful", 1)
        leader = c.leader_of("careful", 0)
        with pytest.raises(ValueError, match="confirm"):
            c.client.force_leader("careful", 0, leader, confirm=False)
        resp = node_request(
            c,
            leader,
            ApiKey.FORCE_LEADER,
            m.ForceLeaderRequest(topic="careful", partition=0, confirm=False),
            m.ForceLeaderResponse,
        )
        assert resp.error == ErrorCode.INVALID_REQUEST
        assert find_leader(c, "careful", 0, [leader])[0] == leader
