"""DeltaSink inside real streaming queries: checkpoints, restarts, a SIGKILLed driver."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from quorumlog.connector.delta import (
    METADATA_KEY,
    STAGING_DIR,
    DeltaSink,
    Position,
    read_committed_positions,
)

from tests.support.spark import SHORT_JVM

from .helpers import rows, start_stream, table_rows, write_input_file

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]

# Scripted source output: two partitions, then an unclean election truncates ev/0 at 12
# (the table holds up to 14) and the source resumes there with epoch 3.
BATCHES = [
    rows("ev", 0, range(0, 8), 1, "old") + rows("ev", 1, range(0, 5), 1, "p1"),
    rows("ev", 0, range(8, 15), 1, "old"),
    rows("ev", 1, range(5, 9), 2, "p1"),
    rows("ev", 0, range(12, 16), 3, "new") + rows("ev", 1, range(9, 10), 2, "p1"),
]
EXPECTED = sorted(
    rows("ev", 0, range(0, 12), 1, "old")
    + rows("ev", 0, range(12, 16), 3, "new")
    + rows("ev", 1, range(0, 5), 1, "p1")
    + rows("ev", 1, range(5, 10), 2, "p1")
)
EXPECTED_POSITIONS = {"ev": {0: Position(16, 3), 1: Position(10, 2)}}


def query_id(checkpoint: Path) -> str:
    return str(json.loads((checkpoint / "metadata").read_text())["id"])


def sink_commits(path: Path) -> Counter[int]:
    """How many commits each batch id made."""
    return Counter(
        c[METADATA_KEY]["batchId"] for c in DeltaTable(str(path)).history() if METADATA_KEY in c
    )


def assert_every_row_once(path: Path) -> None:
    got = table_rows(path)
    held = Counter((t, p, o) for t, p, o, _, _ in got)
    assert max(held.values()) == 1
    assert got == EXPECTED


def drain(spark: Any, input_dir: Path, checkpoint: Path, table: Path) -> Any:
    """Start the query into a ``DeltaSink``, process every input file there is, stop it."""
    query = start_stream(spark, input_dir, checkpoint, DeltaSink(table))
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return query


def test_stream_with_redelivery_and_restart(spark: Any, tmp_path: Path) -> None:
    input_dir, checkpoint, table = tmp_path / "in", tmp_path / "ck", tmp_path / "t"
    for i, batch in enumerate(BATCHES[:2]):
        write_input_file(input_dir, i, batch)
    query = drain(spark, input_dir, checkpoint, table)
    assert DeltaTable(str(table)).transaction_version(query_id(checkpoint)) == 1

    for i, batch in enumerate(BATCHES[2:], start=2):
        write_input_file(input_dir, i, batch)
    restarted = drain(spark, input_dir, checkpoint, table)
    assert str(restarted.id) == str(query.id) == query_id(checkpoint)
    assert_every_row_once(table)
    assert sink_commits(table) == {0: 1, 1: 1, 2: 1, 3: 1}
    truncations = DeltaTable(str(table)).history(limit=1)[0][METADATA_KEY]["truncations"]
    assert truncations == [
        {
            "topic": "ev",
            "partition": 0,
            "divergenceOffset": 12,
            "firstRedeliveredOffset": 12,
            "oldOffset": 15,
            "oldEpoch": 1,
            "newEpoch": 3,
        }
    ]
    assert read_committed_positions(table) == EXPECTED_POSITIONS


def run_killed_job(input_dir: Path, checkpoint: Path, table: Path, *args: str) -> None:
    """Run ``stream_job`` with ``args`` as its own process; it must die by its SIGKILL."""
    env = dict(os.environ, PYTHONPATH=str(REPO), JAVA_TOOL_OPTIONS=SHORT_JVM)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.connector_delta.stream_job",
            str(input_dir),
            str(checkpoint),
            str(table),
            *args,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the job kills it, not us
    )
    try:
        out, _ = proc.communicate(timeout=240)  # a loaded machine starts Spark slowly
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, out.decode(errors="replace")[-3000:]


def test_exactly_once_across_a_driver_killed_between_delta_and_spark_commits(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    input_dir, checkpoint, table = tmp_path / "in", tmp_path / "ck", tmp_path / "t"
    for i, batch in enumerate(BATCHES):
        write_input_file(input_dir, i, batch)
    kill_after = 2
    run_killed_job(input_dir, checkpoint, table, str(kill_after))

    # Delta has batch 2; Spark planned it (offsets log) but never committed it.
    assert DeltaTable(str(table)).transaction_version(query_id(checkpoint)) == kill_after
    assert (checkpoint / "offsets" / str(kill_after)).exists()
    assert not (checkpoint / "commits" / str(kill_after)).exists()

    caplog.set_level(logging.INFO, logger="quorumlog.connector.delta")
    drain(spark, input_dir, checkpoint, table)
    assert f"batch {kill_after} of app {query_id(checkpoint)} already committed" in caplog.text
    assert sink_commits(table) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert_every_row_once(table)
    assert read_committed_positions(table) == EXPECTED_POSITIONS


def test_a_write_killed_midway_leaves_staging_that_the_restart_sweeps(
    spark: Any, tmp_path: Path
) -> None:
    input_dir, checkpoint, table = tmp_path / "in", tmp_path / "ck", tmp_path / "t"
    for i, batch in enumerate(BATCHES):
        write_input_file(input_dir, i, batch)
    kill_after = 2
    run_killed_job(input_dir, checkpoint, table, str(kill_after), "mid-write")

    # batch 2's files are in its staging directory, none in the table, nothing committed
    assert DeltaTable(str(table)).transaction_version(query_id(checkpoint)) == kill_after - 1
    left = list((table / STAGING_DIR).iterdir())
    assert len(left) == 1 and list(left[0].rglob("*.parquet")), left

    # the restarted query sweeps it before its first batch, then replays batch 2
    drain(spark, input_dir, checkpoint, table)
    assert not (table / STAGING_DIR).exists()
    assert sink_commits(table) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert_every_row_once(table)
    assert read_committed_positions(table) == EXPECTED_POSITIONS
