"""``free_ports``: the ports a LocalCluster's nodes listen on are free when chosen and
outside the kernel's ephemeral range, so no socket bound to port 0 or connecting out
takes one before its node binds it (a node then exited with "address already in use")."""

from __future__ import annotations

import socket

import pytest
from quorumlog.replica.node import cluster
from quorumlog.replica.node.cluster import LOWEST_PORT, ephemeral_low, free_ports


def _listen(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low = ephemeral_low()
    if low - LOWEST_PORT < 8 * 40:
        pytest.skip(f"no room below this machine's ephemeral range (it starts at {low})")
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert all(LOWEST_PORT <= p < low for p in ports), ports
    # Sockets the kernel gives a port of its own (as every outgoing connection and every
    # proxy of the chaos tests is) never get one of them...
    kernel_picks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(200)]
    try:
        for s in kernel_picks:
            s.bind(("127.0.0.1", 0))
        assert not {s.getsockname()[1] for s in kernel_picks} & set(ports)
        # ... and each is free to listen on.
        listeners = [_listen(p) for p in ports]
        for s in listeners:
            s.close()
    finally:
        for s in kernel_picks:
            s.close()


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "ephemeral_low", lambda: LOWEST_PORT + 10)
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(p >= LOWEST_PORT + 10 for p in ports), ports
    for s in [_listen(p) for p in ports]:
        s.close()
