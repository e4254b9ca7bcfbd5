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
from pathlib import Path
from typing import Any

from .. import defaults
from ..client import Client, ClientSecurity
from ..client.errors import QuorumLogError
from ..storage.types import OffsetAndEpoch

log = logging.getLogger(__name__)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
        principals: dict[str, tuple[str, list[str]]] | None = None,
        kafka: bool = False,
    ) -> None:
        """``secure``: TLS on every listener with a throwaway CA, and SCRAM authentication
        with principals node-1..N, ``admin`` and ``principals`` (name -> (kind, topics));
        ``mutual_tls`` also requires client certificates. ``kafka``: every node also
        serves Kafka clients (``kafka_bootstrap``)."""
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
        self.start_timeout_s = start_timeout_s
        ids = range(1, nodes + 1)
        ports = free_ports(2 * nodes if kafka else nodes, host)  # one call: all distinct
        self.ports = dict(zip(ids, ports[:nodes], strict=True))
        self.kafka_ports = dict(zip(ids, ports[nodes:], strict=True)) if kafka else {}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
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
        voters = ",".join(f"{i}@{self.host}:{p}" for i, p in self.kafka_ports.items())
        listen = f"{self.host}:{self.kafka_ports[node]}"
        return ["--kafka-listen", listen, "--kafka-voters", voters]

    def node_dir(self, node: int) -> Path:
        return self.data_dir / f"node-{node}"

    def log_path(self, node: int) -> Path:
        return self.data_dir / f"node-{node}.log"

    def command(self, node: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "quorumlog.replica.cli.main",
            "serve",
            "--node-id",
            str(node),
            "--listen",
            f"{self.host}:{self.ports[node]}",
            "--voters",
            self.voters,
            "--data-dir",
            str(self.node_dir(node)),
            "--cluster-id",
            self.cluster_id,
            "--log-level",
            self.log_level,
            *self._security_args(node),
            *self._kafka_args(node),
            *self.node_args,
        ]

    # ---- security ----------------------------------------------------------------
    @property
    def security_dir(self) -> Path:
        return self.data_dir / "security"

    def _setup_security(self, extra: dict[str, tuple[str, list[str]]]) -> None:
        from ..protocol.scram import MECHANISMS, make_verifier
        from .certs import CertificateAuthority
        from .security import AuthConfig, Principal

        self.ca = CertificateAuthority(self.security_dir)
        self.ca_file = self.ca.ca_file
        self.node_certs = {n: self.ca.issue(f"node-{n}") for n in self.ports}
        self.client_cert = self.ca.issue("client") if self.mutual_tls else None
        wanted: dict[str, tuple[str, list[str]]] = {f"node-{n}": ("node", []) for n in self.ports}
        wanted["admin"] = ("admin", [])
        wanted.update(extra)
        auth = AuthConfig()
        for name, (kind, topics) in wanted.items():
            secret = secrets.token_urlsafe(24)
            self.secrets[name] = secret
            path = self.secret_file(name)
            path.write_text(secret + "\n")
            path.chmod(0o600)
            # A verifier per mechanism: Kafka clients may use SCRAM-SHA-256 or -512.
            auth.add(
                Principal(name, kind, tuple(topics)),
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
            self.procs[node] = subprocess.Popen(
                self.command(node), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
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
                    c.refresh_nodes()
                    if c._controller_id >= 0 and len(c._nodes) == self.n:
                        alive = 0
                        for nid in self.procs:
                            try:
                                c.api_versions(nid)
                                alive += 1
                            except (QuorumLogError, OSError):
                                pass
                        if alive == len(self.procs):
                            return
                    last = "metadata quorum has no leader yet"
            except (QuorumLogError, OSError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise TimeoutError(f"cluster not ready after {timeout_s}s: {last}")

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

    def leader_of(self, topic: str, partition: int) -> int:
        return self.client.partition_metadata(topic, partition, refresh=True).leader_id

    def wait_for_leader(
        self,
        topic: str,
        partition: int,
        timeout_s: float = defaults.REQUEST_TIMEOUT_MS / 1000,
        *,
        not_node: int | None = None,
    ) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pm = self.client.partition_metadata(topic, partition, refresh=True)
                if pm.leader_id >= 0 and pm.leader_id != not_node and self.is_running(pm.leader_id):
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
