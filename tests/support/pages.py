"""What of a file the kernel holds in its page cache."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path


def resident_pages(path: Path) -> tuple[int, int]:
    """(pages in the page cache, pages) of a file, by mincore(2) over a read-only map of
    it (mapping faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec), pages
