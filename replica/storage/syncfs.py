"""syncfs(2): write back and flush one whole filesystem, reporting writeback errors.

Python has no ``os.syncfs``; this calls libc's through ctypes (which drops the GIL for
the call). Only Linux >= 5.8 reports writeback errors from syncfs (to each descriptor,
those that happened since it was opened); elsewhere ``syncfs_available()`` is False and
nothing here is used. One directory descriptor per filesystem is opened by ``watch``
when the first log on it opens, before any of its writes, and kept for the life of the
process, so a later syncfs reports every writeback error of those writes, whoever else
has seen it meanwhile.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

from . import fileio

__all__ = ["syncfs", "syncfs_available", "watch"]

_MIN_KERNEL = (5, 8)

_lock = threading.Lock()
_fds: dict[int, int] = {}  # st_dev -> a directory descriptor on that filesystem


def _load() -> Callable[[int], int] | None:
    uname = os.uname()
    parts = uname.release.split("-")[0].split(".")
    try:
        kernel = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None
    if uname.sysname != "Linux" or kernel < _MIN_KERNEL:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    call: Callable[[int], int] = fn
    return call


_call = _load()


def syncfs_available() -> bool:
    """Whether this system has a syncfs(2) that reports writeback errors."""
    return _call is not None


def watch(device: int, directory: str) -> None:
    """Keep a descriptor on the filesystem ``device`` (``directory`` is on it) from now
    on, for ``syncfs``. Cheap after the first call per filesystem; no-op without syncfs."""
    if _call is None or device in _fds:
        return
    with _lock:
        if device in _fds:
            return
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return  # syncfs(device) then reports the filesystem as not watched
        if os.fstat(fd).st_dev != device:
            os.close(fd)
            return
        _fds[device] = fd


def syncfs(device: int) -> OSError | None:
    """syncfs the filesystem ``device``: None on success, else the error (also when
    syncfs is unavailable or the filesystem was never watched)."""
    fd = _fds.get(device)
    if _call is None or fd is None:
        return OSError(f"syncfs is unavailable for device {device}")
    try:
        if fileio.syncfs(_call, fd) == 0:
            return None
    except OSError as exc:  # a fault injected by the file layer
        return exc
    errno = ctypes.get_errno()
    return OSError(errno, os.strerror(errno))
