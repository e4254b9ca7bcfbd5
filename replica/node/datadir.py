"""A node's data directory: who may use it (``.lock``), whose it is (``meta.properties``),
whether it replaced a lost one (``replaced-directories``, ``catch-up-pending``), and what
is being deleted (``.trash``).

A replica's directory is deleted (moved off this node, its topic deleted) by renaming it
into ``.trash``, which frees its name at once, and unlinking its files in a thread of
their own, as Kafka renames a log to ``-delete`` and deletes it later: unlinking a large
replica's segments takes long (about 0.27 s a GiB of cached segments on a 2-core virtual
machine), and on the event loop every partition of the node would wait for it, its
leaders long enough at a few GiB to lose their quorums. What a crash leaves in ``.trash``
is deleted when the node starts again.

A segment retention or truncation deletes is unlinked on the spot, but its file's last
descriptor is closed by the same thread (``Trash.close_later``): that close is what frees
its cached pages and blocks, as slow as a directory's unlink a GiB."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from ..storage import fileio
from ..storage.fileutil import atomic_write, write_all
from .directories import new_directory_id

log = logging.getLogger(__name__)

# Held (flock) by the one process serving a data directory; contains its pid.
LOCK_FILE = ".lock"
# Old directory ids this directory is known to have replaced (see DataDir.replaced).
REPLACED_DIRECTORIES_FILE = "replaced-directories"
# Present while replicas opened fresh must catch up (a replaced directory).
CATCH_UP_PENDING_FILE = "catch-up-pending"
# Like Kafka's high-watermark checkpoint: metadata records below this are committed.
METADATA_APPLIED_FILE = "metadata-applied"
# Directories renamed here are being deleted (DataDir.discard).
TRASH_DIR = ".trash"


class Trash:
    """Deletes what is renamed into ``root``, and closes the descriptors of files unlinked,
    in a thread of its own, one pass after another while more comes meanwhile."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._again = False
        self._fds: list[int] = []  # to close, under _lock
        self.deleted = 0  # entries deleted (tests)

    def put(self, directory: Path) -> None:
        """Rename ``directory`` in (at once: its name is free when this returns) and have
        it deleted; nothing if it is not there."""
        fileio.makedirs(str(self.root), durable=False)
        try:
            fileio.replace(
                str(directory), str(self.root / f"{directory.name}.{uuid.uuid4().hex[:12]}")
            )
        except FileNotFoundError:
            return
        self.empty()

    def close_later(self, fd: int) -> None:
        """Close ``fd``, the last descriptor of a file unlinked since (a segment that
        retention or a truncation deleted), in the background."""
        with self._lock:
            self._fds.append(fd)
        self.empty()

    def empty(self) -> None:
        """Delete everything in the trash, in the background."""
        with self._lock:
            if self._thread is not None:
                self._again = True  # the running pass may have listed the trash already
                return
            self._thread = threading.Thread(target=self._run, name="trash", daemon=True)
            self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Until no deletion runs (tests); False on timeout."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                fds, self._fds = self._fds, []
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    log.warning("cannot close a deleted file's descriptor", exc_info=True)
            try:
                entries = list(self.root.iterdir())
            except FileNotFoundError:
                entries = []
            for entry in entries:
                try:
                    shutil.rmtree(entry)
                    self.deleted += 1
                except OSError:
                    log.warning(
                        "cannot delete %s (deleted on the next start)", entry, exc_info=True
                    )
            with self._lock:
                if not self._again:
                    self._thread = None
                    return
                self._again = False


class DataDir:
    def __init__(self, path: Path, cluster_id: str, node_id: int) -> None:
        self.path = path
        self.cluster_id = cluster_id
        self.node_id = node_id
        self._lock_fd: int | None = None
        self.catch_up_pending = False
        self.trash = Trash(path / TRASH_DIR)

    def lock(self) -> None:
        """Take ``.lock`` (as Kafka's) before anything else touches the directory: two
        processes on one directory would both append to the same logs and quorum-state
        files. flock is released by the kernel when the process dies, so a kill -9
        leaves no stale lock. A loser exits naming the holder's pid and changes nothing
        (the file is opened without truncation)."""
        fileio.makedirs(str(self.path), durable=True)
        path = self.path / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise SystemExit(
                f"quorumlog: data dir {self.path} is in use by another quorumlog process "
                f"(pid {holder}, holds {path}); one node process per data directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        self.catch_up_pending = (self.path / CATCH_UP_PENDING_FILE).exists()
        if self.trash.root.is_dir():
            self.trash.empty()  # what a deletion cut short by a crash left

    def discard(self, directory: Path) -> None:
        """Delete ``directory`` (in this data directory): renamed into the trash now,
        its files unlinked in the background (see the module's docstring)."""
        try:
            self.trash.put(directory)
        except OSError:
            log.warning("cannot move %s to the trash; deleting it here", directory, exc_info=True)
            shutil.rmtree(directory, ignore_errors=True)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the only descriptor releases the flock
            self._lock_fd = None

    def check(self) -> str:
        """Check (or create) ``meta.properties``; returns the directory's id. A directory
        made before directory ids existed gets one now: it is not a replacement."""
        meta = self.path / "meta.properties"
        wanted = f"cluster.id={self.cluster_id}\nnode.id={self.node_id}\n"
        if meta.exists():
            have = meta.read_text()
            lines = have.splitlines(keepends=True)
            ids = [ln.strip().partition("=")[2] for ln in lines if ln.startswith("directory.id=")]
            rest = "".join(ln for ln in lines if not ln.startswith("directory.id="))
            if rest != wanted or len(ids) > 1:
                raise SystemExit(
                    f"quorumlog: data dir {self.path} belongs to another cluster or node "
                    f"({have.strip()!r}); this node is node.id={self.node_id} of "
                    f"cluster.id={self.cluster_id}"
                )
            if ids:
                return ids[0]
        directory_id = new_directory_id()
        atomic_write(str(meta), f"{wanted}directory.id={directory_id}\n".encode())
        return directory_id

    def replaced(self, peer: int, remembered: str, catch_up_all: Callable[[], None]) -> None:
        """A peer remembers another data directory for this node: this one replaced a
        lost one that may have acknowledged records. Every replica hosted here, open now
        (``catch_up_all``) or opened fresh until the metadata log has caught up
        (``catch-up-pending``), catches up with an unknown floor before it votes, stands
        or counts. Durable before returning (the caller then answers the peer or applies
        its frames)."""
        marker = self.path / REPLACED_DIRECTORIES_FILE
        old = _read(marker)
        if remembered in old.split():
            return  # marked already; that peer has not yet recorded our new id
        log.warning(
            "node %d: data directory replaced a lost one (node %d remembers directory %s): "
            "every replica here catches up before it votes, stands or counts again",
            self.node_id,
            peer,
            remembered,
        )
        atomic_write(str(self.path / CATCH_UP_PENDING_FILE), b"")
        self.catch_up_pending = True
        catch_up_all()
        atomic_write(str(marker), f"{old}{remembered}\n".encode())

    def end_catch_up_pending(self) -> None:
        """The metadata log caught up: every partition that existed before is open (and
        marked), so replicas opened from now on are new ones."""
        self.catch_up_pending = False
        try:
            fileio.unlink(str(self.path / CATCH_UP_PENDING_FILE))
        except FileNotFoundError:
            pass
        log.info("node %d: metadata caught up after a replaced data directory", self.node_id)

    def metadata_applied(self) -> int | None:
        try:
            return int((self.path / METADATA_APPLIED_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def save_metadata_applied(self, offset: int) -> None:
        # Not fsync'd: a value lost or torn by a crash reads as unknown (None).
        path = self.path / METADATA_APPLIED_FILE
        tmp = str(path.with_suffix(".tmp"))
        fd = fileio.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, f"{offset}\n".encode())
        finally:
            fileio.close(fd)
        fileio.replace(tmp, str(path))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
