"""The node's log cleaner (``node.cleaner``): a compacted topic written with many versions
of each key and tombstones is cleaned by every replica on its own; a reader sees the
latest value of each live key (and no deleted key) from the leader and from each
replica's log, offsets ascending; the bytes on disk shrink to about the live data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage import Log, batches_to_table, encode_batch, iter_batches
from quorumlog.replica.storage.log_files import CLEANER_OFFSET_FILE

from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

TOPIC = "compacted"
KEYS = 40
DELETED = 10  # the first DELETED keys end with a tombstone
WAIT_S = 120.0


def _latest(rows: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    last: dict[bytes, bytes | None] = {}
    for _offset, key, value in rows:
        assert key is not None
        last[key] = value
    return {k: v for k, v in last.items() if v is not None}


def _rows(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    table = batches_to_table(data)
    return list(
        zip(
            table.column("offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


def _replica_dirs(c: LocalCluster) -> list[Path]:
    found = [d for n in range(1, c.n + 1) for d in c.node_dir(n).rglob(f"{TOPIC}-0") if d.is_dir()]
    assert len(found) == c.n, found
    return found


def _log_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.log"))


def test_a_compacted_topic_is_cleaned_on_every_replica(tmp_path: Path) -> None:
    rng = random.Random(63)
    with LocalCluster(3, tmp_path / "c") as c:
        client = c.client
        client.create_topic(
            TOPIC,
            1,
            3,
            configs={
                "cleanup.policy": "compact",
                "segment.bytes": str(1 << 14),
                "min.cleanable.dirty.ratio": "0.1",
                "delete.retention.ms": "0",
            },
        )
        expected: dict[bytes, bytes | None] = {}
        written = 0  # bytes of the batches produced (each replica's log held as many)
        for r in range(80):
            keys = [b"key-%d" % rng.randrange(KEYS) for _ in range(40)]
            if r > 60:  # after the tombstones, versions of the live keys only
                keys = [k for k in keys if int(k.split(b"-")[1]) >= DELETED]
            values: list[bytes | None] = [
                b"r%d-%d-" % (r, i) + b"x" * 100 for i in range(len(keys))
            ]
            if r == 60:
                keys = [b"key-%d" % k for k in range(DELETED)]
                values = [None] * DELETED
            batch = encode_batch(values, keys=keys)
            written += len(batch)
            client.produce(TOPIC, 0, batch)
            expected.update(zip(keys, values, strict=True))
        live = {k: v for k, v in expected.items() if v is not None}
        dirs = _replica_dirs(c)

        def cleaned() -> bool:
            return all(
                (d / CLEANER_OFFSET_FILE).exists() and _log_bytes(d) * 4 < written for d in dirs
            )

        wait_until(cleaned, WAIT_S, "every replica cleaned its log")
        # From the leader, from offset 0: the latest value of each live key, offsets up.
        rows: list[tuple[int, bytes | None, bytes | None]] = []
        offset = 0
        for _ in range(10_000):
            res = client.fetch(TOPIC, 0, offset, max_bytes=1 << 20)
            if offset >= res.high_watermark:
                break
            rows.extend(_rows(res.records))
            offset = list(iter_batches(res.records))[-1].next_offset
        offsets = [o for o, _k, _v in rows]
        assert offsets == sorted(set(offsets))
        assert _latest(rows) == live
        sizes = [_log_bytes(d) for d in dirs]
    # Each replica's own log, read after the cluster stopped.
    for d in dirs:
        lg = Log(str(d))
        data = b""
        offset = lg.start_offset
        while offset < lg.end_offset:
            chunk = lg.read(offset, 1 << 20)
            if not chunk:
                break
            data += chunk
            offset = list(iter_batches(chunk))[-1].next_offset
        lg.close()
        assert _latest(_rows(data)) == live, d
    live_bytes = sum(len(k) + len(v) for k, v in live.items())
    assert max(sizes) < written / 4, (sizes, written, live_bytes)
