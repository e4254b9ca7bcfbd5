"""Group commit across logs: make many logs durable with one sync of their filesystem.

``flush_logs`` is what a node's flush job runs in its worker thread: it captures what
each log has to make durable (``Log.begin_flush``), syncs, then marks each log durable
(``PendingFlush.complete``). When at least ``syncfs_min`` logs on one filesystem have
something to sync, one syncfs(2) replaces their fdatasyncs and directory fsyncs;
otherwise, or when syncfs is unavailable or fails, each file is synced by itself.

Why syncfs is trusted: since Linux 5.8 syncfs reports writeback errors of the
filesystem that happened since the descriptor it is called on was opened (older kernels
return 0 whatever happened, so syncfs is not used there). The descriptor is kept open
for the life of the process, so no error is missed between two calls. The error names
no file (and may come from another program's file on the same filesystem), so after a
failed syncfs every log of the group is synced file by file, which reports an error to
exactly the log it belongs to.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .. import defaults
from .errors import StorageError
from .log import Log, PendingFlush

__all__ = ["GroupFlush", "flush_logs", "syncfs_available"]

log = logging.getLogger(__name__)

_MIN_KERNEL = (5, 8)  # syncfs reports writeback errors from here on


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


class _Syncfs:
    """syncfs(2) through libc, on one long-lived directory descriptor per filesystem."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}
        self._call: Callable[[int], int] | None = None
        self.available = False
        release = os.uname().release.split("-")[0].split(".")
        try:
            kernel = (int(release[0]), int(release[1]))
        except (IndexError, ValueError):
            kernel = (0, 0)
        if os.uname().sysname != "Linux" or kernel < _MIN_KERNEL:
            return
        try:
            fn = ctypes.CDLL(None, use_errno=True).syncfs
        except (AttributeError, OSError):
            return
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
        self._call = fn
        self.available = True

    def sync(self, device: int, directory: str) -> OSError | None:
        """syncfs the filesystem ``device`` (``directory`` is on it). None on success."""
        assert self._call is not None
        with self._lock:
            fd = self._fds.get(device)
            if fd is None:
                try:
                    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                except OSError as exc:
                    return exc
                if os.fstat(fd).st_dev != device:
                    os.close(fd)
                    return OSError(f"{directory} is not on device {device}")
                self._fds[device] = fd
        # ctypes drops the GIL for the call: the event loop keeps running.
        if self._call(fd) == 0:
            return None
        errno = ctypes.get_errno()
        return OSError(errno, os.strerror(errno))


_syncfs = _Syncfs()


def syncfs_available() -> bool:
    """Whether this system has a syncfs(2) that reports writeback errors (Linux >= 5.8)."""
    return _syncfs.available


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
            if syncfs_min > 0 and len(members) >= syncfs_min and _syncfs.available:
                result.syncfs_calls += 1
                error = _syncfs.sync(device, pending[members[0]].log.directory)
                if error is None:
                    by_file = []
                    for i in members:
                        try:
                            pending[i].synced_by_filesystem()
                        except StorageError as exc:
                            failed[i] = exc
                else:
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
