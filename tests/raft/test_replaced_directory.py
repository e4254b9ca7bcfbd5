"""A replica whose data directory replaced a lost one (issue 12): ``begin_catch_up()``
with an unknown floor. It neither votes nor stands nor counts towards the HWM until a
leader's fetch answer gives it a floor and it is durably past it."""

from __future__ import annotations

from quorumlog.replica.raft import (
    CATCH_UP_UNKNOWN,
    Role,
    VoteResponse,
)

from tests.raft.harness import (
    Cluster,
    answer,
    catching_up_fetch,
    fetch,
    leader_log,
    new_leader,
    replicated_cluster,
)
from tests.sim.memlog import MemLog
from tests.support.messages import vote_request


def test_a_leader_tells_a_catching_up_fetcher_a_floor_covering_its_epoch_start() -> None:
    leader = new_leader(leader_log((1, 5)), epoch=2)
    resp = answer(leader, catching_up_fetch(2, 2, 0, -1))
    # Its HWM (0) is not yet past its epoch start: the floor is the epoch start, above
    # every record committed before its epoch.
    assert leader.high_watermark == 0 and resp.catch_up_floor == leader.epoch_start_offset == 5
    assert answer(leader, fetch(2, 2, 0, -1)).catch_up_floor == -1


def test_a_replaced_replica_does_not_vote_until_caught_up_past_the_leaders_floor() -> None:
    c, leader, follower = replicated_cluster()
    hwm = c.cores[leader].high_watermark
    # Its disk is lost: an empty log and no quorum state, marked before anything else.
    c.crash(follower)
    c.logs[follower] = MemLog()
    c.persisted[follower] = None
    c.start(follower)
    out = c.cores[follower].begin_catch_up(c.now)
    assert c.logs[follower].catch_up_offset == CATCH_UP_UNKNOWN and c.cores[follower].catching_up
    c.apply(follower, out)
    # A candidate with any log gets no vote (nor pre-vote) from it.
    core = c.cores[follower]
    epoch = c.cores[leader].epoch
    any_log = {"last_offset_epoch": 9, "last_offset": 99}
    for e, pre in ((epoch + 1, True), (epoch, False)):
        vote = vote_request(src=3, dst=follower, candidate_epoch=e, pre_vote=pre, **any_log)
        (resp,) = core.handle(vote, c.now).messages
        assert isinstance(resp, VoteResponse) and not resp.vote_granted
    assert core.role is Role.UNATTACHED
    # Its fetches say catching_up until it is past the leader's HWM.
    c.advance(2000)
    assert not core.catching_up and c.logs[follower].catch_up_offset == -1
    assert c.logs[follower].durable_end_offset >= hwm
    assert [c.logs[follower].record(o) for o in range(hwm)] == [
        c.logs[leader].record(o) for o in range(hwm)
    ]
    assert not c.cores[leader]._state.catching_up  # type: ignore[union-attr]  # counted again


def test_a_fresh_replica_not_marked_votes_as_today() -> None:
    c = Cluster()
    core = c.cores[2]
    assert not core.catching_up
    (resp,) = core.handle(vote_request(src=3, candidate_epoch=1, pre_vote=True), c.now).messages
    assert isinstance(resp, VoteResponse) and resp.vote_granted


def test_a_replaced_replica_takes_a_floor_only_once_enough_voters_told_their_epochs() -> None:
    """With 3 voters, the leader alone cannot vouch that it is current (a stale leader of
    an old epoch would give a floor below records acknowledged in a later one): the
    replaced replica also needs the third voter's epoch."""
    c, leader, replaced = replicated_cluster()
    other = next(n for n in c.voters if n not in (leader, replaced))
    c.crash(other)
    c.crash(replaced)
    c.logs[replaced] = MemLog()
    c.persisted[replaced] = None
    c.start(replaced)
    c.apply(replaced, c.cores[replaced].begin_catch_up(c.now))
    c.advance(400)  # less than the leader's check-quorum timeout
    core = c.cores[replaced]
    assert core.role is Role.FOLLOWER and core.leader_id == leader
    assert c.logs[replaced].catch_up_offset == CATCH_UP_UNKNOWN and core.catching_up
    c.start(other)
    c.advance(2000)
    assert not core.catching_up and c.logs[replaced].catch_up_offset == -1
