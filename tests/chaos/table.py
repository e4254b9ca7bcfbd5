"""The campaign's Delta side: a sink that records what every micro-batch held, and reads
of the table (its rows, its committed positions)."""

from __future__ import annotations

import threading
from typing import Any

from quorumlog.connector.delta import DeltaSink, read_committed_positions

from .checker import ConsumedBatch, Record

TOPIC = "chaos"


class RecordingSink:
    """DeltaSink plus a record of what every committed micro-batch held (the consumption
    history the checker needs). Runs on the Spark driver, in this process."""

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.batches: list[ConsumedBatch] = []
        self.truncations = 0
        self.committed_version = -1  # the newest Delta version this sink recorded
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        df = df.persist()
        try:
            data = df.select("partition", "offset", "leaderEpoch", "value").toArrow()
            result = self.sink.write_batch(df, batch_id)
            # Recorded before anything else can fail: once the commit has landed the
            # campaign may stop the query, and Spark then fails the unpersist below.
            if result is not None:
                self._record(batch_id, data, result)
        finally:
            df.unpersist()

    def _record(self, batch_id: int, data: Any, result: Any) -> None:
        truncated = {t.partition for t in result.truncations}
        rows: dict[int, list[Record]] = {}
        for p, o, e, v in zip(
            data.column("partition").to_pylist(),
            data.column("offset").to_pylist(),
            data.column("leaderEpoch").to_pylist(),
            data.column("value").to_pylist(),
            strict=True,
        ):
            rows.setdefault(p, []).append((o, e, v))
        with self._lock:
            self.truncations += len(truncated)
            for p, recs in sorted(rows.items()):
                self.batches.append(ConsumedBatch(batch_id, p, tuple(recs), p in truncated))
            self.committed_version = max(self.committed_version, result.version)


def committed_position(table: str, partition: int) -> tuple[int, int]:
    """(end offset, epoch of the last row) the table's last commit records; (-1, -1) if none."""
    try:
        pos = read_committed_positions(table).get(TOPIC, {}).get(partition)
    except Exception:  # no table yet
        return (-1, -1)
    return (pos[0], pos[1]) if pos is not None else (-1, -1)


def table_version(table: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(table).version())


def committed_end(table: str, partition: int) -> int:
    return committed_position(table, partition)[0]


def read_table(table: str) -> dict[int, list[Record]]:
    from deltalake import DeltaTable

    t = DeltaTable(table).to_pyarrow_table(columns=["partition", "offset", "leaderEpoch", "value"])
    out: dict[int, list[Record]] = {}
    for p, o, e, v in zip(
        t.column("partition").to_pylist(),
        t.column("offset").to_pylist(),
        t.column("leaderEpoch").to_pylist(),
        t.column("value").to_pylist(),
        strict=True,
    ):
        out.setdefault(p, []).append((o, e, v or b""))
    for rows in out.values():
        rows.sort()
    return out
