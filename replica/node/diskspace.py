"""A full data disk: the node keeps serving, stops appending, and resumes on its own.

When any write of a log hits ENOSPC, the node enters *disk full*: it logs one clear
message, releases a small reserve file it keeps in the data directory (so that the
quorum journal can still record votes and epochs, and a leader can hand over), and
refuses further log appends up front (``DiskError``, without touching the disk) so the
freed room is not eaten by them. Each replica's core then stops writing: a leader
hands its leadership to a follower that can write, a follower backs off and fetches
again later (``RaftReplica.on_disk_fault``). ``poll`` (about once a second) leaves the
state once the disk has room again, remakes the reserve, and the replicas catch up on
their own. A failing disk (EIO) is not this: see ``node.Node``'s fail-stop.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from .. import defaults
from ..storage import fileio
from ..storage.errors import DiskError
from ..storage.fileutil import write_all

__all__ = ["RESERVE_FILE", "DiskSpace"]

log = logging.getLogger(__name__)

RESERVE_FILE = ".space-reserve"


class DiskSpace:
    def __init__(
        self,
        path: Path,
        node_id: int,
        reserve_bytes: int = defaults.DISK_RESERVE_BYTES,
    ) -> None:
        self.path = path
        self.node_id = node_id
        self.reserve_bytes = reserve_bytes
        self.full = False
        self.episodes = 0  # how many times the disk filled (tests, metrics)
        self._reserve = path / RESERVE_FILE

    def prepare(self) -> bool:
        """Make the reserve file if it is missing; False if the disk has no room."""
        if self._reserve.exists() and self._reserve.stat().st_size >= self.reserve_bytes:
            return True
        tmp = str(self._reserve) + ".tmp"
        try:
            fd = fileio.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, bytes(self.reserve_bytes))
                fileio.fsync(fd)
            finally:
                fileio.close(fd)
            fileio.replace(tmp, str(self._reserve))
            return True
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            try:
                fileio.unlink(tmp)
            except FileNotFoundError:
                pass
            return False

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def check_write(self, path: str) -> None:
        """Before a log append: refuse it while the disk is full."""
        if self.full:
            raise DiskError(
                path,
                OSError(errno.ENOSPC, "No space left on device (writes paused until it has)"),
            )

    def saw(self, exc: BaseException) -> None:
        """A write failed with ``exc``: enter disk full if it is ENOSPC."""
        code = exc.errno if isinstance(exc, OSError | DiskError) else None
        if code != errno.ENOSPC or self.full:
            return
        self.full = True
        self.episodes += 1
        released = self._release()
        log.error(
            "node %d: data disk %s is full (%s): log appends stop, leaderships move to "
            "replicas that can write; %s; appends resume by themselves once %d bytes are free",
            self.node_id,
            self.path,
            exc,
            f"released the {self.reserve_bytes}-byte reserve for election state"
            if released
            else "no reserve to release",
            self.resume_bytes,
        )

    @property
    def resume_bytes(self) -> int:
        return 2 * self.reserve_bytes + defaults.DISK_RESUME_MARGIN_BYTES

    def poll(self) -> bool:
        """While full: leave the state if the disk has room again. True when it did."""
        if not self.full:
            return False
        try:
            free = self.free_bytes()
        except OSError:
            return False
        if free < self.resume_bytes or not self.prepare():
            return False
        self.full = False
        log.warning(
            "node %d: data disk %s has room again (%d bytes free): log appends resume",
            self.node_id,
            self.path,
            free,
        )
        return True

    def _release(self) -> bool:
        try:
            fileio.unlink(str(self._reserve))
            return True
        except FileNotFoundError:
            return False
        except OSError:
            log.exception("node %d: cannot release the disk reserve", self.node_id)
            return False
