"""TLS contexts, the principals file (``--auth-config``) and coarse authorization.

The principals file is JSON; it holds SCRAM verifiers, never secrets::

    {"principals": {
        "node-1": {"kind": "node", "scram": {"mechanism": "SCRAM-SHA-256", "salt": "...",
                   "iterations": 4096, "stored_key": "...", "server_key": "..."}},
        "ingest": {"kind": "producer", "topics": ["events", "logs-*"],
                   "transactional_ids": ["etl-*"], "scram": {...}},
        "spark":  {"kind": "consumer", "topics": ["*"],
                   "scram": [{"mechanism": "SCRAM-SHA-256", ...},
                             {"mechanism": "SCRAM-SHA-512", ...}]},
        "ops":    {"kind": "admin", "scram": {...}}}}

``scram`` is one verifier, or a list of them with one per mechanism (as Kafka stores a
SCRAM credential per mechanism). The native protocol authenticates with SCRAM-SHA-256;
Kafka clients may use either mechanism the principal has a verifier for.

``topics`` and ``transactional_ids`` are glob patterns (fnmatch): a producer principal
may use Kafka transactional ids matching its ``transactional_ids`` only (none without
it: Kafka's ACLs deny by default), an admin any. Kinds: node (raft traffic), producer
(Produce to its topics), consumer (Fetch, ListOffsets, OffsetsForLeaderEpoch on its
topics), admin (everything but raft: topic admin, force-leader, produce and read any
topic). Metadata, ApiVersions, ListTopics and DescribeQuorum are open to every
authenticated principal.

A node principal is bound to one node id: its ``node_id`` field, or the ``<id>`` of a name
``node-<id>``. Raft messages on its connection must claim that id as their sender
(``check_raft_sender``); a node principal with neither may send no raft traffic.

A plaintext cluster has no principals file: its nodes prove membership with the cluster
secret (``--cluster-secret-file``). Each node authenticates to its peers with SCRAM as
``node-<id>`` with a secret derived from the cluster secret (``node_secret``), so a node can
build the verifier of every voter without storing one (``cluster_auth_config``).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
import logging
import os
import secrets
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..driver import NodeHeartbeat
from ..protocol import REQUESTS, ApiKey, Frame, decode_body
from ..protocol.messages import RAFT_KEYS
from ..protocol.scram import (
    SCRAM_SHA_256,
    Mechanism,
    ScramError,
    Verifier,
    decoy_verifier,
    make_verifier,
)
from ..raft import LeaderAnnouncement, Message

log = logging.getLogger(__name__)

KINDS = ("node", "producer", "consumer", "admin")

# (A Kafka envelope's request is authorized inside, by the Kafka listener's rules.)
_ANY_AUTHENTICATED = frozenset(
    {
        ApiKey.API_VERSIONS,
        ApiKey.METADATA,
        ApiKey.LIST_TOPICS,
        ApiKey.DESCRIBE_QUORUM,
        ApiKey.KAFKA_ENVELOPE,
        ApiKey.TXN_GROUP_COMMIT,  # its handler checks the transactional ids
    }
)
_TOPIC_CHANGES = frozenset({ApiKey.CREATE_TOPIC, ApiKey.DELETE_TOPIC, ApiKey.ALTER_TOPIC})
_ADMIN_ONLY = _TOPIC_CHANGES | {
    ApiKey.REASSIGN,
    ApiKey.CHANGE_VOTER,
    ApiKey.FORCE_LEADER,
    ApiKey.RETIRE_NODE,
    ApiKey.CATCH_UP_THROTTLE,
}
#: Only a node may say where it listens: on every listener, plaintext ones included.
NODE_ONLY = frozenset({ApiKey.REGISTER_NODE, ApiKey.WRITE_TXN_MARKERS})
_PRODUCE = frozenset({ApiKey.PRODUCE, ApiKey.PRODUCE_MANY, ApiKey.INIT_PRODUCER_ID})
_CONSUME = frozenset({ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.OFFSETS_FOR_LEADER_EPOCH})


class AuthConfigError(ValueError):
    """A principals file that cannot be used; the message names the file and the entry."""


NODE_PRINCIPAL_PREFIX = "node-"


def node_principal(node_id: int) -> str:
    return f"{NODE_PRINCIPAL_PREFIX}{node_id}"


def node_id_of_name(name: str) -> int | None:
    """``node-<id>`` -> id; None for any other name."""
    rest = name[len(NODE_PRINCIPAL_PREFIX) :] if name.startswith(NODE_PRINCIPAL_PREFIX) else ""
    return int(rest) if rest.isdigit() and str(int(rest)) == rest else None


@dataclass(frozen=True)
class Principal:
    name: str
    kind: str
    topics: tuple[str, ...] = ()
    # The node a node principal speaks for (raft messages must claim it); None otherwise.
    node_id: int | None = None
    transactional_ids: tuple[str, ...] = ()

    def may_use_topic(self, topic: str) -> bool:
        return any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.topics)

    def may_use_transactional_id(self, transactional_id: str) -> bool:
        if self.kind == "admin":
            return True
        return self.kind == "producer" and any(
            fnmatch.fnmatchcase(transactional_id, pattern) for pattern in self.transactional_ids
        )


#: A principal's SCRAM verifiers by mechanism name (SCRAM-SHA-256, SCRAM-SHA-512).
Credentials = dict[str, Verifier]


@dataclass
class AuthConfig:
    principals: dict[str, tuple[Principal, Credentials]] = field(default_factory=dict)
    # Keys the decoy verifiers for unknown principals; fresh per process.
    decoy_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def add(self, principal: Principal, *verifiers: Verifier) -> None:
        """Add or replace ``principal`` with these verifiers (one per mechanism)."""
        self.principals[principal.name] = (
            principal,
            {v.mechanism.name: v for v in verifiers},
        )

    def credential(
        self, name: str, mechanism: Mechanism = SCRAM_SHA_256
    ) -> tuple[Principal, Verifier] | None:
        """The principal ``name`` and its verifier for ``mechanism``; None if there is no
        such principal or it has no verifier for that mechanism."""
        entry = self.principals.get(name)
        verifier = entry[1].get(mechanism.name) if entry is not None else None
        return None if entry is None or verifier is None else (entry[0], verifier)

    def decoy(self, name: str, mechanism: Mechanism = SCRAM_SHA_256) -> Verifier:
        """What an exchange for a principal without a ``credential`` runs against."""
        return decoy_verifier(name, self.decoy_key, mechanism)

    @staticmethod
    def load(path: str | os.PathLike[str]) -> AuthConfig:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise AuthConfigError(f"cannot read auth config {path}: {exc}") from exc
        return AuthConfig.from_json(doc, str(path))

    @staticmethod
    def from_json(doc: Any, where: str = "auth config") -> AuthConfig:
        if not isinstance(doc, dict) or not isinstance(doc.get("principals"), dict):
            raise AuthConfigError(f"{where}: expected {{'principals': {{name: entry}}}}")
        out = AuthConfig()
        for name, entry in doc["principals"].items():
            if not isinstance(entry, dict):
                raise AuthConfigError(f"{where}: principal {name!r} is not an object")
            kind = entry.get("kind")
            if kind not in KINDS:
                raise AuthConfigError(
                    f"{where}: principal {name!r} has kind {kind!r}; expected one of {KINDS}"
                )
            topics = entry.get("topics", [])
            if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
                raise AuthConfigError(f"{where}: principal {name!r}: topics must be strings")
            txn_ids = entry.get("transactional_ids", [])
            if not isinstance(txn_ids, list) or not all(isinstance(t, str) for t in txn_ids):
                raise AuthConfigError(
                    f"{where}: principal {name!r}: transactional_ids must be strings"
                )
            if "secret" in entry or "password" in entry:
                raise AuthConfigError(
                    f"{where}: principal {name!r} holds a plaintext secret; store a SCRAM "
                    "verifier instead (quorumlog auth add-principal)"
                )
            node_id = entry.get("node_id")
            if node_id is not None and (
                kind != "node" or not isinstance(node_id, int) or isinstance(node_id, bool)
            ):
                raise AuthConfigError(
                    f"{where}: principal {name!r}: node_id must be an integer, and only "
                    "node principals have one"
                )
            if kind == "node" and node_id is None:
                node_id = node_id_of_name(name)
            verifiers = _verifiers_from_json(entry.get("scram"), f"{where}: principal {name!r}")
            principal = Principal(name, kind, tuple(topics), node_id, tuple(txn_ids))
            out.add(principal, *verifiers)
        return out

    def to_json(self) -> dict[str, Any]:
        principals: dict[str, Any] = {}
        for name, (p, creds) in sorted(self.principals.items()):
            entry: dict[str, Any] = {"kind": p.kind}
            if p.topics:
                entry["topics"] = list(p.topics)
            if p.transactional_ids:
                entry["transactional_ids"] = list(p.transactional_ids)
            if p.node_id is not None and p.node_id != node_id_of_name(name):
                entry["node_id"] = p.node_id
            # One verifier keeps the original form, so files older code reads stay so.
            scram = [creds[mechanism].to_json() for mechanism in sorted(creds)]
            entry["scram"] = scram[0] if len(scram) == 1 else scram
            principals[name] = entry
        return {"principals": principals}

    def save(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)


def _verifiers_from_json(doc: Any, where: str) -> list[Verifier]:
    """``scram``: one verifier object, or a list with one per mechanism."""
    items = doc if isinstance(doc, list) else [doc or {}]
    if not items:
        raise AuthConfigError(f"{where}: scram is an empty list; give at least one verifier")
    out: list[Verifier] = []
    for item in items:
        if not isinstance(item, dict):
            raise AuthConfigError(f"{where}: each scram verifier must be an object")
        try:
            verifier = Verifier.from_json(item)
        except ScramError as exc:
            raise AuthConfigError(f"{where}: {exc}") from exc
        if any(v.mechanism == verifier.mechanism for v in out):
            raise AuthConfigError(f"{where}: two scram verifiers for {verifier.mechanism.name}")
        out.append(verifier)
    return out


def _topic_of(api: ApiKey, frame: Frame) -> str | None:
    req_cls, _ = REQUESTS[api]
    try:
        req: Any = decode_body(req_cls, frame.body, b"")
    except Exception:
        return None  # malformed: the node answers INVALID_REQUEST itself
    topic = getattr(req, "topic", None)
    return topic if isinstance(topic, str) else None


def authorize(principal: Principal, frame: Frame) -> str | None:
    """None if allowed, else why not (for the AUTHORIZATION_FAILED message and the log)."""
    try:
        api = ApiKey(frame.api_key)
    except ValueError:
        return None  # unknown api: the node answers INVALID_REQUEST
    return authorize_api(principal, api, lambda: _topic_of(api, frame))


def authorize_api(
    principal: Principal, api: ApiKey, topic_of: Callable[[], str | None]
) -> str | None:
    """The rule of ``authorize`` for a request of ``api`` on the topic ``topic_of()``
    names (None: none, or not decodable); the Kafka listener asks it per topic too."""
    kind = principal.kind
    if api in RAFT_KEYS:
        return None if kind == "node" else "only node principals may send raft traffic"
    if api in NODE_ONLY:
        return None if kind == "node" else f"only node principals may call {api.name}"
    if api in _ANY_AUTHENTICATED:
        return None
    if api in _TOPIC_CHANGES and kind == "node":
        # Forwarded by the node whose Kafka listener authorized its client
        # (``topic_changes``) to this one, the metadata leader.
        return None
    if api in _ADMIN_ONLY:
        return None if kind == "admin" else f"only admin principals may call {api.name}"
    if kind == "admin":
        return None
    if (api in _PRODUCE and kind == "producer") or (api in _CONSUME and kind == "consumer"):
        topic = topic_of()
        if topic is None or principal.may_use_topic(topic):
            return None
        return f"{kind} principal {principal.name!r} is not granted topic {topic!r}"
    return f"{kind} principals may not call {api.name}"


# ---- node identity -------------------------------------------------------------------


class ForgedSender(Exception):
    """A raft message whose claimed sender is not the node its connection authenticated as."""


def check_raft_sender(msg: Message | NodeHeartbeat, sender: int) -> None:
    """Raise ``ForgedSender`` unless every node id ``msg`` claims to come from is ``sender``:
    ``src`` (``replica_id`` for a Fetch), and for Begin/EndQuorumEpoch the leader it
    announces, which is always its sender."""
    claimed = msg.src
    if claimed == sender and isinstance(msg, LeaderAnnouncement):
        claimed = msg.leader_id
    if claimed != sender:
        raise ForgedSender(
            f"{type(msg).__name__} claims node {claimed}, the connection is node {sender}"
        )


def check_own_principal(auth: AuthConfig, name: str, node_id: int, where: str) -> None:
    """Refuse to start as a principal the peers would not take for this node (they would
    refuse every raft message it sends)."""
    entry = auth.principals.get(name)
    if entry is None:
        return  # the peers' principals files may differ from ours: they will tell
    p = entry[0]
    if p.kind != "node" or p.node_id != node_id:
        raise SystemExit(
            f"quorumlog: this is node {node_id}, but its --auth-principal {name!r} is a "
            f"{p.kind} principal for node {p.node_id} in {where}; its peers would refuse its "
            f"raft traffic (give it node_id {node_id}, or use node-{node_id})"
        )


def node_secret(cluster_secret: str, node_id: int) -> str:
    """Node ``node_id``'s SCRAM secret in a plaintext cluster: keyed by the cluster secret,
    so every node can derive every voter's verifier and no node can derive it without it."""
    mac = hmac.new(
        cluster_secret.encode(), f"quorumlog {node_principal(node_id)}".encode(), hashlib.sha256
    )
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


@dataclass
class ClusterAuthConfig(AuthConfig):
    """The node principals of a plaintext cluster (nothing else may authenticate): every
    ``node-<id>``, its verifier derived from the cluster secret when it first
    authenticates, so a node that joins later is known as well as those started with."""

    cluster_secret: str = field(default="", repr=False)

    def credential(
        self, name: str, mechanism: Mechanism = SCRAM_SHA_256
    ) -> tuple[Principal, Verifier] | None:
        nid = node_id_of_name(name)
        if name not in self.principals and nid is not None and self.cluster_secret:
            principal = Principal(name, "node", (), nid)
            self.add(principal, make_verifier(node_secret(self.cluster_secret, nid)))
        return super().credential(name, mechanism)


def cluster_auth_config(cluster_secret: str, voters: list[int]) -> AuthConfig:
    """The node principals of a plaintext cluster; ``voters``' verifiers made now."""
    out = ClusterAuthConfig(cluster_secret=cluster_secret)
    for nid in voters:
        out.credential(node_principal(nid))
    return out


def new_cluster_secret() -> str:
    return secrets.token_urlsafe(32)


def write_secret_file(path: Path, secret: str) -> None:
    """Create ``path`` readable by its owner only, before the secret is written into it."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


# ---- TLS -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    ca_file: str
    # Require and verify client certificates (mutual TLS).
    client_auth: bool = False


def server_context(tls: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    ctx.load_verify_locations(cafile=tls.ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.client_auth else ssl.CERT_NONE
    return ctx


def peer_client_context(tls: TlsFiles) -> ssl.SSLContext:
    """How a node connects to its peers: verify them against the CA; present its own
    certificate (the peers may require it)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def read_secret(secret_file: str | None, secret_env: str | None, what: str) -> str | None:
    """A secret from a file (first line) or an environment variable; never from argv."""
    if secret_file:
        try:
            text = Path(secret_file).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read {what} secret file {secret_file}: {exc}") from exc
        if not text or not text[0]:
            raise ValueError(f"{what} secret file {secret_file} is empty")
        return text[0]
    if secret_env:
        value = os.environ.get(secret_env)
        if not value:
            raise ValueError(f"{what}: environment variable {secret_env} is not set")
        return value
    return None
