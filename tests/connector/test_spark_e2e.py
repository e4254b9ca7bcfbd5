"""End to end: real Spark (the session fixture), real node processes (LocalCluster).

No ``register`` call anywhere here: format "quorumlog" resolves through the top-level
``pyspark_quorumlog`` module (Spark's Python data source discovery)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from quorumlog.connector import LogTruncationException, ending_offsets_json, next_offsets
from quorumlog.replica.client.producer import Producer

from tests.support.cli import run_cli
from tests.support.spark import run_available_now, source, triples
from tests.support.waits import retry, wait_until

from .cluster_helpers import wait_replicated

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


def log_contents(spark: Any, cluster: Any, topic: str) -> list[tuple[int, int, int, bytes]]:
    return triples(source(spark, cluster, topic, startingOffsets="earliest"))


# ---- batch ------------------------------------------------------------------------------


def test_batch_read_every_record_once_with_offsets_and_epochs(spark: Any, cluster: Any) -> None:
    c = cluster
    c.create_topic("batch3", 3)
    expected = []
    for p in range(3):
        for v, (o, e) in zip(
            [f"p{p}-{i}".encode() for i in range(7)],
            c.produce("batch3", p, [f"p{p}-{i}".encode() for i in range(7)], keys=[b"k"] * 7),
            strict=True,
        ):
            expected.append((p, o, e, v))
    df = source(spark, c, "batch3")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "leaderEpoch:int,timestamp:timestamp,headers:array<struct<key:string,value:binary>>>"
    )
    assert triples(df) == sorted(expected)
    row = df.where("partition = 0").orderBy("offset").first()
    assert (row["topic"], bytes(row["key"])) == ("batch3", b"k")
    assert row["timestamp"] is not None


def test_batch_starting_ending_offsets_and_incremental_reads(spark: Any, cluster: Any) -> None:
    c = cluster
    c.create_topic("incr", 2)
    first = {p: c.produce("incr", p, [f"a{i}".encode() for i in range(5)]) for p in range(2)}
    (o2, e2) = first[0][2]
    starting = json.dumps({"incr": {"0": {"offset": o2, "epoch": e2}, "1": first[1][0].offset}})
    ending = json.dumps({"incr": {"0": first[0][4].offset, "1": -1}})
    got = triples(source(spark, c, "incr", startingOffsets=starting, endingOffsets=ending))
    assert [(p, o) for p, o, _, _ in got] == [(0, o2), (0, o2 + 1)] + [
        (1, oe.offset) for oe in first[1]
    ]
    # incremental: end fixed up front, the next batch starts exactly there
    end1 = ending_offsets_json(c.bootstrap, "incr")
    df1 = source(spark, c, "incr", startingOffsets="earliest", endingOffsets=end1)
    assert len(triples(df1)) == 10
    assert json.loads(next_offsets(df1)) == json.loads(end1)
    for p in range(2):
        c.produce("incr", p, [b"b0", b"b1"])
    df2 = source(spark, c, "incr", startingOffsets=next_offsets(df1))
    assert sorted(v for *_, v in triples(df2)) == [b"b0", b"b0", b"b1", b"b1"]


def test_batch_reads_after_the_topic_grows_name_its_new_partitions(
    spark: Any, cluster: Any
) -> None:
    """``quorumlog topic alter --partitions``: the next batch read from the previous one's
    epoch-aware offsets (which name only the old partition) reads the new partitions from
    offset 0, and the offsets it hands on name every partition with its epoch."""
    c = cluster
    c.create_topic("grown", 1)
    c.produce("grown", 0, [b"old-0", b"old-1"])
    end1 = ending_offsets_json(c.bootstrap, "grown")
    df1 = source(spark, c, "grown", startingOffsets="earliest", endingOffsets=end1)
    assert [v for *_, v in triples(df1)] == [b"old-0", b"old-1"]
    assert set(json.loads(next_offsets(df1))["grown"]) == {"0"}

    altered = run_cli("topic", "alter", "grown", "-b", c.bootstrap, "--partitions", "3")
    assert altered.returncode == 0, altered.stderr
    c.client.wait_for_leaders("grown")
    produced = {p: c.produce("grown", p, [f"new-{p}".encode()])[0] for p in range(3)}

    # Named by neither offsets JSON: the new partitions read from their first offset.
    df2 = source(spark, c, "grown", startingOffsets=next_offsets(df1))
    assert triples(df2) == [
        (p, produced[p].offset, produced[p].epoch, f"new-{p}".encode()) for p in range(3)
    ]
    after = json.loads(next_offsets(df2, previous=next_offsets(df1)))["grown"]
    assert after == {
        str(p): {"offset": produced[p].offset + 1, "epoch": produced[p].epoch} for p in range(3)
    }

    # Epoch-aware offsets naming the new partitions, both ends.
    c.produce("grown", 2, [b"more-2"])
    end3 = ending_offsets_json(c.bootstrap, "grown")
    assert set(json.loads(end3)["grown"]) == {"0", "1", "2"}
    df3 = source(
        spark, c, "grown", startingOffsets=json.dumps({"grown": after}), endingOffsets=end3
    )
    assert [(p, v) for p, _, _, v in triples(df3)] == [(2, b"more-2")]
    assert json.loads(next_offsets(df3, previous=json.dumps({"grown": after}))) == json.loads(end3)


OPTION_ERRORS: list[tuple[dict[str, str | None], str]] = [
    ({"bootstrap": None}, "Missing required option 'bootstrap'"),
    ({"bootstrap": "nohost"}, "option 'bootstrap': 'nohost'"),
    ({"topic": None}, "Exactly one of the options 'topic'"),
    ({"topicPattern": "x["}, "both were given"),
    ({"startingOffsets": "first"}, "option 'startingOffsets': 'first'"),
    ({"endingOffsets": "earliest"}, "option 'endingOffsets': 'earliest'"),
    ({"maxOffsetsPerTrigger": "0"}, "option 'maxOffsetsPerTrigger': '0'"),
    ({"onTruncation": "skip"}, "option 'onTruncation': 'skip'"),
    ({"failOnDataLoss": "maybe"}, "option 'failOnDataLoss': 'maybe'"),
    ({"fetchMaxBytes": "lots"}, "option 'fetchMaxBytes': 'lots'"),
    ({"requestTimeoutMs": "-5"}, "option 'requestTimeoutMs': '-5'"),
    ({"subscribe": "x"}, "Unknown option 'subscribe'"),
]


def _reader_options(override: dict[str, str | None]) -> dict[str, str]:
    options = {"bootstrap": "127.0.0.1:1", "topic": "t", **override}
    return {k: v for k, v in options.items() if v is not None}


@pytest.mark.parametrize(
    "override, message", OPTION_ERRORS, ids=[next(iter(o)) for o, _ in OPTION_ERRORS]
)
def test_option_error_at_analysis_time(override: dict[str, str | None], message: str) -> None:
    """What Spark's load() runs in a Python worker for read and readStream alike
    (pyspark.sql.worker.create_data_source): the options as a CaseInsensitiveDict, the
    discovered DefaultSource made from them, its schema() asked. Every bad option fails
    there, with its message; run here, not in a worker per case (~1.3 s each). The test
    below shows, for each of read and readStream, that Spark's load() raises it."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    from pyspark_quorumlog import DefaultSource

    options = CaseInsensitiveDict(_reader_options(override))
    with pytest.raises(Exception, match="Accepted|Missing required|Exactly one") as info:
        DefaultSource(options=options).schema()
    assert message in str(info.value)


@pytest.mark.parametrize(
    "stream, override, message",
    [
        (False, *OPTION_ERRORS[4]),  # startingOffsets
        (True, *OPTION_ERRORS[-1]),  # an unknown option
    ],
    ids=["read", "readStream"],
)
def test_option_error_at_analysis_time_through_spark(
    spark: Any, stream: bool, override: dict[str, str | None], message: str
) -> None:
    reader = (spark.readStream if stream else spark.read).format("quorumlog")
    for k, v in _reader_options(override).items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match="Accepted|Missing required|Exactly one") as info:
        reader.load()  # analysis only: nothing runs, no cluster is contacted
    assert message in str(info.value)


def test_unknown_topic_and_unreachable_bootstrap_are_clear(spark: Any, cluster: Any) -> None:
    with pytest.raises(
        Exception, match=r"Topic\(s\) \['nope'\] given in option 'topic' do not exist"
    ):
        source(spark, cluster, "nope").count()
    df = spark.read.format("quorumlog").option("bootstrap", "127.0.0.1:1").option("topic", "t")
    with pytest.raises(Exception, match="Cannot reach the quorumlog cluster.*127.0.0.1:1"):
        df.option("requestTimeoutMs", "1000").load().count()


# ---- streaming --------------------------------------------------------------------------


def test_stream_exactly_once_across_batches_restart_and_leader_kill(
    spark: Any, tmp_path: Path
) -> None:
    from quorumlog.replica.node.cluster import LocalCluster

    with LocalCluster(nodes=3, data_dir=tmp_path / "c") as c:
        c.create_topic("ev", 2)
        for p in range(2):
            c.produce("ev", p, [f"a{p}-{i}".encode() for i in range(30)])
        out, ck = tmp_path / "out", tmp_path / "ck"

        def sink_count() -> int:
            try:
                return int(spark.read.parquet(str(out)).count())
            except Exception:
                return 0

        df = source(
            spark, c, "ev", stream=True, startingOffsets="earliest", maxOffsetsPerTrigger="25"
        )
        query = (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(processingTime="300 milliseconds")
            .start()
        )
        try:
            wait_until(lambda: sink_count() >= 60, 90, "the first 60 rows")
            assert len([p for p in query.recentProgress if p["numInputRows"] > 0]) >= 3
            leader = c.wait_for_leader("ev", 0)
            c.kill(leader)  # kill -9 during the query
            for p in range(2):
                retry(lambda p=p: c.produce("ev", p, [f"b{p}-{i}".encode() for i in range(20)]), 60)
            wait_until(lambda: sink_count() >= 100, 120, "rows produced after the kill")
            assert query.exception() is None
        finally:
            query.stop()
        c.restart(leader)
        for p in range(2):
            retry(lambda p=p: c.produce("ev", p, [f"c{p}-{i}".encode() for i in range(10)]), 60)
        # restart from the checkpoint (clean failover since: must not look like truncation)
        run_available_now(source(spark, c, "ev", stream=True, startingOffsets="earliest"), out, ck)
        got = triples(spark.read.parquet(str(out)))
        assert len(got) == len(set(got))
        assert got == log_contents(spark, c, "ev")
        assert len(got) >= 120


def test_truncation_fail_then_resume(spark: Any, tmp_path: Path) -> None:
    from quorumlog.replica.node.cluster import LocalCluster

    with LocalCluster(nodes=3, data_dir=tmp_path / "c") as c:
        c.create_topic("tr", 1)
        c.produce("tr", 0, [b"a", b"b"])
        # acks=quorum needs one follower: wait until both hold a and b, so the divergence
        # below is known (under load the lagging one may not have fetched them yet).
        leader = wait_replicated(c, "tr", 0)
        lagging, other = [n for n in sorted(c.ports) if n != leader]
        c.pause(lagging)
        c.produce("tr", 0, [b"absorbed"])  # answers the fetch it had parked; then it hears nothing
        lost = c.produce("tr", 0, [f"old{i}".encode() for i in range(5)])
        out, ck = tmp_path / "out", tmp_path / "ck"

        def query(on_truncation: str) -> Any:
            return run_available_now(
                source(
                    spark,
                    c,
                    "tr",
                    stream=True,
                    startingOffsets="earliest",
                    onTruncation=on_truncation,
                ),
                out,
                ck,
            )

        assert query("fail").exception() is None
        position = (lost[-1].offset + 1, lost[-1].epoch)
        assert max(o for _, o, _, _ in triples(spark.read.parquet(str(out)))) == position[0] - 1

        # unclean election: the lagging replica leads without the records consumed above.
        # The other follower is paused, not killed: a restarted one may not fetch from the
        # forced leader within 1.5 x the fetch timeout, which then resigns, and the old
        # majority's log (with the records) wins the next election.
        c.kill(leader)
        c.pause(other)
        c.resume(lagging)
        try:
            retry(lambda: c.force_leader("tr", 0, lagging), 60)
        finally:
            c.resume(other)
        retry(lambda: c.produce("tr", 0, [b"new0"]), 60)
        c.restart(leader)
        assert c.client.list_offsets("tr", 0, "latest").offset < position[0]
        # where the new leader's log leaves the consumed history (the lagging replica may or
        # may not have received "absorbed")
        divergence = c.client.offsets_for_leader_epoch("tr", 0, position[1]).end_offset
        assert lost[0].offset - 1 <= divergence <= lost[0].offset

        def expect_truncation() -> None:
            failed = query("fail")
            error = failed.exception()
            assert error is not None
            found = LogTruncationException.from_spark_error(error)
            assert found is not None, str(error)[:2000]
            (t,) = found.truncations
            assert (t.topic, t.partition) == ("tr", 0)
            assert (t.position_offset, t.position_epoch) == position
            assert t.divergence_offset == divergence
            assert f"tr/0: consumed position offset {position[0]}" in str(error)

        expect_truncation()  # new log end below the checkpointed offset
        retry(lambda: c.produce("tr", 0, [f"new{i}".encode() for i in range(1, 12)]), 60)
        assert c.client.list_offsets("tr", 0, "latest").offset > position[0]
        expect_truncation()  # log end past the checkpoint: only the epoch reveals it

        assert query("resume").exception() is None
        rows = triples(spark.read.parquet(str(out)))
        resumed = [r for r in rows if r[3].startswith(b"new")]
        log_now = log_contents(spark, c, "tr")
        assert resumed == [r for r in log_now if r[1] >= divergence]
        assert min(r[1] for r in resumed) >= divergence


# ---- a partition moving under a reader ---------------------------------------------------


def test_a_stream_across_a_partition_move_sees_new_epochs_and_no_truncation(
    spark: Any, cluster: Any, tmp_path: Path
) -> None:
    """A partition moves off the node leading it (``Client.reassign``) between two
    micro-batch runs of a stream: the second run resumes from its checkpoint, reads the
    records written during and after the move once, at a later leader epoch, and raises
    no truncation; a batch read of the whole log agrees."""
    c = cluster
    c.create_topic("moves", 1, 2)
    before = c.produce("moves", 0, [b"a%02d" % i for i in range(20)])
    df = source(spark, c, "moves", stream=True, startingOffsets="earliest")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    first = run_available_now(df, out, ckpt)
    assert first.exception() is None
    replicas = c.client.metadata(["moves"])["moves"].partitions[0].replicas
    leader = c.leader_of("moves", 0)
    spare = next(n for n in c.ports if n not in replicas)
    target = [spare] + [n for n in replicas if n != leader]
    assert len(target) == len(replicas), (leader, replicas)  # the move takes the leader off
    # Records written while the leader removes itself go through an idempotent producer:
    # an append that commits after its leader resigned is answered NOT_LEADER, and a
    # plain retry would append it twice (as in Kafka without idempotence).
    producer = Producer(c.client)

    def produce(values: list[bytes]) -> list[int]:
        futures = [producer.send("moves", v, partition=0) for v in values]
        producer.flush(timeout_s=60)
        return [f.result().offset for f in futures]

    c.client.reassign("moves", {0: target})
    during = produce([b"b%02d" % i for i in range(20)])

    def moved() -> bool:
        # The leader reports the new voters once it has appended the change; the move has
        # ended when the old leader, removed, resigned and one of the new set leads.
        q = c.client.describe_quorum("moves", 0)
        return sorted(v.replica_id for v in q.voters) == sorted(target) and q.leader_id != leader

    wait_until(moved, timeout=60, what="the move to end")
    after = produce([b"c%02d" % i for i in range(20)])
    producer.close()
    second = run_available_now(df, out, ckpt)
    assert second.exception() is None  # no LogTruncationException across the move
    rows = sorted(
        (r["offset"], r["leaderEpoch"], bytes(r["value"]))
        for r in spark.read.parquet(str(out)).collect()
    )
    values = [v for _, _, v in rows]
    expected = [b"a%02d" % i for i in range(20)] + [b"b%02d" % i for i in range(20)]
    assert values == expected + [b"c%02d" % i for i in range(20)]  # each once, in order
    assert rows[-1][1] > before[0].epoch  # the move's leader change shows as a new epoch
    assert [o for o, _, _ in rows[-20:]] == after
    assert [o for o, _, _ in rows[20:40]] == during
    assert triples(source(spark, c, "moves")) == [(0, o, e, v) for o, e, v in rows]
