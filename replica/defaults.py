"""Every shipped default of quorumlog, in one place.

The CLI (``quorumlog serve`` / ``produce`` / ``consume``), ``NodeConfig``, ``LocalCluster``,
the raft core's ``QuorumConfig``, the storage ``LogConfig``, the client, the connector's
options and the tests read these names; none spells the numbers again. Each knob names
the Kafka / KIP config it stands for, in brackets, where one exists. This module imports
nothing, so every layer (storage and protocol included) may import it.
"""

from __future__ import annotations

# ---- the partition quorum as a node runs it (KIP-595) ------------------------------------
# Why these and not KRaft's (below): kill -9 of a leader must be followed by a new leader
# within ~1 s. A follower gives up on a silent leader after the fetch timeout (800 ms),
# pre-votes, then stands after a randomized election timeout in [400, 800) ms, so a new
# leader follows in ~0.8-1.0 s. A live leader under load is never deposed: followers'
# fetches return as soon as data arrives and idle long-polls every
# REPLICA_FETCH_MAX_WAIT_MS (250 ms), well inside 800 ms, and the request timeout leaves
# room for one lost fetch to be retried (see quorum_request_timeout_ms).

# [quorum.fetch.timeout.ms] a follower with no successful fetch for this long pre-votes; a
# leader not fetched by a majority within 1.5x this resigns.
QUORUM_FETCH_TIMEOUT_MS = 800
# [quorum.election.timeout.ms] T: an election starts after T + rand[0, T).
QUORUM_ELECTION_TIMEOUT_MS = 400
# [quorum.election.backoff.max.ms] cap of the back-off after a failed election.
QUORUM_ELECTION_BACKOFF_MAX_MS = 400
# [retry.backoff.ms] the quorum's back-off base (elections, EndQuorumEpoch ranks, fetch
# retries).
QUORUM_RETRY_BACKOFF_MS = 50
# [retry.backoff.max.ms] cap of the EndQuorumEpoch successor rank back-off.
QUORUM_RETRY_BACKOFF_MAX_MS = 400
# [replica.fetch.max.wait.ms] how long a follower's fetch may be parked at the leader.
REPLICA_FETCH_MAX_WAIT_MS = 250
# [replica.fetch.max.bytes] size bound of a follower's fetch.
REPLICA_FETCH_MAX_BYTES = 4 << 20
# Idle partitions quiesce: no fetches, no timers; the nodes' heartbeats (every quarter
# fetch timeout, per pair of nodes) stand for them (`serve --no-quiesce` turns it off).
QUIESCE = True
# [leader.imbalance.check.interval.seconds, auto.leader.rebalance.enable] how often a node
# hands leadership back to each partition's preferred (first) replica when that replica is
# caught up (0 = never).
LEADER_IMBALANCE_CHECK_INTERVAL_MS = 30_000
# [leader.imbalance.per.broker.percentage] the rebalance starts handing a node's preferred
# partitions back to it only when more than this share of them is led elsewhere (then
# all of them go back): a few partitions off their preferred replica after a busy
# election cost no election of their own.
LEADER_IMBALANCE_PER_NODE_PCT = 10
# The smallest [quorum.request.timeout.ms] a node uses, and the margin it keeps below
# the fetch timeout (see quorum_request_timeout_ms).
QUORUM_REQUEST_TIMEOUT_MIN_MS = 100


def quorum_request_timeout_ms(fetch_timeout_ms: int, fetch_max_wait_ms: int) -> int:
    """[quorum.request.timeout.ms] a node derives from its fetch timing: a parked fetch
    plus this stays a margin below the fetch timeout, so one lost fetch is resent before
    the follower gives up on its leader."""
    margin = QUORUM_REQUEST_TIMEOUT_MIN_MS
    return max(margin, fetch_timeout_ms - fetch_max_wait_ms - margin)


# ---- KRaft's own defaults (the raft core's QuorumConfig() before anyone tunes it) --------
# The pure core behaves like the reference until a caller passes the shipped timing
# above; the simulator and the raft unit tests run with these.
KRAFT_ELECTION_TIMEOUT_MS = 1000  # [quorum.election.timeout.ms]
KRAFT_FETCH_TIMEOUT_MS = 2000  # [quorum.fetch.timeout.ms]
KRAFT_ELECTION_BACKOFF_MAX_MS = 1000  # [quorum.election.backoff.max.ms]
KRAFT_RETRY_BACKOFF_MS = 100  # [retry.backoff.ms]
KRAFT_RETRY_BACKOFF_MAX_MS = 1000  # [retry.backoff.max.ms] (KIP-595: one second)
KRAFT_REQUEST_TIMEOUT_MS = 1000  # [quorum.request.timeout.ms]
KRAFT_FETCH_MAX_WAIT_MS = 500  # [fetch.max.wait.ms]
# A replica whose log refused a write (disk full or failing) tries again this often.
DISK_RETRY_MS = 500
# Bytes per second a node's leaders send to observers (replicas a reassignment is adding,
# catching up) over all partitions: the copy of a moving partition must leave room for
# producers (Kafka's leader.replication.throttled.rate; there, off by default). 0: none.
# It paces a new replica's backlog only: what producers append meanwhile is sent as well
# (driver.partition.Throttle), so a move ends at any setting. ``quorumlog perf reassign``
# on two cores shared by four nodes: producers kept 0.27 of their rate at 100 MiB/s, 0.63
# at 16 MiB/s (the move's copies took a quarter of the machine's CPU), 0.76 at 8 MiB/s
# (median of 3 runs each, interleaved), where the move took 2.3 times as long.
CATCH_UP_BYTES_PER_S = 8 << 20
# A node keeps this much disk in a reserve file, released when the data disk fills so
# that election state stays writable (node/diskspace.py); appends resume once twice the
# reserve plus the margin is free again.
DISK_RESERVE_BYTES = 4 << 20
DISK_RESUME_MARGIN_BYTES = 8 << 20
KRAFT_FETCH_MAX_BYTES = 1 << 20  # [fetch.max.bytes]

# ---- storage ------------------------------------------------------------------------------
# [segment.bytes] roll the active segment before it would exceed this (Kafka: 1 GiB; a
# smaller segment lets retention free space sooner on small disks).
SEGMENT_BYTES = 256 << 20
# [index.interval.bytes] bytes between sparse offset-index entries.
INDEX_INTERVAL_BYTES = 4096
# [retention.bytes] / [retention.ms]: None keeps everything (Kafka: -1 bytes, 7 days).
RETENTION_BYTES: int | None = None
RETENTION_MS: int | None = None
# [segment.ms] roll an active segment older than this; None: never.
SEGMENT_MS: int | None = None
# Log compaction (Kafka's topic configs and their log.cleaner.* broker defaults):
# [cleanup.policy] delete, compact, or compact,delete.
CLEANUP_POLICY = "delete"
# [min.cleanable.dirty.ratio] clean a log once this share of it is dirty (uncleaned).
MIN_CLEANABLE_DIRTY_RATIO = 0.5
# [min.compaction.lag.ms] a record stays uncompacted at least this long.
MIN_COMPACTION_LAG_MS = 0
# [max.compaction.lag.ms] a record is compacted within this long (None: no bound).
MAX_COMPACTION_LAG_MS: int | None = None
# [delete.retention.ms] a compacted topic's tombstone stays readable this long (from its
# timestamp); a clean after that drops it.
DELETE_RETENTION_MS = 86_400_000
# Background CRC scrub of sealed segments, for the whole node (0: off). 4 MiB/s reads
# 1 TiB in about 3 days for well under 1% of a core (crc32 runs at GB/s).
SCRUB_BYTES_PER_SECOND = 4 << 20
# [log.cleaner.io.max.bytes.per.second] the log cleaner's pace: segment bytes it reads and
# writes per second, for the whole node (0 = unthrottled, Kafka's default). A clean is
# CPU and disk taken from producers: one core cleans about 75 MiB/s, and at 64 MiB/s three
# nodes cleaning on a 2-core machine left producers 0.60 of their rate (perf compaction);
# 16 MiB/s is about a fifth of a core, and 1 GiB of dirty log a minute.
CLEANER_BYTES_PER_SECOND = 16 << 20
# One clean takes at most this much of a log not cleaned yet (whole segments, at least
# one): a large backlog is cleaned in rounds, each swapped in when done (Kafka bounds a
# round by its dedupe buffer, log.cleaner.dedupe.buffer.size).
CLEANER_MAX_DIRTY_BYTES = 64 << 20

# ---- open files and group commit across partitions (many partitions per node) ------------
# The node-wide cache of segment file descriptors: at most this many stay open (least
# recently used idle ones are closed first), and never more than a quarter of the soft
# RLIMIT_NOFILE, so 10,000 idle partitions cost no descriptor each (ulimit -n may be 1024).
MAX_OPEN_SEGMENT_FILES = 512
# The newest batches a leader appended stay in memory (``storage.tail``) for the fetches
# that follow at once (its followers', consumers' at the tail): at most this many and this
# much a log, and this much for the whole process (the least recently appended logs' go
# first); 0 keeps none.
TAIL_LOG_BATCHES = 8
TAIL_LOG_BYTES = 8 << 20
TAIL_CACHE_BYTES = 64 << 20
# One flush job makes every dirty log durable with a single syncfs(2) of the data
# filesystem once at least this many logs are dirty (fewer: one fdatasync per file, which
# is cheaper for a handful); 0 never uses syncfs. See ``quorumlog perf storage --flush``.
SYNCFS_MIN_DIRTY_LOGS = 3

# ---- sizes on the wire --------------------------------------------------------------------
# [socket.request.max.bytes] the largest frame a node or client accepts.
MAX_FRAME_BYTES = 64 << 20
# [max.message.bytes] the largest record batch a produce may carry, for topics that set
# none. Kafka ships 1 MiB (+ overhead) because its batches are small compressed record
# sets; ours are Arrow IPC batches and throughput comes from big ones: `quorumlog perf
# produce` sends 10,000 x 100 B records per batch (~1.2 MB on the wire) for >= 1M
# records/s, and a Spark/Delta writer may send larger tables. 8 MiB admits that with room
# (a 10,000-record batch of 800 B values) while one batch stays far below the frame
# limit and costs each replica ~0.1 s (CRC + write) on a loaded machine.
MAX_MESSAGE_BYTES = 8 << 20
# [fetch.max.bytes] what a consumer fetch (client, connector) asks for at most.
FETCH_MAX_BYTES = 8 << 20

# ---- produce (node side) ------------------------------------------------------------------
# [request.timeout.ms of a produce, Kafka's ProduceRequest timeout] how long the leader
# waits for acks=quorum when the request names no timeout.
PRODUCE_TIMEOUT_MS = 30000

# ---- Kafka consumer groups (the Kafka listener's group coordinator) -----------------------
# [offsets.topic.num.partitions] partitions of __consumer_offsets, set when it is created
# (Kafka: 50). Each is a quorum whose leader coordinates the groups hashed to it; a few
# spread coordination over the nodes while costing little when idle.
OFFSETS_TOPIC_NUM_PARTITIONS = 8
# [transaction.state.log.num.partitions] partitions of __transaction_state, set when it is
# created (Kafka: 50): each partition's leader coordinates the transactional ids hashed
# to it, as the offsets topic's do groups.
TRANSACTION_STATE_NUM_PARTITIONS = 8
# [offsets.topic.segment.bytes] / [transaction.state.log.segment.bytes] the segment size
# of both compacted internal topics (Kafka: 100 MiB). The cleaner never touches the active
# segment, so this bounds what a coordinator reads after a failover beyond one record per
# key: 1 MiB is a few thousand commits.
INTERNAL_TOPIC_SEGMENT_BYTES = 1 << 20
# [transaction.max.timeout.ms] the longest transaction.timeout.ms a producer may ask for
# (Kafka's: 15 minutes); a transaction open longer is aborted by its coordinator.
TRANSACTION_MAX_TIMEOUT_MS = 900_000
# [transaction.timeout.ms] a native transactional producer's transaction timeout (Kafka's
# producer default): its coordinator aborts a transaction open longer.
TRANSACTION_TIMEOUT_MS = 60_000
# [offsets.commit.timeout.ms] how long an OffsetCommit waits for quorum durability.
OFFSETS_COMMIT_TIMEOUT_MS = 5000
# [offset.metadata.max.bytes] the largest metadata string a commit may carry.
OFFSET_METADATA_MAX_BYTES = 4096
# [group.min.session.timeout.ms] / [group.max.session.timeout.ms] (Kafka's).
GROUP_MIN_SESSION_TIMEOUT_MS = 6000
GROUP_MAX_SESSION_TIMEOUT_MS = 1_800_000
# [group.max.size] members per group (Kafka: unbounded); and, not a Kafka setting, the
# most groups one coordinator node holds and the longest a JoinGroup may wait for a
# rebalance (a member's rebalance timeout, librdkafka's max.poll.interval.ms, is capped).
GROUP_MAX_SIZE = 1000
GROUP_MAX_COUNT = 10_000
GROUP_MAX_REBALANCE_TIMEOUT_MS = 300_000
# [group.initial.rebalance.delay.ms] a new (empty) group's first rebalance waits this long
# for more members, and as long again after each one that joins meanwhile (within the
# rebalance timeout), so members that start together share one generation (Kafka's).
GROUP_INITIAL_REBALANCE_DELAY_MS = 3000

# ---- client, CLI and connector ------------------------------------------------------------
# [default.api.timeout.ms / delivery.timeout.ms] what one client call may take, retries
# included (Kafka: 60 s / 120 s; ours fails sooner with the facts).
REQUEST_TIMEOUT_MS = 30000
# [request.timeout.ms] what one attempt may take (connecting included) before its node is
# given up on for this attempt: long enough for a healthy node's answer on a loaded
# machine (a quorum commit takes tens of ms), short enough that a call in flight when its
# leader hangs moves to the new leader (elected ~1.2 s after the hang with the fetch
# timeout above) within ~2 s.
ATTEMPT_TIMEOUT_MS = 1500
# [retry.backoff.ms] / [retry.backoff.max.ms] the client's back-off between attempts.
RETRY_BACKOFF_MS = 100
RETRY_BACKOFF_MAX_MS = 1000
# Requests of one connection a node reads ahead of its answers (and a client's
# produce_many sends together on one connection).
CONNECTION_MAX_IN_FLIGHT = 32
# [linger.ms] how long the producer waits to fill a batch.
LINGER_MS = 5
# [batch.size] the producer's batch bound, in bytes and in records.
BATCH_MAX_BYTES = 1 << 20
BATCH_MAX_RECORDS = 10000
# The producer's sender threads, each sending one node's ready batches (up to
# CONNECTION_MAX_IN_FLIGHT of them a call, a few calls in flight) on its own connection.
PRODUCER_MAX_IN_FLIGHT = 4
# [max.in.flight.requests.per.connection] an idempotent producer's batches of one
# partition in flight at once, in order on one connection (a backlog does not wait a
# round trip per batch); at most the batches a leader remembers of a producer
# (storage.producers.BATCHES_KEPT), so a retry of any of them is known as a duplicate.
# A producer that is not idempotent sends one at a time (a retry could reorder them).
PRODUCER_PARTITION_IN_FLIGHT = 5
# [buffer.memory] / [max.block.ms] records a producer holds before send() blocks, and for
# how long it blocks before it raises.
PRODUCER_BUFFER_BYTES = 64 << 20
PRODUCER_MAX_BLOCK_MS = 60000
