"""``quorumlog perf producer`` at a tiny size: every phase acknowledges every record and
the final JSON line carries each figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.perf import producer as perf_producer

from tests.support.figures import assert_numbers

pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(300)
def test_every_phase_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    # 3,000 records: send_many's last call is a part of its 700-value chunk.
    rc = perf_producer.main(
        ["--records", "3000", "--keyed-partitions", "4", "--many-chunk", "700", "--json"]
    )
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["bench"] == "producer" and figures["records"] == 3000
    for name in ("native", "native_keyed", "native_many", "librdkafka", "librdkafka_keyed"):
        assert_numbers(
            figures, f"{name}_rec_per_s", f"{name}_cpu_s_per_m", f"{name}_node_cpu_s_per_m"
        )
    assert_numbers(figures, "page_cache_write_mb_per_s")
    ratio = figures["native_rec_per_s"] / figures["librdkafka_rec_per_s"]
    assert figures["native_vs_librdkafka"] == pytest.approx(ratio, abs=0.001)
    keyed = figures["librdkafka_keyed_rec_per_s"] / figures["native_keyed_rec_per_s"]
    assert figures["librdkafka_keyed_vs_native_keyed"] == pytest.approx(keyed, abs=0.001)


def test_the_native_phases_run_without_librdkafka(capsys: pytest.CaptureFixture[str]) -> None:
    rc = perf_producer.main(
        ["--records", "500", "--keyed-partitions", "2", "--nodes", "1", "--skip-librdkafka"]
    )
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and "librdkafka_rec_per_s" not in figures
    assert_numbers(figures, "native_rec_per_s")
    assert "native send, partition=0" in out


def test_a_phase_ends_with_every_replica_caught_up(tmp_path: Path) -> None:
    """Between phases every replica has every record: acks=quorum answers with two of
    three, and the third (here paused while the records were written) catches up
    before the next phase, not during it."""
    with LocalCluster(3, tmp_path, log_level="WARNING") as c:
        c.create_topic("t", 1)
        leader = c.wait_for_leader("t", 0, 60)
        behind = next(n for n in (1, 2, 3) if n != leader)
        with Client(c.bootstrap) as client:
            producer = Producer(client)
            c.pause(behind)
            try:
                for _ in range(20_000):
                    producer.send("t", b"v" * 100, partition=0)
                producer.flush(60)
            finally:
                c.resume(behind)
            producer.close(60)
            perf_producer._settle(client, "t", 1)
            quorum = client.describe_quorum("t", 0)
            assert quorum.high_watermark > 20_000  # the records and a leader's mark
            assert [v.end_offset for v in quorum.voters] == [quorum.high_watermark] * 3
