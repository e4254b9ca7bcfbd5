"""The connector's own reads through the Client survive a hung leader (SIGSTOP): the
driver's planning lookups (an existing Client connected to the leader) and the Delta
sink's divergence lookups (``LogDivergenceResolver``) answer from the new leader while the
old one stays stopped, long before their 30 s request timeout would have given up on it
(how soon is printed, not judged: a loaded machine stretches it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from quorumlog.connector import planning
from quorumlog.connector.delta import LogDivergenceResolver
from quorumlog.connector.offsets import Position, TopicPartition
from quorumlog.connector.options import parse_options
from quorumlog.replica.node.cluster import LocalCluster

TOPIC = "lookups"


@pytest.mark.cluster
def test_planning_and_delta_lookups_follow_a_new_leader(tmp_path: Path) -> None:
    with LocalCluster(3, tmp_path) as c:
        c.create_topic(TOPIC, 1)
        acked = c.produce(TOPIC, 0, [b"a", b"b", b"c"])
        end = Position(acked[-1].offset + 1, acked[-1].epoch)
        tp = TopicPartition(TOPIC, 0)
        opts = parse_options({"bootstrap": c.bootstrap, "topic": TOPIC})
        client = planning.connect(opts.bootstrap, opts.request_timeout_ms, "driver")
        planner = planning.Planner(opts, client)
        resolver = LogDivergenceResolver(c.bootstrap)
        try:
            assert planner.with_leader(tp, lambda pm: planner.latest(tp, pm)) == end
            leader = client.partition_metadata(TOPIC, 0).leader_id
            results: dict[str, Any] = {}

            def run(name: str, fn: Any) -> threading.Thread:
                def body() -> None:
                    try:
                        results[name] = (fn(), time.monotonic() - paused_at)
                    except BaseException as exc:  # reported below
                        results[name] = (exc, time.monotonic() - paused_at)

                return threading.Thread(target=body, daemon=True)

            threads = [
                run(
                    "planning",
                    lambda: planner.with_leader(tp, lambda pm: planner.validate(tp, end, pm)),
                ),
                run("delta", lambda: resolver(TOPIC, 0, end)),
            ]
            c.pause(leader)
            paused_at = time.monotonic()
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(15)
            finally:
                c.resume(leader)
            print({k: f"{v[1]:.2f} s" for k, v in results.items()})
            # Answered within 15 s while the leader is stopped: from the new leader, not
            # after waiting out the request timeout (30 s) on the old one.
            assert set(results) == {"planning", "delta"}, (
                "a lookup still blocked 15 s after SIGSTOP"
            )
            assert results["planning"][0] is None  # no divergence: a clean failover
            assert results["delta"][0] == end.offset
        finally:
            client.close()
