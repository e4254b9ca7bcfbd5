"""``quorumlog perf transactions`` at a tiny size: both loops deliver records, the
transactional one commits, and a read_committed consumer sees its commits."""

from __future__ import annotations

import json

import pytest
from quorumlog.replica.perf import transactions as perf_transactions

from tests.support.figures import assert_numbers


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_both_loops_and_the_commit_latency(capsys: pytest.CaptureFixture[str]) -> None:
    rc = perf_transactions.main(["--seconds", "1.5", "--partitions", "2", "--json"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and figures["bench"] == "transactions"
    # Both loops delivered records (counts; the rates are the command's to print).
    assert figures["idempotent_records"] > 0 and figures["transactional_records"] > 0
    assert isinstance(figures["idempotent_rec_per_s"], int)
    assert figures["transactions"] >= 1
    assert figures["commits_seen"] == figures["transactions"]
    assert_numbers(figures, "commit_to_visible_ms_p50")
    assert isinstance(figures["transactional_vs_idempotent"], float)
