"""The metrics' event hooks on their own: election states persisted count candidacies,
leaderships and epoch changes once each; records fetched count from the fetch offset;
a Kafka answer's error codes are found at any partition's depth."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from quorumlog.replica.node.metrics import NodeMetrics, _kafka_errors, _records_from
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import ElectionState
from quorumlog.replica.storage import QuorumState
from quorumlog.replica.storage.records import encode_batch

KEY = ("t", 0)


class Partitions:
    """PartitionManager's persist_all, over a journal held in a dict."""

    def __init__(self) -> None:
        self.states: dict[Any, QuorumState] = {}
        self.journal = self.states

    def persist_all(self, items: list[tuple[Any, ElectionState]]) -> None:
        for key, s in items:
            self.states[key] = QuorumState(
                s.epoch,
                -1 if s.leader_id is None else s.leader_id,
                -1 if s.voted_id is None else s.voted_id,
            )


def _counts(metrics: NodeMetrics) -> tuple[int, int, int]:
    return metrics.elections_started, metrics.elections_won, metrics.epoch_changes


def test_persisted_states_count_elections_once() -> None:
    metrics = NodeMetrics(SimpleNamespace(node_id=1))
    parts = Partitions()
    # Stands in epoch 1 and wins it, both in one step: one candidacy, one leadership.
    metrics.persist(parts, [(KEY, ElectionState(1, None, 1)), (KEY, ElectionState(1, 1, 1))])
    assert _counts(metrics) == (1, 1, 1)
    assert metrics.persist_seconds.collect()[0].samples  # timed
    # The same state again (a rewrite) counts nothing.
    metrics.persist(parts, [(KEY, ElectionState(1, 1, 1))])
    assert _counts(metrics) == (1, 1, 1)
    # Follows node 2 in epoch 3: an epoch change only.
    metrics.persist(parts, [(KEY, ElectionState(3, 2, None))])
    assert _counts(metrics) == (1, 1, 2)
    # A vote for another candidate is no candidacy of this node's.
    metrics.persist(parts, [(("t", 1), ElectionState(1, None, 2))])
    assert _counts(metrics) == (1, 1, 3)


def test_traffic_counts_records_from_the_fetch_offset() -> None:
    metrics = NodeMetrics(SimpleNamespace(node_id=1))
    records = encode_batch([b"a"] * 5, base_offset=10)
    fetch = m.FetchRequest(
        topic="t",
        partition=0,
        current_leader_epoch=m.NO_EPOCH,
        fetch_offset=12,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
    )
    resp = m.FetchResponse(
        error=0,
        error_message="",
        leader_id=1,
        leader_epoch=1,
        high_watermark=15,
        log_start_offset=0,
        records=records,
    )
    metrics.answered(KEY, fetch, resp)
    assert metrics.traffic["t"].records_out == 3
    assert metrics.traffic["t"].bytes_out == len(records)
    assert _records_from(b"\x00garbage", 0) == 0  # a metric never raises


def test_kafka_error_codes_at_any_depth() -> None:
    answer = {
        "error_code": 0,
        "responses": [
            {"name": "t", "partition_responses": [{"error_code": 6}, {"error_code": 0}]},
            {"name": "u", "partition_responses": [{"error_code": 3}]},
        ],
    }
    assert sorted(_kafka_errors(answer, 4)) == [3, 6]
    assert list(_kafka_errors(None, 4)) == []
