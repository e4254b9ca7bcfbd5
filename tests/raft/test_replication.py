"""Fetch errors, divergence and truncation, the HWM rule, check-quorum, EndQuorumEpoch,
force_leader, consumers/observers, flush-before-fetch and the fencing helper."""

from __future__ import annotations

import dataclasses

import pytest
from quorumlog.replica.raft import (
    CONSUMER_REPLICA_ID,
    ElectionState,
    EndQuorumEpochRequest,
    ErrorCode,
    FetchRequest,
    NotLeaderError,
    QuorumConfig,
    Role,
    VoteRequest,
)

from tests.raft.harness import (
    Cluster,
    answer,
    fetch,
    leader_log,
    leader_with_records,
    make_replica,
    new_leader,
)
from tests.sim.memlog import client_batch
from tests.support.messages import end_quorum_epoch, fetch_response

# ---------------------------------------------------------------- fetch errors


def test_fetch_errors_as_the_kip_says() -> None:
    leader = new_leader(epoch=5)
    assert answer(leader, fetch(2, 5, 0, -1, cluster="other")).error == ErrorCode.INVALID_CLUSTER_ID
    fenced = answer(leader, fetch(2, 4, 0, -1))
    assert fenced.error == ErrorCode.FENCED_LEADER_EPOCH
    assert (fenced.leader_id, fenced.leader_epoch) == (1, 5)  # tells the fetcher who leads
    assert answer(leader, fetch(2, 6, 0, -1)).error == ErrorCode.UNKNOWN_LEADER_EPOCH
    follower = make_replica(2, persisted=ElectionState(5, 1, None))
    not_leader = answer(follower, fetch(3, 5, 0, -1, dst=2))
    assert not_leader.error == ErrorCode.NOT_LEADER and not_leader.leader_id == 1
    assert answer(leader, fetch(2, 5, 0, -1)).error == ErrorCode.NONE


def test_check_leader_epoch_helper() -> None:
    leader = new_leader(epoch=5)
    assert leader.check_leader_epoch(5) == ErrorCode.NONE
    assert leader.check_leader_epoch(-1) == ErrorCode.NONE
    assert leader.check_leader_epoch(4) == ErrorCode.FENCED_LEADER_EPOCH
    assert leader.check_leader_epoch(6) == ErrorCode.UNKNOWN_LEADER_EPOCH
    follower = make_replica(2, persisted=ElectionState(5, 1, None))
    assert follower.check_leader_epoch(5) == ErrorCode.NOT_LEADER


# ---------------------------------------------------------------- divergence


def test_divergence_answer_uses_end_offset_for_last_fetched_epoch() -> None:
    # Leader: epoch 1 at [0, 5), epoch 3 at [5, 8), then its own epoch 4 control batch.
    leader = new_leader(leader_log((1, 5), (3, 3)), epoch=4)
    # Follower wrote epoch 2 at [5, 9) that the leader never had.
    resp = answer(leader, fetch(2, 4, 9, 2))
    assert resp.diverging_epoch == (1, 5) and resp.records == b""
    # Same epoch but past the leader's end of it.
    assert answer(leader, fetch(2, 4, 7, 1)).diverging_epoch == (1, 5)
    # Consistent: records, no divergence.
    ok = answer(leader, fetch(2, 4, 5, 1))
    assert ok.diverging_epoch is None and ok.records


def test_follower_truncates_to_min_of_both_ends_and_fetches_again() -> None:
    log = leader_log((1, 5), (2, 4))  # epoch 2 at [5, 9)
    follower = make_replica(2, log=log, persisted=ElectionState(4, 1, None))
    out = follower.startup_output()
    (req,) = [m for m in out.messages if isinstance(m, FetchRequest)]
    assert (req.fetch_offset, req.last_fetched_epoch) == (9, 2)
    resp = fetch_response(
        leader_epoch=4, diverging_epoch=(1, 5), fetch_offset=9, request_id=req.request_id
    )
    out = follower.handle(resp, 10)
    assert log.end_offset == 5 and out.truncated_to == 5
    assert not out.truncated_below_high_watermark
    (again,) = [m for m in out.messages if isinstance(m, FetchRequest)]
    assert (again.fetch_offset, again.last_fetched_epoch) == (5, 1)


def test_truncation_below_the_high_watermark_is_surfaced() -> None:
    c = Cluster()
    leader = c.elect()
    c.produce([1, 2, 3])
    c.advance(100)
    follower = next(i for i in c.voters if i != leader)
    core = c.cores[follower]
    hwm = core.high_watermark
    assert hwm == 4
    epoch = core.epoch
    pending = core._state.fetch_request_id  # type: ignore[union-attr]
    resp = fetch_response(
        src=leader,
        dst=follower,
        leader_id=leader,
        leader_epoch=epoch,
        high_watermark=hwm,
        diverging_epoch=(1, 1),
        fetch_offset=4,
        request_id=pending,
    )
    out = core.handle(resp, c.now)
    assert out.truncated_below_high_watermark and out.truncated_to == 1
    assert core.truncations_below_high_watermark == 1


def test_stale_or_duplicate_fetch_answers_are_ignored() -> None:
    follower = make_replica(2, persisted=ElectionState(4, 1, None))
    follower.startup_output()
    stale = fetch_response(leader_epoch=4, records=client_batch([1]), request_id=999)
    assert follower.handle(stale, 0).messages == []
    assert follower.log_end_offset == 0


# ---------------------------------------------------------------- flush before fetch


def test_follower_asks_for_a_flush_before_reporting_its_offset() -> None:
    follower = make_replica(2, persisted=ElectionState(4, 1, None))
    (req,) = follower.startup_output().messages
    assert isinstance(req, FetchRequest)
    src = leader_log((4, 3))
    records = src.read(0, 1 << 20)
    resp = fetch_response(leader_epoch=4, records=records, request_id=req.request_id)
    out = follower.handle(resp, 5)
    (nxt,) = [m for m in out.messages if isinstance(m, FetchRequest)]
    assert nxt.fetch_offset == 3 and out.flush_log
    assert follower.durable_end_offset == 0  # the driver has not flushed yet


# ---------------------------------------------------------------- high watermark


def test_hwm_needs_a_durable_majority_above_the_epoch_start() -> None:
    # The leader holds old-epoch data [0, 5) and starts epoch 2 at offset 5.
    leader = new_leader(leader_log((1, 5)), epoch=2)
    assert leader.epoch_start_offset == 5
    leader.log.flush()
    leader.on_log_flushed(0)
    assert leader.high_watermark == 0  # own flush alone is no majority
    # Follower 2 holds [0, 5): a majority holds old entries, not the epoch start.
    answer(leader, fetch(2, 2, 5, 1))
    assert leader.high_watermark == 0
    # Follower 2 durably holds the control batch: HWM moves past the epoch start.
    answer(leader, fetch(2, 2, 6, 2))
    assert leader.high_watermark == 6


def test_leader_counts_only_its_durable_end() -> None:
    leader = new_leader(epoch=2)  # control batch at offset 0, not flushed
    answer(leader, fetch(2, 2, 1, 2))
    assert leader.high_watermark == 0  # follower 2 holds offset 0, the leader not durably
    leader.append(client_batch([1, 2]), 0)
    answer(leader, fetch(2, 2, 3, 2))
    assert leader.high_watermark == 0
    leader.log.flush()
    out = leader.on_log_flushed(0)
    assert leader.high_watermark == 3 and out.high_watermark == 3 and out.fetch_wakeup


def test_observers_never_count_and_hwm_never_goes_back() -> None:
    leader = new_leader(epoch=2, voters=(1, 2, 3))
    leader.append(client_batch([1, 2, 3]), 0)
    answer(leader, fetch(9, 2, 4, 2))  # an observer fully caught up
    leader.log.flush()
    leader.on_log_flushed(0)
    assert leader.high_watermark == 0
    answer(leader, fetch(2, 2, 4, 2))
    assert leader.high_watermark == 4
    answer(leader, fetch(2, 2, 2, 2))  # a follower that lost data reports less
    assert leader.high_watermark == 4
    rows = {r.replica_id: r for r in leader.describe(0).observers}
    assert rows[9].end_offset == 4 and rows[9].lag == 0


def test_a_fetch_of_no_bytes_reads_nothing_and_still_reports_the_replica() -> None:
    """A fetch asking for 0 bytes (a new replica waiting its turn to copy, as its
    leader's driver asks for it) is answered with no records, without a read of the log,
    and still reports where the replica is: a voter's offset counts toward the HWM."""
    leader = new_leader(epoch=2, voters=(1, 2, 3))
    leader.append(client_batch([1, 2, 3]), 0)
    leader.log.flush()
    leader.on_log_flushed(0)
    read = leader.log.read
    reads: list[int] = []

    def counted(offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        reads.append(offset)
        return read(offset, max_bytes, max_offset)

    leader.log.read = counted  # type: ignore[method-assign]
    probe = dataclasses.replace(fetch(9, 2, 0, -1), max_bytes=0)
    resp = answer(leader, probe)
    assert resp.error == ErrorCode.NONE and resp.records == b"" and reads == []
    assert not answer(leader, fetch(9, 2, 0, -1)).is_empty() and reads == [0]
    answer(leader, dataclasses.replace(fetch(2, 2, 4, 2), max_bytes=0))
    assert leader.high_watermark == 4


def test_a_fetch_without_a_replica_id_is_refused() -> None:
    """Consumers are served by the driver (tests/driver); the core serves replicas only."""
    leader = leader_with_records()
    consumer = dataclasses.replace(fetch(2, 2, 0, -1), replica_id=CONSUMER_REPLICA_ID)
    resp = answer(leader, consumer)
    assert resp.error == ErrorCode.INVALID_REQUEST and resp.records == b""
    assert leader.high_watermark == 0 and leader.describe(0).observers == []


def test_empty_answer_is_parkable() -> None:
    leader = leader_with_records()
    assert not answer(leader, fetch(2, 2, 0, -1)).is_empty()
    assert answer(leader, fetch(2, 2, 4, 2)).is_empty()


def test_a_leader_of_an_empty_log_writes_its_epoch_with_its_first_records() -> None:
    """Electing a leader of an empty log writes nothing (a new partition costs no write or
    flush); its leader-change record goes in ahead of the first client records, so the
    epoch still starts with one and the HWM commits through it."""
    leader = new_leader(epoch=2)
    assert leader.log.end_offset == 0 and leader.log.last_epoch() == -1
    assert leader.leader_committed  # nothing earlier to commit
    assert answer(leader, fetch(2, 2, 0, -1)).is_empty()
    info, epoch, _ = leader.append(client_batch([1, 2]), 0)
    assert (info.first_offset, epoch, leader.log.end_offset) == (1, 2, 3)
    assert leader.log.epoch_at(0) == 2 and leader.log.epoch_at(1) == 2
    leader.append(client_batch([3]), 0)
    assert leader.log.end_offset == 4  # one leader-change record per epoch
    leader.log.flush()
    leader.on_log_flushed(0)
    answer(leader, fetch(2, 2, 4, 2))
    assert leader.high_watermark == 4
    # A leader of a log that holds records writes its record at once.
    again = new_leader(leader_log((1, 3)), epoch=3)
    assert again.log.end_offset == 4 and again.log.epoch_at(3) == 3
    assert not again.leader_committed  # until its record of epoch 3 is
    again.log.flush()
    again.on_log_flushed(0)
    answer(again, fetch(2, 3, 4, 3))
    assert again.high_watermark == 4 and again.leader_committed


# ---------------------------------------------------------------- check-quorum


def test_leader_not_fetched_by_a_majority_resigns() -> None:
    cfg = QuorumConfig(fetch_timeout_ms=2000)
    leader = new_leader(epoch=2, config=cfg)
    out = leader.tick(2999)
    assert leader.role is Role.LEADER and not out.leader_changed
    answer(leader, fetch(2, 2, 0, -1), 2000)  # a majority (1 + 2) fetched: timer reset
    leader.tick(3500)
    assert leader.role is Role.LEADER
    out = leader.tick(2000 + 3000)
    assert leader.role is Role.RESIGNED and out.leader_changed
    assert {m.dst for m in out.messages if isinstance(m, EndQuorumEpochRequest)} == {2, 3}
    with pytest.raises(NotLeaderError):
        leader.append(client_batch([1]), 5000)


def test_follower_without_fetches_becomes_prospective() -> None:
    follower = make_replica(2, persisted=ElectionState(3, 1, None))
    follower.tick(1999)
    assert follower.role is Role.FOLLOWER
    out = follower.tick(2000)
    assert follower.role is Role.PROSPECTIVE and follower.epoch == 3
    assert all(isinstance(m, VoteRequest) and m.pre_vote for m in out.messages)


# ---------------------------------------------------------------- EndQuorumEpoch


def test_graceful_shutdown_ranks_successors_by_replicated_offset() -> None:
    leader = new_leader(epoch=2, voters=(1, 2, 3, 4))
    leader.append(client_batch([1, 2, 3]), 0)
    answer(leader, fetch(3, 2, 4, 2))
    answer(leader, fetch(4, 2, 1, 2))
    out = leader.begin_shutdown(0)
    reqs = [m for m in out.messages if isinstance(m, EndQuorumEpochRequest)]
    assert {m.dst for m in reqs} == {2, 3, 4}
    assert reqs[0].preferred_successors == (3, 4, 2)
    assert leader.role is Role.RESIGNED


@pytest.mark.parametrize(("rank", "wait"), [(0, 0), (1, 100), (2, 200), (3, 400), (5, 1000)])
def test_successor_rank_n_waits_min_max_backoff(rank: int, wait: int) -> None:
    cfg = QuorumConfig(retry_backoff_ms=100, retry_backoff_max_ms=1000)
    voters = (1, 2, 3, 4, 5, 6, 7)
    me = 2
    successors = tuple(v for v in (3, 4, 5, 6, 7) if v != me)
    successors = successors[:rank] + (me,) + successors[rank:]
    r = make_replica(me, voters=voters, persisted=ElectionState(4, 1, None), config=cfg)
    out = r.handle(end_quorum_epoch(dst=me, leader_epoch=4, preferred_successors=successors), 1000)
    if wait == 0:
        assert r.role is Role.CANDIDATE and r.epoch == 5  # at once, no pre-vote
        assert out.persist == ElectionState(5, None, me)
    else:
        r.tick(1000 + wait - 1)
        assert r.role is Role.FOLLOWER
        r.tick(1000 + wait)
        assert r.role is Role.CANDIDATE and r.epoch == 5


def test_voter_not_in_successors_waits_an_election_timeout() -> None:
    r = make_replica(2, voters=(1, 2, 3), persisted=ElectionState(4, 1, None))
    r.handle(end_quorum_epoch(leader_epoch=4, preferred_successors=(3,)), 0)
    r.tick(999)
    assert r.role is Role.FOLLOWER
    r.tick(2000)
    assert r.role is Role.CANDIDATE and r.epoch == 5


# ---------------------------------------------------------------- force_leader


def _committed_without_one() -> tuple[Cluster, int, int, int]:
    """A cluster whose leader committed records that one follower (``behind``) never
    got: (cluster, leader, behind, the committed end)."""
    c = Cluster()
    leader = c.elect()
    behind = next(i for i in c.voters if i != leader)
    c.produce([1, 2, 3])
    c.advance(200, drop=lambda m: behind in (m.src, m.dst))
    committed_end = c.cores[leader].high_watermark
    assert c.logs[behind].end_offset < committed_end
    return c, leader, behind, committed_end


def test_force_leader_leads_a_new_epoch_without_votes_and_truncates_others() -> None:
    c, leader, behind, committed_end = _committed_without_one()
    top = max(core.epoch for core in c.cores.values())
    c.crash(leader)
    out = c.cores[behind].force_leader(c.now, min_epoch=top + 1000)
    c.apply(behind, out)
    assert c.cores[behind].role is Role.LEADER
    assert c.cores[behind].epoch == top + 1000
    assert out.persist == ElectionState(top + 1000, behind, behind)
    # The old leader returns and follows: its committed tail is truncated, visibly.
    c.start(leader)
    c.advance(500)
    assert c.cores[leader].leader_id == behind
    assert c.logs[leader].end_offset_for(1).end_offset < committed_end


def test_forced_leader_stays_until_the_old_majority_follows_it() -> None:
    """The majority is down, so the forced leader is never fetched by one: check-quorum
    must not make it resign. Otherwise the old majority, back with its longer log, elects
    one of its own and reverts the forced epoch that readers may already have seen."""
    c, leader, behind, committed_end = _committed_without_one()
    majority = [i for i in c.voters if i != behind]
    for node in majority:
        c.crash(node)
    top = max(core.epoch for core in c.cores.values())
    c.apply(behind, c.cores[behind].force_leader(c.now, min_epoch=top + 1000))
    c.advance(5 * c.config.check_quorum_timeout_ms)
    assert c.cores[behind].role is Role.LEADER and c.cores[behind].epoch == top + 1000
    for node in majority:
        c.start(node)
    c.advance(3000)
    assert c.cores[behind].role is Role.LEADER and c.cores[behind].epoch == top + 1000
    for node in majority:
        assert c.cores[node].leader_id == behind
        assert c.logs[node].end_offset_for(1).end_offset < committed_end
    # Followed by a majority once, it is an ordinary leader: cut off, it resigns.
    c.advance(3 * c.config.check_quorum_timeout_ms, drop=lambda m: behind in (m.src, m.dst))
    assert c.cores[behind].role is not Role.LEADER


def test_observer_cannot_be_forced_to_lead() -> None:
    with pytest.raises(ValueError):
        make_replica(9, voters=(1, 2, 3)).force_leader(0)


def test_follower_truncates_to_its_own_end_when_that_is_lower() -> None:
    # Follower: epoch 1 at [0, 5) then epoch 2 at [5, 9); the leader's epoch 1 runs to 7.
    log = leader_log((1, 5), (2, 4))
    follower = make_replica(2, log=log, persisted=ElectionState(4, 1, None))
    (req,) = follower.startup_output().messages
    assert isinstance(req, FetchRequest)
    resp = fetch_response(
        leader_epoch=4, diverging_epoch=(1, 7), fetch_offset=9, request_id=req.request_id
    )
    out = follower.handle(resp, 10)
    assert out.truncated_to == 5 and log.last_epoch() == 1
