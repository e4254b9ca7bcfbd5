"""``serve --join``: a node that starts with the address of any node of a running cluster
instead of a voter list. Before it starts it registers itself (its id, data directory and
listeners) through that node with the metadata leader, which answers the cluster's id,
every node's addresses and the voters the metadata quorum started with. The node then
starts as any other with what it learned, and follows the metadata log as an observer
until ``quorumlog cluster add-voter`` makes it a voter.

What it learned is kept in the data directory (``joined.json``): a restart registers
again (nothing changes if nothing did) through the nodes it knows, and starts from what
it kept if none of them answers."""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from ..client import Client, ClientSecurity
from ..client.errors import DuplicateNodeError, QuorumLogError
from ..protocol import messages as m
from .config import NodeConfig
from .datadir import DataDir
from .metadata import NodeRegistration
from .nodes import load_joined, save_joined

log = logging.getLogger(__name__)

#: A joining node whose id another process holds tries again every JOIN_RETRY_S for
#: twice the fetch timeout: that process may just have stopped (an id is held only
#: while its process was heard within the fetch timeout).
JOIN_RETRY_S = 1.0


def node_security(config: NodeConfig) -> ClientSecurity:
    """How the node reaches its peers' listeners as a client: its node principal (the
    cluster secret's, or ``--auth-config``'s), over TLS if it has TLS."""
    credentials = config.peer_credentials()
    assert credentials is not None  # NodeConfig: --join needs a secret or --auth-config
    principal, secret = credentials
    tls = config.tls
    return ClientSecurity(
        ca_file=tls.ca_file if tls else None,
        cert_file=tls.cert_file if tls and tls.client_auth else None,
        key_file=tls.key_file if tls and tls.client_auth else None,
        principal=principal,
        secret=secret,
    )


def join(config: NodeConfig) -> NodeConfig:
    """``config`` with what registering through ``config.join`` taught: the cluster id,
    every node's addresses (``voters``, ``kafka_voters``), the metadata quorum's first
    voters and the incarnation it registered with."""
    kept = load_joined(config.data_dir)
    bootstrap = [f"{h}:{p}" for h, p in config.join]
    if kept is not None:
        bootstrap += [f"{h}:{p}" for h, p in kept["nodes"].values()]
    incarnation = random.SystemRandom().getrandbits(62)
    deadline = time.monotonic() + 2 * config.fetch_timeout_ms / 1000
    try:
        with Client(bootstrap, request_timeout_ms=10_000, security=node_security(config)) as client:
            client.refresh_nodes()
            cluster_id = client.cluster_id
            if config.cluster_id and config.cluster_id != cluster_id:
                raise SystemExit(
                    f"quorumlog: --join reached cluster {cluster_id}, not --cluster-id "
                    f"{config.cluster_id}"
                )
            resp = _register(client, config, cluster_id, incarnation, deadline)
    except QuorumLogError as exc:
        if kept is None or isinstance(exc, DuplicateNodeError):
            raise SystemExit(
                f"quorumlog: cannot join the cluster through {','.join(bootstrap)}: {exc}"
            ) from None
        log.warning(
            "could not register through %s (%s): starting from what this node learned when "
            "it joined; it registers once the metadata quorum answers",
            ",".join(bootstrap),
            exc,
        )
        return _joined(config, kept, incarnation)
    doc: dict[str, Any] = {
        "cluster_id": resp.cluster_id,
        "metadata_voters": list(resp.metadata_voters),
        "nodes": {str(n.node_id): [n.host, n.port] for n in resp.nodes},
        "kafka": {str(n.node_id): [n.kafka_host, n.kafka_port] for n in resp.nodes if n.kafka_port},
    }
    save_joined(config.data_dir, doc)
    log.info(
        "node %d joined cluster %s: nodes %s, metadata quorum started with voters %s",
        config.node_id,
        resp.cluster_id,
        sorted(n.node_id for n in resp.nodes),
        list(resp.metadata_voters),
    )
    return _joined(config, doc, incarnation)


def _register(
    client: Client, config: NodeConfig, cluster_id: str, incarnation: int, deadline: float
) -> m.RegisterNodeResponse:
    """Register with this node's directory id (its data directory made for ``cluster_id``
    if new), again while the id is held by another live process, until ``deadline``."""
    datadir = DataDir(config.data_dir, cluster_id, config.node_id)
    datadir.lock()
    try:
        directory = datadir.check()
    finally:
        datadir.unlock()
    reg = NodeRegistration(
        config.node_id, directory, (config.host, config.port), config.kafka_listen, config.rack
    )
    req = reg.request(incarnation)
    while True:
        try:
            return client.register_node(req)
        except DuplicateNodeError as exc:
            if time.monotonic() + JOIN_RETRY_S > deadline:
                raise
            log.warning("%s; trying again", exc)
            time.sleep(JOIN_RETRY_S)


def _joined(config: NodeConfig, doc: Mapping[str, Any], incarnation: int) -> NodeConfig:
    nodes = _addresses(doc["nodes"])
    nodes[config.node_id] = (config.host, config.port)
    kafka: dict[int, tuple[str, int]] = {}
    if config.kafka_listen is not None:
        kafka = _addresses(doc.get("kafka", {}))
        kafka[config.node_id] = config.kafka_listen
    return dataclasses.replace(
        config,
        cluster_id=str(doc["cluster_id"]),
        voters=nodes,
        kafka_voters=kafka,
        metadata_voters=[int(v) for v in doc["metadata_voters"]],
        incarnation=incarnation,
    )


def _addresses(by_id: Mapping[str, Any]) -> dict[int, tuple[str, int]]:
    return {int(n): (str(a[0]), int(a[1])) for n, a in by_id.items()}
