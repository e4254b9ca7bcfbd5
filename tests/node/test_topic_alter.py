"""Topics that change: partitions added to a live topic take records at once (their own
leaders, offsets from 0, the old partitions untouched); per-topic configs set at create
and by alter are applied by every replica (retention and segment size per topic) and
shown by Metadata; what cannot be is refused with the reason."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.client.errors import QuorumLogError
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.metadata import MetadataState, TopicAssignment
from quorumlog.replica.node.topic_configs import (
    MIN_SEGMENT_BYTES,
    config_problem,
    log_config_for,
)
from quorumlog.replica.protocol import ErrorCode
from quorumlog.replica.storage import LogConfig

from tests.support.cluster import read_all
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

WAIT_S = 60.0


def test_partitions_added_to_a_live_topic_take_records_from_offset_0(
    cluster: LocalCluster,
) -> None:
    c = cluster
    c.create_topic("grow", 2)
    before = {p: c.produce("grow", p, [b"old"])[-1].offset for p in range(2)}
    c.client.alter_topic("grow", partitions=5)
    meta = c.client.wait_for_leaders("grow")
    assert sorted(meta.partitions) == [0, 1, 2, 3, 4]
    # The preferred replicas keep spreading over the nodes.
    assert sorted(meta.partitions[p].replicas[0] for p in (2, 3, 4)) == [1, 2, 3]
    for p in range(2, 5):
        acks = c.produce("grow", p, [f"new-{p}".encode()])
        assert [v for _, _, v in read_all(c.client, "grow", p)][-1] == f"new-{p}".encode()
        assert acks[0].offset <= 1  # a leader-change record at 0 at most
    for p in range(2):
        assert [o for o, _, _ in read_all(c.client, "grow", p)][-1] == before[p]
    with pytest.raises(QuorumLogError) as shrink:
        c.client.alter_topic("grow", partitions=3)
    assert shrink.value.error_code == ErrorCode.INVALID_PARTITIONS
    assert "never shrink" in str(shrink.value)
    # Asking for the count it has changes nothing and is no error.
    c.client.alter_topic("grow", partitions=5)


def test_configs_at_create_and_alter_are_shown_and_checked(cluster: LocalCluster) -> None:
    c = cluster
    c.client.create_topic("conf", 1, configs={"retention.ms": "86400000"})
    assert c.client.metadata(["conf"])["conf"].configs == {"retention.ms": "86400000"}
    c.client.alter_topic("conf", configs={"retention.bytes": "1000000", "retention.ms": None})
    got = wait_until(
        lambda: c.client.metadata(["conf"])["conf"].configs == {"retention.bytes": "1000000"},
        WAIT_S,
        "the altered configs in Metadata",
    )
    assert got
    c.client.alter_topic("conf", configs={"max.message.bytes": "2000"})
    # Committed when the alter returns; the node that answers Metadata may apply it later.
    assert wait_until(
        lambda: c.client.metadata(["conf"])["conf"].partitions[0].max_message_bytes == 2000,
        WAIT_S,
        "the altered max.message.bytes in Metadata",
    )
    for bad, why in (
        ({"flush.ms": "1000"}, "not served"),
        ({"cleanup.policy": "compacted"}, "cleanup.policy must be"),
        ({"retention.ms": "soon"}, "must be an integer"),
        ({"segment.bytes": "10"}, f"[{MIN_SEGMENT_BYTES},"),
    ):
        with pytest.raises(QuorumLogError) as refused:
            c.client.alter_topic("conf", configs=bad)
        assert refused.value.error_code == ErrorCode.INVALID_CONFIG and why in str(refused.value)
    with pytest.raises(QuorumLogError) as refused:
        c.client.create_topic("conf-bad", 1, configs={"retention.bytes": "0"})
    assert refused.value.error_code == ErrorCode.INVALID_CONFIG
    assert "conf-bad" not in c.client.list_topics()


def test_a_topic_s_own_retention_and_segment_size_apply_on_every_replica(
    cluster: LocalCluster,
) -> None:
    """The nodes keep everything (no node-wide retention): a topic that sets small
    segments and a byte bound loses its oldest segments, on every replica."""
    c = cluster
    c.create_topic("kept", 1)
    c.create_topic("bounded", 1)
    value = b"x" * 4000
    for name in ("kept", "bounded"):
        for _ in range(20):
            c.produce(name, 0, [value] * 4)
    c.client.alter_topic(
        "bounded",
        configs={"segment.bytes": str(MIN_SEGMENT_BYTES), "retention.bytes": str(3 * 16_000)},
    )
    # The active segment rolls at the new size once written to, and retention (every 5 s)
    # deletes whole sealed segments past the bound.
    for _ in range(10):
        c.produce("bounded", 0, [value] * 4)
    wait_until(
        lambda: c.client.metadata(["bounded"])["bounded"].partitions[0].log_start_offset > 0,
        WAIT_S,
        "retention of the topic that sets it",
    )
    assert c.client.metadata(["kept"])["kept"].partitions[0].log_start_offset == 0

    def first_segments() -> dict[tuple[int, str], int]:
        """Per node, the base offset of its oldest segment of each topic's partition 0."""
        out = {}
        for node in c.procs:
            for name in ("kept", "bounded"):
                bases = [int(f.stem) for f in (c.node_dir(node) / f"{name}-0").glob("*.log")]
                out[(node, name)] = min(bases)
        return out

    wait_until(
        lambda: all(
            (base > 0) == (name == "bounded") for (_, name), base in first_segments().items()
        ),
        WAIT_S,
        "retention on every replica of the bounded topic, on none of the other",
    )


def test_config_checks_and_storage_settings() -> None:
    assert config_problem({"retention.ms": "-1", "segment.bytes": "1048576"}, 1 << 20) is None
    assert config_problem({"retention.ms": None}, 1 << 20) is None  # a deletion
    assert "positive" in (config_problem({"retention.bytes": "0"}, 1 << 20) or "")
    base = LogConfig(retention_ms=1000)
    assert log_config_for(base, {}) is base
    tuned = log_config_for(base, {"retention.ms": "-1", "segment.bytes": "1048576"})
    assert (tuned.retention_ms, tuned.segment_bytes) == (None, 1048576)


def test_alter_records_replace_the_whole_topic_and_old_creates_still_apply() -> None:
    state = MetadataState()
    state.apply({"op": "create_topic", "name": "t", "replicas": [[1]], "max_message_bytes": 9})
    assert state.topics["t"].configs == {"max.message.bytes": "9"}
    alter = {"op": "alter_topic", "name": "t", "replicas": [[1], [2]], "configs": {"a": "1"}}
    state.apply(alter)
    state.apply(alter)
    assert state.topics["t"] == TopicAssignment("t", [[1], [2]], {"a": "1"})
    assert state.topics["t"].max_message_bytes is None
    state.apply({**alter, "name": "unknown"})
    assert "unknown" not in state.topics


def test_a_native_producer_compresses_as_the_topic_s_compression_type_says(
    cluster: LocalCluster,
) -> None:
    """compression.type zstd: the Producer (told by Metadata) sends zstd Arrow batches,
    which rest so on disk; readers get the records back as they were."""
    c = cluster
    values = [
        json.dumps({"id": i, "user": f"user-{i % 40}", "event": "click"}).encode()
        for i in range(3000)
    ]
    sizes = {}
    for kind in ("uncompressed", "zstd"):
        topic = f"native-{kind}"
        c.client.create_topic(topic, 1, configs={"compression.type": kind})
        producer = Producer(c.client, linger_ms=5000)  # whole batches, as a steady load makes
        try:
            for v in values:
                producer.send(topic, v, partition=0)
            producer.flush()
        finally:
            producer.close()
        assert [v for _, _, v in read_all(c.client, topic, 0)] == values
        leader = c.wait_for_leader(topic, 0)
        sizes[kind] = sum(
            f.stat().st_size for f in (c.node_dir(leader) / f"{topic}-0").glob("*.log")
        )
    assert sizes["zstd"] < 0.4 * sizes["uncompressed"], sizes
