"""Static check (mypy only) that ``Log`` satisfies the raft core's ``ReplicaLog``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..raft.log import ReplicaLog
    from .log import Log

    def _conforms(log: Log) -> ReplicaLog:
        checked: ReplicaLog = log
        return checked
