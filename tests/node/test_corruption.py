"""Latent corruption on a real 3-node cluster (issue 12, item 3): a flipped byte in a
sealed segment of one replica is found (by the background scrub on a follower, by the
read that would serve it on a leader), never served, and repaired from a healthy copy."""

from __future__ import annotations

from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage import HEADER_SIZE, Log, iter_batches
from quorumlog.replica.storage.log import CATCH_UP_FILE

from tests.support.cluster import (
    ELECTION_BOUND_S,
    describe,
    find_leader,
    freeze_and_stop,
    read_all,
    wait_caught_up,
    wait_led_and_caught_up,
)
from tests.support.waits import wait_for_log, wait_until

TOPIC = "scrubbed"
BATCHES = 30
PER_BATCH = 50
# Small segments, so most of the data sits in sealed (indexed, trusted) segments. The
# tests move leadership themselves: no preferred-leader rebalance may move it meanwhile
# (it would take it from the leader a test waits on).
NODE_ARGS = ["--segment-bytes", "32768", "--leader-imbalance-check-interval-ms", "0"]


def values(batch: int) -> list[bytes]:
    return [b"batch-%03d-record-%03d-" % (batch, i) + b"x" * 64 for i in range(PER_BATCH)]


def expected_values() -> list[bytes]:
    return [v for b in range(BATCHES) for v in values(b)]


def partition_dir(c: LocalCluster, node: int) -> Path:
    return c.node_dir(node) / f"{TOPIC}-0"


def damage_sealed_batch(c: LocalCluster, node: int) -> Path:
    """Flip a payload byte of the second batch of the second segment (sealed) of a
    stopped node's replica; returns the segment file."""
    segments = sorted(p for p in partition_dir(c, node).iterdir() if p.suffix == ".log")
    assert len(segments) >= 3, segments
    seg = segments[1]
    header = list(iter_batches(seg.read_bytes()))[1]
    with open(seg, "r+b") as fh:
        fh.seek(header.position + HEADER_SIZE + 40)
        byte = fh.read(1)
        fh.seek(header.position + HEADER_SIZE + 40)
        fh.write(bytes([byte[0] ^ 0xFF]))
    return seg


def all_batch_bytes(directory: Path) -> bytes:
    log = Log(str(directory))
    try:
        parts = []
        offset = log.start_offset
        while offset < log.end_offset:
            chunk = log.read(offset, 1 << 20)  # CRC-checked: raises if anything is damaged
            parts.append(chunk)
            offset = list(iter_batches(chunk))[-1].next_offset
        return b"".join(parts)
    finally:
        log.close()


def setup(c: LocalCluster) -> int:
    c.create_topic(TOPIC, 1, 3)
    for b in range(BATCHES):
        c.produce(TOPIC, 0, values(b))
    leader, _ = find_leader(c, TOPIC, 0, c.ports)
    wait_caught_up(c, leader, TOPIC, 0, c.ports)
    return leader


def wait_repaired(c: LocalCluster, node: int) -> None:
    """Until ``node`` has re-fetched past its old log end (no catch-up mark) and the
    leader reports it at its own log end."""
    wait_until(
        lambda: not (partition_dir(c, node) / CATCH_UP_FILE).exists(),
        60,  # re-fetching the cut log; slow only on a loaded machine
        f"node {node} caught back up",
    )
    leader, _ = find_leader(c, TOPIC, 0, c.ports)
    wait_caught_up(c, leader, TOPIC, 0, [node])


def check_identical_copies(c: LocalCluster, damaged: int) -> None:
    freeze_and_stop(c)
    copies = {n: all_batch_bytes(partition_dir(c, n)) for n in c.ports}
    healthy = [n for n in c.ports if n != damaged]
    assert copies[damaged] == copies[healthy[0]] == copies[healthy[1]]


@pytest.mark.cluster
def test_follower_damage_is_found_by_the_scrub_and_repaired(tmp_path: Path) -> None:
    with LocalCluster(
        3, tmp_path, node_args=[*NODE_ARGS, "--scrub-bytes-per-second", "1048576"]
    ) as c:
        leader = setup(c)
        follower = next(n for n in c.ports if n != leader)
        c.terminate(follower)  # clean shutdown: its sealed segments are trusted on restart
        seg = damage_sealed_batch(c, follower)
        c.start_node(follower)
        wait_for_log(c, "found by the scrub", ELECTION_BOUND_S, nodes=[follower])
        line = next(
            ln for ln in c.log_path(follower).read_text().splitlines() if "found by the scrub" in ln
        )
        assert f"{TOPIC}-0" in line and seg.name in line and "offset" in line
        wait_repaired(c, follower)
        # Consumers read everything intact.
        assert [v for _, _, v in read_all(c.client, TOPIC, 0)] == expected_values()
        check_identical_copies(c, follower)


@pytest.mark.cluster
def test_leader_damage_is_never_served_and_repaired(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path, node_args=NODE_ARGS) as c:
        leader = setup(c)
        victim = next(n for n in c.ports if n != leader)
        c.terminate(victim)
        damage_sealed_batch(c, victim)
        c.node_args = [*NODE_ARGS, "--scrub-bytes-per-second", "0"]  # only a read finds it
        c.start_node(victim)
        wait_caught_up(c, leader, TOPIC, 0, c.ports)
        # The damaged node must lead: hand leadership over gracefully until it does.
        epoch = 0
        for _ in range(8):
            if leader == victim:
                break
            c.terminate(leader)
            find_leader(c, TOPIC, 0, [n for n in c.ports if n != leader])
            c.start_node(leader)
            # Whoever leads once all are back (the leader just elected may lose its
            # quorum while the stopped node restarts, and another take over).
            leader, epoch = wait_led_and_caught_up(c, TOPIC, 0)
        assert leader == victim, "the damaged node never took over"
        # A consumer reading the whole partition gets every record intact: the damaged
        # leader refuses to serve the batch, resigns, and the client moves on.
        assert [v for _, _, v in read_all(c.client, TOPIC, 0)] == expected_values()
        text = c.log_path(victim).read_text()
        assert "found by a read, not served" in text and f"{TOPIC}-0" in text
        after, _ = find_leader(c, TOPIC, 0, c.ports, min_epoch=epoch + 1)
        assert after != victim or describe(c, after, TOPIC, 0).leader_epoch > epoch
        wait_repaired(c, victim)
        check_identical_copies(c, victim)
