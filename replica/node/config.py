"""One typed configuration object for a node."""

from __future__ import annotations

import argparse
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..protocol import max_batch_bytes
from .security import TlsFiles, node_principal, node_secret, read_secret


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{what} {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _parse_id_addresses(items: list[str], what: str, label: str) -> dict[int, tuple[str, int]]:
    """Comma lists of ``ID@HOST:PORT``; ``what`` and ``label`` name them in errors."""
    out: dict[int, tuple[str, int]] = {}
    for text in items:
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            ident, sep, addr = item.partition("@")
            if not sep or not ident.isdigit():
                raise ValueError(f"{what} {item!r} is not ID@HOST:PORT")
            out[int(ident)] = parse_host_port(addr, f"{label} {ident} address")
    return out


def ipaddress_is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def parse_voters(text: str) -> dict[int, tuple[str, int]]:
    voters = _parse_id_addresses([text], "voter", "voter")
    if not voters:
        raise ValueError("--voters is empty: give ID@HOST:PORT for every voter")
    return voters


def parse_peer_addresses(items: list[str]) -> dict[int, tuple[str, int]]:
    """``--peer-address ID@HOST:PORT`` (repeatable, or comma lists): where this node
    connects to peer ID for raft traffic, instead of its ``--voters`` address."""
    return _parse_id_addresses(items, "peer address", "peer")


# The node's name for the shipped max.message.bytes (replica.defaults says why).
DEFAULT_MAX_MESSAGE_BYTES = defaults.MAX_MESSAGE_BYTES
# The largest max.message.bytes a topic or node may set; topics may lower the limit, not
# raise it. Not the frame limit (a 63 MiB batch fits every frame, see max_batch_bytes) but
# time: each replica checks and writes one batch in one go on its event loop, and a
# follower flushes it before its next fetch, all within the fetch timeout (defaults.QUORUM_FETCH_TIMEOUT_MS) (a
# stalled loop times out every partition of the node at once). Measured on the loaded
# 2-core test machine (load 5-7): 8 MiB batches replicate with no election in every
# trial, 16 MiB ones now and then cause one, 32 MiB ones make leadership churn. A higher
# ceiling needs a longer fetch timeout, or appends off the event loop.
MAX_MESSAGE_BYTES_CEILING = DEFAULT_MAX_MESSAGE_BYTES


#: What a rack name may hold (Kafka takes any string; these survive every shell, unit
#: template and metrics label unquoted).
RACK_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def parse_rack(text: str | None) -> str | None:
    """``--rack``'s value, checked (None: not given)."""
    if text is None:
        return None
    if not RACK_NAME.match(text):
        raise SystemExit(
            f"quorumlog: --rack {text!r}: give 1-64 letters, digits, '.', '_', ':' or '-'"
        )
    return text


#: The most partitions a topic may have (a create, or a growth). Kafka sets none; what
#: bounds them is what a node can hold: with the replication factor at the number of
#: nodes, each node holds a replica of every partition (100,000 replicas take about 1 GB
#: of memory a node). The topic's metadata record (its whole assignment) and a Metadata
#: answer for all of it fit in their frames at this bound.
MAX_TOPIC_PARTITIONS = 100_000


def partitions_problem(partitions: int, what: str = "partitions") -> str | None:
    """Why a topic may not have ``partitions`` partitions, or None."""
    if not 1 <= partitions <= MAX_TOPIC_PARTITIONS:
        return f"{what} must be 1..{MAX_TOPIC_PARTITIONS}, got {partitions}"
    return None


def check_max_message_bytes(value: int, max_frame_bytes: int, what: str) -> str | None:
    """Why ``value`` is not an allowed max.message.bytes, or None."""
    ceiling = min(MAX_MESSAGE_BYTES_CEILING, max_batch_bytes(max_frame_bytes))
    if not 1 <= value <= ceiling:
        return (
            f"{what} must be 1..{ceiling} bytes (one batch of that size must replicate "
            f"well within the quorum fetch timeout and fit every frame), got {value}"
        )
    return None


def topic_defaults_problem(config: NodeConfig) -> str | None:
    """Why the node's defaults of topic configs are not values a topic could set, or
    None (the topics' own checks, ``topic_configs``)."""
    from .topic_configs import node_config_problem  # topic_configs imports this module

    return node_config_problem(
        {
            "segment.ms": config.segment_ms,
            "cleanup.policy": config.cleanup_policy,
            "min.cleanable.dirty.ratio": config.min_cleanable_dirty_ratio,
            "min.compaction.lag.ms": config.min_compaction_lag_ms,
            "max.compaction.lag.ms": config.max_compaction_lag_ms,
            "delete.retention.ms": config.delete_retention_ms,
        }
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class NodeConfig:
    node_id: int
    host: str
    port: int
    voters: dict[int, tuple[str, int]]
    data_dir: Path
    cluster_id: str
    # Every default is replica.defaults' (the Kafka / KIP config names are there).
    # Quorum timing (quorum.election.timeout.ms, quorum.fetch.timeout.ms).
    election_timeout_ms: int = defaults.QUORUM_ELECTION_TIMEOUT_MS
    fetch_timeout_ms: int = defaults.QUORUM_FETCH_TIMEOUT_MS
    # Storage (segment.bytes, retention.bytes, retention.ms).
    segment_bytes: int = defaults.SEGMENT_BYTES
    retention_bytes: int | None = defaults.RETENTION_BYTES
    retention_ms: int | None = defaults.RETENTION_MS
    # The topic configs' node defaults (segment.ms, cleanup.policy and compaction's:
    # ``topic_configs``); None is "never"/"no bound".
    segment_ms: int | None = defaults.SEGMENT_MS
    cleanup_policy: str = defaults.CLEANUP_POLICY
    min_cleanable_dirty_ratio: float = defaults.MIN_CLEANABLE_DIRTY_RATIO
    min_compaction_lag_ms: int = defaults.MIN_COMPACTION_LAG_MS
    max_compaction_lag_ms: int | None = defaults.MAX_COMPACTION_LAG_MS
    delete_retention_ms: int = defaults.DELETE_RETENTION_MS
    # group.initial.rebalance.delay.ms: how long a new group's first rebalance waits for
    # more members.
    group_initial_rebalance_delay_ms: int = defaults.GROUP_INITIAL_REBALANCE_DELAY_MS
    # Drop the logs' pages from the page cache once synced (--page-cache drop).
    drop_synced_pages: bool = False
    # Transport.
    max_frame_bytes: int = defaults.MAX_FRAME_BYTES
    # max.message.bytes for topics that set none.
    max_message_bytes: int = defaults.MAX_MESSAGE_BYTES
    # replica.fetch.max.wait.ms: how long a follower's fetch may be parked at the leader.
    replica_fetch_max_wait_ms: int = defaults.REPLICA_FETCH_MAX_WAIT_MS
    produce_timeout_ms: int = defaults.PRODUCE_TIMEOUT_MS
    # Idle partitions stop fetching; one heartbeat per pair of nodes stands for them.
    quiesce: bool = defaults.QUIESCE
    leader_imbalance_check_interval_ms: int = defaults.LEADER_IMBALANCE_CHECK_INTERVAL_MS
    scrub_bytes_per_second: int = defaults.SCRUB_BYTES_PER_SECOND
    cleaner_bytes_per_second: int = defaults.CLEANER_BYTES_PER_SECOND
    catch_up_bytes_per_second: int = defaults.CATCH_UP_BYTES_PER_S
    # Raft traffic to these peers goes here instead of their --voters address (e.g.
    # through a fault-injecting proxy); Metadata still advertises --voters.
    peer_addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    # Security (None: plaintext, no authentication; loopback only unless --allow-insecure).
    tls: TlsFiles | None = None
    auth_config: Path | None = None
    # The principal and secret this node authenticates as to its peers.
    auth_principal: str | None = None
    auth_secret: str | None = field(default=None, repr=False)
    # Plaintext clusters (no auth_config): the secret nodes prove membership with before
    # the node accepts their raft traffic (security.node_secret).
    cluster_secret: str | None = field(default=None, repr=False)
    # The Kafka listener (kafka_listener/; None: off) and every node's Kafka address, as
    # Metadata answers it to Kafka clients (this node's listener if not given).
    kafka_listen: tuple[str, int] | None = None
    kafka_voters: dict[int, tuple[str, int]] = field(default_factory=dict)
    # offsets.topic.num.partitions: used by the metadata leader creating __consumer_offsets.
    offsets_topic_partitions: int = defaults.OFFSETS_TOPIC_NUM_PARTITIONS
    # transaction.state.log.num.partitions and transaction.max.timeout.ms.
    transaction_state_partitions: int = defaults.TRANSACTION_STATE_NUM_PARTITIONS
    transaction_max_timeout_ms: int = defaults.TRANSACTION_MAX_TIMEOUT_MS
    # --allow-insecure: plaintext on non-loopback addresses, SASL without TLS.
    allow_insecure: bool = False
    # The Prometheus endpoint (metrics.py; None: off): loopback, or over the node's TLS.
    metrics_listen: tuple[str, int] | None = None
    # Per-partition series too (high watermark, log end, follower lag): 10,000 partitions
    # would otherwise mean tens of thousands of series.
    metrics_per_partition: bool = False
    # serve --join: nodes of a running cluster to join through (``join.join`` fills
    # ``voters``, ``kafka_voters``, ``metadata_voters`` and ``cluster_id`` from them).
    join: list[tuple[str, int]] = field(default_factory=list)
    # The voters the metadata quorum started with (None: ``voters``, a new cluster's).
    metadata_voters: list[int] | None = None
    # broker.rack (``--rack``): the failure domain placement keeps a partition's replicas
    # apart by; None: none (the node is a rack of its own).
    rack: str | None = None
    # The heartbeat incarnation the node's driver uses (None: drawn at start); a joining
    # node registers with it before it starts.
    incarnation: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.node_id not in self.voters:
            raise ValueError(
                f"--node-id {self.node_id} is not among --voters {sorted(self.voters)}"
            )
        if not self.cluster_id and not self.join:
            raise ValueError("--cluster-id must not be empty")
        unknown = sorted(set(self.peer_addresses) - set(self.voters))
        if unknown:
            raise ValueError(f"--peer-address names node(s) {unknown} that are not --voters")
        problem = check_max_message_bytes(
            self.max_message_bytes, self.max_frame_bytes, "--max-message-bytes"
        )
        if problem:
            raise ValueError(problem)
        if self.auth_config is not None and self.cluster_secret is not None:
            raise ValueError(
                "--cluster-secret-file/--cluster-secret-env is for plaintext clusters; with "
                "--auth-config nodes authenticate as their node principals"
            )
        if (
            self.kafka_listen is not None
            and self.auth_config is not None
            and self.tls is None
            and not self.allow_insecure
        ):
            raise ValueError(
                "--kafka-listen with --auth-config but no TLS would take Kafka clients' SASL "
                "exchanges in the clear: give --tls-cert/--tls-key/--tls-ca (clients then use "
                "security.protocol=SASL_SSL), or pass --allow-insecure for SASL_PLAINTEXT"
            )
        unknown = sorted(set(self.kafka_voters) - set(self.voters))
        if unknown:
            raise ValueError(f"--kafka-voters names node(s) {unknown} that are not --voters")
        if self.kafka_voters and self.kafka_listen is None:
            raise ValueError("--kafka-voters needs --kafka-listen")
        if self.metrics_listen is not None and not is_loopback(self.metrics_listen[0]):
            if self.tls is None:
                raise ValueError(
                    f"--metrics-listen {self.metrics_listen[0]} is not a loopback address: "
                    "bind one (e.g. 127.0.0.1), or give the node TLS (--tls-cert, --tls-key, "
                    "--tls-ca) and the metrics are served over it"
                )
        problem = topic_defaults_problem(self)
        if problem:
            raise ValueError(problem)
        if self.group_initial_rebalance_delay_ms < 0:
            raise ValueError(
                "--group-initial-rebalance-delay-ms must be >= 0, got "
                f"{self.group_initial_rebalance_delay_ms}"
            )
        for what, n in (
            ("--offsets-topic-partitions", self.offsets_topic_partitions),
            ("--transaction-state-partitions", self.transaction_state_partitions),
        ):
            problem = partitions_problem(n, what)
            if problem:
                raise ValueError(problem)
        if self.transaction_max_timeout_ms < 1:
            raise ValueError(
                f"--transaction-max-timeout-ms must be >= 1, got {self.transaction_max_timeout_ms}"
            )
        if self.auth_config is None and self.cluster_secret is None and self.join:
            raise ValueError(
                "--join needs the cluster's secret (--cluster-secret-file FILE or "
                "--cluster-secret-env VAR) or --auth-config: a node registers itself as a node"
            )
        if self.auth_config is None and self.cluster_secret is None and len(self.voters) > 1:
            raise ValueError(
                f"a cluster of {len(self.voters)} voters without --auth-config needs the "
                "cluster secret its nodes authenticate to each other with: "
                "--cluster-secret-file FILE (or --cluster-secret-env VAR); "
                "`quorumlog cluster new-secret FILE` creates one"
            )

    def peer_credentials(self) -> tuple[str, str] | None:
        """Who this node authenticates as to its peers: its node principal (secure), or
        node-<id> with the secret derived from the cluster secret (plaintext)."""
        if self.auth_principal and self.auth_secret:
            return self.auth_principal, self.auth_secret
        if self.cluster_secret:
            return node_principal(self.node_id), node_secret(self.cluster_secret, self.node_id)
        return None

    @staticmethod
    def from_args(args: argparse.Namespace) -> NodeConfig:
        host, port = parse_host_port(args.listen, "--listen")
        tls, auth_config, principal, secret = _security_from_args(args)
        try:
            cluster_secret = read_secret(
                getattr(args, "cluster_secret_file", None),
                getattr(args, "cluster_secret_env", None),
                "cluster",
            )
        except ValueError as exc:
            raise SystemExit(f"quorumlog: {exc}") from None
        if (
            not is_loopback(host)
            and not (tls is not None and auth_config is not None)
            and not args.allow_insecure
        ):
            raise SystemExit(
                f"quorumlog: refusing to serve plaintext without authentication on {host}: "
                "bind a loopback address, enable TLS and authentication (--tls-cert, "
                "--tls-key, --tls-ca, --auth-config), or pass --allow-insecure"
            )
        kafka_listen = kafka_voters = None
        if getattr(args, "kafka_listen", None):
            kafka_listen = parse_host_port(args.kafka_listen, "--kafka-listen")
            if (
                not is_loopback(kafka_listen[0])
                and not (tls is not None and auth_config is not None)
                and not args.allow_insecure
            ):
                raise SystemExit(
                    f"quorumlog: refusing to serve Kafka clients without authentication on "
                    f"{kafka_listen[0]}: bind a loopback address, enable TLS and "
                    "authentication (SASL_SSL), or pass --allow-insecure"
                )
        if getattr(args, "kafka_voters", None):
            kafka_voters = parse_voters(args.kafka_voters)
        join = [
            parse_host_port(a.strip(), "--join")
            for a in (getattr(args, "join", None) or "").split(",")
            if a.strip()
        ]
        if bool(join) == bool(args.voters):
            raise SystemExit(
                "quorumlog: give --voters (a new cluster's voters) or --join HOST:PORT (a "
                "running cluster's node), not both"
                if join
                else "quorumlog: give --voters ID@HOST:PORT,... to start a new cluster, or "
                "--join HOST:PORT to join a running one"
            )
        if not join and not args.cluster_id:
            raise SystemExit("quorumlog: --voters needs --cluster-id")
        if join and ipaddress_is_wildcard(host):
            raise SystemExit(
                f"quorumlog: --join registers --listen {host}:{port} as where the other "
                "nodes reach this one: give the address they can reach, not a wildcard"
            )
        metrics_listen = None
        if getattr(args, "metrics_listen", None):
            metrics_listen = parse_host_port(args.metrics_listen, "--metrics-listen")
        return NodeConfig(
            node_id=args.node_id,
            host=host,
            port=port,
            voters=parse_voters(args.voters) if args.voters else {args.node_id: (host, port)},
            data_dir=Path(args.data_dir),
            cluster_id=args.cluster_id or "",
            election_timeout_ms=args.election_timeout_ms,
            fetch_timeout_ms=args.fetch_timeout_ms,
            segment_bytes=args.segment_bytes,
            retention_bytes=args.retention_bytes,
            retention_ms=args.retention_ms,
            segment_ms=getattr(args, "segment_ms", defaults.SEGMENT_MS),
            cleanup_policy=getattr(args, "cleanup_policy", defaults.CLEANUP_POLICY),
            min_cleanable_dirty_ratio=getattr(
                args, "min_cleanable_dirty_ratio", defaults.MIN_CLEANABLE_DIRTY_RATIO
            ),
            min_compaction_lag_ms=getattr(
                args, "min_compaction_lag_ms", defaults.MIN_COMPACTION_LAG_MS
            ),
            max_compaction_lag_ms=getattr(
                args, "max_compaction_lag_ms", defaults.MAX_COMPACTION_LAG_MS
            ),
            delete_retention_ms=getattr(args, "delete_retention_ms", defaults.DELETE_RETENTION_MS),
            group_initial_rebalance_delay_ms=getattr(
                args,
                "group_initial_rebalance_delay_ms",
                defaults.GROUP_INITIAL_REBALANCE_DELAY_MS,
            ),
            drop_synced_pages=getattr(args, "page_cache", "keep") == "drop",
            max_message_bytes=args.max_message_bytes,
            scrub_bytes_per_second=args.scrub_bytes_per_second,
            cleaner_bytes_per_second=getattr(
                args, "cleaner_bytes_per_second", defaults.CLEANER_BYTES_PER_SECOND
            ),
            catch_up_bytes_per_second=getattr(
                args, "catch_up_bytes_per_second", defaults.CATCH_UP_BYTES_PER_S
            ),
            leader_imbalance_check_interval_ms=args.leader_imbalance_check_interval_ms,
            tls=tls,
            auth_config=auth_config,
            auth_principal=principal,
            auth_secret=secret,
            cluster_secret=cluster_secret,
            peer_addresses=parse_peer_addresses(getattr(args, "peer_address", None) or []),
            kafka_listen=kafka_listen,
            kafka_voters=kafka_voters or {},
            offsets_topic_partitions=getattr(
                args, "offsets_topic_partitions", defaults.OFFSETS_TOPIC_NUM_PARTITIONS
            ),
            transaction_state_partitions=getattr(
                args, "transaction_state_partitions", defaults.TRANSACTION_STATE_NUM_PARTITIONS
            ),
            transaction_max_timeout_ms=getattr(
                args, "transaction_max_timeout_ms", defaults.TRANSACTION_MAX_TIMEOUT_MS
            ),
            allow_insecure=bool(args.allow_insecure),
            quiesce=getattr(args, "quiesce", defaults.QUIESCE),
            metrics_listen=metrics_listen,
            metrics_per_partition=bool(getattr(args, "metrics_per_partition", False)),
            join=join,
            rack=parse_rack(getattr(args, "rack", None)),
        )


def _security_from_args(
    args: argparse.Namespace,
) -> tuple[TlsFiles | None, Path | None, str | None, str | None]:
    cert, key, ca = (getattr(args, n, None) for n in ("tls_cert", "tls_key", "tls_ca"))
    tls = None
    if cert or key or ca:
        if not (cert and key and ca):
            raise SystemExit("quorumlog: TLS needs all of --tls-cert, --tls-key and --tls-ca")
        tls = TlsFiles(cert, key, ca, client_auth=bool(getattr(args, "tls_client_auth", False)))
    auth = getattr(args, "auth_config", None)
    if not auth:
        return tls, None, None, None
    principal = getattr(args, "auth_principal", None) or f"node-{args.node_id}"
    try:
        secret = read_secret(
            getattr(args, "auth_secret_file", None),
            getattr(args, "auth_secret_env", None),
            f"node principal {principal!r}",
        )
    except ValueError as exc:
        raise SystemExit(f"quorumlog: {exc}") from None
    if secret is None:
        raise SystemExit(
            "quorumlog: --auth-config needs this node's own secret for its peers: "
            "--auth-secret-file FILE or --auth-secret-env VAR"
        )
    return tls, Path(auth), principal, secret
