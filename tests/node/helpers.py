"""Helpers for node tests: bounded waits, direct per-node requests (no metadata fan-out, so
a SIGSTOPped node never stalls a check), reading partitions back through the client and
from a stopped node's partition directory."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quorumlog.replica import defaults
from quorumlog.replica.client import Client
from quorumlog.replica.client.connection import Connection, ConnectionLost
from quorumlog.replica.client.errors import QuorumLogError
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage import Log, batches_to_table, encode_batch

T = TypeVar("T")

# The node's shipped fetch timeout (replica.defaults, read by default_quorum_config).
FETCH_TIMEOUT_S = defaults.QUORUM_FETCH_TIMEOUT_MS / 1000
# Generous bound for "a new leader appears" on a loaded 2-core machine.
ELECTION_BOUND_S = 20.0

Record = tuple[int, int, bytes | None]  # (offset, leader epoch, value)


def wait_until(
    cond: Callable[[], T | None],
    what: str,
    timeout_s: float = ELECTION_BOUND_S,
    interval_s: float = 0.02,
) -> T:
    """Poll ``cond`` until it returns a truthy value (returned); bounded in time and count.
    Exceptions from ``cond`` count as "not yet" and are shown if the wait times out."""
    deadline = time.monotonic() + timeout_s
    max_polls = int(timeout_s / interval_s) + 100
    last_exc: BaseException | None = None
    for _ in range(max_polls):
        try:
            value = cond()
            if value:
                return value
        except (QuorumLogError, OSError, TimeoutError) as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {timeout_s}s waiting for {what} (last error: {last_exc})"
    )


def node_request(
    cluster: LocalCluster,
    node: int,
    api: ApiKey,
    req: Any,
    resp_cls: type[T],
    timeout_s: float = 2.0,
) -> T:
    """One request to one node over a fresh connection (closed afterwards)."""
    conn = Connection(
        cluster.host, cluster.ports[node], client_id="test-direct", timeout_s=timeout_s
    )
    try:
        return conn.request(api, req, resp_cls)
    finally:
        conn.close()


def local_view(
    cluster: LocalCluster, node: int, topic: str, partition: int, timeout_s: float = 1.0
) -> m.PartitionInfo | None:
    """What ``node`` itself says about ``topic/partition`` (leader, epoch, is_local_leader)."""
    resp = node_request(
        cluster,
        node,
        ApiKey.METADATA,
        m.MetadataRequest(topics=[topic]),
        m.MetadataResponse,
        timeout_s,
    )
    for t in resp.topics:
        if t.name == topic and t.error == 0:
            for p in t.partitions:
                if p.partition == partition:
                    return p
    return None


def find_leader(
    cluster: LocalCluster,
    topic: str,
    partition: int,
    among: Iterable[int],
    *,
    min_epoch: int = 0,
    timeout_s: float = ELECTION_BOUND_S,
    interval_s: float = 0.02,
) -> tuple[int, int]:
    """Wait until one of ``among`` says it leads ``topic/partition`` in an epoch >=
    ``min_epoch``; return (leader, epoch). Asks the nodes directly, one by one."""
    nodes = list(among)

    def probe() -> tuple[int, int] | None:
        for n in nodes:
            try:
                p = local_view(cluster, n, topic, partition, timeout_s=0.5)
            except (ConnectionLost, QuorumLogError, OSError):
                continue
            if p is not None and p.is_local_leader and p.leader_epoch >= min_epoch:
                return n, p.leader_epoch
        return None

    return wait_until(
        probe, f"a leader of {topic}/{partition} among {nodes}", timeout_s, interval_s
    )


def produce_to(
    cluster: LocalCluster,
    node: int,
    topic: str,
    partition: int,
    values: list[bytes],
    *,
    acks: int = m.ACKS_QUORUM,
    timeout_ms: int = 10000,
) -> m.ProduceResponse:
    """Produce one batch straight to ``node`` (no routing, no retries)."""
    req = m.ProduceRequest(
        topic=topic,
        partition=partition,
        acks=acks,
        timeout_ms=timeout_ms,
        records=encode_batch(values),
    )
    return node_request(
        cluster, node, ApiKey.PRODUCE, req, m.ProduceResponse, timeout_s=timeout_ms / 1000 + 5
    )


def read_all(client: Client, topic: str, partition: int, start: int = 0) -> list[Record]:
    """Every user record from ``start`` up to the high watermark, via ``Client.fetch``."""
    out: list[Record] = []
    offset = start
    for _ in range(100_000):
        res = client.fetch(topic, partition, offset, max_bytes=1 << 20)
        if offset >= res.high_watermark:
            return out
        table = res.to_arrow(start_offset=offset)
        out.extend(
            zip(
                table.column("offset").to_pylist(),
                table.column("leaderEpoch").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            )
        )
        last = res.last_offset_and_epoch()
        assert last is not None, f"empty fetch at {offset} below HWM {res.high_watermark}"
        offset = min(last.offset + 1, res.high_watermark)
    raise AssertionError("read_all did not reach the high watermark")


@dataclass(frozen=True)
class LogContents:
    records: list[tuple[int, int, bytes | None, bool]]  # offset, epoch, value, is_control
    epochs: list[tuple[int, int]]  # the leader-epoch checkpoint: (epoch, start offset)
    end_offset: int

    def user_records(self) -> list[Record]:
        return [(o, e, v) for o, e, v, control in self.records if not control]


def read_log_dir(directory: Path) -> LogContents:
    """Everything in a stopped replica's partition directory (control batches included)."""
    log = Log(str(directory))
    try:
        records: list[tuple[int, int, bytes | None, bool]] = []
        offset = log.start_offset
        for _ in range(100_000):
            if offset >= log.end_offset:
                break
            data = log.read(offset, 1 << 20)
            table = batches_to_table(data, include_control=True)
            user = {o for o in batches_to_table(data).column("offset").to_pylist()}
            for o, e, v in zip(
                table.column("offset").to_pylist(),
                table.column("leaderEpoch").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            ):
                records.append((o, e, v, o not in user))
            offset = records[-1][0] + 1
        epochs = [(x.epoch, x.offset) for x in log.epoch_cache.entries]
        return LogContents(records, epochs, log.end_offset)
    finally:
        log.close()


def replica_logs(cluster: LocalCluster, topic: str, partition: int) -> dict[int, LogContents]:
    """Every node's copy of ``topic/partition``; the cluster must be stopped."""
    assert not any(cluster.is_running(n) for n in cluster.ports), "stop the cluster first"
    return {
        n: read_log_dir(cluster.node_dir(n) / f"{topic}-{partition}")
        for n in cluster.ports
        if (cluster.node_dir(n) / f"{topic}-{partition}").is_dir()
    }


def freeze_and_stop(cluster: LocalCluster) -> None:
    """SIGKILL every node at once (what they wrote stays in the page cache), then stop.
    A graceful stop would hand leadership over while nodes exit one by one, and a
    follower may win that election and append a control batch no one else gets."""
    for n in cluster.ports:
        if cluster.is_running(n):
            cluster.procs[n].kill()
    for n in cluster.ports:
        if n in cluster.procs:
            cluster.procs[n].wait(timeout=10)
    cluster.stop()


def describe(
    cluster: LocalCluster, leader: int, topic: str, partition: int
) -> m.DescribeQuorumResponse:
    return node_request(
        cluster,
        leader,
        ApiKey.DESCRIBE_QUORUM,
        m.DescribeQuorumRequest(topic=topic, partition=partition),
        m.DescribeQuorumResponse,
    )


def wait_caught_up(
    cluster: LocalCluster,
    leader: int,
    topic: str,
    partition: int,
    nodes: Iterable[int],
    timeout_s: float = ELECTION_BOUND_S,
) -> None:
    """Until the leader reports every one of ``nodes`` at its own log end offset."""
    want = list(nodes)

    def caught_up() -> bool:
        d = describe(cluster, leader, topic, partition)
        if d.error != 0:
            return False
        ends = {v.replica_id: v.end_offset for v in d.voters}
        return all(ends.get(n, -1) == ends.get(leader) for n in want)

    wait_until(caught_up, f"replicas {want} caught up with leader {leader}", timeout_s)


def copy_log_dir(cluster: LocalCluster, node: int, topic: str, partition: int, dest: Path) -> Path:
    """A copy of a (dead) node's partition directory, to read without touching the original
    (opening a Log recovers and closes it cleanly, which would hide an unclean restart)."""
    import shutil

    target = dest / f"copy-node-{node}-{topic}-{partition}"
    shutil.copytree(cluster.node_dir(node) / f"{topic}-{partition}", target)
    return target


def assert_replicas_identical(logs: dict[int, LogContents]) -> LogContents:
    """All replicas hold the same records (offsets, epochs, values, control flags) and the
    same epoch checkpoint; returns one of them."""
    assert len(logs) >= 2, logs.keys()
    items = sorted(logs.items())
    first_node, first = items[0]
    for n, other in items[1:]:
        assert other.end_offset == first.end_offset, (
            f"node {n} ends at {other.end_offset}, node {first_node} at {first.end_offset}"
        )
        for a, b in zip(first.records, other.records, strict=True):
            assert a == b, f"node {first_node} has {a}, node {n} has {b}"
        assert other.epochs == first.epochs, (first_node, first.epochs, n, other.epochs)
    return first
