"""``quorumlog perf kafka`` at a tiny size: both producer APIs deliver every record, the
consumer reads them all, and the nodes' CPU per million records is measured."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.perf import kafka as perf_kafka

from tests.support.figures import assert_numbers


@pytest.mark.cluster
@pytest.mark.timeout(120)
@pytest.mark.parametrize("api", ["batch", "record"])
def test_every_record_produced_and_consumed(capsys: pytest.CaptureFixture[str], api: str) -> None:
    # 2,500 records: the batch API's last chunk is a part of PRODUCE_CHUNK.
    rc = perf_kafka.main(
        ["--records", "2500", "--partitions", "3", "--producer-api", api, "--json"]
    )
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["producer_api"] == api
    assert figures["consumed"] == 2500
    assert_numbers(
        figures,
        "produce_rec_per_s",
        "consume_rec_per_s",
        "consume_default_backoff_rec_per_s",
        "node_cpu_s_per_m_produced",
        "client_cpu_s_per_m_produced",
        "produce_machine_busy_pct",
        "node_cpu_s_per_m_consumed",
    )
    assert figures["client_cpu_s_per_m_produced"] > 0
    assert figures["consumer_config"] == {"fetch.queue.backoff.ms": 10}
    assert figures["compression"] == "none" and figures["disk_bytes_per_record"] > 100


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_compressed_json_records_take_less_disk(capsys: pytest.CaptureFixture[str]) -> None:
    """JSON-like records, zstd from producer to disk: every record delivered and read,
    and the topic's segments hold far fewer bytes per record than the values alone."""
    rc = perf_kafka.main(
        ["--records", "3000", "--partitions", "2", "--compression", "zstd", "--payload", "json"]
        + ["--json"]
    )
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["consumed"] == 3000
    assert (figures["compression"], figures["payload"]) == ("zstd", "json")
    assert 0 < figures["disk_bytes_per_record"] < 60


def test_json_payload_values_are_distinct_events_of_the_asked_size() -> None:
    values = perf_kafka._values("json", 120)
    assert len(set(values)) == perf_kafka.VALUE_POOL
    assert all(len(v) == 120 and json.loads(v)["event"] == "page_view" for v in values)


def test_client_settings_are_key_value_pairs() -> None:
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        perf_kafka.main(["--producer-config", "linger.ms"])


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_keyed_records_over_many_partitions_and_the_listener_s_answer_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--keyed: a produce(topic, value, key) call per record over every partition, each
    delivered and read; the listener's Produce answers are counted and timed."""
    rc = perf_kafka.main(["--records", "3000", "--partitions", "8", "--keyed", "--json"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["producer_api"] == "keyed" and figures["consumed"] == 3000
    assert figures["produce_requests"] > 0
    assert figures["records_per_produce_request"] > 0
    assert_numbers(figures, "produce_answer_ms_mean", "produce_answer_ms_p99")
