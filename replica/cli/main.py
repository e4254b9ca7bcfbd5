"""The ``quorumlog`` command: serve, cluster, topic, produce, consume, describe, partition, perf."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from typing import Any

from .. import defaults
from ..perf import COMMANDS as PERF

log = logging.getLogger("quorumlog")


def _setup_logging(level: str, log_format: str = "text", node_id: int | None = None) -> None:
    from .logformat import setup_logging

    setup_logging(level, log_format, node_id)


def _add_bootstrap(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", "-b", required=True, help="host:port[,host:port...] of any nodes")
    g = p.add_argument_group("security (TLS and SCRAM authentication)")
    g.add_argument("--tls-ca", default=None, help="CA file: connect with TLS, verify the nodes")
    g.add_argument("--tls-cert", default=None, help="client certificate (mutual TLS)")
    g.add_argument("--tls-key", default=None, help="client key (mutual TLS)")
    g.add_argument("--principal", default=None, help="authenticate as this principal")
    g.add_argument("--secret-file", default=None, help="file whose first line is the secret")
    g.add_argument("--secret-env", default=None, help="environment variable holding the secret")


def _client(args: argparse.Namespace) -> Any:
    from ..client import Client, ClientSecurity

    security = None
    if args.tls_ca or args.principal or args.tls_cert:
        security = ClientSecurity(
            ca_file=args.tls_ca,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
            principal=args.principal,
            secret_file=args.secret_file,
            secret_env=args.secret_env,
        )
    return Client(args.bootstrap, security=security)


def cmd_auth_add_principal(args: argparse.Namespace) -> int:
    """Add or replace a principal's SCRAM verifier in an --auth-config file. The secret is
    read from --secret-file / --secret-env, or generated and printed once."""
    import secrets as _secrets
    from pathlib import Path

    from ..node.security import AuthConfig, Principal, node_id_of_name, read_secret
    from ..protocol.scram import ScramError, make_verifier, mechanism_named

    path = Path(args.config)
    auth = AuthConfig.load(path) if path.exists() else AuthConfig()
    secret = read_secret(args.secret_file, args.secret_env, f"principal {args.name!r}")
    generated = secret is None
    if secret is None:
        secret = _secrets.token_urlsafe(24)
    topics = tuple(t.strip() for t in (args.topics or "").split(",") if t.strip())
    node_id = args.node_id
    if node_id is not None and args.kind != "node":
        raise ValueError("--node-id is only for --kind node")
    if args.kind == "node" and node_id is None:
        node_id = node_id_of_name(args.name)
        if node_id is None:
            raise ValueError(
                f"node principal {args.name!r} needs --node-id (or a name node-<id>): raft "
                "messages on its connections must claim that node id"
            )
    try:
        mechanisms = [mechanism_named(n.strip()) for n in args.mechanisms.split(",") if n.strip()]
    except ScramError as exc:
        raise ValueError(f"--mechanisms: {exc}") from None
    if not mechanisms:
        raise ValueError("--mechanisms names no mechanism")
    auth.add(
        Principal(args.name, args.kind, topics, node_id),
        *(make_verifier(secret, iterations=args.iterations, mechanism=m) for m in mechanisms),
    )
    auth.save(path)
    print(f"principal {args.name!r} ({args.kind}) written to {path}", file=sys.stderr)
    if generated:
        print(secret)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ..node.config import NodeConfig
    from ..node.node import run_node

    _setup_logging(args.log_level, args.log_format, args.node_id)
    config = NodeConfig.from_args(args)
    return run_node(config)


def cmd_cluster_new_secret(args: argparse.Namespace) -> int:
    """Write a fresh cluster secret to a new file readable only by its owner; copy it to
    every node and start each with ``serve --cluster-secret-file FILE``."""
    from pathlib import Path

    from ..node.security import new_cluster_secret, write_secret_file

    path = Path(args.file)
    if path.exists():
        raise ValueError(f"{path} exists; refusing to replace a cluster secret")
    write_secret_file(path, new_cluster_secret())
    print(f"cluster secret written to {path} (mode 0600)", file=sys.stderr)
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    from ..node.cluster import LocalCluster, rack_layout

    _setup_logging("WARNING")
    racks: dict[int, str] = {}
    if args.racks is not None or args.nodes_per_rack is not None:
        racks = rack_layout(args.nodes_per_rack or 1, args.racks or 1)
        if args.nodes is not None and args.nodes != len(racks):
            raise ValueError(
                f"--nodes {args.nodes} is not --nodes-per-rack x --racks ({len(racks)}): "
                "give one or the other"
            )
    nodes = len(racks) or args.nodes or 3
    cluster = LocalCluster(
        nodes,
        args.data_dir,
        log_level=args.log_level,
        kafka=args.kafka,
        metrics=args.metrics,
        racks=racks,
    )
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with cluster:
        print(f"quorumlog cluster of {nodes} nodes is up (data under {cluster.data_dir})")
        print(f"bootstrap: {cluster.bootstrap}")
        for rack in sorted(set(racks.values())):
            print(f"{rack}: nodes {[n for n, r in racks.items() if r == rack]}")
        if args.kafka:
            print(f"Kafka clients' bootstrap.servers: {cluster.kafka_bootstrap}")
        if args.metrics:
            endpoints = ",".join(f"{cluster.host}:{p}" for p in cluster.metrics_ports.values())
            print(f"metrics endpoints (quorumlog top -b ...): {endpoints}")
        print(f"cluster secret (node-to-node authentication): {cluster.cluster_secret_file}")
        print("Ctrl-C stops every node.")
        sys.stdout.flush()
        while not stop:
            dead = [n for n in cluster.procs if not cluster.is_running(n)]
            if dead:
                print(f"node(s) {dead} exited; see {cluster.log_path(dead[0])}", file=sys.stderr)
                return 1
            time.sleep(0.2)
    print("stopped")
    return 0


def cmd_topic(args: argparse.Namespace) -> int:

    with _client(args) as c:
        if args.action == "create":
            partitions = args.partitions or 1
            warning = c.create_topic(
                args.name,
                partitions,
                args.replication_factor,
                max_message_bytes=args.max_message_bytes,
                configs=_topic_configs(args.config),
            )
            c.wait_for_leaders(args.name)
            print(f"created topic {args.name} with {partitions} partition(s)")
            if warning:
                print(f"rack warning: {warning}")
        elif args.action == "alter":
            configs: dict[str, str | None] = dict(_topic_configs(args.config))
            configs.update(dict.fromkeys(args.delete_config))
            warning = ""
            if args.partitions or configs:
                warning = c.alter_topic(args.name, partitions=args.partitions, configs=configs)
            if args.replication_factor is not None:
                from .reassign import alter_replication_factor

                if not alter_replication_factor(c, args.name, args.replication_factor, 1800.0):
                    return 1
            c.wait_for_leaders(args.name)
            t = c.metadata([args.name])[args.name]
            shown = ", ".join(f"{k}={v}" for k, v in sorted(t.configs.items())) or "none"
            print(f"altered topic {args.name}: {len(t.partitions)} partition(s), configs {shown}")
            if warning:
                print(f"rack warning: {warning}")
        elif args.action == "delete":
            c.delete_topic(args.name)
            print(f"deleted topic {args.name}")
        else:
            for t in c.list_topics():
                print(t)
    return 0


def _topic_configs(pairs: list[str]) -> dict[str, str]:
    """``--config k=v`` arguments as a dict (a malformed one exits with a usage error)."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(
                f"--config takes NAME=VALUE (e.g. retention.ms=86400000), got {pair!r}"
            )
        out[name.strip()] = value.strip()
    return out


def cmd_produce(args: argparse.Namespace) -> int:
    from ..client.producer import Producer

    with _client(args) as c:
        producer = Producer(c, acks=args.acks, linger_ms=args.linger_ms)
        count = 0
        if args.generate:
            value = b"x" * args.value_size
            for _ in range(args.generate):
                producer.send(args.topic, value, partition=args.partition)
                count += 1
        else:
            for line in sys.stdin.buffer:
                line = line.rstrip(b"\n")
                key: bytes | None = None
                if args.key_separator:
                    k, sep, v = line.partition(args.key_separator.encode())
                    if sep:
                        key, line = k, v
                producer.send(args.topic, line, key=key, partition=args.partition)
                count += 1
        results = producer.flush()
        producer.close()
        print(f"produced {count} record(s) to {args.topic}", file=sys.stderr)
        if args.verbose:
            for r in results:
                print(
                    json.dumps(
                        {
                            "partition": r.partition,
                            "base_offset": r.base_offset,
                            "last_offset": r.last_offset,
                            "epoch": r.leader_epoch,
                        }
                    )
                )
    return 0


def cmd_consume(args: argparse.Namespace) -> int:

    with _client(args) as c:
        meta = c.metadata([args.topic])[args.topic]
        parts = [args.partition] if args.partition is not None else sorted(meta.partitions)
        positions = {p: c.list_offsets(args.topic, p, args.from_).offset for p in parts}
        seen = 0
        deadline = time.monotonic() + args.timeout_ms / 1000 if args.timeout_ms else None
        while args.max_records is None or seen < args.max_records:
            progressed = False
            for p in parts:
                res = c.fetch(
                    args.topic, p, positions[p], max_wait_ms=100 if len(parts) == 1 else 0
                )
                table = res.to_arrow(start_offset=positions[p])
                if table.num_rows:
                    progressed = True
                    for row in table.to_pylist():
                        value = row["value"]
                        text = value.decode(errors="replace") if value is not None else ""
                        if args.print_offsets:
                            print(f"{p}\t{row['offset']}\t{row['leaderEpoch']}\t{text}")
                        else:
                            print(text)
                        seen += 1
                last = res.last_offset_and_epoch()
                if last is not None and last.offset + 1 > positions[p]:
                    positions[p] = min(last.offset + 1, res.high_watermark)
            sys.stdout.flush()
            if deadline is not None and time.monotonic() > deadline:
                break
            if not progressed and deadline is None and not args.follow:
                break
    return 0


def cmd_describe(args: argparse.Namespace) -> int:

    with _client(args) as c:
        meta = c.metadata([args.topic] if args.topic else None)
        rows = []
        for name, t in meta.items():
            for p in sorted(t.partitions):
                pm = t.partitions[p]
                try:
                    q = c.describe_quorum(name, p)
                    reps = ", ".join(
                        f"{v.replica_id}:{v.end_offset}(lag {v.lag})" for v in q.voters
                    )
                except Exception as exc:  # a partition without a leader still gets a row
                    reps = f"unavailable ({exc})"
                rows.append(
                    (
                        name,
                        str(p),
                        str(pm.leader_id),
                        str(pm.leader_epoch),
                        str(pm.high_watermark),
                        reps,
                    )
                )
        header = (
            "TOPIC",
            "PARTITION",
            "LEADER",
            "EPOCH",
            "HIGH-WATERMARK",
            "REPLICAS (id:end offset)",
        )
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        for name, t in meta.items():
            if t.configs:
                shown = ", ".join(f"{k}={v}" for k, v in sorted(t.configs.items()))
                print(f"{name} configs: {shown}")
        _describe_racks(c, meta)
    return 0


def _describe_racks(c: Any, meta: dict[str, Any]) -> None:
    """The nodes' racks, and the described partitions whose replicas share one though
    the racks could keep them apart (nothing without racks)."""
    from ..client.balance import rack_problems
    from .reassign import cluster_view

    racks = c.node_racks
    if not racks:
        return
    by_rack: dict[str, list[int]] = {}
    for node in c.node_ids:
        by_rack.setdefault(racks.get(node, "(none)"), []).append(node)
    print(
        "racks: "
        + "; ".join(f"{r}: nodes {', '.join(map(str, n))}" for r, n in sorted(by_rack.items()))
    )
    assignments, nodes = cluster_view(c)
    for line in rack_problems(assignments, nodes, racks, meta):
        print(f"rack warning: {line}")


def cmd_force_leader(args: argparse.Namespace) -> int:

    if not args.i_understand_data_loss:
        print(
            "force-leader is an UNCLEAN leader election: node "
            f"{args.node} will lead {args.topic}/{args.partition} without a majority, and committed "
            "records it lacks are LOST (consumers will see a truncation).\n"
            "Re-run with --i-understand-data-loss to proceed.",
            file=sys.stderr,
        )
        return 2
    with _client(args) as c:
        epoch = c.force_leader(args.topic, args.partition, args.node, confirm=True)
    print(f"node {args.node} now leads {args.topic}/{args.partition} in epoch {epoch}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quorumlog", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run one node")
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML file of flags: each key a flag's name without its dashes (node-id = 1); "
        "a flag on the command line wins; an unknown key is an error",
    )
    p.add_argument("--node-id", type=int, required=True)
    p.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    p.add_argument(
        "--voters",
        help="id@host:port,... of every voter (this node included): how a new cluster starts",
    )
    p.add_argument(
        "--join",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="join a running cluster through any of its nodes instead of --voters: the node "
        "registers itself and follows the metadata quorum as an observer (`quorumlog cluster "
        "add-voter` makes it a voter)",
    )
    p.add_argument("--data-dir", required=True)
    p.add_argument("--cluster-id", help="required with --voters; with --join, checked if given")
    p.add_argument(
        "--rack",
        default=None,
        metavar="NAME",
        help="the failure domain this node stands in (broker.rack: a machine, a rack, a "
        "zone): a partition's replicas go to distinct racks while there are as many racks "
        "as replicas",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text lines, or one JSON object a line (time, level, logger, node, topic and "
        "partition of a line about one, message); both name the node id",
    )
    # The node's integer knobs: (flag, shipped default, what it is).
    for flag, default, what in (
        (
            "--election-timeout-ms",
            defaults.QUORUM_ELECTION_TIMEOUT_MS,
            "quorum.election.timeout.ms",
        ),
        ("--fetch-timeout-ms", defaults.QUORUM_FETCH_TIMEOUT_MS, "quorum.fetch.timeout.ms"),
        ("--segment-bytes", defaults.SEGMENT_BYTES, "segment.bytes"),
        ("--retention-bytes", defaults.RETENTION_BYTES, "retention.bytes per partition"),
        ("--retention-ms", defaults.RETENTION_MS, "retention.ms"),
        ("--segment-ms", defaults.SEGMENT_MS, "segment.ms: roll a segment this old"),
        (
            "--min-compaction-lag-ms",
            defaults.MIN_COMPACTION_LAG_MS,
            "min.compaction.lag.ms: compacted topics keep every record this young",
        ),
        (
            "--max-compaction-lag-ms",
            defaults.MAX_COMPACTION_LAG_MS,
            "max.compaction.lag.ms: compact a record at most this long after it is written",
        ),
        (
            "--delete-retention-ms",
            defaults.DELETE_RETENTION_MS,
            "delete.retention.ms: a compacted topic's tombstones stay this long",
        ),
        (
            "--group-initial-rebalance-delay-ms",
            defaults.GROUP_INITIAL_REBALANCE_DELAY_MS,
            "group.initial.rebalance.delay.ms: a new consumer group's first rebalance waits "
            "this long for more members (0 = none)",
        ),
        (
            "--max-message-bytes",
            defaults.MAX_MESSAGE_BYTES,
            "max.message.bytes for topics that set none: the largest record batch a "
            "produce may carry",
        ),
        (
            "--leader-imbalance-check-interval-ms",
            defaults.LEADER_IMBALANCE_CHECK_INTERVAL_MS,
            "leader.imbalance.check.interval: hand leadership back to each partition's "
            "preferred replica this often (0 = never)",
        ),
        (
            "--scrub-bytes-per-second",
            defaults.SCRUB_BYTES_PER_SECOND,
            "background CRC check of sealed segments, bytes per second for the node "
            "(0 = off); damage found is repaired from the leader",
        ),
        (
            "--cleaner-bytes-per-second",
            defaults.CLEANER_BYTES_PER_SECOND,
            "log.cleaner.io.max.bytes.per.second: the log cleaner's pace compacting topics "
            "whose cleanup.policy is compact, bytes read and written per second for the "
            "node (0 = unthrottled)",
        ),
        (
            "--catch-up-bytes-per-second",
            defaults.CATCH_UP_BYTES_PER_S,
            "the replication throttle: bytes per second this node's leaders send replicas "
            "a reassignment is adding, over all partitions (0 = unthrottled)",
        ),
    ):
        shown = "unlimited" if default is None else "%(default)s"
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {shown})")
    p.add_argument(
        "--cleanup-policy",
        default=defaults.CLEANUP_POLICY,
        metavar="POLICY",
        help="cleanup.policy for topics that set none: delete (retention deletes old "
        "segments), compact (keep the latest record of each key) or compact,delete "
        "(default %(default)s)",
    )
    p.add_argument(
        "--min-cleanable-dirty-ratio",
        type=float,
        default=defaults.MIN_CLEANABLE_DIRTY_RATIO,
        metavar="RATIO",
        help="min.cleanable.dirty.ratio: compact a log once this share of it is not yet "
        "compacted (default %(default)s)",
    )
    p.add_argument(
        "--peer-address",
        action="append",
        default=[],
        metavar="ID@HOST:PORT",
        help="connect to peer ID here for raft traffic instead of its --voters address "
        "(repeatable or a comma list; e.g. through a fault-injecting proxy)",
    )
    p.add_argument(
        "--allow-insecure",
        action="store_true",
        help="allow plaintext on a non-loopback address, and Kafka SASL without TLS",
    )
    p.add_argument(
        "--page-cache",
        choices=("keep", "drop"),
        default="keep",
        help="drop: once a log's writes are synced, ask the kernel to drop their pages "
        "from the page cache, so that the memory is reused at once (on a virtual machine "
        "whose host takes back freed memory, a new page costs several times a reused "
        "one); reads past the in-memory tail then come from the disk. keep: the kernel "
        "decides, as Kafka's brokers do (default)",
    )
    p.add_argument(
        "--no-quiesce",
        dest="quiesce",
        action="store_false",
        help="idle partitions keep long-polling instead of quiescing (for comparisons)",
    )
    p.add_argument(
        "--kafka-listen",
        default=None,
        metavar="HOST:PORT",
        help="also serve Kafka clients here (plaintext; off by default)",
    )
    p.add_argument(
        "--kafka-voters",
        default=None,
        metavar="ID@HOST:PORT,...",
        help="every node's --kafka-listen address, for the Metadata Kafka clients get "
        "(default: this node's only)",
    )
    p.add_argument(
        "--offsets-topic-partitions",
        type=int,
        default=defaults.OFFSETS_TOPIC_NUM_PARTITIONS,
        help="offsets.topic.num.partitions: partitions of __consumer_offsets, where Kafka "
        "consumer groups commit, when this node creates it (default %(default)s)",
    )
    p.add_argument(
        "--transaction-state-partitions",
        type=int,
        default=defaults.TRANSACTION_STATE_NUM_PARTITIONS,
        help="transaction.state.log.num.partitions: partitions of __transaction_state, "
        "where Kafka transactional ids are coordinated, when this node creates it "
        "(default %(default)s)",
    )
    p.add_argument(
        "--transaction-max-timeout-ms",
        type=int,
        default=defaults.TRANSACTION_MAX_TIMEOUT_MS,
        help="transaction.max.timeout.ms: the longest transaction.timeout.ms a Kafka "
        "producer may ask for (default %(default)s)",
    )
    p.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default; a "
        "non-loopback HOST needs the node's TLS, and is then served over https)",
    )
    p.add_argument(
        "--metrics-per-partition",
        action="store_true",
        help="also serve per-partition series (high watermark, log end, follower lag); "
        "per-topic and per-node aggregates are always served",
    )
    g = p.add_argument_group("security (TLS and SCRAM authentication)")
    g.add_argument("--tls-cert", default=None, help="this node's certificate (PEM)")
    g.add_argument("--tls-key", default=None, help="this node's private key (PEM)")
    g.add_argument("--tls-ca", default=None, help="CA that signed the nodes' (and clients') certs")
    g.add_argument(
        "--tls-client-auth", action="store_true", help="require client certificates (mutual TLS)"
    )
    g.add_argument("--auth-config", default=None, help="principals file (SCRAM verifiers)")
    g.add_argument(
        "--auth-principal", default=None, help="this node's principal (default node-<id>)"
    )
    g.add_argument("--auth-secret-file", default=None, help="this node's secret, first line")
    g.add_argument("--auth-secret-env", default=None, help="env variable with this node's secret")
    g.add_argument(
        "--cluster-secret-file",
        default=None,
        help="plaintext clusters (no --auth-config): file whose first line is the cluster "
        "secret nodes authenticate to each other with (`quorumlog cluster new-secret FILE`); "
        "required with more than one voter",
    )
    g.add_argument(
        "--cluster-secret-env", default=None, help="env variable holding the cluster secret"
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("auth", help="principals and SCRAM verifiers for --auth-config")
    asub = p.add_subparsers(dest="action", required=True)
    ap = asub.add_parser("add-principal", help="add or replace a principal's verifier")
    ap.add_argument("name")
    ap.add_argument("--kind", choices=["node", "producer", "consumer", "admin"], required=True)
    ap.add_argument("--config", required=True, help="the principals JSON file (created if absent)")
    ap.add_argument("--topics", default="", help="granted topic globs, comma-separated")
    ap.add_argument("--secret-file", default=None)
    ap.add_argument("--secret-env", default=None)
    ap.add_argument("--iterations", type=int, default=4096)
    ap.add_argument(
        "--mechanisms",
        default="SCRAM-SHA-256",
        help="comma-separated SCRAM mechanisms to store a verifier for: SCRAM-SHA-256 "
        "(native and Kafka clients), SCRAM-SHA-512 (Kafka clients)",
    )
    ap.add_argument(
        "--node-id",
        type=int,
        default=None,
        help="kind node: the node id this principal speaks for (default: N of a name node-N)",
    )
    ap.set_defaults(func=cmd_auth_add_principal)

    p = sub.add_parser(
        "cluster", help="embedded cluster on loopback; change a running cluster's nodes"
    )
    csub = p.add_subparsers(dest="action", required=True)
    up = csub.add_parser("up", help="start N nodes, print the bootstrap, stop them on Ctrl-C")
    up.add_argument("--nodes", type=int, default=None, help="how many nodes (default 3)")
    up.add_argument(
        "--nodes-per-rack",
        type=int,
        default=None,
        metavar="N",
        help="with --racks: N nodes in each rack (serve --rack rack-1, rack-2, ...), as "
        "several nodes on each of R machines",
    )
    up.add_argument("--racks", type=int, default=None, metavar="R", help="how many racks")
    up.add_argument("--data-dir", default=None)
    up.add_argument("--log-level", default="INFO")
    up.add_argument(
        "--kafka", action="store_true", help="every node also serves Kafka clients (plaintext)"
    )
    up.add_argument(
        "--metrics", action="store_true", help="every node also serves Prometheus metrics"
    )
    up.set_defaults(func=cmd_cluster_up)
    ns = csub.add_parser(
        "new-secret",
        help="create a cluster secret file (mode 0600) for serve --cluster-secret-file",
    )
    ns.add_argument("file")
    ns.set_defaults(func=cmd_cluster_new_secret)
    from .reassign import add_cluster_parsers

    add_cluster_parsers(csub, _add_bootstrap)

    p = sub.add_parser("topic", help="create, alter, list or delete topics")
    p.add_argument("action", choices=["create", "alter", "list", "delete"])
    p.add_argument("name", nargs="?")
    _add_bootstrap(p)
    p.add_argument(
        "--partitions",
        "-p",
        type=int,
        default=None,
        help="create: how many (default 1); alter: grow to this many (never fewer)",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a topic config in Kafka's names (retention.ms, retention.bytes, segment.bytes, "
        "segment.ms, max.message.bytes, compression.type, cleanup.policy, "
        "min.cleanable.dirty.ratio, min.compaction.lag.ms, max.compaction.lag.ms, "
        "delete.retention.ms); repeatable",
    )
    p.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="NAME",
        help="alter: drop a config the topic set (the nodes' value applies again); repeatable",
    )
    p.add_argument(
        "--replication-factor",
        "-r",
        type=int,
        default=None,
        help="create: replicas per partition (default min(3, nodes)); alter: move every "
        "partition to this many, online",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=None,
        help="the topic's max.message.bytes: the largest record batch a produce may carry "
        "(default: each node's serve --max-message-bytes)",
    )
    p.set_defaults(func=cmd_topic)

    p = sub.add_parser("produce", help="produce stdin lines (or a generated load)")
    p.add_argument("topic")
    _add_bootstrap(p)
    p.add_argument("--partition", type=int, default=None)
    p.add_argument("--acks", choices=["quorum", "leader"], default="quorum")
    p.add_argument(
        "--linger-ms", type=int, default=defaults.LINGER_MS, help="linger.ms (default %(default)s)"
    )
    p.add_argument("--key-separator", default=None)
    p.add_argument(
        "--generate", type=int, default=0, help="produce N generated records instead of stdin"
    )
    p.add_argument("--value-size", type=int, default=100)
    p.add_argument(
        "--verbose", "-v", action="store_true", help="print (partition, offsets, epoch) per batch"
    )
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print records")
    p.add_argument("topic")
    _add_bootstrap(p)
    p.add_argument("--partition", type=int, default=None)
    p.add_argument("--from", dest="from_", choices=["earliest", "latest"], default="earliest")
    p.add_argument("--max-records", type=int, default=None)
    p.add_argument("--timeout-ms", type=int, default=0)
    p.add_argument("--follow", "-f", action="store_true")
    p.add_argument("--print-offsets", action="store_true")
    p.set_defaults(func=cmd_consume)

    p = sub.add_parser(
        "describe", help="a table per partition: leader, epoch, high watermark, replicas"
    )
    _add_bootstrap(p)
    p.add_argument("--topic", default=None)
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("partition", help="operator actions on partitions")
    psub = p.add_subparsers(dest="action", required=True)
    fl = psub.add_parser(
        "force-leader", help="UNCLEAN leader election (may lose committed records)"
    )
    fl.add_argument("topic")
    fl.add_argument("partition", type=int)
    fl.add_argument("--node", type=int, required=True)
    _add_bootstrap(fl)
    fl.add_argument("--i-understand-data-loss", action="store_true")
    fl.set_defaults(func=cmd_force_leader)
    from .reassign import add_parser as add_reassign

    add_reassign(psub, _add_bootstrap)

    from .top import add_parser as add_top

    add_top(sub)

    p = sub.add_parser("perf", help="benchmarks: " + ", ".join(PERF))
    p.add_argument("which", choices=sorted(PERF))
    return parser


def run_perf(which: str, argv: list[str]) -> int:
    from ..perf import load

    rc: int = load(which).main(argv)
    return rc


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise KeyError(name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # perf commands own their flags: hand everything after the benchmark name to it.
    if len(argv) >= 2 and argv[0] == "perf" and argv[1] in PERF:
        return run_perf(argv[1], argv[2:])
    parser = build_parser()
    if argv and argv[0] == "serve":
        from .config_file import apply_config_file, config_path

        path = config_path(argv[1:])
        if path is not None:
            try:
                apply_config_file(_subparser(parser, "serve"), path)
            except ValueError as exc:
                parser.error(str(exc))
    args = parser.parse_args(argv)
    if args.command == "topic" and args.action in ("create", "alter", "delete") and not args.name:
        parser.error(f"topic {args.action} needs a topic name")
    try:
        rc: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from ..client.errors import QuorumLogError

        if isinstance(exc, QuorumLogError | ValueError | TimeoutError):
            print(f"quorumlog: error: {exc}", file=sys.stderr)
            return 1
        raise
    return rc


if __name__ == "__main__":
    sys.exit(main())
