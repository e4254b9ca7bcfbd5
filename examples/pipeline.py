"""The main job (``make demo``): log -> Spark Structured Streaming -> Delta, through a clean
failover and an unclean leader election that truncates records the stream already consumed.

1. Start an embedded 3-node cluster, create topic ``events`` (2 partitions), produce a
   steady stream from a background thread (acks=quorum).
2. Run ``spark.readStream.format("quorumlog")`` with ``onTruncation=resume`` into a Delta
   table through ``DeltaSink`` (exactly once, truncation-safe).
3. kill -9 the leader of partition 1: a new leader takes over, nothing is lost, and the
   stream does not report a truncation.
4. Force an unclean election on partition 0: a lagging replica (paused while records were
   committed and consumed) is made leader; the log is truncated under the stream and new
   records land at the same offsets.
5. Stop producing, let the stream drain, and check that the Delta table holds exactly the
   log's records: counts per partition, no duplicate (partition, offset), no stale epoch.

Prints a short report and exits non-zero if any check fails. Stops everything it started.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TOPIC = "events"
REPORT_PREFIX = "REPORT "


def log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class SteadyProducer(threading.Thread):
    """Appends small batches to every partition until stopped; tolerates outages."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.stop_event = threading.Event()
        self.acked = 0
        self.failed = 0

    def run(self) -> None:
        from quorumlog.replica.client import Client, QuorumLogError
        from quorumlog.replica.storage import encode_batch

        seq = 0
        with Client(self.bootstrap, request_timeout_ms=3000, retry_backoff_ms=50) as client:
            while not self.stop_event.is_set():
                for p in range(self.partitions):
                    values = [f"p{p}-{seq}-{i}".encode() for i in range(20)]
                    try:
                        client.produce(TOPIC, p, encode_batch(values), timeout_ms=3000)
                        self.acked += len(values)
                    except (QuorumLogError, OSError):
                        self.failed += len(values)
                seq += 1
                self.stop_event.wait(0.05)


def wait_until(what: str, predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def main() -> int:
    from deltalake import DeltaTable
    from quorumlog.connector.delta import DeltaSink
    from quorumlog.replica.node.cluster import LocalCluster

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    work = Path(tempfile.mkdtemp(prefix="quorumlog-demo-"))
    table_path = str(work / "events_delta")
    checkpoint = str(work / "checkpoint")
    started = time.monotonic()
    checks: dict[str, bool] = {}

    with LocalCluster(3, work / "cluster", log_level="WARNING") as cluster:
        log(f"3-node cluster up: {cluster.bootstrap}")
        cluster.create_topic(TOPIC, 2)
        client = cluster.client
        producer = SteadyProducer(cluster.bootstrap, 2)
        producer.start()

        from quorumlog.connector.local import local_spark_session

        spark = local_spark_session("quorumlog-demo", **{"spark.sql.shuffle.partitions": "2"})

        # Given the cluster, the sink asks it where the log diverged (KIP-320) when a
        # batch re-delivers offsets after a truncation, so the table stays exact.
        sink = DeltaSink(table_path, bootstrap=cluster.bootstrap)
        source = {"bootstrap": cluster.bootstrap, "topic": TOPIC, "startingOffsets": "earliest"}
        stream = (
            spark.readStream.format("quorumlog").options(**source, onTruncation="resume").load()
        )
        query = (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )

        def table_rows() -> int:
            try:
                return int(DeltaTable(table_path).to_pyarrow_dataset().count_rows())
            except Exception:
                return 0

        try:
            wait_until("the first records in Delta", lambda: table_rows() > 0, 90)
            log(f"streaming into Delta: {table_rows()} rows so far")

            # --- a clean failover -----------------------------------------------------
            victim = cluster.leader_of(TOPIC, 1)
            log(f"kill -9 node {victim}, leader of {TOPIC}/1")
            cluster.kill(victim)
            new_leader = cluster.wait_for_leader(TOPIC, 1, 30, not_node=victim)
            log(f"node {new_leader} leads {TOPIC}/1 now; restarting node {victim}")
            cluster.start_node(victim)
            cluster.wait_ready(60)
            before = table_rows()
            wait_until(
                "the stream to move past the failover", lambda: table_rows() > before + 100, 60
            )

            # --- an unclean leader election on partition 0 -----------------------------
            leader = cluster.wait_for_leader(TOPIC, 0, 30)
            meta = client.partition_metadata(TOPIC, 0, refresh=True)
            lagging = next(n for n in meta.replicas if n != leader)
            other = next(n for n in meta.replicas if n not in (leader, lagging))
            log(f"pause node {lagging} (a follower of {TOPIC}/0); records keep being committed")
            cluster.pause(lagging)
            hwm_at_pause = client.partition_metadata(TOPIC, 0, refresh=True).high_watermark
            wait_until(
                "records committed while the follower lags",
                lambda: (
                    client.partition_metadata(TOPIC, 0, refresh=True).high_watermark
                    > hwm_at_pause + 200
                ),
                60,
            )
            consumed_hwm = client.partition_metadata(TOPIC, 0, refresh=True).high_watermark
            wait_until(
                "the stream to consume them",
                lambda: spark_committed_offset(table_path, 0) >= consumed_hwm,
                60,
            )
            log(f"stream consumed {TOPIC}/0 up to offset {spark_committed_offset(table_path, 0)}")
            log(f"kill -9 nodes {leader} and {other}; resume {lagging}; force it to lead (UNCLEAN)")
            cluster.kill(leader)
            cluster.kill(other)
            cluster.resume(lagging)
            new_epoch = client.force_leader(TOPIC, 0, lagging, confirm=True)
            cluster.start_node(leader)
            cluster.start_node(other)
            cluster.wait_ready(60)
            log(
                f"node {lagging} leads {TOPIC}/0 in epoch {new_epoch}; committed records were truncated"
            )
            truncated_at = client.offsets_for_leader_epoch(TOPIC, 0, new_epoch - 1).end_offset
            wait_until(
                "new records past the truncation point",
                lambda: (
                    client.partition_metadata(TOPIC, 0, refresh=True).high_watermark
                    > consumed_hwm + 50
                ),
                60,
            )

            # --- drain and verify ---------------------------------------------------------
            producer.stop_event.set()
            producer.join(10)
            ends = {
                p: client.partition_metadata(TOPIC, p, refresh=True).high_watermark for p in (0, 1)
            }
            wait_until(
                "the stream to reach the log end",
                lambda: all(spark_committed_offset(table_path, p) >= ends[p] for p in ends),
                90,
            )
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
        finally:
            query.stop()
            producer.stop_event.set()

        log_df = (
            spark.read.format("quorumlog")
            .options(**source, endingOffsets="latest")
            .load()
            .select("partition", "offset", "leaderEpoch", "value")
        )
        log_rows = {
            (r.partition, r.offset): (r.leaderEpoch, bytes(r.value)) for r in log_df.collect()
        }
        held = (
            DeltaTable(table_path)
            .to_pyarrow_table(columns=["partition", "offset", "leaderEpoch", "value"])
            .to_pylist()
        )
        delta_keys = [(r["partition"], r["offset"]) for r in held]
        delta_rows = {(r["partition"], r["offset"]): (r["leaderEpoch"], r["value"]) for r in held}
        truncations = [
            t
            for h in DeltaTable(table_path).history()
            for t in (h.get("quorumlog") or {}).get("truncations", [])
        ]
        spark.stop()

    per_partition_log = {p: sum(1 for k in log_rows if k[0] == p) for p in (0, 1)}
    per_partition_delta = {p: sum(1 for k in delta_rows if k[0] == p) for p in (0, 1)}
    duplicates = len(delta_keys) - len(set(delta_keys))
    stale = sum(1 for k, v in delta_rows.items() if k in log_rows and log_rows[k][0] != v[0])
    missing = sum(1 for k in log_rows if k not in delta_rows)
    extra = sum(1 for k in delta_rows if k not in log_rows)
    checks["truncation detected and recorded in the Delta log"] = any(
        t.get("partition") == 0 for t in truncations
    )
    checks["counts per partition equal the log's"] = per_partition_log == per_partition_delta
    checks["no duplicate (partition, offset)"] = duplicates == 0
    checks["no stale epoch"] = stale == 0
    checks["table equals the log (same records)"] = delta_rows == log_rows
    elapsed = time.monotonic() - started

    print()
    print("quorumlog demo report")
    print(
        f"  producer: {producer.acked} records acknowledged, {producer.failed} refused during outages"
    )
    print(
        f"  unclean election on {TOPIC}/0: epoch {new_epoch}, log diverged at offset {truncated_at}"
    )
    for t in truncations:
        print(
            f"  Delta commit recorded truncation: partition {t.get('partition')}, divergence offset "
            f"{t.get('divergenceOffset')}, epoch {t.get('oldEpoch')} -> {t.get('newEpoch')}"
        )
    for p in (0, 1):
        print(
            f"  {TOPIC}/{p}: log {per_partition_log[p]} records, Delta {per_partition_delta[p]} rows"
        )
    print(f"  duplicates {duplicates}, stale epochs {stale}, missing {missing}, extra {extra}")
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")
    print(f"  took {elapsed:.0f}s")
    summary = {
        "checks": checks,
        "log": per_partition_log,
        "delta": per_partition_delta,
        "duplicates": duplicates,
        "stale": stale,
        "truncations": truncations,
        "seconds": round(elapsed, 1),
    }
    print(REPORT_PREFIX + json.dumps(summary, default=str))
    return 0 if all(checks.values()) else 1


def spark_committed_offset(table_path: str, partition: int) -> int:
    """The end offset the Delta table's last commit records for ``partition`` (-1 if none)."""
    from quorumlog.connector.delta import read_committed_positions

    try:
        positions = read_committed_positions(table_path).get(TOPIC, {})
    except Exception:
        return -1
    pos = positions.get(partition)
    return pos[0] if pos is not None else -1


if __name__ == "__main__":
    sys.exit(main())
