"""LocalCluster: N real node processes on free loopback ports, for tests, examples and
benchmarks (``quorumlog cluster up`` uses it too). Every process it starts, it stops."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import defaults
from ..client import Client, ClientSecurity
from ..client.errors import QuorumLogError
from ..protocol import messages as m
from ..storage.types import OffsetAndEpoch

log = logging.getLogger(__name__)


#: Where the kernel's ephemeral ports start when /proc does not say (Linux's default).
EPHEMERAL_LOW_DEFAULT = 32768
#: The lowest port ``free_ports`` hands out (below it: well-known and registered services
#: more often listen).
LOWEST_PORT = 10000


def ephemeral_low() -> int:
    """The first port the kernel picks from for a socket bound to port 0 or connected
    without a bind (``net.ipv4.ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT


def _bound(host: str, port: int) -> socket.socket | None:
    """A socket bound to ``host``:``port`` (0: the kernel's pick), None if it is taken."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        if port == 0:
            raise
        return None
    return s


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports of ``host`` that nothing is bound to now, for processes to
    listen on later. They are taken below the kernel's ephemeral range where it leaves
    room: a port from that range, free when chosen, may be the kernel's pick for another
    socket's bind to port 0 or outgoing connection before the process binds it (a node
    then exits with "address already in use"); the range's own ports otherwise."""
    candidates = list(range(LOWEST_PORT, ephemeral_low()))
    if len(candidates) < 8 * n:
        candidates = []  # no room below: the kernel's picks
    secrets.SystemRandom().shuffle(candidates)
    socks: list[socket.socket] = []
    try:
        for port in [*candidates, *[0] * n]:
            if len(socks) == n:
                break
            s = _bound(host, port)
            if s is not None:
                socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def rack_layout(nodes_per_rack: int, racks: int) -> dict[int, str]:
    """Node ids 1.. ``nodes_per_rack`` in ``rack-1``, the next as many in ``rack-2``,
    ...: ``quorumlog cluster up --nodes-per-rack N --racks R``'s layout (one rack a
    machine, several nodes a machine, as docs/deploying.md runs them)."""
    if nodes_per_rack < 1 or racks < 1:
        raise ValueError(f"give 1 or more nodes a rack and racks, got {nodes_per_rack} and {racks}")
    return {
        n: f"rack-{(n - 1) // nodes_per_rack + 1}" for n in range(1, nodes_per_rack * racks + 1)
    }


class LocalCluster:
    def __init__(
        self,
        nodes: int = 3,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        cluster_id: str | None = None,
        node_args: list[str] | None = None,
        log_level: str = "INFO",
        start_timeout_s: float = 60.0,
        secure: bool = False,
        mutual_tls: bool = False,
        principals: dict[str, tuple[str, list[str]] | tuple[str, list[str], list[str]]]
        | None = None,
        kafka: bool = False,
        node_env: dict[int, dict[str, str]] | None = None,
        metrics: bool = False,
        racks: Mapping[int, str] | None = None,
    ) -> None:
        """``racks``: each node's ``serve --rack`` (by node id; ``rack_layout`` makes
        one; a node not in it has none).
        ``node_env``: extra environment variables of a node's process (by node id).
        ``secure``: TLS on every listener with a throwaway CA, and SCRAM authentication
        with principals node-1..N, ``admin`` and ``principals`` (name -> (kind, topics));
        ``mutual_tls`` also requires client certificates. ``kafka``: every node also
        serves Kafka clients (``kafka_bootstrap``). ``metrics``: every node serves its
        Prometheus metrics (``metrics_urls``)."""
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.n = nodes
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="quorumlog-")
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir)
        self.host = host
        self.cluster_id = cluster_id or uuid.uuid4().hex[:16]
        self.node_args = node_args or []
        self.log_level = log_level
        self.node_env = node_env or {}
        self.racks = dict(racks or {})
        self.start_timeout_s = start_timeout_s
        ids = range(1, nodes + 1)
        # One call: all distinct.
        ports = free_ports(nodes * (1 + bool(kafka) + bool(metrics)), host)
        self.ports = dict(zip(ids, ports[:nodes], strict=True))
        rest = ports[nodes:]
        self.kafka_ports = dict(zip(ids, rest[:nodes], strict=True)) if kafka else {}
        rest = rest[nodes:] if kafka else rest
        self.metrics_ports = dict(zip(ids, rest[:nodes], strict=True)) if metrics else {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        # Nodes started with --join (``join``), each with the node it joins through.
        self.joined: dict[int, int] = {}
        self._client: Client | None = None
        self.secure = secure or mutual_tls
        self.mutual_tls = mutual_tls
        self.secrets: dict[str, str] = {}
        if self.secure:
            self._setup_security(principals or {})
        else:
            self._setup_cluster_secret()

    # ---- lifecycle ---------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{p}" for p in self.ports.values())

    @property
    def voters(self) -> str:
        return ",".join(f"{i}@{self.host}:{p}" for i, p in self.ports.items())

    @property
    def kafka_bootstrap(self) -> str:
        """bootstrap.servers for Kafka clients (a cluster started with ``kafka=True``)."""
        if not self.kafka_ports:
            raise ValueError("this LocalCluster was started without kafka=True")
        return ",".join(f"{self.host}:{p}" for p in self.kafka_ports.values())

    def _kafka_args(self, node: int) -> list[str]:
        if not self.kafka_ports:
            return []
        listen = f"{self.host}:{self.kafka_ports[node]}"
        if node in self.joined:  # learned when it joins
            return ["--kafka-listen", listen]
        voters = ",".join(
            f"{i}@{self.host}:{p}" for i, p in self.kafka_ports.items() if i not in self.joined
        )
        return ["--kafka-listen", listen, "--kafka-voters", voters]

    @property
    def metrics_urls(self) -> dict[int, str]:
        """Each node's metrics endpoint (a cluster started with ``metrics=True``)."""
        scheme = "https" if self.secure else "http"
        return {n: f"{scheme}://{self.host}:{p}/metrics" for n, p in self.metrics_ports.items()}

    def _metrics_args(self, node: int) -> list[str]:
        if not self.metrics_ports:
            return []
        return ["--metrics-listen", f"{self.host}:{self.metrics_ports[node]}"]

    def node_dir(self, node: int) -> Path:
        return self.data_dir / f"node-{node}"

    def log_path(self, node: int) -> Path:
        return self.data_dir / f"node-{node}.log"

    def command(self, node: int) -> list[str]:
        if node in self.joined:
            # Through the first node started with the cluster that ran when it joined, on
            # every start (as an operator's command line stays the same).
            through = self.joined[node]
            how = ["--join", f"{self.host}:{self.ports[through]}"]
        else:
            how = ["--voters", self.voters, "--cluster-id", self.cluster_id]
        return [
            sys.executable,
            "-m",
            "quorumlog.replica.cli.main",
            "serve",
            "--node-id",
            str(node),
            "--listen",
            f"{self.host}:{self.ports[node]}",
            *how,
            "--data-dir",
            str(self.node_dir(node)),
            "--log-level",
            self.log_level,
            *self._security_args(node),
            *self._kafka_args(node),
            *self._metrics_args(node),
            *(["--rack", self.racks[node]] if node in self.racks else []),
            *self.node_args,
        ]

    # ---- security ----------------------------------------------------------------
    @property
    def security_dir(self) -> Path:
        return self.data_dir / "security"

    def _setup_security(
        self, extra: dict[str, tuple[str, list[str]] | tuple[str, list[str], list[str]]]
    ) -> None:
        from ..protocol.scram import MECHANISMS, make_verifier
        from .certs import CertificateAuthority
        from .security import AuthConfig, Principal

        self.ca = CertificateAuthority(self.security_dir)
        self.ca_file = self.ca.ca_file
        self.node_certs = {n: self.ca.issue(f"node-{n}") for n in self.ports}
        self.client_cert = self.ca.issue("client") if self.mutual_tls else None
        wanted: dict[str, tuple[str, list[str]] | tuple[str, list[str], list[str]]] = {
            f"node-{n}": ("node", []) for n in self.ports
        }
        wanted["admin"] = ("admin", [])
        wanted.update(extra)
        auth = AuthConfig()
        for name, (kind, topics, *txn_ids) in wanted.items():
            secret = secrets.token_urlsafe(24)
            self.secrets[name] = secret
            path = self.secret_file(name)
            path.write_text(secret + "\n")
            path.chmod(0o600)
            # A verifier per mechanism: Kafka clients may use SCRAM-SHA-256 or -512.
            auth.add(
                Principal(name, kind, tuple(topics), None, tuple(*txn_ids)),
                *(make_verifier(secret, mechanism=m) for m in MECHANISMS.values()),
            )
        self.auth_config = self.security_dir / "auth.json"
        auth.save(self.auth_config)

    @property
    def cluster_secret_file(self) -> Path:
        """Plaintext clusters: the secret every node proves membership with (mode 0600)."""
        return self.data_dir / "cluster.secret"

    def _setup_cluster_secret(self) -> None:
        from .security import new_cluster_secret, read_secret, write_secret_file

        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.cluster_secret_file.exists():
            write_secret_file(self.cluster_secret_file, new_cluster_secret())
        secret = read_secret(str(self.cluster_secret_file), None, "cluster")
        assert secret is not None
        self.cluster_secret = secret

    def node_credentials(self, node: int) -> tuple[str, str]:
        """(principal, secret) node ``node`` authenticates to its peers with (what a test
        needs to speak raft as that node)."""
        if self.secure:
            return f"node-{node}", self.secrets[f"node-{node}"]
        from .security import node_principal, node_secret

        return node_principal(node), node_secret(self.cluster_secret, node)

    def secret_file(self, principal: str) -> Path:
        return self.security_dir / f"{principal}.secret"

    def _security_args(self, node: int) -> list[str]:
        if not self.secure:
            return ["--cluster-secret-file", str(self.cluster_secret_file)]
        cert = self.node_certs[node]
        args = ["--tls-cert", cert.cert_file, "--tls-key", cert.key_file, "--tls-ca", self.ca_file]
        if self.mutual_tls:
            args.append("--tls-client-auth")
        return [
            *args,
            "--auth-config",
            str(self.auth_config),
            "--auth-secret-file",
            str(self.secret_file(f"node-{node}")),
        ]

    def client_security(self, principal: str = "admin") -> ClientSecurity | None:
        """How a client reaches this cluster as ``principal`` (None when not secure)."""
        if not self.secure:
            return None
        return ClientSecurity(
            ca_file=self.ca_file,
            cert_file=self.client_cert.cert_file if self.client_cert else None,
            key_file=self.client_cert.key_file if self.client_cert else None,
            principal=principal,
            secret_file=str(self.secret_file(principal)),
        )

    def start_node(self, node: int) -> None:
        if node in self.procs and self.procs[node].poll() is None:
            raise RuntimeError(f"node {node} is already running")
        self.node_dir(node).mkdir(parents=True, exist_ok=True)
        out = open(self.log_path(node), "ab")
        try:
            extra = self.node_env.get(node)
            self.procs[node] = subprocess.Popen(
                self.command(node),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **extra} if extra else None,
            )
        finally:
            out.close()

    def start(self) -> LocalCluster:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.ports:
                self.start_node(node)
            self.wait_ready(self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def join(self, node: int, timeout_s: float = 60.0, *, rack: str | None = None) -> None:
        """Start a new node ``node`` with ``serve --join`` (no voter list names it; in
        ``rack`` if given) and wait until every running node lists it. Secure clusters
        cannot grow this way (their principals file names the nodes they started with)."""
        if node in self.ports:
            raise ValueError(f"node {node} is a node of this cluster already")
        if self.secure:
            raise ValueError("a secure LocalCluster cannot grow: its principals are fixed")
        if rack is not None:
            self.racks[node] = rack
        wanted = 1 + bool(self.kafka_ports) + bool(self.metrics_ports)
        taken = {*self.ports.values(), *self.kafka_ports.values(), *self.metrics_ports.values()}
        ports = [p for p in free_ports(wanted + len(taken), self.host) if p not in taken][:wanted]
        self.ports[node] = ports.pop(0)
        if self.kafka_ports:
            self.kafka_ports[node] = ports.pop(0)
        if self.metrics_ports:
            self.metrics_ports[node] = ports.pop(0)
        self.joined[node] = next(
            n for n in self.ports if n not in self.joined and n != node and self.is_running(n)
        )
        self.n += 1
        self.start_node(node)
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.is_running(node):
                raise RuntimeError(f"node {node} exited while joining:\n{self.tail(node)}")
            try:
                if all(
                    node in {i.node_id for i in self.nodes_listed_by(n)}
                    for n in self.procs
                    if self.is_running(n)
                ):
                    return
            except (QuorumLogError, OSError):
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"node {node} not listed by every node after {timeout_s}s")
            time.sleep(0.1)

    def nodes_listed_by(self, node: int, client: Client | None = None) -> list[m.NodeInfo]:
        """The nodes node ``node``'s own Metadata answer lists (its view, not merged with
        the others'), asked through ``client`` or a client of its own."""
        address = (self.host, self.ports[node])
        req = m.MetadataRequest(topics=[], partitions=[])
        if client is not None:
            return list(client._metadata_from(address, req, 2.0).nodes)
        with Client(self.bootstrap, request_timeout_ms=2000, security=self.client_security()) as c:
            return list(c._metadata_from(address, req, 2.0).nodes)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until every node answers and the metadata quorum has a leader."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"node(s) {dead} exited during start-up; see {self.log_path(dead[0])}:\n{self.tail(dead[0])}"
                )
            try:
                with Client(
                    self.bootstrap, request_timeout_ms=2000, security=self.client_security()
                ) as c:
                    registered = self._registered(c)
                    if c._controller_id >= 0 and len(c._nodes) == self.n and registered:
                        alive = 0
                        for nid in self.procs:
                            try:
                                c.api_versions(nid)
                                alive += 1
                            except (QuorumLogError, OSError):
                                pass
                        if alive == len(self.procs):
                            return
                    last = "metadata quorum has no leader, or not every node registered, yet"
            except (QuorumLogError, OSError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise TimeoutError(f"cluster not ready after {timeout_s}s: {last}")

    def _registered(self, client: Client) -> bool:
        """Whether the metadata leader knows every running node's registration (what
        each node writes once when it first starts): the cluster is idle from then on."""
        client.refresh_nodes()
        if client._controller_id not in self.ports:
            return False
        known = {
            n.node_id for n in self.nodes_listed_by(client._controller_id, client) if n.directory
        }
        return all(n in known for n in self.procs if self.is_running(n))

    def tail(self, node: int, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path(node).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- faults ------------------------------------------------------------------
    def kill(self, node: int) -> None:
        """kill -9: the node loses everything it had not fsync'd."""
        proc = self.procs[node]
        proc.kill()
        proc.wait(timeout=10)

    def terminate(self, node: int, timeout_s: float = 15.0) -> None:
        """SIGTERM: graceful shutdown (EndQuorumEpoch for the partitions it leads)."""
        proc = self.procs[node]
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"node {node} still running {timeout_s:.0f}s after SIGTERM; "
                f"see {self.log_path(node)}:\n{self.tail(node)}"
            ) from None

    def pause(self, node: int) -> None:
        os.kill(self.procs[node].pid, signal.SIGSTOP)

    def resume(self, node: int) -> None:
        os.kill(self.procs[node].pid, signal.SIGCONT)

    def restart(self, node: int, *, graceful: bool = False) -> None:
        if self.procs[node].poll() is None:
            (self.terminate if graceful else self.kill)(node)
        self.start_node(node)

    def is_running(self, node: int) -> bool:
        return node in self.procs and self.procs[node].poll() is None

    # ---- conveniences ------------------------------------------------------------
    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(
                self.bootstrap,
                request_timeout_ms=defaults.REQUEST_TIMEOUT_MS,
                security=self.client_security(),
            )
        return self._client

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        *,
        timeout_s: float = defaults.REQUEST_TIMEOUT_MS / 1000,
    ) -> None:
        self.client.create_topic(name, partitions, replication_factor)
        self.client.wait_for_leaders(name, int(timeout_s * 1000))

    def produce(
        self,
        topic: str,
        partition: int,
        values: list[bytes],
        keys: list[bytes | None] | None = None,
        *,
        timeout_ms: int = defaults.REQUEST_TIMEOUT_MS,
    ) -> list[OffsetAndEpoch]:
        """Append one batch with acks=quorum; returns (offset, epoch) per record."""
        from ..storage.records import encode_batch

        res = self.client.produce(
            topic, partition, encode_batch(values, keys=keys), timeout_ms=timeout_ms
        )
        return [
            OffsetAndEpoch(o, res.leader_epoch) for o in range(res.base_offset, res.last_offset + 1)
        ]

    def leader_of(self, topic: str, partition: int, timeout_s: float = 10.0) -> int:
        """The partition's leader as the answering nodes see it, waiting while they know
        none yet (a node that does not host the partition learns its leader a moment
        after the election); TimeoutError when none is known within ``timeout_s``."""
        return self.wait_for_leader(topic, partition, timeout_s, running=False)

    def wait_for_leader(
        self,
        topic: str,
        partition: int,
        timeout_s: float = defaults.REQUEST_TIMEOUT_MS / 1000,
        *,
        not_node: int | None = None,
        running: bool = True,
    ) -> int:
        """The partition's leader once one is known (and, with ``running``, its process
        runs), other than ``not_node``; TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pm = self.client.partition_metadata(topic, partition, refresh=True)
                if (
                    pm.leader_id >= 0
                    and pm.leader_id != not_node
                    and (not running or self.is_running(pm.leader_id))
                ):
                    return pm.leader_id
            except QuorumLogError:
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{topic}/{partition} has no leader after {timeout_s}s")
            time.sleep(0.02)

    def force_leader(self, topic: str, partition: int, node: int) -> int:
        return self.client.force_leader(topic, partition, node, confirm=True)

    def describe(self, topic: str, partition: int) -> Any:
        return self.client.describe_quorum(topic, partition)
