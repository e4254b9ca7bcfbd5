"""The synchronous client: metadata, produce, fenced fetch, list offsets, offsets-for-epoch.

Timeouts as Kafka's clients: a call (produce, fetch, ...) may take ``request_timeout_ms`` in
all (Kafka's ``delivery.timeout.ms`` / ``default.api.timeout.ms``), made of attempts that
each take at most ``attempt_timeout_ms`` (Kafka's ``request.timeout.ms``), connecting
included. What a node waits for inside an attempt (a long poll's max wait, an acks=quorum
produce's wait for the quorum) is cut to fit in the attempt, so an attempt that outlives
its timeout means a node that stopped answering (SIGSTOP, a stalled VM, a long GC): its
connection is closed, the node is suspected until it answers again (for one attempt
timeout at most), metadata is refreshed from the nodes that answer, and the retry goes to
the partition's current leader. Retries back off with one formula (``backoff_s``).

Leader routing uses a metadata cache refreshed on NOT_LEADER / FENCED / UNKNOWN epoch,
on connection loss and on a timed-out attempt: a cold cache learns a topic from one node,
a refresh asks every node for the one partition it routes. When a caller passes its own
``current_leader_epoch``, fencing errors are raised to it instead of retried: the caller
(a KIP-320 consumer) must re-validate its position before reading on.
"""

from __future__ import annotations

# Kept a name of this module: tests/client/test_leader_moved.py patches
# ``client.random.choice``, which is the one ``random`` module metadata.py picks a node with.
import random  # noqa: F401

from .. import defaults
from ..protocol import messages as m
from .admin import AdminCalls
from .coordinators import CoordinatorCalls
from .metadata import METADATA_GRACE_S, METADATA_TIMEOUT_S, PartitionMetadata, TopicMetadata
from .produce import (
    PIPELINE,
    PRODUCE_MANY_BYTES,
    ProduceCall,
    ProduceCalls,
    ProduceResult,
    check_batch_size,
)
from .reads import ISOLATION_LEVELS, FetchResult, ReadCalls, isolation_level
from .security import ClientSecurity

__all__ = [
    "DEFAULT_ATTEMPT_TIMEOUT_MS",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "ISOLATION_LEVELS",
    "METADATA_GRACE_S",
    "METADATA_TIMEOUT_S",
    "PIPELINE",
    "PRODUCE_MANY_BYTES",
    "Client",
    "FetchResult",
    "PartitionMetadata",
    "ProduceCall",
    "ProduceResult",
    "TopicMetadata",
    "check_batch_size",
    "isolation_level",
    "parse_bootstrap",
]

# The client's names for its shipped defaults (replica.defaults says why).
DEFAULT_REQUEST_TIMEOUT_MS = defaults.REQUEST_TIMEOUT_MS
DEFAULT_ATTEMPT_TIMEOUT_MS = defaults.ATTEMPT_TIMEOUT_MS


def parse_bootstrap(bootstrap: str | list[str]) -> list[tuple[str, int]]:
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out: list[tuple[str, int]] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap address {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("bootstrap is empty: give host:port[,host:port...]")
    return out


class Client(AdminCalls, ProduceCalls, ReadCalls, CoordinatorCalls):
    """The client: one façade over its roles, each in its own module (``base``: connections
    and retries; ``metadata``: the metadata cache; ``routing``: leader-routed and admin
    requests; ``admin``, ``produce``, ``reads``: the calls; ``coordinators``: Kafka's
    transaction and group coordinators). A Client is used by one thread
    at a time (``clone`` makes another)."""

    def __init__(
        self,
        bootstrap: str | list[str],
        *,
        client_id: str = "quorumlog",
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS,
        retry_backoff_ms: int = defaults.RETRY_BACKOFF_MS,
        retry_backoff_max_ms: int = defaults.RETRY_BACKOFF_MAX_MS,
        security: ClientSecurity | None = None,
    ) -> None:
        """``request_timeout_ms``: what one call may take, retries included;
        ``attempt_timeout_ms``: what one attempt may take (connecting included) before
        its node is given up on for this attempt; ``retry_backoff_ms`` /
        ``retry_backoff_max_ms``: the back-off between attempts (see ``backoff_s``)."""
        self._bootstrap = parse_bootstrap(bootstrap)
        for name, value in (
            ("request_timeout_ms", request_timeout_ms),
            ("attempt_timeout_ms", attempt_timeout_ms),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.security = security
        self._ssl_context = security.ssl_context() if security is not None else None
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.attempt_timeout_ms = attempt_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = max(retry_backoff_ms, retry_backoff_max_ms)
        # Each role's state (declared where it is used: base, metadata).
        self._nodes = {}
        self._conns = {}
        self._suspects = {}
        self._leaders = {}
        self._controller_id = m.UNKNOWN
        self.cluster_id = ""
        self._retired = set()
        self._racks = {}
        self._pool = None
        self._internal_counts = {}

    def clone(self) -> Client:
        """A client with this one's settings and connections of its own (a Client is used
        by one thread at a time) that shares what this one knows of the cluster: its
        nodes and partition leaders, one mapping each (an entry is replaced whole, never
        changed in place). What one learns, the others route by: a Producer's sender that
        has not sent yet knows the leaders the others learnt, where it asked one node at
        random, which could be a hung one (an attempt timeout lost for a partition whose
        leader runs)."""
        twin = Client(
            [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self._bootstrap],
            client_id=self.client_id,
            request_timeout_ms=self.request_timeout_ms,
            attempt_timeout_ms=self.attempt_timeout_ms,
            retry_backoff_ms=self.retry_backoff_ms,
            retry_backoff_max_ms=self.retry_backoff_max_ms,
            security=self.security,
        )
        twin._nodes = self._nodes
        twin._leaders = self._leaders
        twin._internal_counts = self._internal_counts
        return twin

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
