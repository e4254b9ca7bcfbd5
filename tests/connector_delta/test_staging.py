"""The sweep of staging directories left by writes that never finished."""

from __future__ import annotations

import os
from pathlib import Path

from quorumlog.connector.delta.staging import STAGING_DIR, staging_path, sweep


def staged(root: Path, app_id: str, age_s: float = 0.0) -> str:
    """A staging directory of ``app_id`` holding one file, last changed ``age_s`` ago."""
    path = staging_path(str(root), app_id)
    os.makedirs(os.path.join(path, "topic=ev"))
    data = os.path.join(path, "topic=ev", "part-0.parquet")
    Path(data).write_bytes(b"x")
    when = 1_000_000.0 - age_s
    for p in (data, os.path.join(path, "topic=ev"), path):
        os.utime(p, (when, when))
    return path


def test_own_leftovers_go_at_once_others_only_after_the_write_timeout(tmp_path: Path) -> None:
    in_use = staged(tmp_path, "query-a")
    leftover = staged(tmp_path, "query-a")
    young = staged(tmp_path, "query-b", age_s=10)
    old = staged(tmp_path, "query-b", age_s=4000)
    removed = sweep(str(tmp_path), "query-a", {in_use}, 3600, now=1_000_000.0)
    assert sorted(removed) == sorted(os.path.basename(p) for p in (leftover, old))
    assert os.path.isdir(in_use) and os.path.isdir(young)
    assert not os.path.exists(leftover) and not os.path.exists(old)

    # a file written into it just now keeps another app's directory
    os.utime(os.path.join(young, "topic=ev", "part-0.parquet"), (1_000_100.0, 1_000_100.0))
    assert sweep(str(tmp_path), "query-a", {in_use}, 60, now=1_000_120.0) == []
    # nothing left: the staging parent goes too
    assert sweep(str(tmp_path), "query-c", set(), 60, now=1_000_500.0)
    assert not (tmp_path / STAGING_DIR).exists()
    assert sweep(str(tmp_path), "query-c", set(), 60, now=1_000_500.0) == []
