"""A node: one asyncio process hosting many partition replicas, each driven by its own
raft core (``replica.raft``) over its own on-disk log (``replica.storage``).

The driver rules of ``replica.raft`` are kept here: quorum-state is persisted before a
message of the same output is sent, the log is flushed before a follower fetch is sent,
leader appends are group-committed (one fsync in a worker thread for everything appended
meanwhile), and empty fetch answers are parked as long-polls.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..protocol import ApiKey, DecodeError, ErrorCode, Frame, decode_body, encode, max_batch_bytes
from ..protocol import messages as m
from ..raft import (
    UNCLEAN_EPOCH_GAP,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    ElectionState,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    Message,
    NotLeaderError,
    Output,
    QuorumConfig,
    RaftReplica,
    VoteRequest,
    VoteResponse,
)
from ..storage import (
    CATCH_UP_UNKNOWN,
    Log,
    LogConfig,
    QuorumState,
    QuorumStateStore,
    batches_to_table,
)
from ..storage.errors import CorruptDataError, CorruptRecordError, StorageError
from ..storage.errors import OffsetOutOfRangeError as StorageOffsetOutOfRange
from ..storage.fileutil import atomic_write
from ..storage.records import encode_batch, iter_batches
from .config import NodeConfig, check_max_message_bytes
from .directories import DirectoryIds, new_directory_id
from .metadata import (
    METADATA_TOPIC,
    MetadataState,
    assign_replicas,
    decode_record,
    encode_record,
    validate_topic_name,
)
from .security import (
    AuthConfig,
    check_own_principal,
    check_raft_sender,
    cluster_auth_config,
    node_principal,
    node_secret,
    peer_client_context,
    server_context,
)
from .transport import PeerLink, Server

log = logging.getLogger(__name__)

RAFT_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        VoteRequest,
        VoteResponse,
        BeginQuorumEpochRequest,
        BeginQuorumEpochResponse,
        EndQuorumEpochRequest,
        EndQuorumEpochResponse,
        FetchRequest,
        FetchResponse,
    )
}

TICK_S = 0.01
# Held (flock) by the one process serving a data directory; contains its pid.
LOCK_FILE = ".lock"
# Old directory ids this directory is known to have replaced (see _on_directory_replaced).
REPLACED_DIRECTORIES_FILE = "replaced-directories"
# Present while replicas opened fresh must catch up (a replaced directory).
CATCH_UP_PENDING_FILE = "catch-up-pending"


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def default_quorum_config(config: NodeConfig) -> QuorumConfig:
    """The shipped timing (replica.defaults says why): a follower gives up on a silent
    leader after the fetch timeout, so kill -9 of a leader is followed by a new leader about
    0.8-1.0 s later, while idle long-polls answer well within that window, so a live leader
    under load is never deposed."""
    return QuorumConfig(
        election_timeout_ms=config.election_timeout_ms,
        fetch_timeout_ms=config.fetch_timeout_ms,
        election_backoff_max_ms=defaults.QUORUM_ELECTION_BACKOFF_MAX_MS,
        retry_backoff_ms=defaults.QUORUM_RETRY_BACKOFF_MS,
        retry_backoff_max_ms=defaults.QUORUM_RETRY_BACKOFF_MAX_MS,
        request_timeout_ms=defaults.quorum_request_timeout_ms(
            config.fetch_timeout_ms, config.replica_fetch_max_wait_ms
        ),
        fetch_max_wait_ms=config.replica_fetch_max_wait_ms,
        fetch_max_bytes=defaults.REPLICA_FETCH_MAX_BYTES,
    )


class WallClockLog(Log):
    """The core is handed monotonic time; control batches get wall-clock timestamps."""

    def append_control(
        self, epoch: int, leader_id: int, voters: list[int], timestamp_ms: int
    ) -> Any:
        return super().append_control(epoch, leader_id, voters, int(time.time() * 1000))


@dataclass
class Parked:
    request: FetchRequest
    deadline_ms: int


@dataclass
class PartitionReplica:
    topic: str
    partition: int
    replicas: list[int]
    directory: Path
    log: Log
    store: QuorumStateStore
    core: RaftReplica
    parked: list[Parked] = field(default_factory=list)
    # The high watermark last sent to each replica in a fetch answer: an empty answer may be
    # parked only if it tells that replica nothing new.
    sent_hwm: dict[int, int] = field(default_factory=dict)
    # acks=quorum produces: (last offset, epoch, future completed when HWM passes it)
    waiters: list[tuple[int, int, asyncio.Future[None]]] = field(default_factory=list)
    hwm_changed: asyncio.Event = field(default_factory=asyncio.Event)
    flushing: bool = False
    flush_again: bool = False
    after_flush: list[Output] = field(default_factory=list)
    last_role: str = ""
    last_leader: int | None = None
    last_epoch: int = -1
    closed: bool = False
    # A new partition's non-preferred replicas hold their timers until this (monotonic
    # ms), so the preferred replica (the first of the assignment) stands first and
    # leadership spreads across nodes as the assignment does.
    ticks_from_ms: int = 0

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.partition}"


def _to_quorum_state(s: ElectionState, voters: list[int]) -> QuorumState:
    return QuorumState(
        leader_epoch=s.epoch,
        leader_id=m.UNKNOWN if s.leader_id is None else s.leader_id,
        voted_id=m.UNKNOWN if s.voted_id is None else s.voted_id,
        voters=tuple(voters),
    )


def _to_election_state(q: QuorumState | None) -> ElectionState | None:
    if q is None:
        return None
    return ElectionState(
        q.leader_epoch,
        None if q.leader_id < 0 else q.leader_id,
        None if q.voted_id < 0 else q.voted_id,
    )


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.quorum = default_quorum_config(config)
        self.log_config = LogConfig(
            segment_bytes=config.segment_bytes,
            retention_bytes=config.retention_bytes,
            retention_ms=config.retention_ms,
        )
        self.rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self.metadata = MetadataState()
        self.peers: dict[int, PeerLink] = {}
        self.server = Server(
            config.host,
            config.port,
            self._handle_request,
            self._handle_raft,
            max_frame_bytes=config.max_frame_bytes,
            ssl_context=server_context(config.tls) if config.tls else None,
            auth=self._load_auth(),
            # Plaintext: clients stay anonymous; only peers holding the cluster secret
            # authenticate, and only they may send raft traffic.
            node_auth=(
                cluster_auth_config(config.cluster_secret, sorted(config.voters))
                if config.cluster_secret and not config.auth_config
                else None
            ),
        )
        self._lock_fd: int | None = None
        self.directories: DirectoryIds | None = None
        self._catch_up_pending = False
        self._stopping = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self._pending_topics: set[str] = set()
        self._retention_at = 0.0
        # Background scrub of sealed segments: replicas visited in turn, at most
        # config.scrub_bytes_per_second for the whole node.
        self._scrub_at = time.monotonic()
        self._scrub_next = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        # Replica fetches being handled now, by (topic, partition, replica, request id):
        # an empty answer to one of them is parked as a long-poll instead of sent.
        self._parkable: dict[tuple[str, int, int, int], FetchRequest] = {}
        self._handlers: dict[int, Callable[[Any], Any]] = {
            ApiKey.API_VERSIONS: self._api_versions,
            ApiKey.METADATA: self._metadata,
            ApiKey.PRODUCE: self._produce,
            ApiKey.FETCH: self._fetch,
            ApiKey.LIST_OFFSETS: self._list_offsets,
            ApiKey.OFFSETS_FOR_LEADER_EPOCH: self._offsets_for_leader_epoch,
            ApiKey.DESCRIBE_QUORUM: self._describe_quorum,
            ApiKey.CREATE_TOPIC: self._create_topic,
            ApiKey.DELETE_TOPIC: self._delete_topic,
            ApiKey.LIST_TOPICS: self._list_topics,
            ApiKey.FORCE_LEADER: self._force_leader,
        }

    # ------------------------------------------------------------------ lifecycle
    def _lock_data_dir(self) -> None:
        """Take ``<data-dir>/.lock`` (as Kafka's ``.lock``) before anything else touches
        the directory: two processes on one directory would both append to the same logs
        and quorum-state files. flock is released by the kernel when the process dies,
        so a kill -9 leaves no stale lock. A loser exits naming the holder's pid and
        changes nothing (the file is opened without truncation)."""
        d = self.config.data_dir
        d.mkdir(parents=True, exist_ok=True)
        path = d / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise SystemExit(
                f"quorumlog: data dir {d} is in use by another quorumlog process (pid {holder}, "
                f"holds {path}); one node process per data directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the only descriptor releases the flock
            self._lock_fd = None

    def _check_data_dir(self) -> str:
        """Check (or create) ``meta.properties``; returns the directory's id. A directory
        made before directory ids existed gets one now: it is not a replacement."""
        d = self.config.data_dir
        meta = d / "meta.properties"
        wanted = f"cluster.id={self.config.cluster_id}\nnode.id={self.node_id}\n"
        if meta.exists():
            have = meta.read_text()
            lines = have.splitlines(keepends=True)
            ids = [ln.strip().partition("=")[2] for ln in lines if ln.startswith("directory.id=")]
            rest = "".join(ln for ln in lines if not ln.startswith("directory.id="))
            if rest != wanted or len(ids) > 1:
                raise SystemExit(
                    f"quorumlog: data dir {d} belongs to another cluster or node ({have.strip()!r}); "
                    f"this node is node.id={self.node_id} of cluster.id={self.config.cluster_id}"
                )
            if ids:
                return ids[0]
        directory_id = new_directory_id()
        atomic_write(str(meta), f"{wanted}directory.id={directory_id}\n".encode())
        return directory_id

    def _on_directory_replaced(self, peer: int, remembered: str) -> None:
        """A peer remembers another data directory for this node: this one replaced a
        lost one that may have acknowledged records. Every replica hosted here, open now
        or opened fresh until the metadata log has caught up (``CATCH_UP_PENDING_FILE``),
        catches up with an unknown floor before it votes, stands or counts. Durable
        before returning (the caller then answers the peer or applies its frames)."""
        marker = self.config.data_dir / REPLACED_DIRECTORIES_FILE
        try:
            handled = remembered in marker.read_text().split()
        except FileNotFoundError:
            handled = False
        if handled:
            return  # marked already; that peer has not yet recorded our new id
        log.warning(
            "node %d: data directory replaced a lost one (node %d remembers directory %s): "
            "every replica here catches up before it votes, stands or counts again",
            self.node_id,
            peer,
            remembered,
        )
        atomic_write(str(self.config.data_dir / CATCH_UP_PENDING_FILE), b"")
        self._catch_up_pending = True
        t = now_ms()
        for r in list(self.replicas.values()):
            if not r.closed:
                self._process(r, r.core.begin_catch_up(t))
        try:
            old = marker.read_text()
        except FileNotFoundError:
            old = ""
        atomic_write(str(marker), f"{old}{remembered}\n".encode())

    def _maybe_end_catch_up_pending(self, metadata: PartitionReplica) -> None:
        """Replicas opened fresh stop being marked once the metadata replica is caught
        up and applied: every partition that existed before is open (and marked) by then."""
        if (
            self._catch_up_pending
            and not metadata.core.catching_up
            and self.metadata.applied_offset >= metadata.log.durable_end_offset
        ):
            self._catch_up_pending = False
            (self.config.data_dir / CATCH_UP_PENDING_FILE).unlink(missing_ok=True)
            log.info("node %d: metadata caught up after a replaced data directory", self.node_id)

    async def start(self) -> None:
        self._lock_data_dir()
        self.directories = DirectoryIds(
            self.config.data_dir, self._check_data_dir(), self._on_directory_replaced
        )
        self._catch_up_pending = (self.config.data_dir / CATCH_UP_PENDING_FILE).exists()
        self.server.directories = self.directories
        await self.server.start()
        for nid, (host, port) in self.config.voters.items():
            if nid != self.node_id:
                host, port = self.config.peer_addresses.get(nid, (host, port))
                link = PeerLink(
                    nid,
                    host,
                    port,
                    f"node-{self.node_id}",
                    self.rng,
                    ssl_context=peer_client_context(self.config.tls) if self.config.tls else None,
                    server_hostname=self.config.voters[nid][0],
                    credentials=self._peer_credentials(),
                    directories=self.directories,
                )
                link.start()
                self.peers[nid] = link
        self._open_replica(METADATA_TOPIC, 0, sorted(self.config.voters))
        self._reopen_local_replicas()
        self._replay_metadata()
        self._ticker = asyncio.create_task(self._tick_loop())
        log.info(
            "node %d serving on %s:%d (cluster %s, %d voters)",
            self.node_id,
            self.config.host,
            self.server.port,
            self.config.cluster_id,
            len(self.config.voters),
        )

    def _load_auth(self) -> AuthConfig | None:
        c = self.config
        if c.auth_config is None:
            return None
        auth = AuthConfig.load(c.auth_config)
        if c.auth_principal:
            check_own_principal(auth, c.auth_principal, self.node_id, str(c.auth_config))
        return auth

    def _peer_credentials(self) -> tuple[str, str] | None:
        """Who this node authenticates as to its peers: its node principal (secure), or
        node-<id> with the secret derived from the cluster secret (plaintext)."""
        c = self.config
        if c.auth_principal and c.auth_secret:
            return c.auth_principal, c.auth_secret
        if c.cluster_secret:
            return node_principal(self.node_id), node_secret(c.cluster_secret, self.node_id)
        return None

    async def stop(self, graceful: bool = True) -> None:
        if graceful:
            t = now_ms()
            handing_over = False
            for r in list(self.replicas.values()):
                if r.core.is_leader:
                    handing_over = True
                    self._process(r, r.core.begin_shutdown(t))
            if handing_over:
                # Give the EndQuorumEpoch messages a moment to leave the socket buffers.
                await asyncio.sleep(0.05)
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        await self.server.close()
        for link in self.peers.values():
            await link.close()
        for r in self.replicas.values():
            self._close_replica(r)
        self._unlock_data_dir()
        log.info("node %d stopped", self.node_id)

    def _reopen_local_replicas(self) -> None:
        """Reopen the partition replicas this node holds on disk, with the voters their
        quorum-state recorded, so a restarted node rejoins its quorums at once instead of
        waiting for the metadata log to be re-applied."""
        for d in sorted(self.config.data_dir.iterdir()):
            topic, sep, part = d.name.rpartition("-")
            if not sep or not part.isdigit() or topic == METADATA_TOPIC or not d.is_dir():
                continue
            try:
                state = QuorumStateStore(str(d)).read()
            except StorageError:
                log.exception("cannot read the quorum state of %s; waiting for metadata", d)
                continue
            if state is not None and state.voters and (topic, int(part)) not in self.replicas:
                self._open_replica(topic, int(part), list(state.voters))

    def _replica_dir(self, topic: str, partition: int) -> Path:
        return self.config.data_dir / f"{topic}-{partition}"

    def _open_replica(self, topic: str, partition: int, replicas: list[int]) -> PartitionReplica:
        d = self._replica_dir(topic, partition)
        fresh = not d.exists()
        # repair=True: damage recovery finds mid-log is cut, with the catch-up mark, and
        # re-fetched from the leader (see RaftReplica.on_corruption), not fatal.
        lg = WallClockLog(str(d), self.log_config, repair=True)
        if fresh and self._catch_up_pending:
            # This node's directory replaced a lost one that may have held this replica.
            lg.mark_catch_up(CATCH_UP_UNKNOWN)
        store = QuorumStateStore(str(d))
        persisted = _to_election_state(store.read())
        core = RaftReplica(
            self.quorum,
            self.node_id,
            replicas,
            self.config.cluster_id,
            lg,
            persisted,
            self.rng,
            t := now_ms(),
        )
        r = PartitionReplica(topic, partition, replicas, d, lg, store, core)
        if persisted is None and replicas and replicas[0] != self.node_id:
            r.ticks_from_ms = t + 2 * self.quorum.election_timeout_ms
        self.replicas[(topic, partition)] = r
        self._process(r, core.startup_output())
        log.info("opened replica %s (replicas %s, log end %d)", r.name, replicas, lg.end_offset)
        return r

    def _close_replica(self, r: PartitionReplica) -> None:
        if r.closed:
            return
        r.closed = True
        for _, _, fut in r.waiters:
            if not fut.done():
                fut.set_exception(NotLeaderError(None, r.core.epoch))
        r.waiters.clear()
        try:
            r.log.close()
        except StorageError:
            log.exception("closing %s", r.name)

    # ------------------------------------------------------------------ raft driving
    def _process(self, r: PartitionReplica, out: Output) -> None:
        """Execute one core output under the driver rules (see replica.raft)."""
        if r.closed:
            return
        if out.persist is not None:
            r.store.write(_to_quorum_state(out.persist, r.replicas))
        if out.flush_log and r.log.durable_end_offset < r.log.end_offset:
            # Messages wait for the flush; outputs produced meanwhile queue behind them.
            r.after_flush.append(out)
            self._request_flush(r)
        elif r.after_flush:
            r.after_flush.append(out)
        else:
            self._deliver(r, out)
        if r.core.is_leader and r.log.durable_end_offset < r.log.end_offset:
            # A leader's own appends (also the control batch a new leader writes) count
            # towards the HWM only once durable: group-commit them (driver rule 2).
            self._request_flush(r)
        if out.high_watermark is not None or out.fetch_wakeup:
            self._on_progress(r, out)
        self._observe_role(r, out)

    def _deliver(self, r: PartitionReplica, out: Output) -> None:
        for msg in out.messages:
            self._send_raft(r, msg)
        if out.truncated_below_high_watermark:
            log.warning("%s: committed records were truncated (unclean leader election)", r.name)

    def _send_raft(self, r: PartitionReplica, msg: Message) -> None:
        if isinstance(msg, FetchResponse) and msg.is_empty():
            req = self._parkable.pop((r.topic, r.partition, msg.dst, msg.request_id), None)
            if (
                req is not None
                and req.max_wait_ms > 0
                and r.sent_hwm.get(msg.dst) == msg.high_watermark
            ):
                r.parked.append(Parked(req, now_ms() + req.max_wait_ms))
                return
        if msg.dst == self.node_id:
            self._process(r, r.core.handle(msg, now_ms()))
            return
        self._send_raw(r, msg)

    def _handle_raft(self, frame: Frame, sender: int) -> None:
        """A raft frame from a connection authenticated as node ``sender``. Raises
        DecodeError for a malformed frame and ForgedSender for a message claiming another
        sender; the transport counts and logs both (once per connection)."""
        env = decode_body(m.RaftEnvelope, frame.body, frame.payload)
        cls = RAFT_CLASSES.get(env.kind)
        if cls is None:
            raise DecodeError(f"unknown raft message kind {env.kind!r}")
        msg = decode_body(cls, env.body, env.records)
        check_raft_sender(msg, sender)
        r = self.replicas.get((env.topic, env.partition))
        if r is None or r.closed or msg.dst != self.node_id:
            return
        if isinstance(msg, FetchRequest):
            self._parkable[(env.topic, env.partition, msg.replica_id, msg.request_id)] = msg
            out = r.core.handle(msg, now_ms())
            self._process(r, out)
            self._parkable.pop((env.topic, env.partition, msg.replica_id, msg.request_id), None)
        else:
            self._process(r, r.core.handle(msg, now_ms()))

    def _request_flush(self, r: PartitionReplica) -> None:
        if r.flushing:
            r.flush_again = True
            return
        r.flushing = True
        task = asyncio.create_task(self._flush(r))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, r: PartitionReplica) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                r.flush_again = False
                try:
                    await loop.run_in_executor(None, r.log.flush)
                except StorageError:
                    if r.closed:
                        return
                    raise
                if r.closed:
                    return
                pending, r.after_flush = r.after_flush, []
                self._process(r, r.core.on_log_flushed(now_ms()))
                for out in pending:
                    self._deliver(r, out)
                if not r.flush_again and r.log.durable_end_offset >= r.log.end_offset:
                    return
        finally:
            r.flushing = False

    def _on_progress(self, r: PartitionReplica, out: Output) -> None:
        hwm = r.core.high_watermark
        if out.high_watermark is not None:
            still = []
            for last, epoch, fut in r.waiters:
                if fut.done():
                    continue
                if hwm > last and epoch == r.core.epoch:
                    fut.set_result(None)
                else:
                    still.append((last, epoch, fut))
            r.waiters = still
            r.hwm_changed.set()
            r.hwm_changed = asyncio.Event()
            if r.topic == METADATA_TOPIC:
                self._apply_metadata(r)
        if r.parked:
            self._wake_parked(r, force=False)

    def _wake_parked(self, r: PartitionReplica, *, force: bool) -> None:
        t = now_ms()
        parked, r.parked = r.parked, []
        for p in parked:
            # Parking is decided here, so this re-handled request is never parkable again.
            out = r.core.handle(p.request, t)
            resp = next(
                (
                    x
                    for x in out.messages
                    if isinstance(x, FetchResponse) and x.dst == p.request.replica_id
                ),
                None,
            )
            expired = t >= p.deadline_ms
            if (
                resp is not None
                and resp.is_empty()
                and resp.high_watermark == r.sent_hwm.get(p.request.replica_id)
                and not expired
                and not force
            ):
                # Nothing new for this follower yet: keep it parked.
                out.messages.remove(resp)
                r.parked.append(p)
            elif resp is not None and resp.is_empty():
                # Send the empty answer now (new HWM, expiry or forced).
                out.messages.remove(resp)
                self._send_raw(r, resp)
            self._process(r, out)

    def _send_raw(self, r: PartitionReplica, msg: Message) -> None:
        link = self.peers.get(msg.dst)
        if link is None:
            return
        if isinstance(msg, FetchResponse):
            r.sent_hwm[msg.dst] = msg.high_watermark
        body, payload = encode(msg)
        env_body, _ = encode(
            m.RaftEnvelope(
                topic=r.topic,
                partition=r.partition,
                kind=type(msg).__name__,
                body=body,
                records=b"",
            )
        )
        link.send(env_body, payload)

    def _observe_role(self, r: PartitionReplica, out: Output) -> None:
        core = r.core
        role = core.state_name
        if role != r.last_role or core.leader_id != r.last_leader or core.epoch != r.last_epoch:
            if core.is_leader and (r.last_role != role or r.last_epoch != core.epoch):
                log.info("%s: leader in epoch %d", r.name, core.epoch)
            elif core.leader_id != r.last_leader and core.leader_id is not None:
                log.info("%s: follows node %d in epoch %d", r.name, core.leader_id, core.epoch)
            was_leader = r.last_role == "leader"
            r.last_role, r.last_leader, r.last_epoch = role, core.leader_id, core.epoch
            if was_leader and not core.is_leader:
                for _, _, fut in r.waiters:
                    if not fut.done():
                        fut.set_exception(NotLeaderError(core.leader_id, core.epoch))
                r.waiters.clear()
                if r.parked:
                    self._wake_parked(r, force=True)
            r.hwm_changed.set()
            r.hwm_changed = asyncio.Event()

    async def _tick_loop(self) -> None:
        while True:
            try:
                t = now_ms()
                for r in list(self.replicas.values()):
                    if r.closed:
                        continue
                    deadline = r.core.next_deadline_ms()
                    if deadline is not None and deadline <= t and t >= r.ticks_from_ms:
                        self._process(r, r.core.tick(t))
                    if r.parked and min(p.deadline_ms for p in r.parked) <= t:
                        self._wake_parked(r, force=False)
                if time.monotonic() >= self._retention_at:
                    self._retention_at = time.monotonic() + 5
                    self._apply_retention()
                if time.monotonic() >= self._scrub_at + 1:
                    self._scrub()
                    if self._catch_up_pending:  # also when no metadata arrives any more
                        self._maybe_end_catch_up_pending(self.replicas[(METADATA_TOPIC, 0)])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("tick failed")
            await asyncio.sleep(TICK_S)

    def _scrub(self) -> None:
        """Verify sealed segments in the background, ``scrub_bytes_per_second`` for the
        whole node: replicas take turns; a damaged batch is repaired at once."""
        t = time.monotonic()
        budget = int(self.config.scrub_bytes_per_second * min(t - self._scrub_at, 5.0))
        self._scrub_at = t
        replicas = [r for r in self.replicas.values() if not r.closed]
        if budget <= 0 or not replicas:
            return
        for _ in range(len(replicas)):
            r = replicas[self._scrub_next % len(replicas)]
            before, passes = r.log.scrubbed_bytes, r.log.scrub_passes
            found = r.log.scrub(budget)
            budget -= r.log.scrubbed_bytes - before
            if found is not None:
                self._on_corruption(r, found, "scrub")
            elif r.log.scrub_passes == passes and budget <= 0:
                return  # this replica continues next time
            self._scrub_next += 1
            if budget <= 0:
                return

    def _on_corruption(self, r: PartitionReplica, exc: CorruptDataError, how: str) -> None:
        if how == "scrub":  # a read already logged what it found (replica.storage)
            log.error(
                "%s: corrupt batch at offset %d in %s (position %d), found by the scrub: "
                "%s; cutting the log there and re-fetching from the leader",
                r.name,
                exc.offset,
                exc.path,
                exc.position,
                exc.reason,
            )
        self._process(r, r.core.on_corruption(exc.offset, now_ms()))

    def _apply_retention(self) -> None:
        if self.log_config.retention_bytes is None and self.log_config.retention_ms is None:
            return
        for r in self.replicas.values():
            if r.topic != METADATA_TOPIC and not r.closed:
                # Never delete what is not yet committed: followers may still need it.
                r.log.apply_retention(int(time.time() * 1000), max_offset=r.core.high_watermark)

    # ------------------------------------------------------------------ metadata
    def _apply_metadata(self, r: PartitionReplica, upto: int | None = None) -> None:
        """Apply committed metadata records up to the HWM (or ``upto``, an offset known to
        be committed), then record how far, so a restart can re-apply at once."""
        hwm = r.core.high_watermark if upto is None else min(upto, r.log.end_offset)
        before = self.metadata.applied_offset
        while self.metadata.applied_offset < hwm:
            try:
                data = r.log.read(self.metadata.applied_offset, 1 << 20, max_offset=hwm)
            except CorruptDataError as exc:
                self._on_corruption(r, exc, "a metadata read")
                break
            if not data:
                break
            table = batches_to_table(data)
            offsets = table.column("offset").to_pylist()
            values = table.column("value").to_pylist()
            for off, value in zip(offsets, values, strict=True):
                if off < self.metadata.applied_offset or off >= hwm:
                    continue
                try:
                    self.metadata.apply(decode_record(value))
                except (ValueError, KeyError, TypeError):
                    log.exception("bad metadata record at offset %d", off)
            last = None
            for h in iter_batches(data):
                last = h
            if last is None:
                break
            self.metadata.applied_offset = min(hwm, last.next_offset)
        if self.metadata.applied_offset > before and upto is None:
            self._save_metadata_checkpoint()
        self._reconcile_partitions()
        self._maybe_end_catch_up_pending(r)

    def _metadata_checkpoint_path(self) -> Path:
        return self.config.data_dir / "metadata-applied"

    def _save_metadata_checkpoint(self) -> None:
        # Like Kafka's high-watermark checkpoint: offsets below this are committed.
        path = self._metadata_checkpoint_path()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{self.metadata.applied_offset}\n")
        os.replace(tmp, path)

    def _replay_metadata(self) -> None:
        """At start-up, re-apply the local metadata log up to the last offset this node
        knew to be committed, so it knows every topic before the quorum answers."""
        try:
            upto = int(self._metadata_checkpoint_path().read_text().strip())
        except (OSError, ValueError):
            return
        self._apply_metadata(self.replicas[(METADATA_TOPIC, 0)], upto=upto)

    def _reconcile_partitions(self) -> None:
        wanted: dict[tuple[str, int], list[int]] = {}
        for t in self.metadata.topics.values():
            for p, reps in enumerate(t.replicas):
                if self.node_id in reps:
                    wanted[(t.name, p)] = reps
        for key, reps in wanted.items():
            if key not in self.replicas:
                self._open_replica(key[0], key[1], reps)
        for key in list(self.replicas):
            if key[0] in self.metadata.deleted and key not in wanted:
                r = self.replicas.pop(key)
                self._close_replica(r)
                shutil.rmtree(r.directory, ignore_errors=True)
                log.info("deleted replica %s", r.name)

    # ------------------------------------------------------------------ requests
    async def _handle_request(self, frame: Frame) -> tuple[int, Any] | None:
        try:
            api = ApiKey(frame.api_key)
            req_cls, _ = m.REQUESTS[api]
        except (ValueError, KeyError):
            return int(ApiKey.ERROR), m.ErrorResponse(
                error=int(ErrorCode.INVALID_REQUEST),
                error_message=f"unknown api key {frame.api_key}",
            )
        if frame.api_version != m.API_VERSION:
            return int(ApiKey.ERROR), m.ErrorResponse(
                error=int(ErrorCode.UNSUPPORTED_VERSION),
                error_message=f"api {api.name} version {frame.api_version} is not supported",
            )
        try:
            req = decode_body(req_cls, frame.body, frame.payload)
        except Exception as exc:
            return int(ApiKey.ERROR), m.ErrorResponse(
                error=int(ErrorCode.INVALID_REQUEST), error_message=f"malformed {api.name}: {exc}"
            )
        resp = await self._handlers[api](req)
        return int(api), resp

    def _max_message_bytes(self, topic: str) -> int:
        t = self.metadata.topics.get(topic)
        if t is not None and t.max_message_bytes is not None:
            return t.max_message_bytes
        return self.config.max_message_bytes

    def _oversized_batch(self, topic: str, records: bytes) -> str | None:
        """Why a produce's records hold a batch over the topic's max.message.bytes, or None.
        Only headers are parsed; malformed batches are left to the append path to reject."""
        limit = self._max_message_bytes(topic)
        if len(records) <= limit:
            return None
        try:
            for h in iter_batches(records):
                if h.size > limit:
                    return (
                        f"record batch of {h.size} bytes at position {h.position} exceeds "
                        f"max.message.bytes {limit} of topic {topic!r}"
                    )
        except CorruptRecordError:
            return None
        return None

    def _replica_or_error(self, topic: str, partition: int) -> PartitionReplica | ErrorCode:
        r = self.replicas.get((topic, partition))
        if r is None or r.closed or topic == METADATA_TOPIC:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return r

    @staticmethod
    def _fence(r: PartitionReplica, current_leader_epoch: int) -> ErrorCode:
        if current_leader_epoch == m.UNKNOWN:
            return ErrorCode.NONE if r.core.is_leader else ErrorCode.NOT_LEADER
        return r.core.check_leader_epoch(current_leader_epoch)

    async def _api_versions(self, req: m.ApiVersionsRequest) -> m.ApiVersionsResponse:
        return m.ApiVersionsResponse(
            error=0,
            error_message="",
            node_id=self.node_id,
            cluster_id=self.config.cluster_id,
            apis=[
                m.ApiVersionRange(api_key=int(k), min_version=0, max_version=0) for k in m.REQUESTS
            ],
        )

    async def _metadata(self, req: m.MetadataRequest) -> m.MetadataResponse:
        meta = self.replicas.get((METADATA_TOPIC, 0))
        controller = (
            meta.core.leader_id if meta is not None and meta.core.leader_id is not None else -1
        )
        topics = []
        names = req.topics if req.topics else sorted(self.metadata.topics)
        for name in names:
            t = self.metadata.topics.get(name)
            if t is None:
                topics.append(
                    m.TopicInfo(
                        error=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), name=name, partitions=[]
                    )
                )
                continue
            parts = []
            for p, reps in enumerate(t.replicas):
                r = self.replicas.get((name, p))
                if r is None or r.closed:
                    parts.append(
                        m.PartitionInfo(
                            error=0,
                            partition=p,
                            leader_id=m.UNKNOWN,
                            leader_epoch=m.UNKNOWN,
                            replicas=reps,
                            high_watermark=m.UNKNOWN,
                            log_start_offset=m.UNKNOWN,
                            is_local_leader=False,
                        )
                    )
                    continue
                core = r.core
                leader = core.leader_id if core.leader_id is not None else -1
                parts.append(
                    m.PartitionInfo(
                        error=0,
                        partition=p,
                        leader_id=leader,
                        leader_epoch=core.epoch,
                        replicas=reps,
                        high_watermark=core.high_watermark,
                        log_start_offset=r.log.start_offset,
                        is_local_leader=core.is_leader,
                    )
                )
            topics.append(
                m.TopicInfo(
                    error=0,
                    name=name,
                    partitions=parts,
                    max_message_bytes=self._max_message_bytes(name),
                )
            )
        nodes = [
            m.NodeInfo(node_id=i, host=h, port=p)
            for i, (h, p) in sorted(self.config.voters.items())
        ]
        return m.MetadataResponse(
            error=0,
            error_message="",
            cluster_id=self.config.cluster_id,
            node_id=self.node_id,
            controller_id=controller,
            nodes=nodes,
            topics=topics,
        )

    async def _produce(self, req: m.ProduceRequest) -> m.ProduceResponse:
        def fail(code: ErrorCode, msg: str, leader: int = -1) -> m.ProduceResponse:
            return m.ProduceResponse(
                error=int(code),
                error_message=msg,
                base_offset=m.UNKNOWN,
                last_offset=m.UNKNOWN,
                leader_epoch=m.UNKNOWN,
                leader_id=leader,
            )

        r = self._replica_or_error(req.topic, req.partition)
        if isinstance(r, ErrorCode):
            return fail(r, f"{req.topic}/{req.partition} is not hosted here")
        if not req.records:
            return fail(ErrorCode.INVALID_REQUEST, "produce without records")
        too_large = self._oversized_batch(req.topic, req.records)
        if too_large is not None:
            return fail(ErrorCode.MESSAGE_TOO_LARGE, too_large)
        try:
            info, epoch, out = r.core.append(req.records, now_ms())
        except NotLeaderError as exc:
            return fail(
                ErrorCode.NOT_LEADER, str(exc), exc.leader_id if exc.leader_id is not None else -1
            )
        except (StorageError, ValueError) as exc:
            return fail(ErrorCode.CORRUPT_MESSAGE, f"rejected batch: {exc}")
        self._process(r, out)
        self._request_flush(r)
        if r.parked:
            self._wake_parked(r, force=False)
        if req.acks != m.ACKS_QUORUM:
            return m.ProduceResponse(
                error=0,
                error_message="",
                base_offset=info.first_offset,
                last_offset=info.last_offset,
                leader_epoch=epoch,
                leader_id=self.node_id,
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        r.waiters.append((info.last_offset, epoch, fut))
        timeout = (req.timeout_ms if req.timeout_ms > 0 else self.config.produce_timeout_ms) / 1000
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return fail(
                ErrorCode.REQUEST_TIMED_OUT,
                f"offsets {info.first_offset}-{info.last_offset} not committed by a quorum within {req.timeout_ms} ms",
            )
        except NotLeaderError as exc:
            return fail(
                ErrorCode.NOT_LEADER,
                f"leadership moved before offsets {info.first_offset}-{info.last_offset} were committed: {exc}",
                exc.leader_id if exc.leader_id is not None else -1,
            )
        return m.ProduceResponse(
            error=0,
            error_message="",
            base_offset=info.first_offset,
            last_offset=info.last_offset,
            leader_epoch=epoch,
            leader_id=self.node_id,
        )

    async def _fetch(self, req: m.FetchRequest) -> m.FetchResponse:
        r = self._replica_or_error(req.topic, req.partition)

        def answer(code: ErrorCode, msg: str, records: bytes = b"") -> m.FetchResponse:
            if isinstance(r, ErrorCode):
                return m.FetchResponse(
                    error=int(code),
                    error_message=msg,
                    leader_id=m.UNKNOWN,
                    leader_epoch=m.UNKNOWN,
                    high_watermark=m.UNKNOWN,
                    log_start_offset=m.UNKNOWN,
                )
            leader = r.core.leader_id if r.core.leader_id is not None else -1
            return m.FetchResponse(
                error=int(code),
                error_message=msg,
                leader_id=leader,
                leader_epoch=r.core.epoch,
                high_watermark=r.core.high_watermark,
                log_start_offset=r.log.start_offset,
                records=records,
            )

        if isinstance(r, ErrorCode):
            return answer(r, f"{req.topic}/{req.partition} is not hosted here")
        deadline = time.monotonic() + max(0, req.max_wait_ms) / 1000
        while True:
            code = self._fence(r, req.current_leader_epoch)
            if code != ErrorCode.NONE:
                return answer(code, f"leader epoch {req.current_leader_epoch} vs {r.core.epoch}")
            hwm = r.core.high_watermark
            if req.fetch_offset < r.log.start_offset or req.fetch_offset > r.log.end_offset:
                return answer(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {req.fetch_offset} is outside [{r.log.start_offset}, {r.log.end_offset}]",
                )
            if req.fetch_offset < hwm:
                # At least one whole batch even above max_bytes (KIP-74, Log.read), and no
                # more than one frame can carry: any single batch fits max_batch_bytes.
                max_bytes = min(max(1, req.max_bytes), max_batch_bytes(self.config.max_frame_bytes))
                try:
                    data = r.log.read(req.fetch_offset, max_bytes, max_offset=hwm)
                except StorageOffsetOutOfRange as exc:
                    return answer(ErrorCode.OFFSET_OUT_OF_RANGE, str(exc))
                except CorruptDataError as exc:
                    # Never serve damaged bytes: resign, repair, send the client elsewhere.
                    self._on_corruption(r, exc, "a consumer fetch")
                    return answer(ErrorCode.NOT_LEADER, f"damaged data at offset {exc.offset}")
                return answer(ErrorCode.NONE, "", data)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return answer(ErrorCode.NONE, "")
            try:
                await asyncio.wait_for(r.hwm_changed.wait(), remaining)
            except TimeoutError:
                return answer(ErrorCode.NONE, "")
            if r.closed:
                return answer(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "partition was closed")

    async def _list_offsets(self, req: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
        r = self._replica_or_error(req.topic, req.partition)
        if isinstance(r, ErrorCode):
            return m.ListOffsetsResponse(
                error=int(r),
                error_message=f"{req.topic}/{req.partition} is not hosted here",
                offset=m.UNKNOWN,
                leader_epoch=m.UNKNOWN,
                timestamp=m.UNKNOWN,
            )
        code = self._fence(r, req.current_leader_epoch)
        if code != ErrorCode.NONE:
            return m.ListOffsetsResponse(
                error=int(code),
                error_message=f"leader epoch {req.current_leader_epoch} vs {r.core.epoch}",
                offset=m.UNKNOWN,
                leader_epoch=m.UNKNOWN,
                timestamp=m.UNKNOWN,
            )
        hwm = r.core.high_watermark
        if req.timestamp == m.LATEST_TIMESTAMP:
            epoch = r.log.epoch_at(hwm - 1) if hwm > r.log.start_offset else -1
            return m.ListOffsetsResponse(
                error=0, error_message="", offset=hwm, leader_epoch=epoch, timestamp=m.UNKNOWN
            )
        if req.timestamp == m.EARLIEST_TIMESTAMP:
            start = r.log.start_offset
            epoch = r.log.epoch_at(start - 1) if start > 0 else -1
            return m.ListOffsetsResponse(
                error=0, error_message="", offset=start, leader_epoch=epoch, timestamp=m.UNKNOWN
            )
        offset, ts = self._offset_for_timestamp(r, req.timestamp, hwm)
        epoch = r.log.epoch_at(offset - 1) if offset > r.log.start_offset else -1
        return m.ListOffsetsResponse(
            error=0, error_message="", offset=offset, leader_epoch=epoch, timestamp=ts
        )

    @staticmethod
    def _offset_for_timestamp(r: PartitionReplica, ts: int, hwm: int) -> tuple[int, int]:
        """First offset whose record timestamp is >= ts (scans batch headers; decodes only
        the batch that holds the answer); the HWM if none."""
        import pyarrow.compute as pc

        offset = r.log.start_offset
        while offset < hwm:
            data = r.log.read(offset, 4 << 20, max_offset=hwm)
            if not data:
                break
            for h in iter_batches(data):
                if not h.is_control and h.max_timestamp >= ts:
                    one = data[h.position : h.end]
                    table = batches_to_table(one)
                    stamps = table.column("timestamp").cast("int64")
                    idx = pc.index(pc.greater_equal(stamps, ts), True).as_py()
                    if idx >= 0:
                        return int(table.column("offset")[idx].as_py()), int(stamps[idx].as_py())
                offset = h.next_offset
        return hwm, -1

    async def _offsets_for_leader_epoch(
        self, req: m.OffsetsForLeaderEpochRequest
    ) -> m.OffsetsForLeaderEpochResponse:
        r = self._replica_or_error(req.topic, req.partition)
        if isinstance(r, ErrorCode):
            return m.OffsetsForLeaderEpochResponse(
                error=int(r),
                error_message=f"{req.topic}/{req.partition} is not hosted here",
                leader_epoch=m.UNKNOWN,
                end_offset=m.UNKNOWN,
            )
        code = self._fence(r, req.current_leader_epoch)
        if code != ErrorCode.NONE:
            return m.OffsetsForLeaderEpochResponse(
                error=int(code),
                error_message=f"leader epoch {req.current_leader_epoch} vs {r.core.epoch}",
                leader_epoch=m.UNKNOWN,
                end_offset=m.UNKNOWN,
            )
        answer = r.log.end_offset_for(req.leader_epoch)
        return m.OffsetsForLeaderEpochResponse(
            error=0, error_message="", leader_epoch=answer.epoch, end_offset=answer.end_offset
        )

    async def _describe_quorum(self, req: m.DescribeQuorumRequest) -> m.DescribeQuorumResponse:
        r = self.replicas.get((req.topic, req.partition))
        if r is None or r.closed:
            return m.DescribeQuorumResponse(
                error=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                error_message="not hosted here",
                leader_id=m.UNKNOWN,
                leader_epoch=m.UNKNOWN,
                high_watermark=m.UNKNOWN,
            )
        if not r.core.is_leader:
            return m.DescribeQuorumResponse(
                error=int(ErrorCode.NOT_LEADER),
                error_message="not the leader",
                leader_id=m.UNKNOWN,
                leader_epoch=m.UNKNOWN,
                high_watermark=m.UNKNOWN,
            )
        d = r.core.describe(now_ms())
        t = now_ms()

        def row(p: Any) -> m.ReplicaStateInfo:
            age = t - p.last_fetch_ms if p.last_fetch_ms >= 0 else -1
            return m.ReplicaStateInfo(
                replica_id=p.replica_id, end_offset=p.end_offset, last_fetch_ms=age, lag=p.lag
            )

        return m.DescribeQuorumResponse(
            error=0,
            error_message="",
            leader_id=d.leader_id if d.leader_id is not None else -1,
            leader_epoch=d.leader_epoch,
            high_watermark=d.high_watermark,
            voters=[row(p) for p in d.voters],
            observers=[row(p) for p in d.observers],
        )

    async def _commit_metadata(self, record: dict[str, Any]) -> ErrorCode | None:
        meta = self.replicas[(METADATA_TOPIC, 0)]
        try:
            info, epoch, out = meta.core.append(encode_batch([encode_record(record)]), now_ms())
        except NotLeaderError:
            return ErrorCode.NOT_LEADER
        self._process(meta, out)
        self._request_flush(meta)
        if meta.parked:
            self._wake_parked(meta, force=False)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        meta.waiters.append((info.last_offset, epoch, fut))
        try:
            await asyncio.wait_for(fut, self.config.produce_timeout_ms / 1000)
        except TimeoutError:
            return ErrorCode.REQUEST_TIMED_OUT
        except NotLeaderError:
            return ErrorCode.NOT_LEADER
        # Apply on this node before answering, so a Metadata request that follows sees it.
        self._apply_metadata(meta)
        return None

    async def _create_topic(self, req: m.CreateTopicRequest) -> m.CreateTopicResponse:
        meta = self.replicas[(METADATA_TOPIC, 0)]
        if not meta.core.is_leader:
            return m.CreateTopicResponse(
                error=int(ErrorCode.NOT_LEADER), error_message="not the metadata leader"
            )
        problem = validate_topic_name(req.name)
        if problem:
            return m.CreateTopicResponse(error=int(ErrorCode.INVALID_TOPIC), error_message=problem)
        if not 1 <= req.partitions <= 10000:
            return m.CreateTopicResponse(
                error=int(ErrorCode.INVALID_PARTITIONS),
                error_message=f"partitions must be 1..10000, got {req.partitions}",
            )
        nodes = sorted(self.config.voters)
        rf = req.replication_factor or min(3, len(nodes))
        if not 1 <= rf <= len(nodes):
            return m.CreateTopicResponse(
                error=int(ErrorCode.INVALID_REPLICATION_FACTOR),
                error_message=f"replication factor must be 1..{len(nodes)} (the number of nodes), got {rf}",
            )
        if req.max_message_bytes:
            problem = check_max_message_bytes(
                req.max_message_bytes, self.config.max_frame_bytes, "max.message.bytes"
            )
            if problem:
                return m.CreateTopicResponse(
                    error=int(ErrorCode.INVALID_REQUEST), error_message=problem
                )
        if req.name in self.metadata.topics or req.name in self._pending_topics:
            return m.CreateTopicResponse(
                error=int(ErrorCode.TOPIC_ALREADY_EXISTS),
                error_message=f"topic {req.name!r} already exists",
            )
        self._pending_topics.add(req.name)
        try:
            replicas = assign_replicas(req.name, req.partitions, rf, nodes)
            record: dict[str, Any] = {"op": "create_topic", "name": req.name, "replicas": replicas}
            if req.max_message_bytes:
                record["max_message_bytes"] = req.max_message_bytes
            err = await self._commit_metadata(record)
        finally:
            self._pending_topics.discard(req.name)
        if err is not None:
            return m.CreateTopicResponse(
                error=int(err), error_message="metadata record not committed"
            )
        log.info(
            "created topic %s: %d partition(s), replicas %s", req.name, req.partitions, replicas
        )
        return m.CreateTopicResponse(error=0, error_message="")

    async def _delete_topic(self, req: m.DeleteTopicRequest) -> m.DeleteTopicResponse:
        meta = self.replicas[(METADATA_TOPIC, 0)]
        if not meta.core.is_leader:
            return m.DeleteTopicResponse(
                error=int(ErrorCode.NOT_LEADER), error_message="not the metadata leader"
            )
        if req.name not in self.metadata.topics:
            return m.DeleteTopicResponse(
                error=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                error_message=f"unknown topic {req.name!r}",
            )
        err = await self._commit_metadata({"op": "delete_topic", "name": req.name})
        if err is not None:
            return m.DeleteTopicResponse(
                error=int(err), error_message="metadata record not committed"
            )
        log.info("deleted topic %s", req.name)
        return m.DeleteTopicResponse(error=0, error_message="")

    async def _list_topics(self, req: m.ListTopicsRequest) -> m.ListTopicsResponse:
        return m.ListTopicsResponse(error=0, error_message="", topics=sorted(self.metadata.topics))

    async def _force_leader(self, req: m.ForceLeaderRequest) -> m.ForceLeaderResponse:
        r = self.replicas.get((req.topic, req.partition))
        if r is None or r.closed:
            return m.ForceLeaderResponse(
                error=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                error_message="not hosted here",
                leader_epoch=m.UNKNOWN,
            )
        if not req.confirm:
            return m.ForceLeaderResponse(
                error=int(ErrorCode.INVALID_REQUEST),
                error_message="force-leader needs confirm=true",
                leader_epoch=m.UNKNOWN,
            )
        log.warning(
            "%s: UNCLEAN leader election forced by an operator (log end %d, HWM %d)",
            r.name,
            r.log.end_offset,
            r.core.high_watermark,
        )
        # The forced epoch must not be reachable by ordinary elections among the voters
        # this node cannot reach (they may come back): skip UNCLEAN_EPOCH_GAP epochs.
        self._process(r, r.core.force_leader(now_ms(), r.core.epoch + UNCLEAN_EPOCH_GAP))
        return m.ForceLeaderResponse(error=0, error_message="", leader_epoch=r.core.epoch)


def run_node(config: NodeConfig) -> int:
    async def main() -> None:
        node = Node(config)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await node.start()
        await stop.wait()
        log.info("node %d shutting down gracefully", config.node_id)
        await node.stop(graceful=True)

    asyncio.run(main())
    return 0
