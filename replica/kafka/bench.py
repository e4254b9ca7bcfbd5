"""Codec throughput: ``python -m quorumlog.replica.kafka.bench [--records N] [--value-bytes B]
[--key-bytes K]``.

Encodes and decodes one RecordBatch v2 of N records (value B bytes, a K-byte key or, with
K = 0, a null key as librdkafka's perf producer sends; no headers), with the reference
codec (``records``, lists) and the vectorised one (``columnar``, Arrow columns), and
converts Kafka <-> quorumlog's Arrow batch as the listener does. Prints figures, then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from ..storage.records import encode_batch as encode_native
from .columnar import decode_columns, encode_columns
from .convert import from_kafka, kafka_to_quorumlog, quorumlog_to_kafka
from .records import decode_batch, encode_batch


def _best_rate(records: int, fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return records / best


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--key-bytes", type=int, default=10, help="0: null keys")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.records
    values = [bytes([i % 251]) * args.value_bytes for i in range(n)]
    keys = [b"%0*d" % (args.key_bytes, i) if args.key_bytes else None for i in range(n)]
    # librdkafka stamps each record as it is produced: a few records per millisecond.
    timestamps = [1_700_000_000_000 + i // 8 for i in range(n)]
    kafka = encode_batch(values, keys, timestamps)
    decoded = decode_batch(kafka)
    columns = decode_columns(kafka).records
    native = encode_native(values, keys, timestamps)
    repeats = args.repeats

    def timed(fn: Callable[[], object]) -> float:
        return _best_rate(n, fn, repeats)

    figures = {
        "encode_rec_per_s": timed(lambda: encode_batch(values, keys, timestamps)),
        "decode_rec_per_s": timed(lambda: decode_batch(kafka)),
        "columnar_encode_rec_per_s": timed(
            lambda: encode_columns(columns, base_offset=0, partition_leader_epoch=0)
        ),
        "columnar_decode_rec_per_s": timed(lambda: decode_columns(kafka)),
        "kafka_to_arrow_rec_per_s": timed(lambda: from_kafka(decoded)),
        "decode_to_native_rec_per_s": timed(lambda: kafka_to_quorumlog(decode_columns(kafka))),
        "native_to_kafka_rec_per_s": timed(lambda: quorumlog_to_kafka(native)),
    }
    shape = f"({n} x {args.value_bytes} B records, key {args.key_bytes or 'null'}, one batch)"
    for name, rate in figures.items():
        print(f"{name:28s} {rate:14,.0f}  {shape}")
    print(json.dumps({"records": n, "value_bytes": args.value_bytes, **figures}))
    return figures


if __name__ == "__main__":
    main()
