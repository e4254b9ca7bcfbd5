"""The topic configs of log compaction and segment.ms (``node.topic_configs``): each value
checked as Kafka checks it, the storage settings a topic's replicas then run with, the
node defaults ``serve`` takes, and the refusal of records without a key on a compacted
topic."""

from __future__ import annotations

import dataclasses
import re

import pytest
from quorumlog.replica import defaults
from quorumlog.replica.cli.main import build_parser
from quorumlog.replica.node.config import NodeConfig
from quorumlog.replica.node.topic_configs import (
    KEYLESS_RECORD,
    cleanup_policy,
    config_problem,
    keyless_record,
    log_config_for,
)
from quorumlog.replica.storage import LogConfig
from quorumlog.replica.storage.records import encode_batch

FRAME = 1 << 20
LONG_MAX = (1 << 63) - 1


@pytest.mark.parametrize(
    ("configs", "problem"),
    [
        ({"cleanup.policy": "compact"}, None),
        ({"cleanup.policy": "delete,compact"}, None),
        ({"cleanup.policy": "compact, delete"}, None),
        ({"cleanup.policy": "compacted"}, "cleanup.policy must be"),
        ({"cleanup.policy": ""}, "cleanup.policy must be"),
        ({"min.cleanable.dirty.ratio": "0"}, None),
        ({"min.cleanable.dirty.ratio": "1.0"}, None),
        ({"min.cleanable.dirty.ratio": "1.01"}, "must be in [0, 1]"),
        ({"min.cleanable.dirty.ratio": "nan"}, "must be in [0, 1]"),
        ({"min.cleanable.dirty.ratio": "half"}, "must be a number"),
        ({"min.compaction.lag.ms": "0"}, None),
        ({"min.compaction.lag.ms": "-1"}, "min.compaction.lag.ms must be in [0,"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms must be in [1,"),
        ({"max.compaction.lag.ms": str(LONG_MAX)}, None),
        ({"delete.retention.ms": "0"}, None),
        ({"delete.retention.ms": "-1"}, "delete.retention.ms must be in [0,"),
        ({"segment.ms": "1"}, None),
        ({"segment.ms": "0"}, "segment.ms must be in [1,"),
        ({"segment.ms": "soon"}, "must be an integer"),
        # Kafka's LogConfig.validateValues: the lags may not cross.
        (
            {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "9"},
            "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (9)",
        ),
        ({"min.compaction.lag.ms": "9", "max.compaction.lag.ms": "9"}, None),
    ],
)
def test_compaction_configs_are_checked_as_kafka_checks_them(
    configs: dict[str, str | None], problem: str | None
) -> None:
    got = config_problem(configs, FRAME)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


def test_cleanup_policy_has_one_spelling() -> None:
    assert cleanup_policy("delete") == "delete"
    assert cleanup_policy("compact") == "compact"
    assert cleanup_policy("delete,compact") == cleanup_policy("compact,delete") == "compact,delete"
    assert cleanup_policy("compact,compact") == "compact"
    assert cleanup_policy("compact,shred") is None


def test_a_topic_s_compaction_configs_become_its_storage_settings() -> None:
    base = LogConfig()
    tuned = log_config_for(
        base,
        {
            "cleanup.policy": "delete,compact",
            "min.cleanable.dirty.ratio": "0.1",
            "min.compaction.lag.ms": "5",
            "max.compaction.lag.ms": "60000",
            "delete.retention.ms": "0",
            "segment.ms": "1000",
        },
    )
    assert (
        tuned.cleanup_policy,
        tuned.min_cleanable_dirty_ratio,
        tuned.min_compaction_lag_ms,
        tuned.max_compaction_lag_ms,
        tuned.delete_retention_ms,
        tuned.segment_ms,
    ) == ("compact,delete", 0.1, 5, 60000, 0, 1000)
    # Kafka's "never" is no bound here; what a topic does not set is the node's.
    never = log_config_for(
        dataclasses.replace(base, cleanup_policy="compact", segment_ms=5000),
        {"max.compaction.lag.ms": str(LONG_MAX), "retention.ms": "1000"},
    )
    assert never.max_compaction_lag_ms is None
    assert (never.cleanup_policy, never.segment_ms) == ("compact", 5000)


def _serve(*extra: str) -> NodeConfig:
    args = build_parser().parse_args(
        ["serve", "--node-id", "1", "--listen", "127.0.0.1:9001", "--voters",
         "1@127.0.0.1:9001", "--data-dir", "/tmp/x", "--cluster-id", "c", *extra]
    )  # fmt: skip
    return NodeConfig.from_args(args)


def test_serve_flags_set_the_nodes_defaults_of_the_topic_configs() -> None:
    plain = _serve()
    assert (
        plain.cleanup_policy,
        plain.min_cleanable_dirty_ratio,
        plain.min_compaction_lag_ms,
        plain.max_compaction_lag_ms,
        plain.delete_retention_ms,
        plain.segment_ms,
        plain.group_initial_rebalance_delay_ms,
    ) == (
        defaults.CLEANUP_POLICY,
        defaults.MIN_CLEANABLE_DIRTY_RATIO,
        defaults.MIN_COMPACTION_LAG_MS,
        defaults.MAX_COMPACTION_LAG_MS,
        defaults.DELETE_RETENTION_MS,
        defaults.SEGMENT_MS,
        defaults.GROUP_INITIAL_REBALANCE_DELAY_MS,
    )
    tuned = _serve(
        "--cleanup-policy", "compact", "--min-cleanable-dirty-ratio", "0.2",
        "--min-compaction-lag-ms", "10", "--max-compaction-lag-ms", "20",
        "--delete-retention-ms", "30", "--segment-ms", "40",
        "--group-initial-rebalance-delay-ms", "0",
    )  # fmt: skip
    assert (
        tuned.cleanup_policy,
        tuned.min_cleanable_dirty_ratio,
        tuned.min_compaction_lag_ms,
        tuned.max_compaction_lag_ms,
        tuned.delete_retention_ms,
        tuned.segment_ms,
        tuned.group_initial_rebalance_delay_ms,
    ) == ("compact", 0.2, 10, 20, 30, 40, 0)


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--cleanup-policy", "shred"], "cleanup.policy must be"),
        (["--min-cleanable-dirty-ratio", "2"], "min.cleanable.dirty.ratio must be in [0, 1]"),
        (["--min-compaction-lag-ms", "5", "--max-compaction-lag-ms", "4"], "conflict"),
        (["--segment-ms", "0"], "segment.ms must be in [1,"),
        (["--group-initial-rebalance-delay-ms", "-1"], "must be >= 0"),
    ],
)
def test_serve_refuses_node_defaults_a_topic_could_not_set(flags: list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        _serve(*flags)


def test_records_without_a_key_are_refused_on_compacted_topics_only() -> None:
    keyed = encode_batch([b"v1", None], keys=[b"k1", b"k2"])  # a tombstone has a key
    keyless = encode_batch([b"v1", b"v2", b"v3"], keys=[b"k1", None, None])
    assert keyless_record("compact", keyed) is None
    assert keyless_record("delete", keyless) is None
    problem = keyless_record("compact,delete", keyed + keyless)
    assert problem is not None and problem.startswith(KEYLESS_RECORD)
    assert "2 of 5 records" in problem
    # An empty key is a key (Kafka's: only a null one is missing).
    assert keyless_record("compact", encode_batch([b"v"], keys=[b""])) is None
