"""Static check (mypy only) that the disk ``Log`` satisfies the core's ``ReplicaLog``.

It lives here, not in storage, so storage imports nothing above it: the import of the disk
log is for the type checker only and the core never loads it at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..storage.log import Log
    from .log import ReplicaLog

    def _conforms(log: Log) -> ReplicaLog:
        checked: ReplicaLog = log
        return checked
