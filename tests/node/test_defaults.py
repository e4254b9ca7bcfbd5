"""The shipped defaults have one home, replica.defaults: `quorumlog serve` with no tuning
flags, NodeConfig and the quorum timing a node runs all come out of it."""

from __future__ import annotations

import pytest
from quorumlog.replica import defaults
from quorumlog.replica.cli.main import build_parser
from quorumlog.replica.node.config import NodeConfig
from quorumlog.replica.node.node import default_quorum_config


def _serve(*extra: str) -> NodeConfig:
    args = build_parser().parse_args(
        ["serve", "--node-id", "1", "--listen", "127.0.0.1:9001", "--voters",
         "1@127.0.0.1:9001", "--data-dir", "/tmp/x", "--cluster-id", "c", *extra]
    )  # fmt: skip
    return NodeConfig.from_args(args)


def test_serve_without_tuning_flags_runs_the_shipped_defaults() -> None:
    config = _serve()
    assert (
        config.election_timeout_ms,
        config.fetch_timeout_ms,
        config.segment_bytes,
        config.retention_bytes,
        config.retention_ms,
        config.max_message_bytes,
        config.scrub_bytes_per_second,
        config.replica_fetch_max_wait_ms,
        config.produce_timeout_ms,
    ) == (
        defaults.QUORUM_ELECTION_TIMEOUT_MS,
        defaults.QUORUM_FETCH_TIMEOUT_MS,
        defaults.SEGMENT_BYTES,
        defaults.RETENTION_BYTES,
        defaults.RETENTION_MS,
        defaults.MAX_MESSAGE_BYTES,
        defaults.SCRUB_BYTES_PER_SECOND,
        defaults.REPLICA_FETCH_MAX_WAIT_MS,
        defaults.PRODUCE_TIMEOUT_MS,
    )
    quorum = default_quorum_config(config)
    assert (
        quorum.election_timeout_ms,
        quorum.fetch_timeout_ms,
        quorum.election_backoff_max_ms,
        quorum.retry_backoff_ms,
        quorum.retry_backoff_max_ms,
        quorum.fetch_max_wait_ms,
        quorum.fetch_max_bytes,
    ) == (
        defaults.QUORUM_ELECTION_TIMEOUT_MS,
        defaults.QUORUM_FETCH_TIMEOUT_MS,
        defaults.QUORUM_ELECTION_BACKOFF_MAX_MS,
        defaults.QUORUM_RETRY_BACKOFF_MS,
        defaults.QUORUM_RETRY_BACKOFF_MAX_MS,
        defaults.REPLICA_FETCH_MAX_WAIT_MS,
        defaults.REPLICA_FETCH_MAX_BYTES,
    )


def test_the_quorum_request_timeout_leaves_room_for_one_lost_fetch() -> None:
    # A parked fetch plus its resend timeout ends before the follower would give up on
    # its leader, at the shipped timing and at a tuned one.
    for fetch_timeout in (defaults.QUORUM_FETCH_TIMEOUT_MS, 2000):
        quorum = default_quorum_config(_serve("--fetch-timeout-ms", str(fetch_timeout)))
        assert quorum.fetch_max_wait_ms + quorum.request_timeout_ms < quorum.fetch_timeout_ms


def test_a_zero_fetch_timeout_is_refused_not_replaced_by_the_default() -> None:
    with pytest.raises(ValueError, match="fetch_timeout_ms must be > 0"):
        default_quorum_config(_serve("--fetch-timeout-ms", "0"))
