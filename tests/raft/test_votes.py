"""Vote, pre-vote, election timers, persistence-before-send and restart states."""

from __future__ import annotations

from quorumlog.replica.raft import (
    ElectionState,
    ErrorCode,
    FetchRequest,
    QuorumConfig,
    Role,
    VoteRequest,
    VoteResponse,
)

from tests.raft.harness import Cluster, leader_log, make_replica
from tests.support.messages import begin_quorum_epoch, fetch_request, vote_request, vote_response


def vote(
    src: int, dst: int, epoch: int, last_epoch: int = 0, end: int = 0, pre: bool = False
) -> VoteRequest:
    log = {"last_offset_epoch": last_epoch, "last_offset": end}
    return vote_request(src=src, dst=dst, candidate_epoch=epoch, pre_vote=pre, **log)


def only_response(out_messages: list[object]) -> VoteResponse:
    responses = [m for m in out_messages if isinstance(m, VoteResponse)]
    assert len(responses) == 1
    return responses[0]


# ---------------------------------------------------------------- vote rules


def test_vote_for_older_epoch_is_fenced() -> None:
    r = make_replica(1, persisted=ElectionState(5))
    out = r.handle(vote(2, 1, 4), 0)
    resp = only_response(list(out.messages))
    assert resp.error == ErrorCode.FENCED_LEADER_EPOCH
    assert not resp.vote_granted
    assert resp.leader_epoch == 5
    assert out.persist is None


def test_higher_epoch_moves_to_unattached_then_votes_and_persists_first() -> None:
    r = make_replica(1, persisted=ElectionState(2, leader_id=3))
    out = r.handle(vote(2, 1, 7), 0)
    resp = only_response(list(out.messages))
    assert resp.vote_granted and resp.leader_epoch == 7
    # The vote is in the state the driver must persist before sending the response.
    assert out.persist == ElectionState(7, None, 2)
    assert (r.role, r.epoch, r.voted_id, r.leader_id) == (Role.UNATTACHED, 7, 2, None)


def test_higher_epoch_with_stale_log_moves_epoch_but_refuses_vote() -> None:
    r = make_replica(1, log=leader_log((1, 5)), persisted=ElectionState(1, leader_id=3))
    out = r.handle(vote(2, 1, 4, last_epoch=1, end=3), 0)
    assert not only_response(list(out.messages)).vote_granted
    assert out.persist == ElectionState(4, None, None)


def test_one_vote_per_epoch_and_idempotent_for_the_same_candidate() -> None:
    r = make_replica(1, persisted=ElectionState(1))
    assert only_response(list(r.handle(vote(2, 1, 2), 0).messages)).vote_granted
    assert not only_response(list(r.handle(vote(3, 1, 2), 0).messages)).vote_granted
    # A duplicate request from the same candidate gets the same answer.
    assert only_response(list(r.handle(vote(2, 1, 2), 0).messages)).vote_granted
    assert r.voted_id == 2


def test_log_comparison_epoch_first_then_offset() -> None:
    log = leader_log((1, 3), (3, 4))  # last epoch 3, end offset 7
    for last_epoch, end, granted in [
        (2, 100, False),  # longer but older epoch
        (3, 6, False),  # same epoch, shorter
        (3, 7, True),  # equal
        (4, 1, True),  # newer epoch, shorter
    ]:
        r = make_replica(1, log=log, persisted=ElectionState(3))
        resp = only_response(list(r.handle(vote(2, 1, 4, last_epoch, end), 0).messages))
        assert resp.vote_granted is granted, (last_epoch, end)


def test_follower_does_not_vote_in_its_epoch() -> None:
    f = make_replica(1, persisted=ElectionState(3, leader_id=2))
    assert not only_response(list(f.handle(vote(3, 1, 3), 0).messages)).vote_granted


def test_an_observers_vote_counts_only_for_a_candidate_whose_voters_name_it() -> None:
    """A replica outside its own voter set answers on its log alone (a voter change that
    adds it may not have reached it yet); the candidate counts only its voters' votes."""
    obs = make_replica(9, voters=(1, 2, 3))
    assert only_response(list(obs.handle(vote(2, 9, 1), 0).messages)).vote_granted
    cand = make_replica(1, persisted=ElectionState(4, None, 1))  # candidate of (1, 2, 3)
    assert cand.role is Role.CANDIDATE
    for outsider in (8, 9):
        cand.handle(
            vote_response(src=outsider, leader_epoch=4, vote_granted=True, candidate_epoch=4), 0
        )
    assert cand.role is Role.CANDIDATE  # 1 of 3 voters: no majority
    cand.handle(vote_response(src=2, leader_epoch=4, vote_granted=True, candidate_epoch=4), 0)
    assert cand.role is Role.LEADER


def test_election_timeout_is_randomized_in_t_to_2t() -> None:
    cfg = QuorumConfig(election_timeout_ms=1000)
    deadlines = {make_replica(1, config=cfg, seed=s).next_deadline_ms() for s in range(50)}
    assert all(d is not None and 1000 <= d < 2000 for d in deadlines)
    assert len(deadlines) > 10


def test_failed_election_backs_off_exponentially_capped() -> None:
    cfg = QuorumConfig(retry_backoff_ms=100, election_backoff_max_ms=1000)
    r = make_replica(1, config=cfg, persisted=ElectionState(4, None, 1))  # candidate
    assert r.role is Role.CANDIDATE
    for voter in (2, 3):
        r.handle(vote_response(src=voter, leader_epoch=4, vote_granted=False, candidate_epoch=4), 0)
    # A majority rejected: the candidate lost and waits rand[0, 100 * 2^1) ms.
    deadline = r.next_deadline_ms()
    assert deadline is not None and 0 <= deadline < 200
    assert r.epoch == 4 and r.voted_id == 1


# ---------------------------------------------------------------- pre-vote


def test_pre_vote_changes_nothing_and_is_refused_while_the_leader_is_alive() -> None:
    c = Cluster()
    leader = c.elect()
    follower = next(i for i in c.voters if i != leader)
    other = next(i for i in c.voters if i not in (leader, follower))
    core = c.cores[follower]
    epoch = core.epoch
    out = core.handle(vote(other, follower, epoch + 1, 99, 999, pre=True), c.now)
    resp = only_response(list(out.messages))
    assert not resp.vote_granted and resp.pre_vote
    assert out.persist is None and core.epoch == epoch
    # After a fetch timeout without the leader, the same pre-vote is granted.
    c.crash(leader)
    c.advance(c.config.fetch_timeout_ms + 10, drop=lambda m: m.src == other or m.dst == other)
    out = c.cores[follower].handle(vote(other, follower, epoch + 1, 99, 999, pre=True), c.now)
    assert only_response(list(out.messages)).vote_granted


def test_a_partitioned_node_that_rejoins_does_not_depose_the_leader() -> None:
    c = Cluster()
    leader = c.elect()
    epoch = c.cores[leader].epoch
    loner = next(i for i in c.voters if i != leader)
    # Cut the loner off long enough for several of its own (pre-)elections.
    c.advance(8_000, drop=lambda m: loner in (m.src, m.dst))
    assert c.cores[loner].epoch == epoch  # pre-votes never bump the epoch
    c.advance(3_000)
    assert c.leader() == leader and c.cores[leader].epoch == epoch
    assert c.cores[loner].role is Role.FOLLOWER and c.cores[loner].leader_id == leader


def test_leader_elected_and_replicates() -> None:
    c = Cluster()
    c.elect()
    last = c.produce([1, 2, 3])
    c.advance(100)
    assert all(core.high_watermark == last + 1 for core in c.cores.values())


# ---------------------------------------------------------------- persistence


def test_candidate_persists_its_vote_before_its_vote_requests() -> None:
    r = make_replica(1, persisted=ElectionState(2, None, None))
    r.tick(10_000)  # election timeout -> pre-vote
    assert r.role is Role.PROSPECTIVE and r.epoch == 2
    for voter in (2, 3):
        granted = vote_response(src=voter, leader_epoch=2, pre_vote=True, candidate_epoch=3)
        out = r.handle(granted, 10_000)
        if r.role is Role.CANDIDATE:
            break
    assert r.role is Role.CANDIDATE
    requests = [m for m in out.messages if isinstance(m, VoteRequest)]
    assert requests and all(not m.pre_vote and m.candidate_epoch == 3 for m in requests)
    assert out.persist == ElectionState(3, None, 1)


def test_every_state_change_is_in_the_output_that_sends_on_it() -> None:
    """Run a cluster and check the driver-visible rule on every output: the persisted
    state always equals the core's state after the step."""
    c = Cluster()
    c.elect()
    c.produce([1])
    c.crash(c.leader() or 1)
    c.advance(6_000)
    for node, core in c.cores.items():
        if node not in c.down:
            assert c.persisted[node] == core.election_state


def test_begin_quorum_epoch_makes_a_persisted_follower() -> None:
    r = make_replica(2, persisted=ElectionState(1))
    out = r.handle(begin_quorum_epoch(leader_epoch=3), 0)
    assert out.persist == ElectionState(3, 1, None)
    assert r.role is Role.FOLLOWER
    assert any(isinstance(m, FetchRequest) for m in out.messages)


# ---------------------------------------------------------------- restart


def test_restart_as_leader_comes_back_resigned() -> None:
    r = make_replica(1, log=leader_log((4, 3)), persisted=ElectionState(4, 1, 1))
    assert r.role is Role.RESIGNED and r.epoch == 4
    out = r.startup_output()
    assert {m.dst for m in out.messages} == {2, 3}  # EndQuorumEpoch to the voters
    fetch = fetch_request(current_leader_epoch=4)
    answer = r.handle(fetch, 0).messages[0]
    assert answer.error == ErrorCode.NOT_LEADER  # type: ignore[union-attr]


def test_restart_after_voting_for_itself_comes_back_candidate_same_epoch() -> None:
    r = make_replica(1, persisted=ElectionState(6, None, 1))
    assert r.role is Role.CANDIDATE and r.epoch == 6 and r.voted_id == 1
    out = r.startup_output()
    assert out.persist is None
    assert {(m.dst, m.candidate_epoch) for m in out.messages} == {(2, 6), (3, 6)}  # type: ignore[union-attr]


def test_a_fresh_replica_persists_nothing() -> None:
    """Epoch 0 and no vote is what no persisted state stands for: a node opening
    thousands of new replicas writes none of them."""
    r = make_replica(1)
    assert r.epoch == 0 and r.voted_id is None and r.leader_id is None
    assert r.startup_output().persist is None


def test_restart_raises_a_stale_epoch_to_the_logs_last_epoch() -> None:
    r = make_replica(1, log=leader_log((1, 2), (5, 2)), persisted=ElectionState(3, 2, 2))
    assert r.epoch == 5 and r.role is Role.UNATTACHED and r.voted_id is None
    assert r.startup_output().persist == ElectionState(5, None, None)


def test_restart_as_follower_keeps_leader() -> None:
    r = make_replica(2, persisted=ElectionState(3, 1, 1))
    assert r.role is Role.FOLLOWER and r.leader_id == 1 and r.voted_id == 1
