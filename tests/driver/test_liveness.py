"""Peer liveness: a peer silent for the stale time is stale, but a node never blames its
peers for its own stall (their frames may wait unread in its socket buffers)."""

from __future__ import annotations

from quorumlog.replica.driver.liveness import PeerLiveness


def test_a_silent_peer_is_stale_after_the_stale_time() -> None:
    live = PeerLiveness(800, stall_ms=400)
    live.heard(2, 0)
    assert [live.newly_stale({2}, t) for t in (200, 400, 600)] == [[], [], []]
    assert live.next_stale_ms({2}) == 800
    assert live.newly_stale({2}, 800) == [2]
    assert live.newly_stale({2}, 1000) == []  # once
    assert live.heard(2, 1100)  # back


def test_a_node_back_from_its_own_stall_reads_its_peers_frames_before_blaming_them() -> None:
    live = PeerLiveness(800, stall_ms=400)
    live.heard(2, 0)
    live.heard(3, 0)
    assert live.newly_stale({2, 3}, 200) == []
    # This node stalled from 200 to 1500 ms: it checks before reading what came meanwhile.
    assert live.newly_stale({2, 3}, 1500) == []
    assert live.next_stale_ms({2, 3}) == 1900
    live.heard(2, 1510)  # node 2's frames, read now
    assert live.newly_stale({2, 3}, 1700) == []
    # Node 3 really was silent: found once the grace is over.
    assert live.newly_stale({2, 3}, 1900) == [3]


def test_without_a_stall_guard_a_late_check_blames_at_once() -> None:
    live = PeerLiveness(800)
    live.heard(2, 0)
    assert live.newly_stale({2}, 200) == []
    assert live.newly_stale({2}, 1500) == [2]
