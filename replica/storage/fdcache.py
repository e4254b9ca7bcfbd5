"""A bounded, node-wide cache of open segment file descriptors.

A node hosting thousands of partition replicas cannot keep a descriptor per segment open
(the default ``ulimit -n`` may be 1024). Segments hold a ``FileHandle`` instead and use
its descriptor only inside ``FdCache.pin``; the cache opens it on first use and closes
the least recently used idle ones when more than ``capacity`` are open.

Why it is safe with flushes running in worker threads:

- A pinned descriptor is never closed, and a descriptor number is never handed out after
  it was closed (the OS reuses numbers: an fsync could hit another file). Callers never
  keep the number past the ``with`` block.
- Closing a descriptor keeps the page-cache data, but a later fsync through a newly
  opened descriptor may not report a writeback error that happened before it was opened.
  So a descriptor with writes not yet synced is fdatasync'd before it is closed on
  eviction (``eviction_syncs``), and a failure there is kept on the handle and raised by
  every later ``sync``/``finish_sync`` of it: no durability is ever claimed past it.
- ``sync`` and ``finish_sync`` wait for an eviction of the same file in progress in
  another thread, so its outcome is known before success is reported.

Eviction prefers a clean descriptor among the least recently used idle ones (an
fdatasync in the evicting thread, often the event loop, is the cost avoided).

Writes are counted per handle (a generation bumped when a write pin ends); a sync
records the generation it covers, so a clean handle (never written, or synced, or
evicted after its eviction sync) costs no syscall to flush.

The cache's lock is a leaf: nothing else is locked while it is held, and no fsync runs
under it.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict

from .. import defaults
from . import fileio
from .errors import StorageError

__all__ = ["FdCache", "FileHandle", "shared_cache"]

_OPEN_FLAGS = os.O_RDWR | os.O_APPEND
# How far past the least recently used idle descriptor eviction looks for a clean one.
_CLEAN_SCAN = 32


def nofile_limit() -> int | None:
    """The soft RLIMIT_NOFILE (None: unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


class FileHandle:
    """One file the cache may hold open. Use it only through its ``FdCache``."""

    __slots__ = (
        "_create",
        "_fd",
        "_pins",
        "_released",
        "_retiring",
        "_synced_gen",
        "_write_gen",
        "error",
        "path",
    )

    def __init__(self, path: str, create: bool = False) -> None:
        self.path = path
        self._create = create  # the file does not exist yet: its first open creates it
        self._fd = -1
        self._pins = 0
        self._retiring = 0  # evictions of this file still syncing/closing in some thread
        self._released = False
        self._write_gen = 0
        self._synced_gen = 0
        self.error: OSError | None = None  # an eviction's fdatasync failed: sticky

    @property
    def is_open(self) -> bool:
        return self._fd >= 0


class _Pin:
    __slots__ = ("_cache", "_handle", "_write")

    def __init__(self, cache: FdCache, handle: FileHandle, write: bool) -> None:
        self._cache = cache
        self._handle = handle
        self._write = write

    def __enter__(self) -> int:
        return self._cache._acquire(self._handle)

    def __exit__(self, *exc: object) -> None:
        self._cache._unpin(self._handle, self._write)


# (handle, descriptor, generation it holds, whether it has unsynced writes)
_Victim = tuple[FileHandle, int, int, bool]


class FdCache:
    """At most ``capacity`` descriptors open (clamped to a quarter of the soft
    RLIMIT_NOFILE). The cap is exceeded only while every open descriptor is pinned
    (each thread pins at most one at a time, so by a few), and shrinks back when they
    are unpinned."""

    def __init__(self, capacity: int = defaults.MAX_OPEN_SEGMENT_FILES) -> None:
        limit = nofile_limit()
        if limit is not None:
            capacity = min(capacity, limit // 4)
        self.capacity = max(1, capacity)
        self._cond = threading.Condition(threading.Lock())
        self._idle: OrderedDict[FileHandle, None] = OrderedDict()  # LRU first
        self._open = 0  # descriptors open, counting those being evicted
        self.peak_open = 0
        self.opens = 0
        self.evictions = 0
        self.eviction_syncs = 0

    @property
    def open_files(self) -> int:
        return self._open

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "capacity": self.capacity,
                "open_files": self._open,
                "peak_open_files": self.peak_open,
                "opens": self.opens,
                "evictions": self.evictions,
                "eviction_syncs": self.eviction_syncs,
            }

    # -- handles ---------------------------------------------------------------------

    def handle(self, path: str) -> FileHandle:
        """An existing file, opened on first use."""
        return FileHandle(path)

    def create(self, path: str) -> FileHandle:
        """Create ``path`` (it must not exist) and keep it open: it is written next."""
        handle = FileHandle(path)
        failure: OSError | None = None
        with self._cond:
            victims = self._make_room(1)
            try:
                fd = fileio.open_file(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as exc:
                failure = exc
            else:
                self._adopt(handle, fd)
                self._idle[handle] = None
        self._retire(victims)
        if failure is not None:
            raise failure
        return handle

    def create_later(self, path: str) -> FileHandle:
        """A file that does not exist yet (``path`` must not exist): it is created, in
        an existing directory, by its first use. A log nobody writes costs no file."""
        return FileHandle(path, create=True)

    def release(self, handle: FileHandle) -> None:
        """Forget ``handle``: close its descriptor without syncing (the caller synced what
        it needs, or the file is being deleted or abandoned). A pinned descriptor is
        closed when its last pin ends; later pins raise StorageError."""
        with self._cond:
            if handle._released:
                return
            handle._released = True
            if handle._fd >= 0 and handle._pins == 0:
                self._idle.pop(handle, None)
                self._close_locked(handle)

    # -- use -------------------------------------------------------------------------

    def pin(self, handle: FileHandle, *, write: bool = False) -> _Pin:
        """``with cache.pin(handle) as fd``: the descriptor stays valid (open, this file)
        until the block ends. ``write=True`` marks the file as having unsynced writes
        once the block ends."""
        return _Pin(self, handle, write)

    def generation(self, handle: FileHandle) -> int:
        """How many write pins of ``handle`` have ended: pass it to ``finish_sync`` after
        a sync (an fdatasync or a syncfs) started after this call."""
        with self._cond:
            return handle._write_gen

    def sync(self, handle: FileHandle) -> None:
        """fdatasync the file if anything was written since it was last synced. Raises
        StorageError if the sync, or an earlier eviction sync, failed."""
        with self._cond:
            self._settled(handle)
            gen = handle._write_gen
            if gen == handle._synced_gen:
                return
        with self.pin(handle) as fd:
            try:
                fileio.fdatasync(fd)
            except OSError as exc:
                # A failed fdatasync may have dropped the dirty pages: a retry could
                # succeed over lost data ("fsyncgate"), so the failure is sticky.
                with self._cond:
                    if handle.error is None:
                        handle.error = exc
                raise StorageError(f"{handle.path}: fdatasync failed: {exc}") from exc
        self.finish_sync(handle, gen)

    def finish_sync(self, handle: FileHandle, generation: int) -> None:
        """A sync that started after ``generation(handle)`` returned it succeeded: record
        it, unless an eviction of the file failed to sync (then raise StorageError)."""
        with self._cond:
            self._settled(handle)
            if generation > handle._synced_gen:
                handle._synced_gen = generation

    def check(self, handle: FileHandle) -> None:
        """Raise StorageError if an eviction of ``handle`` failed to sync it."""
        with self._cond:
            self._settled(handle)

    # -- internals (the lock is held where the name ends in _locked or says so) -------

    def _settled(self, handle: FileHandle) -> None:
        while handle._retiring:
            self._cond.wait()
        if handle.error is not None:
            raise StorageError(
                f"{handle.path}: an earlier sync failed ({handle.error}); data written "
                "before it may be lost"
            )

    def _acquire(self, handle: FileHandle) -> int:
        failure: OSError | None = None
        fd = -1
        with self._cond:
            if handle._released:
                raise StorageError(f"{handle.path}: the file is closed")
            if handle._fd >= 0:
                if handle._pins == 0:
                    del self._idle[handle]
                handle._pins += 1
                return handle._fd
            victims = self._make_room(1)
            flags = _OPEN_FLAGS | (os.O_CREAT | os.O_EXCL if handle._create else 0)
            try:
                fd = fileio.open_file(handle.path, flags, 0o644)
            except OSError as exc:
                failure = exc
            else:
                self._adopt(handle, fd)
                handle._pins = 1
                handle._create = False
        self._retire(victims)
        if failure is not None:
            raise StorageError(f"{handle.path}: cannot open: {failure}") from failure
        return fd

    def _unpin(self, handle: FileHandle, write: bool) -> None:
        victims: list[_Victim] = []
        with self._cond:
            handle._pins -= 1
            if write:
                handle._write_gen += 1
            if handle._pins == 0:
                if handle._released:
                    self._close_locked(handle)
                else:
                    self._idle[handle] = None
                    if self._open > self.capacity:
                        victims = self._make_room(0)
        self._retire(victims)

    def _adopt(self, handle: FileHandle, fd: int) -> None:
        handle._fd = fd
        self._open += 1
        self.opens += 1
        if self._open > self.peak_open:
            self.peak_open = self._open

    def _close_locked(self, handle: FileHandle) -> None:
        fd, handle._fd = handle._fd, -1
        self._open -= 1
        try:
            fileio.close(fd)
        except OSError:
            pass  # released: nobody relies on this descriptor's writes any more

    def _make_room(self, wanted: int) -> list[_Victim]:
        """Detach least recently used idle descriptors until ``wanted`` more fit; the
        caller retires them (sync if dirty, close) after dropping the lock. A clean one
        among the ``_CLEAN_SCAN`` least recently used goes first: a dirty one costs an
        fdatasync in the caller's thread (the event loop, often), while the flush job
        is about to sync it anyway."""
        victims: list[_Victim] = []
        excess = self._open + wanted - self.capacity
        while excess > 0 and self._idle:
            handle = next(iter(self._idle))
            for i, candidate in enumerate(self._idle):
                if candidate._write_gen == candidate._synced_gen:
                    handle = candidate
                    break
                if i >= _CLEAN_SCAN:
                    break
            del self._idle[handle]
            gen = handle._write_gen
            victims.append((handle, handle._fd, gen, gen != handle._synced_gen))
            handle._fd = -1
            handle._retiring += 1
            self.evictions += 1
            excess -= 1
        return victims

    def _retire(self, victims: list[_Victim]) -> None:
        for handle, fd, gen, dirty in victims:
            error: OSError | None = None
            if dirty:
                try:
                    fileio.fdatasync(fd)
                except OSError as exc:
                    error = exc
            try:
                fileio.close(fd)
            except OSError as exc:
                error = error or exc
            with self._cond:
                self._open -= 1
                handle._retiring -= 1
                if dirty:
                    self.eviction_syncs += 1
                if error is not None:
                    if handle.error is None:
                        handle.error = error
                elif gen > handle._synced_gen:
                    handle._synced_gen = gen
                self._cond.notify_all()


_shared: FdCache | None = None
_shared_lock = threading.Lock()


def shared_cache() -> FdCache:
    """The process-wide cache (``MAX_OPEN_SEGMENT_FILES``) every ``Log`` uses unless it
    is given its own."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = FdCache()
        return _shared
