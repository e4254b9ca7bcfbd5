"""The quorumlog sink's delivery guarantee, shown with real failures: a stream whose
tasks' first attempts fail after some of their rows reached the sink, whose driver
(with its local-cluster executors, each in its own JVM) is killed with SIGKILL twice
mid-batch and restarted from its checkpoint. Read read_committed, the output holds
every input row exactly once with ``delivery=exactly-once``; the same driver then runs
the same stream with ``delivery=at-least-once`` (after the exactly-once query: two
streaming queries at once trip a Spark race in task serialization), which loses nothing
but writes rows twice under the same task failures (so the first check has teeth). Also: a bad ``delivery`` names the option when the writer is defined, and a
batch ``df.write`` round trip."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.spark import REPO, SHORT_JVM, source
from tests.support.waits import retry, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(900)]

RECORDS = 20_000
PARTITIONS = 2
#: Records per micro-batch of the exactly-once query: enough batches that each kill lands
#: mid-batch with some left (four: a batch committed and one in flight a run, twice).
PER_TRIGGER = 5_000
#: The at-least-once query's: the whole input in one batch (its offsets count the control
#: records too), whose failed first attempts write rows twice (it runs once, after the
#: kills; more batches would show the same at more cost).
ALO_PER_TRIGGER = 2 * RECORDS
#: Values of about 500 B: a failing task's first batches fill the Python worker's 64 KiB
#: output buffer, so Spark hands them to the sink's task before the failure.
PAD = b"x" * 490
DELIVERIES = {"exactly-once": "eo-output", "at-least-once": "alo-output"}
#: Bound of one driver run (a JVM, two executor JVMs, micro-batches) on a busy machine.
RUN_BOUND_S = 300.0
#: Bound of a killed run's transactions' end: the sink's default transactionTimeoutMs
#: (its replay usually fences them first), and some.
TXN_END_BOUND_S = 120.0


@dataclass
class KilledTwice:
    """The input values, and what each sink's output holds read read_committed."""

    values: collections.Counter[bytes]
    outputs: dict[str, collections.Counter[bytes]]
    written: dict[str, int]  # rows in each output's log, read_uncommitted
    log: str


def _offsets(client: Client, topic: str) -> list[tuple[int, int]]:
    """(last stable offset, high watermark) of every partition."""
    return [
        (
            client.list_offsets(topic, p, "latest", isolation="read_committed").offset,
            client.list_offsets(topic, p, "latest").offset,
        )
        for p in range(PARTITIONS)
    ]


def read_all(
    client: Client, topic: str, isolation: str = "read_committed"
) -> collections.Counter[bytes]:
    """Every value a reader sees at ``isolation``, once every transaction has ended (the
    last stable offset at the high watermark)."""
    wait_until(
        lambda: all(lso == hw for lso, hw in _offsets(client, topic)),
        TXN_END_BOUND_S,
        f"no open transaction in {topic}",
    )
    seen: collections.Counter[bytes] = collections.Counter()
    for p in range(PARTITIONS):
        end = client.list_offsets(topic, p, "latest").offset
        offset = 0
        while offset < end:
            fetched = retry(lambda p=p, o=offset: client.fetch(topic, p, o, isolation=isolation))
            last = fetched.last_offset_and_epoch()
            assert last is not None, f"{topic}/{p}: nothing at {offset} below {end}"
            seen.update(bytes(v) for v in fetched.to_arrow(end_offset=end).column("value"))
            offset = last.offset + 1
    return seen


class Driver:
    """sink_driver.py as a process group of its own: the driver's Python process, its
    JVM and the executors' JVMs die together when the group is killed."""

    def __init__(self, cluster: LocalCluster, tmp: Path, input_topic: str) -> None:
        self.checkpoints = tmp / "checkpoints"
        self.args = [
            sys.executable,
            "-m",
            "tests.connector.sink_driver",
            "--bootstrap",
            cluster.bootstrap,
            "--input",
            input_topic,
            "--checkpoints",
            str(self.checkpoints),
            "--max-per-trigger",
            str(PER_TRIGGER),
            "--max-per-trigger-of",
            f"at-least-once={ALO_PER_TRIGGER}",
            *(arg for d, topic in DELIVERIES.items() for arg in ("--sink", f"{d}={topic}")),
        ]
        self.log = tmp / "driver.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        with self.log.open("ab") as out:
            out.write(f"\n==== run {self.runs}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.args,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={
                    **os.environ,
                    "PYSPARK_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": "127.0.0.1",
                    "JAVA_TOOL_OPTIONS": SHORT_JVM,  # each run's JVMs live about a minute
                },
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL to the driver and every process it started."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def committed_batches(self, delivery: str) -> int:
        """Batches the query's checkpoint says it committed (Spark's commit log)."""
        commits = self.checkpoints / delivery / "commits"
        return sum(1 for f in commits.glob("*") if f.name.isdigit()) if commits.is_dir() else 0

    def finish(self) -> dict[str, Any]:
        assert self.proc is not None
        try:
            self.proc.wait(RUN_BOUND_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"the driver did not finish in {RUN_BOUND_S}s\n{self.tail()}"
            ) from None
        lines = self.log.read_text(errors="replace").splitlines()
        results = [line for line in lines if line.startswith("RESULT ")]
        assert self.proc.returncode == 0 and results, self.tail()
        return json.loads(results[-1][len("RESULT ") :])  # type: ignore[no-any-return]

    def tail(self, chars: int = 8_000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@pytest.fixture(scope="module")
def killed_twice(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> KilledTwice:
    """``RECORDS`` values streamed into both sinks by one driver, which is killed with
    SIGKILL mid-batch, restarted from its checkpoints, killed again mid-batch, restarted
    and left to finish. A kill waits until the exactly-once query committed a batch in
    this run and another batch's sink tasks have written rows its transactions hold
    open (begun after the previous kill): the kill lands between a task's rows and the
    driver's decision."""
    tmp = tmp_path_factory.mktemp("killed-twice")
    topic = "eo-input"
    cluster.create_topic(topic, PARTITIONS)
    values: collections.Counter[bytes] = collections.Counter()
    for p in range(PARTITIONS):
        numbers = range(p, RECORDS, PARTITIONS)
        mine = [b"row-%06d." % i + PAD for i in numbers]
        keys: list[bytes | None] = [b"%06d" % i for i in numbers]
        for start in range(0, len(mine), 1_000):
            # keyed: the sink spreads them again
            cluster.produce(topic, p, mine[start : start + 1_000], keys[start : start + 1_000])
        values.update(mine)
    for output in DELIVERIES.values():
        cluster.create_topic(output, PARTITIONS)
    client = cluster.client
    driver = Driver(cluster, tmp, topic)
    eo_output = DELIVERIES["exactly-once"]
    ended_at = [0] * PARTITIONS  # each partition's high watermark when the last run died
    try:
        for _ in range(2):
            committed_before = driver.committed_batches("exactly-once")
            driver.start()

            def mid_batch(ended_at: list[int] = ended_at, before: int = committed_before) -> bool:
                if not driver.running():
                    return True  # reported below
                if driver.committed_batches("exactly-once") <= before:
                    return False
                return any(
                    lso >= end and hw > lso
                    for (lso, hw), end in zip(_offsets(client, eo_output), ended_at, strict=True)
                )

            wait_until(mid_batch, RUN_BOUND_S, "a batch in flight", interval=0.01)
            assert driver.running(), f"the stream ended before the kill\n{driver.tail()}"
            driver.kill()
            ended_at = [hw for _, hw in _offsets(client, eo_output)]
        driver.start()
        result = driver.finish()
    finally:
        driver.kill()
    assert all(r["error"] is None for r in result.values()), driver.tail()
    outputs = {d: read_all(client, topic) for d, topic in DELIVERIES.items()}
    written = {
        d: sum(read_all(client, topic, "read_uncommitted").values())
        for d, topic in DELIVERIES.items()
    }
    return KilledTwice(values, outputs, written, driver.log.read_text(errors="replace"))


def test_exactly_once_through_task_failures_and_driver_kills(killed_twice: KilledTwice) -> None:
    assert killed_twice.log.count("injected failure") > 0  # first attempts did fail
    assert killed_twice.log.count("==== run") == 3
    got, values = killed_twice.outputs["exactly-once"], killed_twice.values
    # failed attempts and killed batches left rows in the log; read_committed hides them
    assert killed_twice.written["exactly-once"] > len(values)
    missing, extra = values - got, got - values
    assert not missing and not extra, (
        f"{sum(missing.values())} rows lost (e.g. {sorted(missing)[:5]}), "
        f"{sum(extra.values())} extra (e.g. {sorted(extra)[:5]})"
    )


def test_at_least_once_writes_rows_twice_through_the_same_failures(
    killed_twice: KilledTwice,
) -> None:
    got, values = killed_twice.outputs["at-least-once"], killed_twice.values
    assert set(got) == set(values)  # nothing lost
    assert sum((got - values).values()) > 0  # and some rows written more than once


def test_a_bad_delivery_names_the_option(spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    from quorumlog.connector import QuorumLogDataSource, QuorumLogOptionError

    opts = {"bootstrap": cluster.bootstrap, "topic": "t", "delivery": "exactly-twice"}
    with pytest.raises(QuorumLogOptionError, match="Invalid value for option 'delivery'"):
        QuorumLogDataSource(opts).writer(spark.range(1).schema, False)
    small = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="Invalid value for option 'delivery'"):
        small.write.format("quorumlog").options(**opts).mode("append").save()
    stream = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS value")
    # Spark (4.2) creates a Python stream writer once the query runs, not in start():
    # the query fails then, before its first batch.
    with pytest.raises(Exception, match="Invalid value for option 'delivery'"):
        query = (
            stream.writeStream.format("quorumlog")
            .options(**opts)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        try:
            query.awaitTermination(120)
        finally:
            query.stop()


def test_a_batch_write_round_trip_exactly_once(spark: Any, cluster: LocalCluster) -> None:
    from pyspark.sql import functions as F

    cluster.create_topic("eo-batch", PARTITIONS)
    df = spark.range(5_000).select(
        F.col("id").cast("string").cast("binary").alias("key"),
        F.concat(F.lit("batch-"), F.col("id").cast("string")).alias("value"),
    )
    df.write.format("quorumlog").option("bootstrap", cluster.bootstrap).option(
        "topic", "eo-batch"
    ).option("delivery", "exactly-once").mode("append").save()
    expected = collections.Counter(f"batch-{i}".encode() for i in range(5_000))
    assert read_all(cluster.client, "eo-batch") == expected
    back = source(spark, cluster, "eo-batch").select("value").collect()  # read_committed
    assert collections.Counter(bytes(r.value) for r in back) == expected
