"""Where the quorumlog sink puts a row without a partition, without Spark or a cluster:
where ``Producer.send`` puts its key (the producer's default partitioner, murmur2 as the
Java client), the rotating partition without a key, and a row's own partition first.
tests/connector/test_sink.py writes the same keys through Spark and the producer."""

from __future__ import annotations

import pyarrow as pa
from quorumlog.connector.sink import _by_partition
from quorumlog.replica.client.partitioner import murmur2

KEYS: list[bytes | None] = [b"", None, *(b"key-%d" % i for i in range(200)), "ключ".encode()]


def placed(table: pa.Table, n: int, turn: int) -> dict[int, int]:
    """Row index (column ``i``) -> the partition the sink sends it to."""
    out = {}
    for partition, rows in _by_partition(table, n, turn):
        for i in rows.column("i").to_pylist():
            assert i not in out
            out[i] = partition
    return out


def test_keyed_rows_go_where_murmur2_puts_them_and_keyless_rows_rotate() -> None:
    table = pa.table({"i": range(len(KEYS)), "key": pa.array(KEYS, pa.binary())})
    for n, turn in ((1, 0), (7, 3), (64, 130)):
        got = placed(table, n, turn)
        for i, key in enumerate(KEYS):
            expected = turn % n if key is None else (murmur2(key) & 0x7FFFFFFF) % n
            assert got[i] == expected, (key, n)
    assert len(set(placed(table, 7, 0).values())) == 7


def test_string_keys_hash_as_their_utf8_bytes_and_a_rows_partition_wins() -> None:
    keys = ["a", "ключ", None, "b"]
    table = pa.table(
        {
            "i": range(4),
            "key": pa.array(keys, pa.string()),
            "partition": pa.array([None, 5, None, 0], pa.int32()),
        }
    )
    got = placed(table, 6, 2)
    assert got == {0: (murmur2(b"a") & 0x7FFFFFFF) % 6, 1: 5, 2: 2, 3: 0}
