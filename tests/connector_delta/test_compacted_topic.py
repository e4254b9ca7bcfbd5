"""The Spark source and the upsert mirror over a compacted topic the nodes' cleaners
cleaned, on a real cluster: a stream mirrors it while it is written and cleaned (its
micro-batches end inside cleaned ranges), and after the clean a batch read from offset 0
and a new stream both read across the gaps (no data-loss or truncation error): the
latest value of each live key, offsets ascending, and the upsert tables equal it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from quorumlog.connector.delta import DeltaSink
from quorumlog.replica.node.cluster import LocalCluster

from tests.connector.cluster_helpers import checkpoint_ends
from tests.support.spark import source
from tests.support.waits import retry, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(420)]

TOPIC = "compacted-mirror"
KEYS = 60
ROUNDS = 12
FILLER = b"~filler"
WAIT_S = 180.0


@pytest.fixture(scope="module")
def ccluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3,
        tmp_path_factory.mktemp("compacted-mirror"),
        node_args=["--cleaner-bytes-per-second", "0"],
    ) as c:
        yield c


def value(k: int, r: int) -> bytes | None:
    """Round ``r``'s record of key ``k``: every 7th key deleted in round 5 (written again
    after), every 10th in the last round."""
    if (r == 5 and k % 7 == 0) or (r == ROUNDS - 1 and k % 10 == 0):
        return None
    return f"k{k}-r{r}-".encode().ljust(100, b".")


def live_after(rounds: int) -> dict[bytes, bytes]:
    live: dict[bytes, bytes] = {}
    for r in range(rounds):
        for k in range(KEYS):
            v = value(k, r)
            if v is None:
                live.pop(b"key-%03d" % k, None)
            else:
                live[b"key-%03d" % k] = v
    return live


def produce_rounds(c: LocalCluster, rounds: range) -> None:
    keys = [b"key-%03d" % k for k in range(KEYS)]
    for r in rounds:
        vals = [value(k, r) for k in range(KEYS)]
        retry(lambda vals=vals: c.produce(TOPIC, 0, vals, keys))  # type: ignore[misc]


def table_state(path: Path) -> dict[bytes, bytes]:
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    rows = DeltaTable(str(path)).to_pyarrow_table(columns=["key", "value"]).to_pylist()
    state = {r["key"]: r["value"] for r in rows}
    assert len(state) == len(rows), "a key has more than one row"
    return state


def mirror(spark: Any, c: LocalCluster, path: Path, ck: Path, **trigger: Any) -> Any:
    df = source(
        spark,
        c,
        TOPIC,
        stream=True,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="150",
        failOnDataLoss="true",
    )
    return (
        df.writeStream.foreachBatch(DeltaSink(path, bootstrap=c.bootstrap, mode="upsert"))
        .option("checkpointLocation", str(ck))
        .trigger(**trigger)
        .start()
    )


def test_source_and_upsert_mirror_over_a_cleaned_compacted_topic(
    spark: Any, ccluster: LocalCluster, tmp_path: Path
) -> None:
    c = ccluster
    c.client.create_topic(
        TOPIC,
        1,
        configs={
            "cleanup.policy": "compact",
            "segment.bytes": str(16 << 10),
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",
        },
    )
    c.client.wait_for_leaders(TOPIC, 30_000)
    produce_rounds(c, range(ROUNDS // 2))
    live = live_after(ROUNDS // 2)
    running = mirror(spark, c, tmp_path / "t", tmp_path / "ck", processingTime="300 milliseconds")
    try:
        wait_until(
            lambda: running.exception() is None and table_state(tmp_path / "t") == live,
            WAIT_S,
            "the first rounds",
        )
        produce_rounds(c, range(ROUNDS // 2, ROUNDS))
        live = live_after(ROUNDS)
        fillers = 0

        def cleaned() -> bool:
            # filler records of one key push the last round out of the active segment
            # and make the log dirty again, so a later clean drops the tombstones
            nonlocal fillers
            retry(lambda: c.produce(TOPIC, 0, [b"f%d" % fillers], [FILLER]))
            fillers += 1
            rows = source(spark, c, TOPIC, startingOffsets="earliest").select("key").collect()
            keys = [bytes(r["key"]) for r in rows if bytes(r["key"]) != FILLER]
            return sorted(keys) == sorted(live)

        wait_until(cleaned, WAIT_S, "the cleaners keep only the latest record of each key")
        live[FILLER] = b"f%d" % (fillers - 1)

        def mirrored() -> bool:
            assert running.exception() is None, running.exception()
            return table_state(tmp_path / "t") == live

        try:
            wait_until(mirrored, WAIT_S, "the mirror, cleaned")
        except AssertionError as exc:
            held = table_state(tmp_path / "t")
            diff = {k: (held.get(k), live.get(k)) for k in held.keys() | live.keys()}
            diff = {k: v for k, v in diff.items() if v[0] != v[1]}
            raise AssertionError(
                f"{exc}\ndiffers: {diff}\nprogress: {running.lastProgress}"
            ) from None
    finally:
        running.stop()

    # after the clean: a batch read from offset 0 reads across the gaps
    rows = source(spark, c, TOPIC, startingOffsets="earliest").select("offset", "key", "value")
    records = [(r["offset"], bytes(r["key"]), r["value"]) for r in rows.collect()]
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert offsets[-1] >= ROUNDS * KEYS  # original offsets, gaps between them
    latest = {k: bytes(v) for _, k, v in records if v is not None}
    assert latest == live

    # and a new mirror streams it from offset 0, micro-batch ends falling in the gaps
    hwm = c.client.list_offsets(TOPIC, 0, "latest").offset
    fresh = mirror(spark, c, tmp_path / "t2", tmp_path / "ck2", availableNow=True)
    try:
        assert fresh.awaitTermination(180), "the availableNow query did not end"
        assert fresh.exception() is None
    finally:
        fresh.stop()
    assert table_state(tmp_path / "t2") == live
    # the checkpoint counts offsets, not rows: every batch took 150 (the last the rest)
    ends = checkpoint_ends(tmp_path / "ck2", TOPIC, 0)
    assert ends == [*range(150, hwm, 150), hwm], (ends, hwm)
    assert any(e - 1 not in set(offsets) for e in ends[:-1]), "no batch ended in a gap"
