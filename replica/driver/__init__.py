"""The replica driver: a node's partition replicas and the rules that turn their raft
cores' outputs into work, as a pure step function (etcd-io/raft's ``RawNode`` + ``Ready``
in spirit). The asyncio node (``replica.node``) and the simulator (``tests/sim``) execute
it alike, so the seeded simulation proves the rules the nodes run.

Rules (each lives in ``PartitionDriver``):

1. **Persist before send**: a core's new election state is in ``Ready.persist`` of the
   same value that carries its messages; the executor writes it first.
2. **Flush before send**: messages of an output with ``flush_log`` (a follower's fetch,
   whose offset counts towards the HWM; a vote request) are held until the log is durable
   up to the end it had then; the executor flushes (``Ready.flush``) and reports back
   (``Driver.flushed``).
3. **Group commit**: a leader's own appends count only once durable, so whenever its log
   has undurable data one flush is requested for everything appended meanwhile.
4. **Long-poll**: an empty answer to a replica's fetch that tells it nothing new is held
   until the leader appends, the HWM moves, or the request's wait expires; a consumer
   fetch with nothing committed to serve waits the same way.
5. **Answers at the high watermark**: an acks=quorum produce is answered once the HWM
   passes its last offset while the core still leads the epoch it appended in; NOT_LEADER
   when that leadership is lost; REQUEST_TIMED_OUT at its deadline.
7. **Quiescence**: timers live in a heap of deadlines; an idle partition has none and
   sends nothing, while one heartbeat per pair of nodes (``liveness``) stands for its
   fetches (``RaftReplica``'s quiescence rules; ``Driver`` wires the two).
6. **Consumers** are served here only: fenced by ``check_leader_epoch``, never above the
   HWM, never a damaged batch (damage found while serving is handed to the core, which
   repairs, and the client is sent elsewhere).
"""

from .driver import CoreFactory, Driver, Request
from .errors import error_response
from .liveness import NODE_KEY, NodeHeartbeat, PeerLiveness
from .partition import Limits, PartitionDriver, ServedLog
from .ready import PartitionKey, Ready

__all__ = [
    "NODE_KEY",
    "CoreFactory",
    "Driver",
    "Limits",
    "NodeHeartbeat",
    "PartitionDriver",
    "PartitionKey",
    "PeerLiveness",
    "Ready",
    "Request",
    "ServedLog",
    "error_response",
]
