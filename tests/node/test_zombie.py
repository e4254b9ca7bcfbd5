"""A SIGSTOPped leader (a zombie) with an unacknowledged tail: the others elect a new
leader; after SIGCONT the zombie resigns (check-quorum), stops serving its old epoch,
follows the new leader and truncates the tail; every replica ends up identical."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey, ErrorCode
from quorumlog.replica.protocol import messages as m

from .helpers import (
    Record,
    assert_replicas_identical,
    find_leader,
    freeze_and_stop,
    local_view,
    node_request,
    produce_to,
    read_all,
    replica_logs,
    wait_caught_up,
    wait_until,
)
from .test_failover import _produce_batches, _produce_tail, wait_hwm

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_sigstopped_leader_resigns_follows_and_truncates_its_tail(tmp_path: Path) -> None:
    topic = "zombie"
    with LocalCluster(3, tmp_path) as c:
        c.create_topic(topic, 1)
        zombie, old_epoch = find_leader(c, topic, 0, [c.leader_of(topic, 0)])
        followers = [n for n in c.ports if n != zombie]
        acked = _produce_batches(c, topic, 3, 30, "acked")
        wait_caught_up(c, zombie, topic, 0, followers)

        # The tail: acks=leader while the followers are stopped, so nothing commits. (The
        # first batch may reach a stopped follower's socket buffer through a parked fetch.)
        for f in followers:
            c.pause(f)
        leak = _produce_tail(c, zombie, topic, old_epoch, "leak", 1)
        tail = _produce_tail(c, zombie, topic, old_epoch, "tail", 3)
        # Still the leader: check-quorum resigns only after 1.5 x fetch timeout.
        view = local_view(c, zombie, topic, 0)
        assert view is not None and view.is_local_leader and view.leader_epoch == old_epoch
        c.pause(zombie)
        for f in followers:
            c.resume(f)

        new_leader, new_epoch = find_leader(c, topic, 0, followers, min_epoch=old_epoch + 1)
        after: list[Record] = []
        for b in range(3):
            values = [f"after-{b}-{i}".encode() for i in range(15)]
            r = produce_to(c, new_leader, topic, 0, values)
            assert r.error == 0, r
            assert r.leader_epoch == new_epoch
            after.extend((r.base_offset + i, r.leader_epoch, v) for i, v in enumerate(values))
        assert after[0][0] <= tail[-1][0]  # the new epoch writes over the tail's offsets

        t0 = time.monotonic()
        c.resume(zombie)

        def resigned() -> bool:
            v = local_view(c, zombie, topic, 0)
            return v is not None and not v.is_local_leader and v.leader_epoch >= new_epoch

        wait_until(resigned, f"zombie {zombie} to give up epoch {old_epoch}", timeout_s=10)
        resign_s = time.monotonic() - t0
        print(f"\nzombie stopped leading {resign_s * 1000:.0f} ms after SIGCONT")

        # It no longer serves its old epoch: fenced reads and produces are refused.
        fetch = node_request(
            c,
            zombie,
            ApiKey.FETCH,
            m.FetchRequest(
                topic=topic,
                partition=0,
                current_leader_epoch=old_epoch,
                fetch_offset=0,
                max_wait_ms=0,
                min_bytes=1,
                max_bytes=1 << 20,
            ),
            m.FetchResponse,
        )
        assert fetch.error == ErrorCode.FENCED_LEADER_EPOCH, fetch
        assert fetch.records == b""
        produced = produce_to(c, zombie, topic, 0, [b"to-the-zombie"], acks=m.ACKS_LEADER)
        assert produced.error == ErrorCode.NOT_LEADER, produced

        wait_until(
            lambda: (
                (v := local_view(c, zombie, topic, 0)) is not None and v.leader_id == new_leader
            ),
            f"zombie {zombie} to follow {new_leader}",
        )
        wait_caught_up(c, new_leader, topic, 0, c.ports)
        wait_hwm(c, topic, after[-1][0] + 1)
        survived = read_all(c.client, topic, 0)
        assert survived in (acked + after, acked + leak + after)
        freeze_and_stop(c)

    same = assert_replicas_identical(replica_logs(c, topic, 0))
    assert same.user_records() == survived
    assert not {v for _, _, v in same.user_records()} & {v for _, _, v in tail}
    assert b"to-the-zombie" not in {v for _, _, v in same.user_records()}
    assert dict(same.epochs)[new_epoch] in (leak[0][0], tail[0][0])
