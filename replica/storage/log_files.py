"""The small files beside a log's segments: their names and how they are read and written
(each holds "<version>\n<offset>\n", written atomically)."""

from __future__ import annotations

import logging

from . import fileio
from .fileutil import atomic_write

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
# Kafka's recovery-point-offset-checkpoint, per partition directory: "0\n<offset>\n"
# (format version, offset). Everything below the offset was fsync'd and verified, so
# recovery after an unclean shutdown re-checks (CRC) only the segments past it.
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
# "0\n<offset>\n": the log lost data it may have acknowledged (corruption repaired by
# truncation) and held, durably, everything below <offset> before. Written before the
# truncation; removed once the durable end reaches the offset again.
CATCH_UP_FILE = "catch-up-offset"
# Kafka's log-start-offset-checkpoint, per partition directory: "0\n<offset>\n". Written
# before retention (or an emptying truncation) deletes segments, so that segments left
# below it by a crash part-way through are known to be deleted ones, not a gap.
LOG_START_FILE = "log-start-offset"
# Kafka's cleaner-offset-checkpoint, per partition directory: "0\n<offset>\n". The log's
# cleaner (``storage.cleaner``) has cleaned it below <offset>: base offsets there may
# skip offsets (what a clean dropped), which recovery and the scrub then accept. Written
# before a clean swaps its segments in, and by a follower before it copies a gap.
CLEANER_OFFSET_FILE = "cleaner-offset-checkpoint"
_OFFSET_FILE_VERSION = 0


def read_offset_file(path: str, default: int) -> int:
    try:
        with open(path, "rb") as fh:
            lines = fh.read().split()
    except FileNotFoundError:
        return default
    try:
        if len(lines) != 2 or int(lines[0]) != _OFFSET_FILE_VERSION or int(lines[1]) < 0:
            raise ValueError(lines)
        return int(lines[1])
    except ValueError:
        log.warning("%s is malformed; ignoring it", path)
        return default


def write_offset_file(path: str, offset: int) -> None:
    atomic_write(path, f"{_OFFSET_FILE_VERSION}\n{offset}\n".encode())


def unlink_quietly(path: str) -> None:
    try:
        fileio.unlink(path)
    except FileNotFoundError:
        pass
