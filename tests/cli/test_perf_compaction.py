"""``quorumlog perf compaction`` at a tiny size, as its own process: the cleaner's rate on
a local log, the producers' rate before and while the nodes clean, and every figure in the
JSON line (no rate judged: a loaded machine's figures are not the benchmark's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FIGURES = {
    "cleaned_mb_per_s",
    "bytes_after_vs_live",
    "produce_during_vs_before",
    "produce_before_records_per_s",
    "produce_during_records_per_s",
    "backlog_mb",
    "backlog_cleaned_mb",
    "records_read",
    "records_kept",
    "load_1m",
    "backlog_cleaning_s",
}


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_perf_compaction_reports_every_figure() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "quorumlog.replica.cli.main", "perf", "compaction"]
        + ["--mb", "4", "--keys", "500", "--segment-mb", "1", "--backlog-mb", "4"]
        + ["--seconds", "1", "--partitions", "1", "--producers", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "compaction"
    assert FIGURES <= set(figures), FIGURES - set(figures)
    # What the clean did, not how fast: it read the dirty log and kept each live key once.
    assert figures["records_kept"] <= 500 < figures["records_read"]
    assert figures["cleaned_input_mb"] > 0 and figures["bytes_after_vs_live"] > 0
