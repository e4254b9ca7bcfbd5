"""``python -m quorumlog.replica.kafka.bench`` at a tiny size: every figure reported, the
Produce request it times read back as the request it built."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.kafka import bench
from quorumlog.replica.kafka.codec import decode_request

from tests.support.figures import assert_numbers


def test_every_figure_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    figures = bench.main(["--records", "50", "--repeats", "1", "--request-records", "7"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"records": 50, "value_bytes": 100, **figures}
    assert_numbers(figures, "produce_request_decode_per_s", "produce_answer_encode_per_s")


def test_the_timed_request_is_librdkafka_s_shape() -> None:
    values = [b"v" * 100] * 10
    keys: list[bytes | None] = [b"%04d" % i for i in range(10)]
    request, answer = bench._produce_exchange(values, keys, list(range(10)), 7)
    header, _, body = decode_request(request)
    assert (header.api_version, header.client_id) == (9, "rdkafka")
    [topic] = body["topic_data"]
    [partition] = topic["partition_data"]
    assert partition["index"] == 3 and partition["records"]
    assert answer["responses"][0]["partition_responses"][0]["base_offset"] == 1234
