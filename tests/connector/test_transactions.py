"""The Spark source over a topic with committed, aborted and open Kafka transactions:
read_committed (the default) reads only committed and non-transactional records,
planned to the last stable offset, and the offsets aborted records and markers leave
are gaps, never truncation; read_uncommitted reads everything. A stream moves on once
the open transaction ends. Real Spark, real nodes, a real librdkafka producer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from quorumlog.connector import QuorumLogDataSource, QuorumLogOptionError
from quorumlog.replica.node.cluster import LocalCluster

from tests.connector.cluster_helpers import checkpoint_ends
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(300)]

TOPIC = "txn-source"


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("txn-src"), kafka=True) as c:
        c.create_topic(TOPIC, 1)
        c.wait_for_leader(TOPIC, 0, 60)
        yield c


def _txn_producer(c: LocalCluster, tid: str) -> confluent_kafka.Producer:
    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "transactional.id": tid,
            "transaction.timeout.ms": 120000,
        }
    )
    p.init_transactions(30)
    return p


def _send(p: confluent_kafka.Producer, prefix: str, n: int) -> None:
    for i in range(n):
        p.produce(TOPIC, f"{prefix}-{i}".encode(), partition=0)
    assert p.flush(30) == 0


def _values(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def _read(spark: Any, c: LocalCluster, **options: str) -> list[str]:
    df = (
        spark.read.format("quorumlog")
        .option("bootstrap", c.bootstrap)
        .option("topic", TOPIC)
        .options(**options)
        .load()
    )
    return sorted(r.value.decode() for r in df.select("value").collect())


def test_committed_aborted_and_open_transactions(
    spark: Any, kcluster: LocalCluster, tmp_path: Path
) -> None:
    c = kcluster
    a = _txn_producer(c, "src-a")
    a.begin_transaction()
    _send(a, "c1", 20)
    a.commit_transaction(30)
    a.begin_transaction()
    _send(a, "aborted", 20)
    a.abort_transaction(30)
    plain = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap})
    _send(plain, "plain", 10)
    b = _txn_producer(c, "src-b")
    b.begin_transaction()
    _send(b, "open", 10)  # left open: everything after it waits for its end
    a.begin_transaction()
    _send(a, "c2", 20)
    a.commit_transaction(30)

    visible = sorted(_values("c1", 20) + _values("plain", 10))
    assert _read(spark, c) == visible
    assert _read(spark, c, **{"kafka.isolation.level": "read_committed"}) == visible
    everything = _read(spark, c, isolationLevel="read_uncommitted")
    assert everything == sorted(
        _values("c1", 20)
        + _values("aborted", 20)
        + _values("plain", 10)
        + _values("open", 10)
        + _values("c2", 20)
    )

    # A stream reads what is stable, then the rest once the open transaction commits:
    # the aborted records and markers are gaps, not truncation (onTruncation=fail).
    out, ck = tmp_path / "out", tmp_path / "ck"
    stream = (
        spark.readStream.format("quorumlog")
        .option("bootstrap", c.bootstrap)
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.select("value", "offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .trigger(processingTime="300 milliseconds")
        .start()
    )

    def rows() -> list[str]:
        try:
            return sorted(r.value.decode() for r in spark.read.parquet(str(out)).collect())
        except Exception:
            return []

    try:
        wait_until(lambda: rows() == visible, 120, "the stable records")
        b.commit_transaction(30)
        wanted = sorted(visible + _values("open", 10) + _values("c2", 20))
        wait_until(lambda: rows() == wanted, 120, "the records once the transaction ended")
        assert query.exception() is None
    finally:
        query.stop()
    offsets = [r.offset for r in spark.read.parquet(str(out)).collect()]
    assert len(offsets) == len(set(offsets))


def test_a_bad_isolation_level_names_the_option() -> None:
    opts = {"bootstrap": "127.0.0.1:1", "topic": "t"}
    with pytest.raises(QuorumLogOptionError, match="option 'isolationLevel'"):
        QuorumLogDataSource({**opts, "isolationLevel": "serializable"}).schema()
    with pytest.raises(QuorumLogOptionError, match="disagree"):
        QuorumLogDataSource(
            {
                **opts,
                "isolationLevel": "read_committed",
                "kafka.isolation.level": "read_uncommitted",
            }
        ).schema()


GAPS = "txn-gaps"


def _gapped_topic(spark: Any, c: LocalCluster) -> tuple[list[tuple[int, str]], set[int]]:
    """``GAPS`` holding committed, aborted and plain records: every record (offset,
    value) read read_uncommitted, and the offsets a read_committed reader never sees
    (aborted records and control records, including the leader's)."""
    c.create_topic(GAPS, 1)
    c.wait_for_leader(GAPS, 0, 60)
    p = _txn_producer(c, "gaps")
    for prefix, n, commit in (("g-c1", 10, True), ("g-ab", 15, False), ("g-c2", 5, True)):
        p.begin_transaction()
        for i in range(n):
            p.produce(GAPS, f"{prefix}-{i}".encode(), partition=0)
        assert p.flush(30) == 0
        (p.commit_transaction if commit else p.abort_transaction)(30)
        if prefix == "g-ab":
            plain = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap})
            for i in range(5):
                plain.produce(GAPS, f"g-pl-{i}".encode(), partition=0)
            assert plain.flush(30) == 0
    hwm = c.client.list_offsets(GAPS, 0, "latest").offset
    rows = _source(c, spark, isolationLevel="read_uncommitted").select("offset", "value").collect()
    everything = sorted((r.offset, r.value.decode()) for r in rows)
    gaps = set(range(hwm)) - {o for o, v in everything if not v.startswith("g-ab")}
    return everything, gaps


def _source(c: LocalCluster, spark: Any, *, stream: bool = False, **options: str) -> Any:
    reader = spark.readStream if stream else spark.read
    return (
        reader.format("quorumlog")
        .option("bootstrap", c.bootstrap)
        .option("topic", GAPS)
        .options(**options)
        .load()
    )


def _position(offset: int) -> str:
    return f'{{"{GAPS}": {{"0": {{"offset": {offset}, "epoch": -1}}}}}}'


def test_offset_gaps_are_gaps_in_batch_and_stream(
    spark: Any, kcluster: LocalCluster, tmp_path: Path
) -> None:
    """Offsets the log holds no visible record at (aborted records, markers; a compacted
    topic's cleaned offsets read the same way) are skipped: a batch read whose start and
    end fall inside them reads the visible records between, and a stream whose
    micro-batches end inside them (maxOffsetsPerTrigger) reads every visible record once,
    without a data-loss or truncation error, checkpointing exact ends."""
    c = kcluster
    everything, gaps = _gapped_topic(spark, c)
    visible = [(o, v) for o, v in everything if o not in gaps]
    aborted = [o for o, v in everything if v.startswith("g-ab")]
    hwm = c.client.list_offsets(GAPS, 0, "latest").offset

    # batch: start and end inside the aborted range, and the end inside it alone
    for start, end in ((aborted[3], hwm), (0, aborted[7]), (aborted[2], aborted[9])):
        df = _source(
            c,
            spark,
            startingOffsets=_position(start),
            endingOffsets=_position(end),
            failOnDataLoss="true",
        )
        got = sorted((r.offset, r.value.decode()) for r in df.select("offset", "value").collect())
        assert got == [(o, v) for o, v in visible if start <= o < end], (start, end)

    # stream: 4 offsets per micro-batch, so ends fall inside the gaps
    out, ck = tmp_path / "out", tmp_path / "ck"
    query = (
        _source(
            c,
            spark,
            stream=True,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="4",
            failOnDataLoss="true",
            onTruncation="fail",
        )
        .select("offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the availableNow query did not end"
        assert query.exception() is None
    finally:
        query.stop()
    got = sorted((r.offset, r.value.decode()) for r in spark.read.parquet(str(out)).collect())
    assert got == visible
    ends = checkpoint_ends(ck, GAPS, 0)
    # each batch took 4 offsets (the last the rest): the checkpoint counts offsets, not rows
    assert ends == [*range(4, hwm, 4), hwm], (ends, hwm)
    assert any(e - 1 in gaps for e in ends), (ends, sorted(gaps))
