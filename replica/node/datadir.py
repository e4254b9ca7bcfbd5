"""A node's data directory: who may use it (``.lock``), whose it is (``meta.properties``)
and whether it replaced a lost one (``replaced-directories``, ``catch-up-pending``)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
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


class DataDir:
    def __init__(self, path: Path, cluster_id: str, node_id: int) -> None:
        self.path = path
        self.cluster_id = cluster_id
        self.node_id = node_id
        self._lock_fd: int | None = None
        self.catch_up_pending = False

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
