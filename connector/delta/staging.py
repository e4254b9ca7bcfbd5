"""The staging directories of the Delta sink's distributed writes, and their sweep.

Spark's writer puts a micro-batch's files into ``<table>/_quorumlog_staging/<name>``; the
driver moves them into the table and removes the directory once the batch is committed
or given up. A driver that dies in between leaves the directory behind; ``sweep``
removes such directories: the sink calls it before its first batch and then every
``SWEEP_INTERVAL_S``.

A directory's name starts with a key of the app (the streaming query) that wrote it.
A query writes one batch at a time and the sink knows which of its directories are in
use, so any other directory of its own app is left over from a write that never
finished (a killed driver of this same query): removed at once. A directory of another
app may belong to a write still running in another driver: removed only when nothing in
it changed for ``write_timeout_s``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Collection

logger = logging.getLogger(__name__)

#: Where Spark's writer puts a batch's files (``<table>/STAGING_DIR/<name>``) before the
#: driver moves them into the table; ``_``-prefixed, so Delta readers never look there.
STAGING_DIR = "_quorumlog_staging"
#: Seconds between two sweeps by one sink.
SWEEP_INTERVAL_S = 300.0
#: Seconds without a change after which another app's staging directory is abandoned.
DEFAULT_WRITE_TIMEOUT_S = 3600.0
#: Entries of a directory tree looked at to find its newest change (a bound: a tree
#: larger than this is judged by what was seen).
_MAX_ENTRIES = 100_000


def app_key(app_id: str) -> str:
    return hashlib.sha256(app_id.encode()).hexdigest()[:16]


def staging_path(root: str, app_id: str) -> str:
    """A new staging directory's path for one batch of ``app_id``."""
    return os.path.join(root, STAGING_DIR, f"{app_key(app_id)}-{uuid.uuid4().hex}")


def _newest_change(path: str) -> float:
    newest = os.stat(path).st_mtime
    seen = 0
    for directory, _dirs, names in os.walk(path):
        for name in [".", *names]:
            seen += 1
            if seen > _MAX_ENTRIES:
                return newest
            try:
                newest = max(newest, os.stat(os.path.join(directory, name)).st_mtime)
            except FileNotFoundError:
                continue
    return newest


def sweep(
    root: str, app_id: str, in_use: Collection[str], write_timeout_s: float, now: float
) -> list[str]:
    """Remove the staging directories under the table at ``root`` that no write will
    finish (see the module's docstring); ``in_use``: this sink's directories being
    written. Returns the names removed."""
    parent = os.path.join(root, STAGING_DIR)
    try:
        names = sorted(os.listdir(parent))
    except FileNotFoundError:
        return []
    ours = app_key(app_id) + "-"
    in_use_names = {os.path.basename(p) for p in in_use}
    removed = []
    for name in names:
        path = os.path.join(parent, name)
        if name in in_use_names or not os.path.isdir(path):
            continue
        try:
            abandoned = name.startswith(ours) or now - _newest_change(path) >= write_timeout_s
        except FileNotFoundError:
            continue  # removed meanwhile by its writer
        if abandoned:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    if removed:
        logger.warning(
            "Delta sink %s: removed %d staging directories of writes that never finished: %s",
            root,
            len(removed),
            ", ".join(removed),
        )
    try:
        os.rmdir(parent)  # only if empty
    except OSError:
        pass
    return removed
