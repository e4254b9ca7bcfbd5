"""``quorumlog perf producer`` at a tiny size: every phase acknowledges every record and
the final JSON line carries each figure."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.cli import perf_producer

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
        assert figures[f"{name}_rec_per_s"] > 0
        assert figures[f"{name}_cpu_s_per_m"] > 0
    ratio = figures["native_rec_per_s"] / figures["librdkafka_rec_per_s"]
    assert figures["native_vs_librdkafka"] == pytest.approx(ratio, abs=0.001)


def test_the_native_phases_run_without_librdkafka(capsys: pytest.CaptureFixture[str]) -> None:
    rc = perf_producer.main(
        ["--records", "500", "--keyed-partitions", "2", "--nodes", "1", "--skip-librdkafka"]
    )
    out = capsys.readouterr().out
    figures = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and "librdkafka_rec_per_s" not in figures and figures["native_rec_per_s"] > 0
    assert "native send, partition=0" in out
