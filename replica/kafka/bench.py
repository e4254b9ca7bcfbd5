"""Codec throughput: ``python -m quorumlog.replica.kafka.bench [--records N] [--value-bytes B]``.

Encodes and decodes one RecordBatch v2 of N records (value B bytes, a 10-byte key, no
headers), and converts Kafka <-> quorumlog's Arrow batch. Prints figures, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from ..storage.records import encode_batch as encode_native
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
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.records
    values = [bytes([i % 251]) * args.value_bytes for i in range(n)]
    keys = [b"key-%06d" % i for i in range(n)]
    timestamps = [1_700_000_000_000 + i for i in range(n)]
    kafka = encode_batch(values, keys, timestamps)
    decoded = decode_batch(kafka)
    native = encode_native(values, keys, timestamps)
    figures = {
        "encode_rec_per_s": _best_rate(
            n, lambda: encode_batch(values, keys, timestamps), args.repeats
        ),
        "decode_rec_per_s": _best_rate(n, lambda: decode_batch(kafka), args.repeats),
        "kafka_to_arrow_rec_per_s": _best_rate(n, lambda: from_kafka(decoded), args.repeats),
        "decode_to_native_rec_per_s": _best_rate(
            n, lambda: kafka_to_quorumlog(decode_batch(kafka)), args.repeats
        ),
        "native_to_kafka_rec_per_s": _best_rate(
            n, lambda: quorumlog_to_kafka(native), args.repeats
        ),
    }
    for name, rate in figures.items():
        print(f"{name:28s} {rate:14,.0f}  ({n} x {args.value_bytes} B records, one batch)")
    print(json.dumps({"records": n, "value_bytes": args.value_bytes, **figures}))
    return figures


if __name__ == "__main__":
    main()
