"""The readers' planning, validation and read paths against a fake client (no cluster, no
Spark): what Spark's driver and executors would call, in Spark's order."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from quorumlog.connector import LogTruncationException, parse_options
from quorumlog.connector.batch import QuorumLogBatchReader
from quorumlog.connector.fetch import QuorumLogPartition, read_partition
from quorumlog.connector.planning import QuorumLogSourceError
from quorumlog.connector.schema import ARROW_SCHEMA
from quorumlog.connector.stream import QuorumLogStreamReader

from .fakes import FakeCluster

ALL = ReadAllAvailable()


def stream(**options: str) -> QuorumLogStreamReader:
    return QuorumLogStreamReader(
        parse_options({"bootstrap": "fake:1", "topic": "events", **options})
    )


def rows(reader: Any, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[int, int, bytes]]:
    out = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            assert batch.schema == ARROW_SCHEMA
            t = pa.Table.from_batches([batch])
            out += list(
                zip(
                    t.column("partition").to_pylist(),
                    t.column("offset").to_pylist(),
                    t.column("value").to_pylist(),
                    strict=True,
                )
            )
    return sorted(out)


def values(n: int, prefix: str = "v") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_micro_batches_exactly_once_with_control_gaps(fake: FakeCluster) -> None:
    fake.create_topic("events", 2)
    fake.produce("events", 0, values(5))
    fake.produce("events", 1, values(2))
    r = stream(startingOffsets="earliest")
    start = r.initialOffset()
    assert start == {"events": {"0": {"offset": 0, "epoch": -1}, "1": {"offset": 0, "epoch": -1}}}
    end = r.latestOffset(start, ALL)
    assert end == {"events": {"0": {"offset": 6, "epoch": 0}, "1": {"offset": 3, "epoch": 0}}}
    got = rows(r, start, end)
    assert [(p, o) for p, o, _ in got] == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 1), (1, 2)]
    # clean failover: a new epoch starts with a control record; nothing is truncated
    fake.elect("events", 0)
    fake.produce("events", 0, [b"after"])
    end2 = r.latestOffset(end, ALL)
    assert end2["events"]["0"] == {"offset": 8, "epoch": 1}
    assert end2["events"]["1"] == end["events"]["1"]
    assert rows(r, end, end2) == [(0, 7, b"after")]
    r.commit(end)
    # no new data: the same JSON as the start, so Spark runs no batch
    assert r.latestOffset(end2, ALL) == end2


def test_restart_from_checkpoint_validates_and_continues(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(4))
    r = stream(startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ALL)
    fake.elect("events", 0)  # clean failover while the query is down
    fake.produce("events", 0, [b"x"])
    restarted = stream(startingOffsets="earliest")  # a new driver process, same checkpoint
    end2 = restarted.latestOffset(end, ALL)
    assert ("ofle", ("events", 0, 0)) in fake.requests
    assert rows(restarted, end, end2) == [(0, 6, b"x")]


def truncated_setup(fake: FakeCluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """Consume offsets up to 11 in epoch 0, then an unclean election keeps only 0..7 and
    new records are written at the same offsets."""
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(10))
    r = stream(startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ALL)
    assert end["events"]["0"] == {"offset": 11, "epoch": 0}
    fake.elect("events", 0, truncate_to=8)  # control record at 8, epoch 1
    return start, end


def test_truncation_fails_with_facts(fake: FakeCluster) -> None:
    _, end = truncated_setup(fake)
    fake.produce("events", 0, values(2, "new"))  # log end 11: not yet past the checkpoint
    with pytest.raises(LogTruncationException) as info:
        stream().latestOffset(end, ALL)
    (t,) = info.value.truncations
    assert (t.topic, t.partition, t.position_offset, t.position_epoch) == ("events", 0, 11, 0)
    assert (t.divergence_offset, t.divergence_epoch, t.exact) == (8, 0, True)
    assert "events/0: consumed position offset 11 (epoch 0), log diverges at offset 8" in str(
        info.value
    )


def test_truncation_seen_only_by_epoch_when_log_end_is_past_checkpoint(fake: FakeCluster) -> None:
    _, end = truncated_setup(fake)
    fake.produce("events", 0, values(10, "new"))  # log end 19 > checkpointed 11
    with pytest.raises(LogTruncationException, match="diverges at offset 8"):
        stream().latestOffset(end, ALL)


def test_truncation_resume_rereads_from_divergence(fake: FakeCluster) -> None:
    _, end = truncated_setup(fake)
    fake.produce("events", 0, values(5, "new"))
    r = stream(onTruncation="resume")
    end2 = r.latestOffset(end, ALL)
    assert end2["events"]["0"] == {"offset": 14, "epoch": 1}
    assert rows(r, end, end2) == [(0, 9 + i, f"new{i}".encode()) for i in range(5)]
    # a restarted process replaying the same batch finds the same divergence
    assert rows(stream(onTruncation="resume"), end, end2) == rows(r, end, end2)


def test_truncation_found_by_leader_epoch_change_in_running_query(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(10))
    r = stream(startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ALL)
    assert rows(r, start, end)
    fake.requests.clear()
    assert r.latestOffset(end, ALL) == end  # same epoch: no validation request
    assert not [q for q in fake.requests if q[0] == "ofle"]
    fake.elect("events", 0, truncate_to=8)
    fake.produce("events", 0, values(1, "new"))
    with pytest.raises(LogTruncationException, match="diverges at offset 8"):
        r.latestOffset(end, ALL)


def test_max_offsets_per_trigger_splits_budget_with_exact_epochs(fake: FakeCluster) -> None:
    fake.create_topic("events", 2)
    fake.produce("events", 0, values(3))  # offsets 1..3 epoch 0
    fake.elect("events", 0)  # control at 4, epoch 1
    fake.produce("events", 0, values(5))  # 5..9 epoch 1
    fake.produce("events", 1, values(9))  # 1..9
    r = stream(startingOffsets="earliest", maxOffsetsPerTrigger="6")
    assert r.getDefaultReadLimit() == ReadMaxRows(6)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"events": {"0": {"offset": 3, "epoch": 0}, "1": {"offset": 3, "epoch": 0}}}
    end2 = r.latestOffset(end, ReadMaxRows(6))
    assert end2["events"]["0"] == {"offset": 6, "epoch": 1}
    got: list[tuple[int, int, bytes]] = []
    pos = start
    while True:
        nxt = r.latestOffset(pos, ReadMaxRows(6))
        if nxt == pos:
            break
        got += rows(r, pos, nxt)
        pos = nxt
    assert sorted((p, o) for p, o, _ in got) == sorted(
        [(0, o) for o in (1, 2, 3, 5, 6, 7, 8, 9)] + [(1, o) for o in range(1, 10)]
    )
    # ReadAllAvailable overrides the option (e.g. the last AvailableNow batch)
    assert r.latestOffset(start, ALL)["events"]["0"]["offset"] == 10


def test_trigger_available_now_has_a_fixed_end(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(3))
    r = stream(startingOffsets="earliest")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    fake.produce("events", 0, values(3, "late"))
    end = r.latestOffset(start, ALL)
    assert end["events"]["0"]["offset"] == 4
    assert r.latestOffset(end, ALL) == end


def test_new_partitions_start_at_earliest_and_vanished_fail(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(2))
    r = stream(startingOffsets="latest")
    start = r.initialOffset()
    fake.topics["events"][1] = type(fake.topics["events"][0])()
    fake.produce("events", 1, [b"p1"])
    end = r.latestOffset(start, ALL)
    assert rows(r, start, end) == [(1, 0, b"p1")]
    del fake.topics["events"][1]
    with pytest.raises(QuorumLogSourceError, match="events/1 no longer exists.*failOnDataLoss"):
        r.latestOffset(end, ALL)


def test_starting_json_position_with_epoch_is_validated(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(5))
    fake.elect("events", 0, truncate_to=3)
    r = stream(startingOffsets='{"events": {"0": {"offset": 5, "epoch": 0}}}')
    start = r.initialOffset()
    assert start == {"events": {"0": {"offset": 5, "epoch": 0}}}
    with pytest.raises(LogTruncationException, match="diverges at offset 3"):
        r.latestOffset(start, ALL)
    # without an epoch the position is trusted (documented: cannot be checked)
    r2 = stream(startingOffsets='{"events": {"0": 3}}')
    s2 = r2.initialOffset()
    assert r2.latestOffset(s2, ALL)["events"]["0"] == {"offset": 4, "epoch": 1}


def test_data_loss_below_log_start(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(5))
    fake.part("events", 0).log_start = 3
    with pytest.raises(QuorumLogSourceError, match="below the log start offset 3.*failOnDataLoss"):
        r = stream(startingOffsets='{"events": {"0": 1}}')
        r.latestOffset(r.initialOffset(), ALL)
    r = stream(startingOffsets='{"events": {"0": 1}}', failOnDataLoss="false")
    s = r.initialOffset()
    assert [o for _, o, _ in rows(r, s, r.latestOffset(s, ALL))] == [3, 4, 5]


def task(**kw: Any) -> QuorumLogPartition:
    base = dict(
        bootstrap="fake:1",
        topic="events",
        partition=0,
        start_offset=0,
        start_epoch=-1,
        end_offset=11,
        end_epoch=0,
        leader_epoch=0,
        fetch_max_bytes=1 << 20,
        request_timeout_ms=2000,
        fail_on_data_loss=True,
        on_truncation="fail",
    )
    base.update(kw)
    return QuorumLogPartition(**base)  # type: ignore[arg-type]


def read_all(p: QuorumLogPartition) -> list[int]:
    return [o for b in read_partition(p) for o in b.column("offset").to_pylist()]


def test_executor_follows_clean_leader_change(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(10))
    calls = []

    def hook(topic: str, partition: int, offset: int) -> None:
        calls.append(offset)
        if len(calls) == 2:
            fake.elect("events", 0)  # fenced from now on; no data lost

    fake.fetch_hook = hook
    assert read_all(task()) == list(range(1, 11))


def test_executor_detects_truncation_after_leader_change(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(10))

    def hook(topic: str, partition: int, offset: int) -> None:
        if offset >= 6 and fake.part("events", 0).leader_epoch == 0:
            fake.elect("events", 0, truncate_to=4)
            fake.produce("events", 0, values(10, "other"))

    fake.fetch_hook = hook
    with pytest.raises(LogTruncationException, match="Detected by the Spark task"):
        read_all(task())
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(10))
    # resume: the task stops at the divergence; the driver re-reads from there next batch
    assert read_all(task(on_truncation="resume")) == [1, 2, 3, 4, 5]


def test_executor_never_reads_past_end_or_high_watermark(fake: FakeCluster) -> None:
    fake.create_topic("events", 1)
    fake.produce("events", 0, values(10))
    assert read_all(task(start_offset=2, start_epoch=0, end_offset=7)) == [2, 3, 4, 5, 6]
    fake.part("events", 0).hwm = 5
    with pytest.raises(QuorumLogSourceError, match="high watermark 5 is below the planned end"):
        read_all(task(start_offset=2, end_offset=7, request_timeout_ms=300))


def test_batch_reader_ranges(fake: FakeCluster) -> None:
    fake.create_topic("events", 2)
    fake.produce("events", 0, values(5))
    fake.produce("events", 1, values(3))
    opts = parse_options(
        {
            "bootstrap": "fake:1",
            "topic": "events",
            "startingOffsets": '{"events": {"0": {"offset": 2, "epoch": 0}}}',
            "endingOffsets": '{"events": {"0": 5, "1": -1}}',
        }
    )
    parts = QuorumLogBatchReader(opts).partitions()
    spans = sorted((p.partition, p.start_offset, p.end_offset) for p in parts)  # type: ignore[attr-defined]
    assert spans == [(0, 2, 5), (1, 0, 4)]
    bad = parse_options(
        {"bootstrap": "fake:1", "topic": "events", "endingOffsets": '{"events": {"0": 99}}'}
    )
    with pytest.raises(QuorumLogSourceError, match="up to offset 99, but its log ends at offset 6"):
        QuorumLogBatchReader(bad).partitions()
    missing = parse_options({"bootstrap": "fake:1", "topic": "nope"})
    with pytest.raises(QuorumLogSourceError, match=r"Topic\(s\) \['nope'\].*Existing topics"):
        QuorumLogBatchReader(missing).partitions()


def test_reader_pickles_without_client(fake: FakeCluster) -> None:
    import pickle

    fake.create_topic("events", 1)
    r = stream(startingOffsets="earliest")
    r.initialOffset()
    copy = pickle.loads(pickle.dumps(r))
    assert copy._client is None and copy.options == r.options
    assert pickle.loads(pickle.dumps(task())) == task()
