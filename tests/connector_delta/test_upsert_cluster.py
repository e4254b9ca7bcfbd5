"""The Spark upsert mirror on a real cluster: a keyed topic written with many versions per
key and tombstones, streamed by ``format("quorumlog")`` into ``DeltaSink(mode="upsert")``;
the table equals the latest value of each live key of the log, across a leader failover
(kill -9) and across an unclean truncation resumed with ``onTruncation=resume`` (the
truncated records' effects undone: an overwritten value comes back, a deleted key comes
back, a key only the truncated records wrote is gone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from quorumlog.connector.delta import DeltaSink, upsert

from tests.connector.cluster_helpers import move_leader, unclean_election
from tests.support.spark import source
from tests.support.waits import retry, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(300)]

State = dict[tuple[int, bytes], bytes]  # (partition, key) -> value


def log_state(spark: Any, cluster: Any, topic: str) -> State:
    """The latest value of each live key, from the whole log read by the source."""
    rows = (
        source(spark, cluster, topic, startingOffsets="earliest")
        .select("partition", "offset", "key", "value")
        .collect()
    )
    state: State = {}
    for r in sorted(rows, key=lambda r: (r["partition"], r["offset"])):
        k = (r["partition"], bytes(r["key"]))
        if r["value"] is None:
            state.pop(k, None)
        else:
            state[k] = bytes(r["value"])
    return state


def table_state(path: Path) -> State:
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    rows = DeltaTable(str(path)).to_pyarrow_table(columns=["partition", "key", "value"]).to_pylist()
    state = {(r["partition"], r["key"]): r["value"] for r in rows}
    assert len(state) == len(rows), "a key has more than one row"
    return state


def produce_round(c: Any, topic: str, partition: int, r: int, keys: int = 10) -> None:
    """One version of each key; every third key (shifting each round) is deleted."""
    names = [f"k{k}".encode() for k in range(keys)]
    vals = [None if (k + r) % 3 == 0 else f"p{partition}-k{k}-r{r}".encode() for k in range(keys)]
    retry(lambda: c.produce(topic, partition, vals, names))  # type: ignore[arg-type]


def start(spark: Any, c: Any, topic: str, path: Path, ck: Path, **trigger: Any) -> Any:
    df = source(spark, c, topic, stream=True, startingOffsets="earliest", onTruncation="resume")
    return (
        df.writeStream.foreachBatch(DeltaSink(path, bootstrap=c.bootstrap, mode="upsert"))
        .option("checkpointLocation", str(ck))
        .trigger(**trigger)
        .start()
    )


def run_to_end(spark: Any, c: Any, topic: str, path: Path, ck: Path) -> None:
    query = start(spark, c, topic, path, ck, availableNow=True)
    try:
        assert query.awaitTermination(180), "the availableNow query did not end"
        assert query.exception() is None, query.exception()
    finally:
        query.stop()


def test_upsert_stream_across_a_leader_failover(spark: Any, cluster: Any, tmp_path: Path) -> None:
    c, topic = cluster, "upsert-failover"
    c.create_topic(topic, 2)
    path, ck = tmp_path / "t", tmp_path / "ck"
    for r in range(3):
        for p in (0, 1):
            produce_round(c, topic, p, r)
    query = start(spark, c, topic, path, ck, processingTime="300 milliseconds")
    try:
        wait_until(lambda: table_state(path) == log_state(spark, c, topic), 120, "first rounds")
        move_leader(c, topic, 0, graceful=False)  # kill -9 the leader while streaming
        for r in range(3, 6):
            for p in (0, 1):
                produce_round(c, topic, p, r)
        want = log_state(spark, c, topic)
        # the model: round 5's values, minus the keys it deleted
        assert want == {
            (p, f"k{k}".encode()): f"p{p}-k{k}-r5".encode()
            for p in (0, 1)
            for k in range(10)
            if (k + 5) % 3
        }
        wait_until(lambda: table_state(path) == want, 120, "the table equal to the log")
        assert query.exception() is None
    finally:
        query.stop()


def test_upsert_after_an_unclean_truncation_equals_the_log(
    spark: Any, cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, topic = cluster, "upsert-unclean"
    monkeypatch.setattr(upsert, "REDUCE_ROWS", 2)  # the rebuild reduces as it reads
    c.create_topic(topic, 1)
    path, ck = tmp_path / "t", tmp_path / "ck"
    keys = [b"a", b"b", b"c", b"d"]
    retry(lambda: c.produce(topic, 0, [b"a0", b"b0", b"c0", b"d0"], keys))  # type: ignore[arg-type]
    retry(lambda: c.produce(topic, 0, [b"a1", None, b"d1"], [b"a", b"c", b"d"]))  # type: ignore[list-item]
    run_to_end(spark, c, topic, path, ck)
    assert table_state(path) == {(0, b"a"): b"a1", (0, b"b"): b"b0", (0, b"d"): b"d1"}

    def mirrored_lost() -> None:
        run_to_end(spark, c, topic, path, ck)
        assert table_state(path) == {
            (0, b"a"): b"a-lost",
            (0, b"d"): b"d1",
            (0, b"g"): b"g-lost",
            (0, b"absorbed"): b"absorbed",
        }

    # acknowledged, mirrored, then truncated away: a overwritten, b deleted, g new
    unclean_election(
        c,
        topic,
        0,
        [b"a-lost", None, b"g-lost"],
        lost_keys=[b"a", b"b", b"g"],
        before_force=mirrored_lost,
    )
    retry(lambda: c.produce(topic, 0, [b"h-new", None], [b"h", b"d"]))  # type: ignore[list-item]
    run_to_end(spark, c, topic, path, ck)  # the query validates its position, resumes
    want = log_state(spark, c, topic)
    assert want.keys() >= {(0, b"a"), (0, b"b"), (0, b"h")}
    assert want[(0, b"a")] == b"a1" and want[(0, b"b")] == b"b0"
    assert (0, b"g") not in want and (0, b"d") not in want
    assert table_state(path) == want
    truncations = DeltaTable(str(path)).history(limit=1)[0]["quorumlog"]["truncations"]
    assert truncations and truncations[0]["partition"] == 0
