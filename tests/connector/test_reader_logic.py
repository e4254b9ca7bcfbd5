"""The readers' planning, validation and read paths against real node processes
(LocalCluster), without Spark: what Spark's driver and executors would call, in Spark's
order. Faults (failover, unclean election, retention, deleted topics) are real ones; see
cluster_helpers.py. Spark end to end is in test_spark_e2e.py."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from collections.abc import Callable, Iterator
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
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage.records import encode_batch

from tests.support.waits import retry, wait_until

from .cluster_helpers import (
    end_position,
    log_entries,
    move_leader,
    unclean_election,
    values,
    wait_replicated,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

ALL = ReadAllAvailable()
# Readers used while a node is paused (SIGSTOP): the client asks every node for metadata,
# waiting up to min(requestTimeoutMs, 5 s) for each that does not answer.
PAUSED_TIMEOUT_MS = "1000"
Row = tuple[str, int, int, bytes]  # topic, partition, offset, value


@pytest.fixture
def stream(cluster: Any) -> Iterator[Callable[..., QuorumLogStreamReader]]:
    """``stream(topic, **options)``: a stream reader on the module cluster (a new one per
    call is a new driver process); every reader is stopped after the test."""
    made: list[QuorumLogStreamReader] = []

    def make(topic: str | None = None, **options: str) -> QuorumLogStreamReader:
        raw = {"bootstrap": cluster.bootstrap, **options}
        if topic is not None:
            raw["topic"] = topic
        reader = QuorumLogStreamReader(parse_options(raw))
        made.append(reader)
        return reader

    yield make
    for reader in made:
        reader.stop()


def rows(reader: Any, start: dict[str, Any], end: dict[str, Any]) -> list[Row]:
    """Plan the tasks of a micro-batch and run them (as executors would)."""
    out: list[Row] = []
    for part in reader.partitions(start, end):
        # executors get a pickled copy of the reader and the partition
        executor = pickle.loads(pickle.dumps(reader))
        out += batch_rows(executor.read(pickle.loads(pickle.dumps(part))))
    return sorted(out)


def batch_rows(batches: Any) -> list[Row]:
    out: list[Row] = []
    for batch in batches:
        assert batch.schema == ARROW_SCHEMA
        t = pa.Table.from_batches([batch])
        out += zip(
            t.column("topic").to_pylist(),
            t.column("partition").to_pylist(),
            t.column("offset").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    return sorted(out)


def produced(topic: str, partition: int, acks: list[Any], vals: list[bytes]) -> list[Row]:
    return [(topic, partition, a.offset, v) for a, v in zip(acks, vals, strict=True)]


def pos(offset: int, epoch: int) -> dict[str, int]:
    return {"offset": offset, "epoch": epoch}


def ofle(requests: list[tuple[str, Any]], topic: str) -> list[Any]:
    return [args for kind, args in requests if kind == "ofle" and args[0] == topic]


def new_topic(c: Any, topic: str, *counts: int) -> list[list[Any]]:
    """Create ``topic`` with one partition per count and produce ``values(count)`` to each;
    the acknowledgements per partition."""
    c.create_topic(topic, len(counts))
    return [c.produce(topic, p, values(n)) for p, n in enumerate(counts)]


# ---- micro-batches, failover, restart ----------------------------------------------------


def test_micro_batches_exactly_once_with_control_gaps(
    cluster: Any, stream: Any, requests: list[Any]
) -> None:
    c = cluster
    a0, a1 = new_topic(c, "gaps", 5, 2)
    # offset 0 of each partition is its first leader's control record (no row)
    assert [a.offset for a in a0] == [1, 2, 3, 4, 5] and [a.offset for a in a1] == [1, 2]
    r = stream("gaps", startingOffsets="earliest")
    start = r.initialOffset()
    assert start == {"gaps": {"0": pos(0, -1), "1": pos(0, -1)}}
    end = r.latestOffset(start, ALL)
    assert end == {"gaps": {"0": pos(6, a0[-1].epoch), "1": pos(3, a1[-1].epoch)}}
    assert rows(r, start, end) == produced("gaps", 0, a0, values(5)) + produced(
        "gaps", 1, a1, values(2)
    )

    # clean failover (graceful stop of the leader): a new epoch starts with a control
    # record; the running reader validates (the epoch changed) and finds no truncation
    requests.clear()
    new_epoch = move_leader(c, "gaps", 0, graceful=True)
    (after,) = c.produce("gaps", 0, [b"after"])
    assert after.epoch >= new_epoch and after.offset > 6  # a control record in between
    end2 = r.latestOffset(end, ALL)
    assert ("gaps", 0, a0[-1].epoch) in ofle(requests, "gaps")
    assert end2["gaps"]["0"] == pos(after.offset + 1, after.epoch)
    # partition 1 only moves if its leader moved too (a control record, no rows)
    assert end2["gaps"]["1"] == end_position(c, "gaps", 1)
    assert rows(r, end, end2) == [("gaps", 0, after.offset, b"after")]
    r.commit(end)
    # no new data: the same JSON as the start, so Spark runs no batch
    assert r.latestOffset(end2, ALL) == end2


def test_restart_from_checkpoint_validates_and_continues(
    cluster: Any, stream: Any, requests: list[Any]
) -> None:
    c = cluster
    (acks,) = new_topic(c, "restart", 4)
    r = stream("restart", startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ALL)
    assert end == {"restart": {"0": pos(5, acks[-1].epoch)}}
    r.stop()  # the query stops; a clean failover happens while it is down
    move_leader(c, "restart", 0, graceful=False)
    (x,) = retry(lambda: c.produce("restart", 0, [b"x"]))
    requests.clear()
    restarted = stream("restart", startingOffsets="earliest")  # new driver, same checkpoint
    end2 = restarted.latestOffset(end, ALL)
    assert ("restart", 0, acks[-1].epoch) in ofle(requests, "restart")  # validated
    assert end2 == {"restart": {"0": pos(x.offset + 1, x.epoch)}}
    assert rows(restarted, end, end2) == [("restart", 0, x.offset, b"x")]


# ---- truncation (unclean leader election) ------------------------------------------------


def consumed_then_truncated(
    c: Any, stream: Any, topic: str, running: Callable[[Any, dict[str, Any]], None] | None = None
) -> tuple[Any, dict[str, Any], dict[str, Any], Any]:
    """A reader consumes 5 records and 5 more acknowledged ones (``running(reader, end)``
    runs then); an unclean election truncates the last 5 (and maybe the record before
    them). Returns (reader, start, end, Truncation)."""
    new_topic(c, topic, 5)
    # while a node is paused every metadata request waits for it up to requestTimeoutMs
    r = stream(topic, startingOffsets="earliest", requestTimeoutMs=PAUSED_TIMEOUT_MS)
    start = r.initialOffset()
    seen: dict[str, Any] = {}

    def consume() -> None:
        seen["end"] = r.latestOffset(start, ALL)
        seen["rows"] = rows(r, start, seen["end"])
        if running is not None:
            running(r, seen["end"])

    truncation = unclean_election(c, topic, 0, values(5, "old"), before_force=consume)
    end = seen["end"]
    assert end == {topic: {"0": pos(*truncation.position)}}
    assert [o for *_, o, _ in seen["rows"]][-5:] == [a.offset for a in truncation.lost]
    return r, start, end, truncation


def test_truncation_fails_with_facts(cluster: Any, stream: Any) -> None:
    c = cluster
    _, _, end, tr = consumed_then_truncated(c, stream, "trfail")
    c.produce("trfail", 0, values(1, "new"))
    assert c.client.list_offsets("trfail", 0, "latest").offset < tr.position[0]
    with pytest.raises(LogTruncationException) as info:
        stream("trfail").latestOffset(end, ALL)  # a restarted query
    (t,) = info.value.truncations
    assert (t.topic, t.partition) == ("trfail", 0)
    assert (t.position_offset, t.position_epoch) == tr.position
    assert (t.divergence_offset, t.divergence_epoch, t.exact) == (
        tr.divergence,
        tr.position[1],
        True,
    )
    assert (
        f"trfail/0: consumed position offset {tr.position[0]} (epoch {tr.position[1]}), "
        f"log diverges at offset {tr.divergence}" in str(info.value)
    )


def test_truncation_seen_only_by_epoch_when_log_end_is_past_checkpoint(
    cluster: Any, stream: Any
) -> None:
    c = cluster
    _, _, end, tr = consumed_then_truncated(c, stream, "trpast")
    c.produce("trpast", 0, values(tr.position[0] - tr.divergence + 3, "new"))
    assert c.client.list_offsets("trpast", 0, "latest").offset > tr.position[0]
    with pytest.raises(LogTruncationException, match=f"diverges at offset {tr.divergence}"):
        stream("trpast").latestOffset(end, ALL)


def test_truncation_resume_rereads_from_divergence(cluster: Any, stream: Any) -> None:
    c = cluster
    _, _, end, tr = consumed_then_truncated(c, stream, "trresume")
    new = c.produce("trresume", 0, values(5, "new"))
    # The forced leader's epoch starts with its control record at the divergence offset;
    # only control records (one per later election: a loaded machine can keep a leader
    # from answering past the fetch timeout) lie between it and the new records.
    first = new[0].offset
    assert [a.offset for a in new] == list(range(first, first + 5))
    between = [e for e in log_entries(c, "trresume", 0) if tr.divergence <= e.offset < first]
    assert [e.offset for e in between] == list(range(tr.divergence, first))
    assert all(e.control for e in between) and between[0].epoch == tr.new_epoch
    assert sorted({e.epoch for e in between}) == [e.epoch for e in between]
    r = stream("trresume", onTruncation="resume")
    end2 = r.latestOffset(end, ALL)
    assert end2 == {"trresume": {"0": pos(new[-1].offset + 1, new[-1].epoch)}}
    expected = produced("trresume", 0, new, values(5, "new"))
    assert rows(r, end, end2) == expected
    # a restarted process replaying the same batch finds the same divergence
    assert rows(stream("trresume", onTruncation="resume"), end, end2) == expected


def test_truncation_found_by_leader_epoch_change_in_running_query(
    cluster: Any, stream: Any, requests: list[Any]
) -> None:
    c = cluster

    def running(r: Any, end: dict[str, Any]) -> None:
        requests.clear()
        assert r.latestOffset(end, ALL) == end  # same epoch: no validation request
        assert ofle(requests, "trrun") == []

    r, _, end, tr = consumed_then_truncated(c, stream, "trrun", running=running)
    c.produce("trrun", 0, values(1, "new"))
    with pytest.raises(LogTruncationException, match=f"diverges at offset {tr.divergence}"):
        r.latestOffset(end, ALL)


def test_starting_json_position_with_epoch_is_validated(cluster: Any, stream: Any) -> None:
    c = cluster
    new_topic(c, "trjson", 5)
    tr = unclean_election(c, "trjson", 0, values(3, "old"))
    offset, epoch = tr.position
    r = stream(
        "trjson", startingOffsets=f'{{"trjson": {{"0": {{"offset": {offset}, "epoch": {epoch}}}}}}}'
    )
    start = r.initialOffset()
    assert start == {"trjson": {"0": pos(offset, epoch)}}
    with pytest.raises(LogTruncationException, match=f"diverges at offset {tr.divergence}"):
        r.latestOffset(start, ALL)
    # without an epoch the position is trusted (documented: cannot be checked)
    r2 = stream("trjson", startingOffsets=f'{{"trjson": {{"0": {tr.divergence}}}}}')
    s2 = r2.initialOffset()
    # the log's end: the forced leader's control record at the divergence (and one more
    # per later election, should a loaded machine hold one)
    assert r2.latestOffset(s2, ALL)["trjson"]["0"] == end_position(c, "trjson", 0)


# ---- admission control ---------------------------------------------------------------------


def test_max_offsets_per_trigger_splits_budget_with_exact_epochs(cluster: Any, stream: Any) -> None:
    c = cluster
    c.create_topic("budget", 2)
    first = c.produce("budget", 0, values(3))  # offsets 1..3
    new_epoch = move_leader(c, "budget", 0, graceful=False, only_this_partition=True)
    second = c.produce("budget", 0, values(5, "w"))  # control record at 4, then 5..9
    p1 = c.produce("budget", 1, values(9))  # 1..9
    assert [a.offset for a in second] == [5, 6, 7, 8, 9] and second[0].epoch == new_epoch
    assert [a.offset for a in p1] == list(range(1, 10))
    e0, e1 = first[0].epoch, p1[0].epoch

    r = stream("budget", startingOffsets="earliest", maxOffsetsPerTrigger="6")
    assert r.getDefaultReadLimit() == ReadMaxRows(6)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"budget": {"0": pos(3, e0), "1": pos(3, e1)}}
    end2 = r.latestOffset(end, ReadMaxRows(6))
    # the end epoch is the epoch of the record before the end offset (5: the new epoch)
    assert end2 == {"budget": {"0": pos(6, new_epoch), "1": pos(6, e1)}}
    got: list[Row] = []
    position = start
    while True:
        nxt = r.latestOffset(position, ReadMaxRows(6))
        if nxt == position:
            break
        planned = sum(
            nxt["budget"][p]["offset"] - position["budget"][p]["offset"] for p in ("0", "1")
        )
        assert planned <= 6
        got += rows(r, position, nxt)
        position = nxt
    assert sorted(got) == sorted(
        produced("budget", 0, first, values(3))
        + produced("budget", 0, second, values(5, "w"))
        + produced("budget", 1, p1, values(9))
    )
    # ReadAllAvailable overrides the option (e.g. the last AvailableNow batch)
    assert r.latestOffset(start, ALL)["budget"]["0"] == pos(10, new_epoch)


def test_trigger_available_now_has_a_fixed_end(cluster: Any, stream: Any) -> None:
    c = cluster
    new_topic(c, "avnow", 3)
    r = stream("avnow", startingOffsets="earliest", maxOffsetsPerTrigger="2")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    c.produce("avnow", 0, values(3, "late"))
    end = r.latestOffset(start, ReadMaxRows(2))
    assert end["avnow"]["0"]["offset"] == 2
    end = r.latestOffset(end, ReadMaxRows(2))
    assert end["avnow"]["0"]["offset"] == 4
    assert r.latestOffset(end, ReadMaxRows(2)) == end
    assert r.latestOffset(end, ALL) == end
    assert [v for *_, v in rows(r, start, end)] == values(3)


# ---- subscription changes --------------------------------------------------------------


def test_new_partitions_start_at_earliest_and_vanished_fail(cluster: Any, stream: Any) -> None:
    c = cluster
    new_topic(c, "npa", 2)
    r = stream(topicPattern="np[ab]", startingOffsets="latest")
    start = r.initialOffset()
    assert list(start) == ["npa"]
    # topics cannot gain partitions: a second topic matching the pattern brings a new one
    c.create_topic("npb", 1)
    (p1,) = c.produce("npb", 0, [b"p1"])
    end = r.latestOffset(start, ALL)
    assert rows(r, start, end) == [("npb", 0, p1.offset, b"p1")]
    c.client.delete_topic("npb")
    wait_until(lambda: "npb" not in c.client.metadata(None), 30, "npb deleted")
    with pytest.raises(QuorumLogSourceError, match="npb/0 no longer exists.*failOnDataLoss"):
        r.latestOffset(end, ALL)
    lenient = stream(topicPattern="np[ab]", failOnDataLoss="false")
    assert lenient.latestOffset(end, ALL) == {"npa": end["npa"]}


def test_data_loss_below_log_start(retention_cluster: Any) -> None:
    c = retention_cluster
    c.create_topic("ret", 1)
    big = [bytes(200) + b"%d" % i for i in range(10)]

    def log_start() -> int:
        return int(c.client.metadata(["ret"])["ret"].partitions[0].log_start_offset)

    for _ in range(12):  # ~24 KiB in 12 batches: retention keeps at most 8 KiB
        c.produce("ret", 0, big)
    # The leader's retention pass (every ~5 s) deletes every segment it may at once, so the
    # first pass after the last produce leaves the final log start. If one already ran
    # while producing (rare), the final one is at most one period later.
    during = log_start()
    first = wait_until(log_start, 30, "retention to remove the oldest segments")
    if during:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and log_start() == first:
            time.sleep(0.2)
    log_start_offset = log_start()
    hwm = c.client.list_offsets("ret", 0, "latest").offset
    wanted = [e.offset for e in log_entries(c, "ret", 0) if not e.control]
    assert wanted[0] >= log_start_offset > 1

    def reader(**options: str) -> QuorumLogStreamReader:
        return QuorumLogStreamReader(
            parse_options(
                {
                    "bootstrap": c.bootstrap,
                    "topic": "ret",
                    "startingOffsets": '{"ret": {"0": 1}}',
                    **options,
                }
            )
        )

    strict = reader()
    try:
        with pytest.raises(
            QuorumLogSourceError,
            match=f"below the log start offset {log_start_offset}.*failOnDataLoss",
        ):
            strict.latestOffset(strict.initialOffset(), ALL)
    finally:
        strict.stop()
    lenient = reader(failOnDataLoss="false")
    try:
        s = lenient.initialOffset()
        end = lenient.latestOffset(s, ALL)
        assert end["ret"]["0"]["offset"] == hwm
        assert [o for _, _, o, _ in rows(lenient, s, end)] == wanted
    finally:
        lenient.stop()
    # an executor whose range was removed after planning
    part = task(c, "ret", start_offset=1, end_offset=hwm)
    with pytest.raises(QuorumLogSourceError, match="were removed from the log .retention."):
        offsets(part)
    assert offsets(dataclasses.replace(part, fail_on_data_loss=False)) == wanted


# ---- executors --------------------------------------------------------------------------


def task(c: Any, topic: str, **kw: Any) -> QuorumLogPartition:
    pm = c.client.partition_metadata(topic, 0, refresh=True)
    base: dict[str, Any] = dict(
        bootstrap=c.bootstrap,
        topic=topic,
        partition=0,
        start_offset=0,
        start_epoch=-1,
        end_offset=pm.high_watermark,
        end_epoch=-1,
        leader_epoch=pm.leader_epoch,
        fetch_max_bytes=1 << 20,
        request_timeout_ms=10_000,
        fail_on_data_loss=True,
        on_truncation="fail",
    )
    base.update(kw)
    return QuorumLogPartition(**base)


def offsets(p: QuorumLogPartition) -> list[int]:
    return [o for b in read_partition(p) for o in b.column("offset").to_pylist()]


def one_batch_per_record(c: Any, topic: str, vals: list[bytes]) -> list[Any]:
    return [c.produce(topic, 0, [v])[0] for v in vals]


def test_executor_follows_leader_change(cluster: Any, stream: Any) -> None:
    c = cluster
    c.create_topic("exfollow", 1)
    acks = one_batch_per_record(c, "exfollow", values(10))
    r = stream("exfollow", startingOffsets="earliest", fetchMaxBytes="1")
    start = r.initialOffset()
    end = r.latestOffset(start, ALL)
    (part,) = r.partitions(start, end)
    old_epoch = part.leader_epoch
    # the leader dies (kill -9) between planning and the task's first fetch
    move_leader(c, "exfollow", 0, graceful=False)
    it = iter(r.read(part))
    got = batch_rows([next(it)])
    # and again mid-read: a graceful failover while the task is reading
    move_leader(c, "exfollow", 0, graceful=True)
    got += batch_rows(it)
    assert c.client.partition_metadata("exfollow", 0, refresh=True).leader_epoch > old_epoch + 1
    assert got == produced("exfollow", 0, acks, values(10))


def test_executor_detects_truncation_after_leader_change(cluster: Any, stream: Any) -> None:
    """Two tasks (fail, resume) planned while the records were committed have read part of
    their range when an unclean election truncates it."""
    c = cluster
    c.create_topic("extrunc", 1)
    kept = one_batch_per_record(c, "extrunc", values(4))
    r = stream(
        "extrunc",
        startingOffsets="earliest",
        fetchMaxBytes="1",
        requestTimeoutMs=PAUSED_TIMEOUT_MS,
    )
    start = r.initialOffset()
    tasks: dict[str, Any] = {}

    def plan_and_start_reading() -> None:
        end = r.latestOffset(start, ALL)
        (part,) = r.partitions(start, end)
        assert part.end_epoch >= 0
        for mode in ("fail", "resume"):
            it = iter(read_partition(dataclasses.replace(part, on_truncation=mode)))
            tasks[mode] = (it, batch_rows([next(it), next(it)]))

    tr = unclean_election(c, "extrunc", 0, values(4, "old"), before_force=plan_and_start_reading)
    it, first = tasks["fail"]
    assert [o for *_, o, _ in first] == [kept[0].offset, kept[1].offset]
    with pytest.raises(LogTruncationException, match="Detected by the Spark task") as info:
        list(it)
    (t,) = info.value.truncations
    assert t.divergence_offset == tr.divergence
    # resume: the task stops at the divergence; the driver re-reads from there next batch
    it, first = tasks["resume"]
    rest = batch_rows(it)
    assert [o for *_, o, _ in first + rest] == [
        e.offset for e in log_entries(c, "extrunc", 0) if not e.control and e.offset < tr.divergence
    ]
    assert all(o < tr.divergence for *_, o, _ in rest)


def test_executor_does_not_skip_rows_for_an_unclean_epoch_that_is_then_undone(
    cluster: Any, stream: Any
) -> None:
    """A resume task meets a forced leader whose epoch no majority holds yet: it must not
    stop at that divergence (the batch would end without the rows after it). The forced
    leader dies before anyone follows it, the old majority elects one of its own, and the
    log the batch was planned on is back: the task reads its whole range."""
    c = cluster
    c.create_topic("exundo", 1)
    leader = wait_replicated(c, "exundo", 0)
    lagging, other = [n for n in sorted(c.ports) if n != leader]
    c.pause(lagging)
    try:
        c.produce("exundo", 0, [b"absorbed"])  # answers the fetch the paused node parked
        one_batch_per_record(c, "exundo", values(6))
        r = stream(
            "exundo", startingOffsets="earliest", fetchMaxBytes="1", requestTimeoutMs="20000"
        )
        start = r.initialOffset()
        (part,) = r.partitions(start, r.latestOffset(start, ALL))
        part = dataclasses.replace(part, on_truncation="resume")
        it = iter(read_partition(part))
        rows = batch_rows([next(it), next(it)])
    finally:
        c.kill(leader)
        c.pause(other)
        c.resume(lagging)
    rest: list[Any] = []
    reader = threading.Thread(target=lambda: rest.extend(batch_rows(it)), daemon=True)
    try:
        forced = retry(lambda: c.force_leader("exundo", 0, lagging))
        reader.start()
        # the task finds the forced leader and waits on its uncommitted divergence
        wait_until(
            lambda: c.client.partition_metadata("exundo", 0, refresh=True).leader_epoch == forced,
            30,
            "metadata to name the forced leader",
        )
        time.sleep(2)  # the task's back-off rounds against the forced leader, by design
        assert reader.is_alive() and not rest
    finally:
        c.kill(lagging)
        c.resume(other)
    c.start_node(leader)
    reader.join(60)
    assert not reader.is_alive()
    planned = [e.offset for e in log_entries(c, "exundo", 0) if not e.control]
    c.start_node(lagging)
    c.wait_ready()
    assert [o for *_, o, _ in rows + rest] == [o for o in planned if o < part.end_offset]


def test_executor_never_reads_past_end_or_high_watermark(retention_cluster: Any) -> None:
    c = retention_cluster  # its leaders keep leading 9 s without followers
    c.create_topic("exhwm", 1)
    acks = c.produce("exhwm", 0, values(10))
    e = acks[0].epoch
    hwm = acks[-1].offset + 1
    within = task(c, "exhwm", start_offset=2, start_epoch=e, end_offset=7, end_epoch=e)
    assert offsets(within) == list(range(2, 7))  # whole batches are fetched, rows sliced
    # records the leader holds beyond its high watermark: acks=leader, followers paused
    leader = wait_replicated(c, "exhwm", 0)
    planned = task(c, "exhwm", start_offset=2, end_offset=hwm + 5, request_timeout_ms=300)
    followers = [n for n in sorted(c.ports) if n != leader]
    for n in followers:
        c.pause(n)
    try:
        res = c.client.produce("exhwm", 0, encode_batch(values(5, "u")), acks=m.ACKS_LEADER)
        assert (res.base_offset, res.last_offset + 1) == (hwm, planned.end_offset)
        seen: list[int] = []
        with pytest.raises(
            QuorumLogSourceError, match=f"high watermark {hwm} is below the planned end"
        ):
            for b in read_partition(planned):
                seen += b.column("offset").to_pylist()
        assert seen == list(range(2, hwm))
    finally:
        for n in followers:
            c.resume(n)


def test_batch_reader_ranges(cluster: Any) -> None:
    c = cluster
    c.create_topic("batch", 2)
    a0 = c.produce("batch", 0, values(5))
    a1 = c.produce("batch", 1, values(3))
    e0 = a0[0].epoch

    def opts(**o: str) -> Any:
        return parse_options({"bootstrap": c.bootstrap, "topic": "batch", **o})

    reader = QuorumLogBatchReader(
        opts(
            startingOffsets=f'{{"batch": {{"0": {{"offset": 2, "epoch": {e0}}}}}}}',
            endingOffsets='{"batch": {"0": 5, "1": -1}}',
        )
    )
    parts = reader.partitions()
    spans = sorted((p.partition, p.start_offset, p.end_offset) for p in parts)  # type: ignore[attr-defined]
    assert spans == [(0, 2, 5), (1, 0, 4)]
    got = sorted(r for p in parts for r in batch_rows(reader.read(p)))
    assert got == produced("batch", 0, a0[1:4], values(5)[1:4]) + produced(
        "batch", 1, a1, values(3)
    )
    with pytest.raises(QuorumLogSourceError, match="up to offset 99, but its log ends at offset 6"):
        QuorumLogBatchReader(opts(endingOffsets='{"batch": {"0": 99}}')).partitions()
    missing = parse_options({"bootstrap": c.bootstrap, "topic": "nope"})
    with pytest.raises(QuorumLogSourceError, match=r"Topic\(s\) \['nope'\].*Existing topics"):
        QuorumLogBatchReader(missing).partitions()


def test_reader_and_partitions_pickle_without_client(cluster: Any, stream: Any) -> None:
    c = cluster
    c.create_topic("pickled", 1)
    acks = c.produce("pickled", 0, values(3))
    r = stream("pickled", startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ALL)
    assert r._client is not None
    copy = pickle.loads(pickle.dumps(r))
    assert copy._client is None and copy.options == r.options
    (part,) = r.partitions(start, end)
    shipped = pickle.loads(pickle.dumps(part))
    assert shipped == part
    # an executor's copy reads with only what the partition carries
    assert batch_rows(copy.read(shipped)) == produced("pickled", 0, acks, values(3))


def test_min_offsets_per_trigger_waits_for_data_or_the_delay(cluster: Any, stream: Any) -> None:
    c = cluster
    c.create_topic("minoff", 1)
    c.produce("minoff", 0, values(3))
    r = stream("minoff", startingOffsets="earliest", minOffsetsPerTrigger="10")
    start = r.initialOffset()
    first = r.latestOffset(start, ALL)
    assert first != start  # the first check fires, as in Spark's Kafka source
    c.produce("minoff", 0, values(4, "b"))
    assert r.latestOffset(first, ALL) == first  # 4 < 10 offsets and 15 min not passed
    c.produce("minoff", 0, values(6, "c"))
    ready = r.latestOffset(first, ALL)
    assert ready != first
    assert ready["minoff"]["0"]["offset"] - first["minoff"]["0"]["offset"] >= 10

    # past maxTriggerDelay a batch fires with fewer offsets
    late = stream(
        "minoff", startingOffsets="earliest", minOffsetsPerTrigger="1000", maxTriggerDelay="200ms"
    )
    s0 = late.initialOffset()
    fired = late.latestOffset(s0, ALL)
    c.produce("minoff", 0, values(2, "d"))
    assert late.latestOffset(fired, ALL) == fired
    wait_until(lambda: late.latestOffset(fired, ALL) != fired, 10, "the delayed batch to fire")
    # Trigger.AvailableNow never waits for minOffsetsPerTrigger
    now = stream("minoff", startingOffsets="earliest", minOffsetsPerTrigger="1000")
    now.prepareForTriggerAvailableNow()
    s1 = now.initialOffset()
    assert now.latestOffset(s1, ALL) != s1
