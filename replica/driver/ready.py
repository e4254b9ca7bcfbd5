"""What one driver step hands its executor (etcd-io/raft's ``Ready``, for a whole node)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..raft import ElectionState, Message
from .liveness import NodeHeartbeat

PartitionKey = tuple[str, int]


@dataclass(slots=True)
class Ready:
    """Execute in this order:

    1. ``persist``: write each partition's election state to its quorum-state file,
       durably, before sending anything of this value (a vote sent before its state is
       durable can be granted twice in one epoch after a crash);
    2. ``flush``: start a log flush (fsync) of each partition named, at most one at a
       time per partition, and hand its completion back with ``Driver.flushed``;
    3. ``send``: each raft message to its ``dst`` (drop, delay, duplicate: the cores
       tolerate it);
    4. ``answers``: complete each client request (by the token it was submitted with)
       with its response;
    5. ``committed``: partitions whose high watermark advanced (the metadata controller
       applies the metadata log's newly committed records);
    6. ``truncated`` (offset, whether committed records went: only an unclean election
       may do that) and ``repaired`` (damage cut the log there): for alerts and checks.

    Messages that must wait for a flush are not here yet: the driver holds them and
    hands them out once the flush they wait for has completed.
    """

    persist: list[tuple[PartitionKey, ElectionState]] = field(default_factory=list)
    flush: list[PartitionKey] = field(default_factory=list)
    send: list[tuple[PartitionKey, Message | NodeHeartbeat]] = field(default_factory=list)
    answers: list[tuple[int, object]] = field(default_factory=list)
    committed: list[PartitionKey] = field(default_factory=list)
    truncated: list[tuple[PartitionKey, int, bool]] = field(default_factory=list)
    repaired: list[tuple[PartitionKey, int]] = field(default_factory=list)

    def merge(self, other: Ready) -> None:
        """Append ``other``'s work after this one's (one execution for both: every
        persist still precedes every send)."""
        self.persist += other.persist
        self.flush += other.flush
        self.send += other.send
        self.answers += other.answers
        self.committed += other.committed
        self.truncated += other.truncated
        self.repaired += other.repaired
