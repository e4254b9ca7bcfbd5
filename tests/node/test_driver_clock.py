"""The driver's clock leaves out event-loop stalls: an overloaded node's quorum timers
stretch rather than count time in which it could not read its peers."""

from __future__ import annotations

import pytest
from quorumlog.replica.node import node as node_module
from quorumlog.replica.node.node import DriverClock


def test_a_stall_beyond_the_allowance_is_not_counted_and_time_never_goes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = [1000]
    monkeypatch.setattr(node_module, "now_ms", lambda: real[0])
    clock = DriverClock(allowance_ms=100)
    clock.turn(10)
    assert clock.now() == 1000
    real[0] = 1010
    clock.turn(10)  # on time
    assert clock.now() == 1010
    real[0] = 1100
    clock.turn(10)  # 80 ms late: within the allowance, counted
    assert clock.now() == 1100
    real[0] = 1400
    seen = clock.now()  # a handler ran during the stall and saw real time
    assert seen == 1400
    real[0] = 3110
    clock.turn(10)  # 3 s since the last turn: all but 10 + 100 ms is left out
    assert clock.stalled_ms == 3110 - 1100 - 10 - 100
    assert clock.now() == seen  # held, never back: 3110 - 1900 = 1210 < 1400
    real[0] = 3120
    clock.turn(10)  # on time again: counted
    real[0] = 3400
    assert clock.stalled_ms == 1900 and clock.now() == 3400 - 1900 == 1500
