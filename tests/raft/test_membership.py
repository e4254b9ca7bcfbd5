"""Voter-set changes on one partition's quorum (KIP-853, ``raft.membership``): one voter
at a time, after an entry of the leader's epoch and the previous change are committed,
adding only a caught-up replica; a leader that removes itself resigns once that
commits; a follower takes the voters from its log and drops them with a truncation."""

from __future__ import annotations

import dataclasses

import pytest
from quorumlog.replica.protocol.errors import ErrorCode
from quorumlog.replica.raft import Role, VoterChangeError

from tests.sim.memlog import client_batch

from .harness import Cluster, answer, fetch, leader_with_records


def produce(c: Cluster, leader: int, ids: list[int]) -> None:
    _, _, out = c.cores[leader].append(client_batch(ids), c.now)
    c.apply(leader, out)
    c.advance(200)


def test_an_observer_is_added_once_caught_up_and_then_counts() -> None:
    c = Cluster(voters=(1, 2, 3), observers=(4,))
    leader = c.elect()
    produce(c, leader, [1, 2, 3])
    c.advance(2000)  # the observer finds the leader and fetches
    core = c.cores[leader]
    with pytest.raises(VoterChangeError, match="one voter at a time"):
        core.change_voters([1, 2, 3, 4, 5], c.now)
    c.apply(leader, core.change_voters([1, 2, 3, 4], c.now))
    assert core.voters == (1, 2, 3, 4) and core.voter_change_pending
    with pytest.raises(VoterChangeError) as pending:
        core.change_voters([1, 2, 4], c.now)
    assert pending.value.error == ErrorCode.REQUEST_TIMED_OUT
    c.advance(300)
    assert not core.voter_change_pending
    assert c.cores[4].voters == (1, 2, 3, 4) and c.cores[4].is_voter
    # Two of the old voters gone: the new majority (3 of 4) still commits with node 4.
    others = [v for v in (1, 2, 3) if v != leader]
    c.down.add(others[0])
    end = c.cores[leader].high_watermark
    produce(c, leader, [4, 5])
    assert c.cores[leader].high_watermark > end


def test_a_replica_not_caught_up_is_not_added() -> None:
    c = Cluster(voters=(1, 2, 3), observers=(4,))
    c.down.add(4)
    leader = c.elect()
    produce(c, leader, [1, 2, 3])
    assert "has not caught up" in (c.cores[leader].voter_change_problem([1, 2, 3, 4], c.now) or "")


def test_an_observer_that_keeps_up_under_steady_appends_is_added() -> None:
    """Records keep coming: every fetch of the observer lands on the end the leader had at
    its previous fetch, never on the high watermark when the leader checks. It has caught
    up all the same (Kafka's lastCaughtUpTimestamp); one that stays behind has not."""
    leader = leader_with_records()
    keeping_up, behind, reported = 0, 0, 0
    for t in range(100, 1100, 100):
        leader.append(client_batch([t]), t)
        leader.log.flush()
        leader.on_log_flushed(t)
        end = leader.log.end_offset
        answer(leader, fetch(2, 2, end, 2), t)  # a voter keeps the high watermark at the end
        answer(leader, fetch(4, 2, keeping_up, 2), t)
        reported, keeping_up = keeping_up, end  # it got the records up to the end
        answer(leader, fetch(5, 2, behind, 2), t)
    assert leader.high_watermark == leader.log.end_offset > reported
    assert leader.voter_change_problem([1, 2, 3, 4], 1000) is None
    assert "has not caught up" in (leader.voter_change_problem([1, 2, 3, 5], 1000) or "")
    # Caught up a fetch timeout ago, and not since: no longer.
    later = 1000 + leader.config.fetch_timeout_ms + 100
    assert "has not caught up" in (leader.voter_change_problem([1, 2, 3, 4], later) or "")


def test_a_replica_is_added_only_on_a_catch_up_of_the_replica_there_is_now() -> None:
    """What the leader knows of a replica may be of one that no longer exists: a removed
    voter keeps its row (caught up) as an observer, and its node deletes the replica and
    makes it anew, empty, if a move brings it back within a fetch timeout. Added on that
    row, an empty voter would hold up every commit that needs it (a majority of four is
    three) for as long as it copies the partition, unthrottled. So a voter added must
    have caught up since the change was asked for (``asked_ms``), and a fetch from below
    the row's offset (a log that lost its end) clears its catch-up."""
    leader = leader_with_records()
    end = leader.log.end_offset
    answer(leader, fetch(2, 2, end, 2), 50)  # a voter: the epoch's entries commit
    answer(leader, fetch(4, 2, end, 2), 100)  # observer 4 at the end: caught up at 100
    assert leader.voter_change_problem([1, 2, 3, 4], 200) is None
    # The move back is asked for at 150, after that catch-up: not counted.
    problem = leader.voter_change_problem([1, 2, 3, 4], 200, asked_ms=150)
    assert "has not caught up" in (problem or "")
    with pytest.raises(VoterChangeError, match="has not caught up"):
        leader.change_voters([1, 2, 3, 4], 200, asked_ms=150)
    next_fetch = dataclasses.replace(fetch(4, 2, end, 2), request_id=8)
    answer(leader, next_fetch, 250)  # its next fetch, at the end since: added
    assert leader.voter_change_problem([1, 2, 3, 4], 300, asked_ms=150) is None
    # Replica 5 caught up, then its log starts over (a replica made anew, empty).
    answer(leader, fetch(5, 2, end, 2), 300)
    assert leader.voter_change_problem([1, 2, 3, 5], 300) is None
    answer(leader, fetch(5, 2, 0, -1), 350)
    assert "has not caught up" in (leader.voter_change_problem([1, 2, 3, 5], 400) or "")


def test_a_leader_that_removes_itself_leads_until_that_commits_then_resigns() -> None:
    c = Cluster(voters=(1, 2, 3))
    leader = c.elect()
    produce(c, leader, [1, 2])
    core = c.cores[leader]
    rest = sorted(v for v in (1, 2, 3) if v != leader)
    c.apply(leader, core.change_voters(rest, c.now))
    assert core.role is Role.LEADER and not core.is_voter
    described = core.describe(c.now)
    assert [v.replica_id for v in described.voters] == rest
    assert [o.replica_id for o in described.observers] == [leader]
    c.advance(300)
    assert core.role is not Role.LEADER
    new = c.elect()
    assert new in rest and c.cores[new].voters == tuple(rest)
    produce(c, new, [3])
    assert c.cores[new].high_watermark == c.logs[new].end_offset


def test_a_truncated_change_is_undone_on_the_follower() -> None:
    c = Cluster(voters=(1, 2, 3), observers=(4,))
    leader = c.elect()
    produce(c, leader, [1])
    c.advance(2000)
    follower = next(v for v in (1, 2, 3) if v != leader)
    log = c.logs[follower]
    end = log.end_offset
    c.apply(leader, c.cores[leader].change_voters([1, 2, 3, 4], c.now))
    c.advance(100)
    assert c.cores[follower].voters == (1, 2, 3, 4)
    log.truncate_to(end)
    assert c.cores[follower].voters == (1, 2, 3)


def test_a_replica_catching_up_after_losing_data_is_not_added() -> None:
    """A move's new copy (or one whose data was lost) may not vote until caught back up:
    added before, a two-voter set could neither elect nor commit (seed 2300 of the sim)."""
    c = Cluster(voters=(1, 2, 3), observers=(4,))
    leader = c.elect()
    produce(c, leader, [1, 2, 3])
    others = {v for v in (1, 2, 3) if v != leader}
    c.down |= others  # node 4 gets no floor: it needs the epochs of two voters
    c.apply(4, c.cores[4].begin_catch_up(c.now))
    c.advance(200)
    assert c.cores[4].catching_up and c.cores[leader].is_leader
    assert "catching up" in (c.cores[leader].voter_change_problem([1, 2, 3, 4], c.now) or "")
    c.down -= others
    c.advance(2000)
    assert not c.cores[4].catching_up
    assert c.cores[leader].voter_change_problem([1, 2, 3, 4], c.now) is None


def test_a_fetch_handled_again_tells_nothing_new_of_its_replica() -> None:
    """A long-poll answered later (or a fetch delivered twice) shows the replica as it
    was when the fetch arrived. In seed 3181 of the sim the old copy's parked fetch,
    answered after that copy was deleted and a move asked for the node back, had the
    leader count the new, empty copy as caught up since the move was asked."""
    leader = leader_with_records()
    end = leader.log.end_offset
    answer(leader, fetch(2, 2, end, 2), now=10)  # commits an entry of epoch 2
    parked = fetch(4, 2, end, 2)
    answer(leader, parked, now=100)  # observer 4 at the leader's end at t=100
    asked = 200  # then a move asks for node 4
    answer(leader, parked, now=300)  # the same fetch, handled again at its expiry
    problem = leader.voter_change_problem([1, 2, 3, 4], 300, asked_ms=asked)
    assert "has not caught up" in (problem or "")
    answer(leader, dataclasses.replace(parked, request_id=8), now=310)  # its next fetch
    assert leader.voter_change_problem([1, 2, 3, 4], 310, asked_ms=asked) is None


def test_a_voter_just_added_counts_once_it_holds_the_record_that_added_it() -> None:
    """Until its log holds the voter-set record that added it, a replica does not know it
    is a voter, and its node, on a view of the move that lags the leader's, may delete
    it as moved off: the leader does not count it before then. Counted, it would commit
    records that only the leader and node 2 hold, on a copy about to be gone."""
    leader = leader_with_records()
    end = leader.log.end_offset
    answer(leader, fetch(2, 2, end, 2), 10)  # commits an entry of epoch 2
    leader.append(client_batch([4, 5]), 20)
    leader.log.flush()
    leader.on_log_flushed(20)
    top = leader.log.end_offset
    answer(leader, fetch(4, 2, top, 2), 30)  # observer 4 holds them, caught up
    leader.change_voters([1, 2, 3, 4], 40)
    added_at = leader.log.voters_offset
    leader.log.flush()
    leader.on_log_flushed(40)
    answer(leader, dataclasses.replace(fetch(2, 2, top, 2), request_id=8), 50)
    assert leader.high_watermark == end  # node 4 (at the record's offset) does not count
    answer(leader, dataclasses.replace(fetch(4, 2, added_at + 1, 2), request_id=8), 60)
    assert leader.high_watermark == top  # it holds the record now: 1, 2 and 4 hold top


def test_a_replica_whose_node_does_not_host_it_yet_is_not_added() -> None:
    """A node whose view of a move lags the leader's still takes its copy for one the
    move took off, and may delete it: until its fetches say ``assigned`` the leader does
    not add it (it would add a copy about to be gone, and then an empty one)."""
    leader = leader_with_records()
    end = leader.log.end_offset
    answer(leader, fetch(2, 2, end, 2), 10)  # commits an entry of epoch 2
    lagging = dataclasses.replace(fetch(4, 2, end, 2), assigned=False)
    answer(leader, lagging, 20)  # at the leader's end, but its node has not seen the move
    assert "has not seen the move" in (leader.voter_change_problem([1, 2, 3, 4], 30) or "")
    answer(leader, dataclasses.replace(lagging, request_id=8, assigned=True), 40)
    assert leader.voter_change_problem([1, 2, 3, 4], 50) is None
