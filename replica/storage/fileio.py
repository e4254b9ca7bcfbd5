"""The one file layer of storage: every write, fsync, rename, truncate, unlink and
directory creation of a log, its indexes and checkpoints, the quorum journal and state
files and a node's identity and metadata files goes through the functions here.

By default they are the system calls themselves. ``install`` swaps in another
``FileOps`` for the whole process:

- ``RecordingFileOps`` (tests/storage/crash) keeps the stream of writes, syncs,
  renames, truncates and unlinks under one directory, from which the crash-state
  explorer builds every state a power loss can leave;
- ``FaultyFileOps`` fails or slows chosen calls (EIO, ENOSPC, a slow fsync), driven by
  a small JSON file a test rewrites while a node runs (``QUORUMLOG_FAULT_FILE``).

Reads go through ``pread`` only so that a fault can fail them too.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "FAULT_FILE_ENV",
    "FaultyFileOps",
    "FileOps",
    "close",
    "drop_cached",
    "fdatasync",
    "fsync",
    "fsync_dir",
    "ftruncate",
    "install",
    "install_from_environment",
    "installed",
    "makedirs",
    "open_file",
    "pread",
    "pwrite",
    "replace",
    "syncfs",
    "unlink",
    "write",
    "writev",
]

log = logging.getLogger(__name__)

#: Names a JSON file of faults for ``FaultyFileOps`` (see ``install_from_environment``).
FAULT_FILE_ENV = "QUORUMLOG_FAULT_FILE"


class FileOps:
    """The system calls. Subclasses observe or change them; each method does exactly
    what its ``os`` namesake does."""

    def open_file(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        return os.writev(fd, buffers)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        if hasattr(os, "fdatasync"):
            os.fdatasync(fd)
        else:  # macOS
            os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def syncfs(self, call: Any, fd: int) -> int:
        """``call(fd)`` is libc's syncfs (``storage.syncfs``); returns its result."""
        result: int = call(fd)
        return result


_ops: FileOps = FileOps()


def installed() -> FileOps:
    return _ops


def install(ops: FileOps) -> FileOps:
    """Use ``ops`` for every storage file call from now on; returns the one it replaces."""
    global _ops
    previous, _ops = _ops, ops
    return previous


def open_file(path: str, flags: int, mode: int = 0o644) -> int:
    return _ops.open_file(path, flags, mode)


def close(fd: int) -> None:
    _ops.close(fd)


def write(fd: int, data: bytes | memoryview) -> int:
    return _ops.write(fd, data)


def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
    return _ops.pwrite(fd, data, offset)


def writev(fd: int, buffers: Sequence[bytes | memoryview]) -> int:
    return _ops.writev(fd, buffers)


def pread(fd: int, size: int, offset: int) -> bytes:
    return _ops.pread(fd, size, offset)


def fsync(fd: int) -> None:
    _ops.fsync(fd)


def fdatasync(fd: int) -> None:
    _ops.fdatasync(fd)


def ftruncate(fd: int, length: int) -> None:
    _ops.ftruncate(fd, length)


def replace(src: str, dst: str) -> None:
    _ops.replace(src, dst)


def unlink(path: str) -> None:
    _ops.unlink(path)


def makedirs(path: str, *, durable: bool = False) -> list[str]:
    """``os.makedirs(path, exist_ok=True)``, each missing level through ``mkdir``;
    returns the directories made, outermost first. ``durable``: also fsync the parent
    of each one made, so that the new entries survive a power loss."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return []
    parent = os.path.dirname(path)
    made = makedirs(parent) if parent != path else []
    try:
        _ops.mkdir(path)
        made.append(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    if durable:
        for directory in made:
            _ops.fsync_dir(os.path.dirname(directory))
    return made


def fsync_dir(path: str) -> None:
    """fsync a directory so that creations, renames and deletions in it are durable."""
    _ops.fsync_dir(path)


def syncfs(call: Any, fd: int) -> int:
    return _ops.syncfs(call, fd)


def drop_cached(fd: int, length: int) -> None:
    """Ask the kernel to drop the clean page-cache pages of the file's first ``length``
    bytes (POSIX_FADV_DONTNEED). Advice, not a change of the file: no ``FileOps`` method
    (nothing a crash or a fault could leave differently); a platform without it ignores
    it."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None and length > 0:
        advise(fd, 0, length, os.POSIX_FADV_DONTNEED)


# -- faults --------------------------------------------------------------------------


class FaultyFileOps(FileOps):
    """Fails or slows chosen calls, as a failing or slow disk would. The faults are a
    JSON list in ``path``, re-read when the file changes (checked at most every 20 ms):
    ``[{"op": "fdatasync", "path": "t-0", "errno": "EIO"}, {"op": "fsync", "delay": 2}]``.
    ``op`` names a ``FileOps`` method (``"sync"`` matches fsync, fdatasync, fsync_dir
    and syncfs; ``"*"`` any), ``path`` a substring of the file's path (descriptors are
    mapped to the path they were opened with), ``errno`` the error to raise, ``delay``
    seconds to wait first. A missing or empty file means no faults."""

    _SYNCS = frozenset({"fsync", "fdatasync", "fsync_dir", "syncfs"})

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}
        self._faults: list[dict[str, Any]] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self.injected = 0
        self.delayed: list[str] = []  # paths of the calls slowed down

    def _rules(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        if now - self._checked < 0.02:
            return self._faults
        self._checked = now
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._stamp = stamp
            faults: list[dict[str, Any]] = []
            if stamp is not None:
                try:
                    with open(self.path, "rb") as fh:
                        raw = fh.read()
                    loaded = json.loads(raw) if raw.strip() else []
                    faults = [f for f in loaded if isinstance(f, dict)]
                except (OSError, ValueError) as exc:
                    log.warning("fault file %s unreadable (%s): no faults", self.path, exc)
            if faults != self._faults:
                log.warning("disk faults now: %s", faults or "none")
            self._faults = faults
        return self._faults

    def _maybe_fail(self, op: str, path: str) -> None:
        for rule in self._rules():
            want = rule.get("op", "*")
            if want != "*" and want != op and not (want == "sync" and op in self._SYNCS):
                continue
            if rule.get("path", "") not in path:
                continue
            delay = float(rule.get("delay", 0))
            if delay > 0:
                self.delayed.append(path)
                time.sleep(delay)
            name = rule.get("errno")
            if name:
                self.injected += 1
                code = getattr(errno, str(name), errno.EIO)
                raise OSError(code, f"{os.strerror(code)} (injected)", path)

    def _fd_path(self, fd: int) -> str:
        return self._paths.get(fd, "")

    def open_file(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open_file(path, flags, mode)
        with self._lock:
            self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self._maybe_fail("write", self._fd_path(fd))
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self._maybe_fail("write", self._fd_path(fd))
        return super().pwrite(fd, data, offset)

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        self._maybe_fail("write", self._fd_path(fd))
        return super().writev(fd, buffers)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._maybe_fail("read", self._fd_path(fd))
        return super().pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync", self._fd_path(fd))
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._maybe_fail("fdatasync", self._fd_path(fd))
        super().fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._maybe_fail("ftruncate", self._fd_path(fd))
        super().ftruncate(fd, length)

    def replace(self, src: str, dst: str) -> None:
        self._maybe_fail("replace", dst)
        super().replace(src, dst)

    def mkdir(self, path: str) -> None:
        self._maybe_fail("mkdir", path)
        super().mkdir(path)

    def fsync_dir(self, path: str) -> None:
        self._maybe_fail("fsync_dir", path)
        super().fsync_dir(path)

    def syncfs(self, call: Any, fd: int) -> int:
        self._maybe_fail("syncfs", "")
        return super().syncfs(call, fd)


def install_from_environment() -> FaultyFileOps | None:
    """In a node process started with ``QUORUMLOG_FAULT_FILE`` set (fault tests), use
    ``FaultyFileOps`` on that file; otherwise do nothing."""
    path = os.environ.get(FAULT_FILE_ENV)
    if not path:
        return None
    ops = FaultyFileOps(path)
    install(ops)
    log.warning("disk fault injection is on (%s=%s)", FAULT_FILE_ENV, path)
    return ops
