"""A leader whose node refuses connections is replaced without waiting for the fetch
timeout; a hint that reaches only some followers never deposes a live leader."""

from __future__ import annotations

from quorumlog.replica.raft import Role, VoteResponse

from tests.raft.harness import CONFIG, Cluster


def _crash(c: Cluster, leader: int) -> None:
    """The leader's node dies; its connections die with it: nothing it sent is still on
    the way."""
    c.crash(leader)
    c.queue = [m for m in c.queue if m.src != leader]
    c.deferred = [m for m in c.deferred if m.src != leader]


def _elected() -> tuple[Cluster, int, int, tuple[int, ...]]:
    """A cluster with a leader: (cluster, leader, its epoch, the survivors' order)."""
    c = Cluster()
    leader = c.elect()
    return c, leader, c.cores[leader].epoch, tuple(n for n in c.voters if n != leader)


def test_followers_told_the_leader_refuses_connections_elect_at_once() -> None:
    c = Cluster()
    leader = c.elect()
    epoch = c.cores[leader].epoch
    _crash(c, leader)
    for node in (n for n in c.cores if n != leader):
        c.apply(node, c.cores[node].on_peer_unreachable(leader, c.now))
    c.advance(CONFIG.election_timeout_ms)  # well before the fetch timeout
    assert CONFIG.election_timeout_ms < CONFIG.fetch_timeout_ms
    new = c.leader()
    assert new is not None and new != leader and c.cores[new].epoch > epoch


def test_a_hint_at_one_follower_does_not_depose_a_live_leader() -> None:
    c = Cluster()
    leader = c.elect()
    epoch = c.cores[leader].epoch
    told = next(n for n in c.cores if n != leader)
    c.apply(told, c.cores[told].on_peer_unreachable(leader, c.now))
    c.advance(CONFIG.fetch_timeout_ms // 2)
    # The other follower still hears from the leader and refuses the pre-vote.
    assert c.leader() == leader and c.cores[leader].epoch == epoch
    assert c.cores[leader].role is Role.LEADER
    assert all(core.epoch == epoch for core in c.cores.values())


def test_the_hint_is_ignored_for_a_node_that_is_not_the_leader() -> None:
    c = Cluster()
    leader = c.elect()
    a, b = (n for n in c.cores if n != leader)
    before = c.cores[a].state_name
    c.apply(a, c.cores[a].on_peer_unreachable(b, c.now))
    assert c.cores[a].state_name == before
    c.advance(CONFIG.fetch_timeout_ms // 2)
    assert c.leader() == leader


def _crash_and_stand_together(c: Cluster, leader: int, order: tuple[int, ...]) -> None:
    """The leader's node dies; both survivors learn it, with the driver's order, and both
    stand before either hears from the other: their pre-votes cross."""
    _crash(c, leader)
    for node in order:
        c.apply(node, c.cores[node].on_peer_unreachable(leader, c.now, order))
    # Past the stand of every rank (a fetch timeout per rank, plus up to T/4), nothing
    # delivered yet.
    c.now += CONFIG.fetch_timeout_ms + CONFIG.election_timeout_ms // 4 + 1
    for node in order:
        c.apply(node, c.cores[node].tick(c.now))
    assert all(c.cores[n].role is Role.PROSPECTIVE for n in order)


def test_crossing_pre_votes_of_two_survivors_elect_the_first_ranked_in_one_epoch() -> None:
    # A loaded node stands late, so a survivor ranked behind may pre-vote while the one
    # ahead stands too. The one ahead refuses it: one election, not a split vote.
    c, leader, epoch, order = _elected()
    _crash_and_stand_together(c, leader, order)
    c.pump()
    first, second = order
    assert c.leader() == first and c.cores[first].epoch == epoch + 1
    refused = [
        m
        for src, m in c.sent
        if src == first and isinstance(m, VoteResponse) and m.pre_vote and m.dst == second
    ]
    assert refused and not refused[-1].vote_granted
    c.advance(CONFIG.fetch_timeout_ms)
    assert c.leader() == first
    assert all(c.cores[n].epoch == epoch + 1 for n in order)


def test_a_survivor_ranked_first_with_a_shorter_log_does_not_hold_back_the_longer() -> None:
    # Only the longer log can win (the shorter one's pre-vote is refused for its log), so
    # the first-ranked survivor defers only when its own log is at least as long.
    c, leader, epoch, order = _elected()
    first, second = order
    c.produce([1, 2, 3])
    c.advance(200, drop=lambda m: first in (m.src, m.dst))
    assert c.logs[second].end_offset > c.logs[first].end_offset
    _crash_and_stand_together(c, leader, order)
    c.advance(CONFIG.fetch_timeout_ms)
    assert c.leader() == second and c.cores[second].epoch == epoch + 1


def test_the_first_ranked_survivor_refused_by_one_not_yet_told_stands_again_soon() -> None:
    # The survivors learn that the leader's node refuses connections at different moments
    # (each from its own link). The one ranked first stands at once; the other, still
    # hearing that leader, refuses it. The first keeps its hint and stands again after an
    # election back-off, and wins before the one ranked behind stands (a fetch timeout
    # after its own hint): the dead node's partitions go where the ranking sends them.
    c, leader, epoch, order = _elected()
    first, second = order
    _crash(c, leader)
    c.apply(first, c.cores[first].on_peer_unreachable(leader, c.now, order))
    c.advance(CONFIG.election_timeout_ms // 4 + 50)  # it stood (within T/4): refused
    refused = [
        m
        for src, m in c.sent
        if src == second and isinstance(m, VoteResponse) and m.pre_vote and m.dst == first
    ]
    assert refused and not refused[-1].vote_granted
    assert c.leader() is None
    c.apply(second, c.cores[second].on_peer_unreachable(leader, c.now, order))
    c.advance(CONFIG.fetch_timeout_ms // 2)  # the second's own stand is later than this
    assert c.leader() == first and c.cores[first].epoch == epoch + 1


def test_a_survivor_does_not_wait_for_one_ranked_ahead_that_may_never_stand() -> None:
    # The survivor ranked first restarted a moment ago: it does not follow the leader yet
    # (it has not heard from it), so it never takes the hint. The driver names it
    # unsettled; the survivor ranked behind stands at once, not a fetch timeout later.
    c, leader, epoch, order = _elected()
    first, second = order
    c.crash(first)
    c.start(first)  # back from what it persisted, nothing heard from the leader since
    _crash(c, leader)
    c.apply(
        second,
        c.cores[second].on_peer_unreachable(leader, c.now, order, frozenset({first})),
    )
    c.advance(CONFIG.election_timeout_ms // 4 + 50)
    assert c.leader() == second and c.cores[second].epoch == epoch + 1


def test_an_unsettled_survivor_ranked_ahead_still_wins_when_it_stands() -> None:
    # The one ranked ahead was named unsettled by the other's node but does follow the
    # leader and takes the hint: both stand at once, the one ahead refuses the other's
    # pre-vote, and it wins in one epoch (the order is unchanged; only the wait is).
    c, leader, epoch, order = _elected()
    first, second = order
    _crash(c, leader)
    c.apply(first, c.cores[first].on_peer_unreachable(leader, c.now, order))
    c.apply(
        second,
        c.cores[second].on_peer_unreachable(leader, c.now, order, frozenset({first})),
    )
    c.advance(CONFIG.fetch_timeout_ms // 2)
    assert c.leader() == first and c.cores[first].epoch == epoch + 1
    assert all(c.cores[n].epoch == epoch + 1 for n in order)
