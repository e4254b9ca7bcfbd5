"""Crash-safe small-file writes: temp file + fsync + rename + directory fsync."""

from __future__ import annotations

import os

from . import fileio
from .fileio import fsync_dir

__all__ = ["atomic_write", "fsync_dir", "write_all"]


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = fileio.write(fd, view)
        view = view[written:]


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new
    content, never a mix."""
    tmp = path + ".tmp"
    fd = fileio.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        fileio.fsync(fd)
    finally:
        fileio.close(fd)
    fileio.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
