"""Quorum timing and sizing: one typed object with the KIP-595 / KRaft names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import defaults

__all__ = ["QuorumConfig"]


@dataclass(frozen=True, slots=True)
class QuorumConfig:
    """Timers of one partition's quorum, in milliseconds.

    Defaults are KRaft's (``replica.defaults.KRAFT_*``: ``quorum.election.timeout.ms`` 1000,
    ``quorum.fetch.timeout.ms`` 2000, ``quorum.election.backoff.max.ms`` 1000), so the
    protocol behaves like the reference before anyone tunes it; a node runs the shipped
    timing (``replica.defaults.QUORUM_*``). What they mean for failover after ``kill -9`` of a
    leader: followers notice after ``fetch_timeout_ms`` (the leader is silent), then one
    pre-vote and one vote round trip, so the next acked write comes ~fetch timeout + a few
    RTTs later (about 2.1 s with these defaults, ~1.1 s with fetch 1000 / election 500).
    A spurious election needs a follower to get no fetch answer for a whole fetch timeout
    while the leader is alive; under load fetches return as soon as data arrives and idle
    long-polls return every ``fetch_max_wait_ms``, so the fetch timeout must stay well
    above ``fetch_max_wait_ms + request_timeout_ms`` plus the worst disk-flush stall. The
    node team tunes ``fetch_timeout_ms`` down to meet its target; keep
    ``fetch_timeout_ms >= 2 * fetch_max_wait_ms`` and ``request_timeout_ms <
    fetch_timeout_ms - fetch_max_wait_ms`` so one lost fetch is retried before the
    follower gives up on its leader.

    Attributes (spec name in brackets):

    * ``election_timeout_ms`` [quorum.election.timeout.ms]: T; a voter with no leader
      starts an election after T + rand[0, jitter).
    * ``election_jitter_max_ms`` [quorum.election.jitter.max.ms]: the random part of the
      election timeout; ``None`` means T, i.e. KRaft's T + rand[0, T).
    * ``fetch_timeout_ms`` [quorum.fetch.timeout.ms]: a follower with no successful
      fetch for this long tries a pre-vote; a leader not fetched by a majority within
      1.5 x this resigns (check-quorum).
    * ``election_backoff_max_ms`` [quorum.election.backoff.max.ms]: cap of the back-off
      after a failed election, ``min(retry_backoff_ms * rand[0, 2^retries), max)``.
    * ``retry_backoff_ms`` [retry.backoff.ms]: base of the election back-off, of the
      EndQuorumEpoch successor ranks, and the wait before retrying a failed fetch.
    * ``retry_backoff_max_ms``: cap of the EndQuorumEpoch rank back-off
      ``min(retry_backoff_max_ms, retry_backoff_ms * 2^(rank-1))`` (KIP-595: one second).
    * ``request_timeout_ms`` [quorum.request.timeout.ms]: an unanswered Vote,
      BeginQuorumEpoch or EndQuorumEpoch is resent after this; an unanswered Fetch after
      ``fetch_max_wait_ms + request_timeout_ms``.
    * ``fetch_max_wait_ms`` / ``fetch_max_bytes`` [fetch.max.wait.ms, fetch.max.bytes]:
      long-poll bound and size bound of a follower's Fetch.
    * ``quiesce``: idle partitions stop fetching (``RaftReplica``'s quiescence). Only
      under a driver that keeps ``peer_seen`` and reports ``on_peer_change`` (the
      ``replica.driver`` does: the nodes and the simulator turn it on); a bare core
      would never notice a silent leader while quiesced.
    * ``disk_retry_ms``: a replica whose log refused a write (a full or failing disk)
      fetches again after this long, and writes again once the disk takes it.
    * ``rebalance_interval_ms`` [leader.imbalance.check.interval.ms]: how often a
      driver hands leadership back to each partition's preferred replica
      (``RaftReplica.hand_over``; Kafka's ``auto.leader.rebalance.enable``); None: never.
    * ``rebalance_imbalance_pct`` [leader.imbalance.per.broker.percentage]: a node's
      preferred partitions go back to it once more than this share of them is led
      elsewhere, and then all of them; below it, none.
    """

    election_timeout_ms: int = defaults.KRAFT_ELECTION_TIMEOUT_MS
    fetch_timeout_ms: int = defaults.KRAFT_FETCH_TIMEOUT_MS
    election_backoff_max_ms: int = defaults.KRAFT_ELECTION_BACKOFF_MAX_MS
    election_jitter_max_ms: int | None = None
    retry_backoff_ms: int = defaults.KRAFT_RETRY_BACKOFF_MS
    retry_backoff_max_ms: int = defaults.KRAFT_RETRY_BACKOFF_MAX_MS
    request_timeout_ms: int = defaults.KRAFT_REQUEST_TIMEOUT_MS
    fetch_max_wait_ms: int = defaults.KRAFT_FETCH_MAX_WAIT_MS
    fetch_max_bytes: int = defaults.KRAFT_FETCH_MAX_BYTES
    quiesce: bool = False
    disk_retry_ms: int = defaults.DISK_RETRY_MS
    rebalance_interval_ms: int | None = None
    rebalance_imbalance_pct: int = defaults.LEADER_IMBALANCE_PER_NODE_PCT

    def __post_init__(self) -> None:
        for name in (
            "election_timeout_ms",
            "fetch_timeout_ms",
            "retry_backoff_ms",
            "request_timeout_ms",
            "fetch_max_bytes",
            "disk_retry_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("election_backoff_max_ms", "retry_backoff_max_ms", "fetch_max_wait_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.election_jitter_max_ms is not None and self.election_jitter_max_ms < 0:
            raise ValueError("election_jitter_max_ms must be >= 0")

    @property
    def jitter_ms(self) -> int:
        """The random part of the election timeout actually used."""
        if self.election_jitter_max_ms is None:
            return self.election_timeout_ms
        return self.election_jitter_max_ms

    @property
    def heartbeat_ms(self) -> int:
        """Each node's heartbeat to each peer (what stands for quiesced partitions'
        fetches); a peer silent for ``fetch_timeout_ms`` (four of them) is stale."""
        return max(1, self.fetch_timeout_ms // 4)

    @property
    def quiesce_after_ms(self) -> int:
        """A leader quiesces a caught-up follower once nothing was appended for this long
        (one long-poll): a partition under load never quiesces between batches."""
        return self.fetch_max_wait_ms

    @property
    def check_quorum_timeout_ms(self) -> int:
        """A leader not fetched by a majority for this long resigns (1.5 x fetch timeout)."""
        return self.fetch_timeout_ms * 3 // 2

    @classmethod
    def from_properties(cls, props: dict[str, str | int]) -> QuorumConfig:
        """Build from the spec's dotted names (``quorum.fetch.timeout.ms`` ...)."""
        names = {
            "quorum.election.timeout.ms": "election_timeout_ms",
            "quorum.fetch.timeout.ms": "fetch_timeout_ms",
            "quorum.election.backoff.max.ms": "election_backoff_max_ms",
            "quorum.election.jitter.max.ms": "election_jitter_max_ms",
            "retry.backoff.ms": "retry_backoff_ms",
            "retry.backoff.max.ms": "retry_backoff_max_ms",
            "quorum.request.timeout.ms": "request_timeout_ms",
            "fetch.max.wait.ms": "fetch_max_wait_ms",
            "fetch.max.bytes": "fetch_max_bytes",
        }
        kwargs: dict[str, Any] = {}
        for key, value in props.items():
            if key not in names:
                raise ValueError(f"unknown quorum config {key!r}; known: {sorted(names)}")
            kwargs[names[key]] = int(value)
        return cls(**kwargs)
