"""Disk faults: a replica whose log refuses writes (full or failing disk) or is not made
durable within a fetch timeout (slow disk) hands over any leadership and does not
stand until it may write again.

One role of ``RaftReplica`` (see ``replica.py``), which mixes the roles in: each method
here runs on a ``RaftReplica``. Pure: no clock, file or socket."""

# Methods here run on a RaftReplica, which subclasses this role: mypy takes that self
# type but calls it "not a supertype of its class" (misc).
# mypy: disable-error-code="misc"
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .output import CoreFields, Output
from .state import (
    LeaderState,
    ResignedState,
    UnattachedState,
)

if TYPE_CHECKING:
    from .replica import RaftReplica

logger = logging.getLogger(__name__)


class DiskRole(CoreFields):
    @property
    def _may_not_stand(self: RaftReplica) -> bool:
        """It lost data it may have acknowledged, or its disk cannot take its writes."""
        return self.catching_up or self._disk_fault

    @property
    def disk_fault(self: RaftReplica) -> bool:
        return self._disk_fault

    def on_disk_fault(self: RaftReplica, now_ms: int, reason: str) -> Output:
        """The driver found this replica's log unwritable (a full or failing disk) or
        not made durable within a fetch timeout (a slow disk). A leader hands its
        leadership to the best caught-up follower (EndQuorumEpoch with ranked
        successors, as at a graceful stop) rather than hold every producer; until a
        write to the log succeeds the replica does not stand (it still votes)."""
        out = Output()
        self._note_disk_fault(reason, now_ms)
        if isinstance(self._state, LeaderState):
            self._become_resigned(now_ms, out, self._ranked_successors(self._state))
        return out

    def on_slow_flush(self: RaftReplica, now_ms: int, target: int, waited_ms: int) -> Output:
        """The log's flush to ``target`` has taken ``waited_ms`` (a fetch timeout or
        more). A leader hands over (``on_disk_fault``) if a follower already holds
        ``target`` durably: this disk is the slow one, and the follower can commit now.
        If every replica is behind, moving leadership would not help: it waits on."""
        st = self._state
        if not isinstance(st, LeaderState):
            return Output()
        ahead = [r for r in st.progress.values() if r.end_offset >= target]
        if not ahead:
            return Output()
        return self.on_disk_fault(
            now_ms, f"its log flush to offset {target} has not finished in {waited_ms} ms"
        )

    def _disk_retry(self: RaftReplica, now_ms: int, out: Output) -> None:
        """A retry interval after a disk fault with no write since: the disk may have
        room again (every replica of a partition may have filled). It may stand again;
        a write that fails makes it hand over again."""
        self._disk_ok()
        st = self._state
        if isinstance(st, ResignedState) and st.election_at is None and self._can_elect():
            st.election_at = self._election_timeout(now_ms)
        elif isinstance(st, UnattachedState) and st.election_at is None and self._can_elect():
            self._become_unattached(now_ms, out)

    def _note_disk_fault(self: RaftReplica, reason: str, now_ms: int) -> None:
        self._disk_retry_at = now_ms + self.config.disk_retry_ms
        if not self._disk_fault:
            # INFO: the node says it once for the disk (node.diskspace, fail-stop).
            logger.info(
                "replica %s: %s; it stops writing, hands over any leadership and retries "
                "every %s ms",
                self.node_id,
                reason,
                self.config.disk_retry_ms,
            )
        self._disk_fault = True

    def _disk_ok(self: RaftReplica) -> None:
        if self._disk_fault:
            self._disk_fault = False
            logger.info("replica %s: its log takes writes again", self.node_id)
