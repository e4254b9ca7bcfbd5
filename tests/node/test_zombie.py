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

from tests.support.cluster import (
    ELECTION_BOUND_S,
    assert_tail_truncated,
    create_and_find_leader,
    find_leader,
    local_view,
    node_request,
    produce_batches,
    produce_direct,
    produce_to,
    uncommitted_tail,
    wait_caught_up,
)
from tests.support.messages import consumer_fetch
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_sigstopped_leader_resigns_follows_and_truncates_its_tail(tmp_path: Path) -> None:
    topic = "zombie"
    with LocalCluster(3, tmp_path) as c:
        zombie, old_epoch = create_and_find_leader(c, topic)
        followers = [n for n in c.ports if n != zombie]
        acked = produce_batches(c, topic, 3, 30, "acked")
        wait_caught_up(c, zombie, topic, 0, followers)

        # The tail: acks=leader while the followers are stopped, so nothing commits.
        leak, tail = uncommitted_tail(c, zombie, topic, old_epoch)
        # Still the leader: check-quorum resigns only after 1.5 x fetch timeout.
        view = local_view(c, zombie, topic, 0)
        assert view is not None and view.is_local_leader and view.leader_epoch == old_epoch
        c.pause(zombie)
        for f in followers:
            c.resume(f)

        new_leader, new_epoch = find_leader(c, topic, 0, followers, min_epoch=old_epoch + 1)
        after = produce_direct(c, new_leader, topic, 3, 15, "after", epoch=new_epoch)
        assert after[0][0] <= tail[-1][0]  # the new epoch writes over the tail's offsets

        t0 = time.monotonic()
        c.resume(zombie)

        def resigned() -> bool:
            v = local_view(c, zombie, topic, 0)
            return v is not None and not v.is_local_leader and v.leader_epoch >= new_epoch

        wait_until(resigned, 10, f"zombie {zombie} to give up epoch {old_epoch}")
        resign_s = time.monotonic() - t0
        print(f"\nzombie stopped leading {resign_s * 1000:.0f} ms after SIGCONT")

        # It no longer serves its old epoch: fenced reads and produces are refused.
        fetch = node_request(
            c,
            zombie,
            ApiKey.FETCH,
            consumer_fetch(topic=topic, current_leader_epoch=old_epoch),
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
            ELECTION_BOUND_S,
            f"zombie {zombie} to follow {new_leader}",
        )
        same = assert_tail_truncated(
            c, new_leader, topic, new_epoch, acked=acked, leak=leak, tail=tail, after=after
        )
    assert b"to-the-zombie" not in {v for _, _, v in same.user_records()}
