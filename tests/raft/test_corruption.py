"""Damaged data (issue 12, item 3): a replica that finds it cuts its log there (a leader
resigns first) and re-fetches; until it is durably back past its old log end it neither
votes, nor stands, nor counts towards the high watermark."""

from __future__ import annotations

import dataclasses

from quorumlog.replica.raft import (
    ElectionState,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    Role,
    VoteResponse,
)

from tests.raft.harness import (
    answer,
    catching_up_fetch,
    fetch,
    leader_log,
    leader_with_records,
    make_replica,
    replicated_cluster,
)
from tests.sim.memlog import client_batch
from tests.support.messages import end_quorum_epoch, vote_request


def test_a_catching_up_voter_does_not_count_towards_the_hwm() -> None:
    leader = leader_with_records()
    answer(leader, catching_up_fetch(2, 2, 4, 2))
    assert leader.high_watermark == 0
    assert 2 not in leader.begin_shutdown(0).messages[0].preferred_successors  # type: ignore[union-attr]
    leader = leader_with_records()
    answer(leader, fetch(2, 2, 4, 2))  # the same fetch, caught up: counts
    assert leader.high_watermark == 4


def test_a_follower_that_finds_damage_cuts_its_log_and_fetches_again() -> None:
    c, leader, follower = replicated_cluster()
    log = c.logs[follower]
    old_end = log.end_offset
    assert old_end == log.durable_end_offset > 5
    base = log.damage(5)
    out = c.cores[follower].on_corruption(base, c.now)
    assert out.repaired_at == base and log.end_offset == base
    assert log.catch_up_offset == old_end and c.cores[follower].catching_up
    fetches = [m for m in out.messages if isinstance(m, FetchRequest)]
    assert fetches and fetches[0].fetch_offset == base and fetches[0].catching_up
    c.apply(follower, out)
    c.advance(500)
    assert log.end_offset >= old_end and log.catch_up_offset == -1
    assert not c.cores[follower].catching_up
    assert [log.record(o) for o in range(old_end)] == [
        c.logs[leader].record(o) for o in range(old_end)
    ]


def test_a_leader_that_finds_damage_resigns_then_cuts_its_log() -> None:
    leader = leader_with_records(leader_log((1, 5)))
    answer(leader, fetch(2, 2, 9, 2))
    assert leader.high_watermark == 9
    base = leader.log.damage(3)  # type: ignore[attr-defined]
    # A follower far behind asks for the damaged batch: never served.
    out = leader.handle(fetch(3, 2, 3, 1), 0)
    (resp,) = [m for m in out.messages if isinstance(m, FetchResponse)]
    assert resp.error == ErrorCode.NOT_LEADER and resp.records == b""
    assert leader.role is Role.RESIGNED and out.leader_changed
    assert leader.log.end_offset == base and out.repaired_at == base
    assert leader.catching_up and leader.high_watermark <= base
    assert leader._state.election_at is None  # type: ignore[union-attr]


def test_a_restarted_replica_still_catching_up_does_not_stand() -> None:
    log = leader_log((1, 5))
    log.truncate_corrupt(2)
    assert log.catch_up_offset == 5
    # It had voted for itself as a candidate: it must not run again.
    r = make_replica(1, log=log, persisted=ElectionState(3, None, 1))
    assert r.role is Role.UNATTACHED and r.catching_up
    out = r.tick(10**6)
    assert r.role is Role.UNATTACHED
    assert all(isinstance(m, FetchRequest) and m.catching_up for m in out.messages)
    # Nor vote, even for a candidate with a better log; the same replica caught up would.
    vote = vote_request(src=2, dst=1, candidate_epoch=4, last_offset_epoch=9, last_offset=100)
    (resp,) = r.handle(vote, 10**6).messages
    assert isinstance(resp, VoteResponse) and not resp.vote_granted
    log.append_as_leader(client_batch([7, 8, 9]), 1)
    log.flush()
    assert log.catch_up_offset == -1 and not r.catching_up
    (resp,) = r.handle(dataclasses.replace(vote, candidate_epoch=5), 10**6).messages
    assert isinstance(resp, VoteResponse) and resp.vote_granted


def test_a_prospective_follower_that_finds_damage_finds_its_leader_again() -> None:
    """Cut off from the leader long enough to be prospective (it still names the leader),
    the follower finds damage: it must look for the leader, follow it and catch up."""
    c, leader, follower = replicated_cluster()
    core, log = c.cores[follower], c.logs[follower]
    old_end = log.end_offset
    c.advance(3000, drop=lambda m: follower in (m.src, m.dst) and leader in (m.src, m.dst))
    assert core.state_name == "prospective" and core.leader_id == leader
    c.apply(follower, core.on_corruption(log.damage(5), c.now))
    c.advance(3000)
    assert core.state_name == "follower" and core.leader_id == leader
    assert log.end_offset >= old_end and log.catch_up_offset == -1


def test_a_follower_asked_to_stand_that_then_finds_damage_drops_the_timer() -> None:
    """The leader resigns naming a follower to stand after a back-off; before that timer
    fires the follower finds damage and may no longer stand. The timer must not stay due
    (a timer the core cannot act on would spin the node's loop): it keeps following."""
    c, leader, follower = replicated_cluster()
    core = c.cores[follower]
    others = tuple(v for v in c.voters if v not in (leader, follower))
    req = end_quorum_epoch(
        src=leader,
        dst=follower,
        leader_id=leader,
        leader_epoch=core.epoch,
        preferred_successors=others + (follower,),  # ranked second: it waits a back-off
    )
    c.apply(follower, core.handle(req, c.now))
    due = core.next_deadline_ms()
    assert due is not None and due > c.now and core.role is Role.FOLLOWER
    base = c.logs[follower].damage(5)
    c.apply(follower, core.on_corruption(base, c.now))
    assert core.catching_up
    c.apply(follower, core.tick(due + 1))
    after = core.next_deadline_ms()
    assert core.role is Role.FOLLOWER and after is not None and after > due + 1
