"""Codec throughput: ``python -m quorumlog.replica.kafka.bench [--records N] [--value-bytes B]
[--key-bytes K]``.

Encodes and decodes one RecordBatch v2 of N records (value B bytes, a K-byte key or, with
K = 0, a null key as librdkafka's perf producer sends; no headers), with the reference
codec (``records``, lists) and the vectorised one (``columnar``, Arrow columns), and
converts Kafka <-> quorumlog's Arrow batch as the listener does; and reads a Produce
request and writes its answer as the listener does for each (one partition, a batch of
``--request-records`` records: librdkafka's shape under a backlog over many partitions,
thousands of requests a second), in requests a second. Prints figures, then one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from ..storage.records import encode_batch as encode_native
from .codec import decode_request, encode_request, encode_response
from .columnar import decode_columns, encode_columns
from .convert import from_kafka, kafka_to_quorumlog, quorumlog_to_kafka
from .messages import PRODUCE
from .records import decode_batch, encode_batch
from .schema import Message


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
    parser.add_argument(
        "--request-records", type=int, default=30, help="records of the Produce request timed"
    )
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
    request, answer = _produce_exchange(values, keys, timestamps, args.request_records)
    requests = {
        "produce_request_decode_per_s": _best_rate(
            1000, lambda: [decode_request(request, trailing_ok=True) for _ in range(1000)], repeats
        ),
        "produce_answer_encode_per_s": _best_rate(
            1000, lambda: [encode_response(PRODUCE, 9, 7, answer) for _ in range(1000)], repeats
        ),
    }
    shape = f"(Produce v9, one partition, {args.request_records} records)"
    for name, rate in requests.items():
        print(f"{name:28s} {rate:14,.0f}  {shape}")
    figures |= requests
    print(json.dumps({"records": n, "value_bytes": args.value_bytes, **figures}))
    return figures


def _produce_exchange(
    values: list[bytes], keys: list[bytes | None], timestamps: list[int], records: int
) -> tuple[bytes, Message]:
    """A Produce v9 request of one partition's batch of ``records`` records, as librdkafka
    sends it, and the answer the listener gives it."""
    batch = encode_batch(values[:records], keys[:records], timestamps[:records])
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 30_000,
        "topic_data": [{"name": "events", "partition_data": [{"index": 3, "records": batch}]}],
    }
    part = {"index": 3, "error_code": 0, "base_offset": 1234, "error_message": None}
    answer: Message = {"responses": [{"name": "events", "partition_responses": [part]}]}
    return encode_request(PRODUCE, 9, 7, body, client_id="rdkafka"), answer


if __name__ == "__main__":
    main()
