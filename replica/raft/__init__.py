"""The per-partition quorum (KIP-595, pull-based Raft) as a pure, sans-I/O state machine.

One ``RaftReplica`` per partition replica. It never reads a clock, opens a file or
socket, starts a thread or uses global randomness: the driver (``replica.driver``) hands it
the time, the messages, a ``ReplicaLog`` and a seeded ``random.Random``, and executes
the ``Output`` each call returns.

API::

    core = RaftReplica(config, node_id, voters, cluster_id, log, persisted, rng, now_ms)
    out = core.startup_output()            # what construction decided (persist, sends)
    out = core.handle(message, now_ms)     # any message whose dst is this node
    out = core.tick(now_ms)                # call at core.next_deadline_ms() (or later)
    info, epoch, out = core.append(records, now_ms)   # leader only, else NotLeaderError
    out = core.on_log_flushed(now_ms)      # after every log.flush() (group commit)
    out = core.begin_shutdown(now_ms)      # leader resigns: EndQuorumEpoch + successors
    out = core.force_leader(now_ms, min_epoch)  # operator's unclean election
    out = core.on_corruption(offset, now_ms)   # the driver found damaged data in the log
    core.check_leader_epoch(current_leader_epoch) -> ErrorCode
    core.describe(now_ms) -> QuorumDescription
    core.role / state_name / epoch / leader_id / voted_id / high_watermark /
    log_end_offset / durable_end_offset / election_state

Driver rules, for every ``Output`` in the order given:

1. **Persist before send.** If ``out.persist`` is set, write it to the quorum-state file
   durably (temp + fsync + rename + dir fsync) before sending any message of this
   output; a crash in between is fine, a message sent before it is not (a vote could be
   granted twice in one epoch). Restart with the last persisted ``ElectionState``.
2. **Flush before fetch.** If ``out.flush_log`` is set, ``log.flush()`` then call
   ``on_log_flushed`` before sending this output's messages. The core sets it when it
   sends a follower Fetch (whose ``fetch_offset`` tells the leader what is durable
   here and so counts towards the HWM) or a VoteRequest (whose log position must
   survive a crash) while the log holds unflushed data. A leader's own appends need no
   flush before sending: the driver group-commits them whenever it likes and calls
   ``on_log_flushed``; only the durable end counts for the leader too.
3. Send ``out.messages``; each carries ``src``/``dst`` and everything its handler needs
   (responses echo the request's epoch / offset / ``request_id``), so the transport may
   drop, duplicate or reorder them: the core ignores stale answers and resends
   unanswered requests from its timers.
4. **Long-poll.** The core answers a Fetch at once. If the answer ``is_empty()``
   (no error, no divergence, no records) the driver may park it for up to the request's
   ``max_wait_ms``; whenever an output has ``fetch_wakeup`` (leader appended data or the
   HWM moved) or the wait expires, it hands the parked *request* to ``handle`` again and
   sends the new answer (re-handling is idempotent). Followers' fetch progress is taken
   when the request first arrives, so parking never delays the HWM.
5. ``out.high_watermark`` (new HWM) → complete acks=quorum produces whose last offset is
   below it, but only while the core still leads the epoch ``append`` returned; once
   ``leader_changed`` shows it lost that leadership, fail them with NOT_LEADER (their
   records may be truncated by the next leader). ``out.leader_changed`` is for logging/metadata. ``out.truncated_to`` says a
   follower truncated; ``out.truncated_below_high_watermark`` means committed data was
   removed, which only an unclean election (``force_leader``) may cause: alert on it.

Disk loss: a replica whose log and quorum-state were lost may come back under its voter
id only if the driver calls ``begin_catch_up()`` (unknown floor) before it handles any
message: the node learns it from its peers (they remember another data-directory id for
it, KIP-853's directory id). Until then a fresh replica (``persisted=None``, empty log) is
a full voter, which is only safe when the partition is new. With an unknown floor it
neither votes nor stands nor counts; it asks the other voters their epochs and takes as
floor the ``catch_up_floor`` (max of HWM and epoch start) of a leader whose epoch is at
least every epoch n - majority + 1 of them answered. A stale leader of an old epoch
would otherwise give it a floor below records the lost disk acknowledged in a later
epoch and count it (the simulator finds this).

Damaged data: ``log.read`` never returns a batch that fails its CRC; it raises
``CorruptDataError`` for the first one. The core handles that on replica fetches itself;
damage the driver finds (consumer reads, a background scrub, recovery) it reports with
``on_corruption``. Either way a leader resigns, the log is cut at the damage with
``log.truncate_corrupt`` (which durably records the old durable end as
``catch_up_offset`` first) and the replica re-fetches; until its durable end is back at
that offset it neither votes, nor stands, nor counts towards the HWM (its fetches say
``catching_up``), so no majority can form without a record it acknowledged.
``out.repaired_at`` tells the driver the log was cut (its HWM may go back to the new end).

Consumers are not served here: the driver (``replica.driver``) serves consumer Fetch,
ListOffsets and OffsetsForLeaderEpoch from the log after ``check_leader_epoch``, never
above the HWM; a raft ``FetchRequest`` without a replica id (-1) is refused. Observers
(replica ids not in ``voters``) are served everything and are listed in ``describe()``
but never count towards the HWM. ``replica.driver`` implements every rule above; the
node and the simulator both execute it.
"""

from __future__ import annotations

from ..protocol.errors import ErrorCode
from . import log, messages
from .config import QuorumConfig
from .log import *  # noqa: F403 (the log interface and its value types)
from .messages import *  # noqa: F403 (the quorum messages)
from .replica import (
    UNCLEAN_EPOCH_GAP,
    NotLeaderError,
    Output,
    QuorumDescription,
    RaftReplica,
    VoterChangeError,
)
from .state import ElectionState, ReplicaProgress, Role

__all__ = [
    *log.__all__,
    *messages.__all__,
    "UNCLEAN_EPOCH_GAP",
    "ElectionState",
    "ErrorCode",
    "NotLeaderError",
    "Output",
    "QuorumConfig",
    "QuorumDescription",
    "RaftReplica",
    "ReplicaProgress",
    "Role",
    "VoterChangeError",
]
