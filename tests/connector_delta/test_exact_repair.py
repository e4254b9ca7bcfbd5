"""Exact repair after an inexact truncation answer, on a real cluster: the leader the
reader validates against never had the reader's epoch, so OffsetsForLeaderEpoch only
bounds the divergence; the sink finds the exact point from the epochs its table holds
and takes the log's records from there, so the table equals the log row for row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from quorumlog.connector.delta import DeltaSink, Position
from quorumlog.connector.offsets import TopicPartition
from quorumlog.connector.validation import validate
from quorumlog.replica.client import Client

from tests.connector.cluster_helpers import log_entries, values, wait_replicated
from tests.support.spark import source
from tests.support.waits import retry, wait_until

from .helpers import table_rows

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(300)]

TOPIC = "inexact"


def log_rows(spark: Any, cluster: Any) -> list[tuple[str, int, int, int, str]]:
    """The log's records as the table's rows (topic, partition, offset, epoch, value)."""
    df = source(spark, cluster, TOPIC, startingOffsets="earliest")
    return sorted(
        (r["topic"], r["partition"], r["offset"], r["leaderEpoch"], bytes(r["value"]).decode())
        for r in df.select("topic", "partition", "offset", "leaderEpoch", "value").collect()
    )


def committed_in(cluster: Any, epoch: int) -> None:
    def done() -> bool:
        return bool(cluster.client.list_offsets(TOPIC, 0, "latest").epoch == epoch)

    wait_until(done, 60, f"{TOPIC}/0 committing in epoch {epoch}")


def test_inexact_answer_is_repaired_exactly_from_the_tables_epochs(
    spark: Any, cluster: Any, tmp_path: Path
) -> None:
    c = cluster
    c.create_topic(TOPIC, 1)
    c.produce(TOPIC, 0, values(5, "r0-"))
    first = wait_replicated(c, TOPIC, 0)
    other, lagging = [n for n in sorted(c.ports) if n != first]
    # r1 is committed by the leader and one follower; the lagging follower misses it
    c.pause(lagging)
    try:
        r1 = c.produce(TOPIC, 0, values(5, "r1-"))
    finally:
        c.pause(first)  # keeps r1 in its epoch and hears nothing more
        c.resume(lagging)
    try:
        # the lagging follower leads a new epoch without r1; the other follows, drops r1
        second_epoch = retry(lambda: c.force_leader(TOPIC, 0, lagging))
        committed_in(c, second_epoch)
        retry(lambda: c.produce(TOPIC, 0, values(6, "r2-")))
        # the table takes the log as it is now: r0, then r2 in the second epoch
        sink = DeltaSink(tmp_path / "t", app_id="inexact", bootstrap=c.bootstrap)
        assert sink.write_batch(source(spark, c, TOPIC, startingOffsets="earliest"), 0)
        held = table_rows(tmp_path / "t")
        position = Position(held[-1][2] + 1, held[-1][3])
        assert position.epoch == second_epoch
        # the first leader comes back and is forced to lead: it never had the second
        # epoch, and its older epoch (with r1) reaches past where the second began
        c.pause(lagging)
        c.resume(first)
        retry(lambda: c.force_leader(TOPIC, 0, first))
    finally:
        c.resume(first)
        c.resume(lagging)
    third_epoch = wait_until(
        lambda: (lambda pm: pm.leader_epoch if pm.leader_id == first else None)(
            c.client.partition_metadata(TOPIC, 0, refresh=True)
        ),
        60,
        "the first leader leading again",
    )
    committed_in(c, third_epoch)
    retry(lambda: c.produce(TOPIC, 0, values(3, "r3-")))

    # What the stream does: validate its position; the answer is inexact, and the stream
    # resumes from the answer's end offset (the first leader's end of its older epoch).
    with Client(c.bootstrap) as client:
        divergence = validate(
            client, TopicPartition(TOPIC, 0), position, leader_epoch=None, log_start_offset=0
        )
    assert divergence is not None and not divergence.exact, divergence
    r1_offsets = [e.offset for e in r1]
    assert divergence.offset > r1_offsets[0]  # rows of the second epoch lie below it
    resumed = f'{{"{TOPIC}": {{"0": {{"offset": {divergence.offset}, "epoch": -1}}}}}}'
    result = sink.write_batch(source(spark, c, TOPIC, startingOffsets=resumed), 1)
    assert result is not None and result.truncations

    # the table is the log, row for row: r1 is back, the second epoch's rows are gone
    assert table_rows(tmp_path / "t") == log_rows(spark, c)
    assert [e.epoch for e in log_entries(c, TOPIC, 0) if e.offset in r1_offsets] == [
        r1[0].epoch
    ] * len(r1)
