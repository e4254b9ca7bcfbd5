"""Kafka clients (librdkafka through confluent-kafka) on a cluster's Kafka listener, set
up as the fault tests need them."""

from __future__ import annotations

import confluent_kafka
from quorumlog.replica.node.cluster import LocalCluster

#: ``serve`` flags of a test cluster whose Kafka consumers join groups: a new group's first
#: assignment at once, not after group.initial.rebalance.delay.ms's 3 s default (Kafka's
#: own integration tests set it to 0 too). The tests of the delay itself keep theirs
#: (test_compaction_configs sets one, test_describe_configs reads the default).
NO_REBALANCE_DELAY = ["--group-initial-rebalance-delay-ms", "0"]


def idempotent_producer(c: LocalCluster) -> confluent_kafka.Producer:
    """An idempotent producer (enable.idempotence) to ``c``'s Kafka listener: a request
    unanswered for a second is resent (to a stalled or killed leader's successor), and a
    record is given 90 s, long enough to outlast the failovers a test causes."""
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "enable.idempotence": True,
            "linger.ms": 2,
            "request.timeout.ms": 1000,
            "message.timeout.ms": 90000,
        }
    )
