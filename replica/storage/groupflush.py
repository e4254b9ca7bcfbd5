"""Group commit across logs: make many logs durable with one sync of their filesystem.

``flush_logs`` is what a node's flush job runs in its worker thread: it captures what
each log has to make durable (``Log.begin_flush``), syncs, then marks each log durable
(``PendingFlush.complete``). When at least ``syncfs_min`` logs on one filesystem have
something to sync, one syncfs(2) replaces their fdatasyncs and directory fsyncs;
otherwise, or when syncfs is unavailable or fails, each file is synced by itself.

Why syncfs is trusted: since Linux 5.8 syncfs reports writeback errors of the
filesystem that happened since the descriptor it is called on was opened (older kernels
return 0 whatever happened, so syncfs is not used there). The descriptor is opened
when the first log on the filesystem is (``syncfs.watch``, before any of its writes) and
kept for the life of the process, so no error is missed, whoever else saw it. The error names
no file (and may come from another program's file on the same filesystem), so after a
failed syncfs every log of the group is synced file by file, which reports an error to
exactly the log it belongs to.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import defaults
from .errors import StorageError
from .log import Log, PendingFlush
from .syncfs import syncfs, syncfs_available

__all__ = ["GroupFlush", "flush_logs", "syncfs_available"]

log = logging.getLogger(__name__)


@dataclass
class GroupFlush:
    """What one ``flush_logs`` call did. ``outcomes[i]`` is ``logs[i]``'s new durable end
    offset or the StorageError that kept it from advancing."""

    outcomes: list[int | StorageError]
    dirty_logs: int = 0
    syncfs_calls: int = 0
    syncfs_failures: int = 0
    file_synced_logs: int = 0  # logs synced file by file
    errors: list[str] = field(default_factory=list)


def flush_logs(
    logs: Sequence[Log], *, syncfs_min: int = defaults.SYNCFS_MIN_DIRTY_LOGS
) -> GroupFlush:
    """Flush every log in ``logs`` (each as ``Log.flush`` would: everything appended
    before this call is durable when its outcome is reported), with one syncfs per
    filesystem when at least ``syncfs_min`` of them (0: never) have files to sync.
    One log's failure does not affect the others' outcomes. Run it in a worker thread;
    while it runs, those logs' truncation, retention and close wait."""
    outcomes: list[int | StorageError | None] = [None] * len(logs)
    result = GroupFlush([])
    first: dict[int, int] = {}  # id(log) -> its first index (a log listed twice)
    pending: dict[int, PendingFlush] = {}
    failed: dict[int, StorageError] = {}
    try:
        # Each log's flush lock, in one global order (no deadlock with another group).
        for i in sorted(range(len(logs)), key=lambda i: logs[i].flush_order):
            if first.setdefault(id(logs[i]), i) != i:
                continue
            try:
                pending[i] = logs[i].begin_flush()
            except StorageError as exc:
                failed[i] = exc
        groups: dict[int, list[int]] = {}
        for i, p in pending.items():
            if p.needs_sync:
                groups.setdefault(p.device, []).append(i)
        result.dirty_logs = sum(len(g) for g in groups.values())
        for device, members in groups.items():
            by_file = members
            if syncfs_min > 0 and len(members) >= syncfs_min and syncfs_available():
                # Changed epoch checkpoints ride on the same syncs: written to temporary
                # files, synced, renamed, synced again (2 syncfs, not 2 fsyncs per log).
                staged: dict[int, str] = {}
                for i in members:
                    try:
                        tmp = pending[i].stage_checkpoint()
                    except StorageError as exc:
                        failed[i] = exc
                        continue
                    if tmp is not None:
                        staged[i] = tmp
                result.syncfs_calls += 1
                error = syncfs(device)
                if error is None and staged:
                    for i, tmp in staged.items():
                        try:
                            pending[i].commit_checkpoint(tmp)
                        except StorageError as exc:
                            failed[i] = exc
                    result.syncfs_calls += 1
                    error = syncfs(device)
                if error is None:
                    by_file = []
                    for i in members:
                        try:
                            pending[i].synced_by_filesystem()
                        except StorageError as exc:
                            failed[i] = exc
                else:
                    for i in staged:
                        pending[i].unstage_checkpoint()  # complete() writes it itself
                    result.syncfs_failures += 1
                    log.warning(
                        "syncfs of %s failed (%s); syncing its %d logs file by file",
                        pending[members[0]].log.directory,
                        error,
                        len(members),
                    )
            result.file_synced_logs += len(by_file)
            for i in by_file:
                try:
                    pending[i].sync_files()
                except StorageError as exc:
                    failed[i] = exc
        for i, p in pending.items():
            if i in failed:
                p.abandon()
                continue
            try:
                outcomes[i] = p.complete()
            except StorageError as exc:
                failed[i] = exc
    finally:
        for p in pending.values():
            p.abandon()  # only those not finished (an unexpected exception)
    for i, failure in failed.items():
        outcomes[i] = failure
        result.errors.append(str(failure))
    for i, lg in enumerate(logs):
        if outcomes[i] is None:
            outcomes[i] = outcomes[first[id(lg)]]
    result.outcomes = [o for o in outcomes if o is not None]
    assert len(result.outcomes) == len(logs)
    return result
