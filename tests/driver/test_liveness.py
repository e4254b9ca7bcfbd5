"""``PeerLiveness.settled``: which peers a survivor waits for before it stands."""

from __future__ import annotations

from quorumlog.replica.driver.liveness import PeerLiveness


def test_a_peer_is_settled_a_stale_window_after_its_incarnation_was_first_heard() -> None:
    live = PeerLiveness(800)
    live.seen.setdefault(2, 0)  # a partition shared with it opened: not heard yet
    assert not live.settled(2, 5_000)
    assert not live.restarted(2, 7, 1_000)
    live.heard(2, 1_000)
    assert not live.settled(2, 1_799)
    assert live.settled(2, 1_800)
    assert not live.restarted(2, 7, 1_900)  # the same process: its time runs on
    assert live.settled(2, 1_900)
    assert live.restarted(2, 8, 2_000)  # a new process: young again
    assert not live.settled(2, 2_500) and live.settled(2, 2_800)


def test_a_silent_or_refusing_peer_is_not_settled_until_heard_again() -> None:
    live = PeerLiveness(800)
    live.restarted(2, 7, 0)
    live.heard(2, 0)
    assert live.newly_stale({2}, 900) == []  # suspected first
    assert not live.settled(2, 900)
    assert live.newly_stale({2}, 910) == [2]
    assert not live.settled(2, 920)
    assert live.heard(2, 930)
    assert live.settled(2, 930)
    live.refused.add(2)
    assert not live.settled(2, 940)
    live.heard(2, 950)
    assert live.settled(2, 950)
