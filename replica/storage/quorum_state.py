"""The ``QuorumState`` value and the per-replica ``quorum-state`` file (JSON) that held it
before the node-level journal (``quorum_journal``). A node now only reads such a file, for
a replica the journal does not know yet (a data directory written by an older version),
and removes it once the replica's next state is durable in the journal."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..constants import UNKNOWN
from . import fileio
from .errors import CorruptCheckpointError
from .fileutil import atomic_write

__all__ = ["QUORUM_STATE_FILE", "QuorumState", "QuorumStateStore"]

QUORUM_STATE_FILE = "quorum-state"
_VERSION = 1


@dataclass(frozen=True)
class QuorumState:
    """What the quorum must remember across restarts. Ids are UNKNOWN (-1) for "none". ``voters``
    is the voter set; ``extra`` holds any further JSON-serialisable fields."""

    leader_epoch: int
    leader_id: int = UNKNOWN
    voted_id: int = UNKNOWN
    voters: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


class QuorumStateStore:
    """Reads and atomically writes ``<directory>/quorum-state``.

    ``write`` returns once the new state is durable (temp + fsync + rename + directory
    fsync); a crash leaves the old or the new state. ``read`` returns None when the file
    does not exist and raises CorruptCheckpointError (naming the file) when it cannot be
    parsed."""

    def __init__(self, directory: str) -> None:
        # Nothing on disk until the first write: a node opens a store per hosted replica
        # to look for a previous version's file, and most have none (or no directory).
        self.directory = directory
        self.path = os.path.join(directory, QUORUM_STATE_FILE)

    def write(self, state: QuorumState) -> None:
        fileio.makedirs(self.directory, durable=True)
        doc = {
            "version": _VERSION,
            "leader_epoch": state.leader_epoch,
            "leader_id": state.leader_id,
            "voted_id": state.voted_id,
            "voters": list(state.voters),
            "extra": state.extra,
        }
        atomic_write(self.path, json.dumps(doc, sort_keys=True).encode() + b"\n")

    def remove(self) -> None:
        """Delete the file (absent: nothing to do). Not fsync'd: a file that comes back
        after a crash is ignored, the journal's entry for the replica wins."""
        try:
            fileio.unlink(self.path)
        except FileNotFoundError:
            pass

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def read(self) -> QuorumState | None:
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc.get("version") != _VERSION:
                raise ValueError(f"unsupported version {doc.get('version')!r}")
            ints = {}
            for name in ("leader_epoch", "leader_id", "voted_id"):
                value = doc[name]
                if type(value) is not int:
                    raise ValueError(f"{name} is not an integer: {value!r}")
                ints[name] = value
            voters = doc.get("voters", [])
            if not isinstance(voters, list) or any(type(v) is not int for v in voters):
                raise ValueError(f"voters is not a list of integers: {voters!r}")
            extra = doc.get("extra", {})
            if not isinstance(extra, dict):
                raise ValueError(f"extra is not an object: {extra!r}")
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"corrupt quorum state file {self.path}: {exc}") from exc
        return QuorumState(
            leader_epoch=ints["leader_epoch"],
            leader_id=ints["leader_id"],
            voted_id=ints["voted_id"],
            voters=tuple(voters),
            extra=extra,
        )
