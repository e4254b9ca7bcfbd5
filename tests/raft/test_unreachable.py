"""A leader whose node refuses connections is replaced without waiting for the fetch
timeout; a hint that reaches only some followers never deposes a live leader."""

from __future__ import annotations

from quorumlog.replica.raft import Role

from tests.raft.harness import CONFIG, Cluster


def test_followers_told_the_leader_refuses_connections_elect_at_once() -> None:
    c = Cluster()
    leader = c.elect()
    epoch = c.cores[leader].epoch
    c.crash(leader)
    # Its connections died with it: nothing it sent is still on the way.
    c.queue = [m for m in c.queue if m.src != leader]
    c.deferred = [m for m in c.deferred if m.src != leader]
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
