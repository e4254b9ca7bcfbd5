"""Real node processes (``LocalCluster``) for tests: the module-scoped cluster fixture,
direct per-node requests (no metadata fan-out, so a SIGSTOPped node never stalls a
check), leaders found by asking the nodes, producing straight to a node, reading
partitions back through the client and from a stopped node's partition directory."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from quorumlog.replica import defaults
from quorumlog.replica.client import Client
from quorumlog.replica.client.connection import Connection
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage import Log, batches_to_table, encode_batch

from .waits import TRANSIENT, wait_until

T = TypeVar("T")

# The node's shipped fetch timeout (replica.defaults, read by default_quorum_config).
FETCH_TIMEOUT_S = defaults.QUORUM_FETCH_TIMEOUT_MS / 1000
# Generous bound for "a new leader appears" on a loaded 2-core machine.
ELECTION_BOUND_S = 20.0

Record = tuple[int, int, bytes | None]  # (offset, leader epoch, value)


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """One 3-node cluster per test module; each test uses its own topic(s). Tests that
    inject faults leave every node running again when they finish."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    with LocalCluster(3, tmp_path_factory.mktemp(name)) as c:
        yield c


#: Lines of each node's log a failed test's report shows.
FAILURE_LOG_LINES = 60


def cluster_log_sections(funcargs: dict[str, Any]) -> list[tuple[str, str]]:
    """The last lines of every node log of the clusters a test used, as report sections:
    CI keeps only a test's report, and a fault test's failure is read from the nodes."""
    sections: list[tuple[str, str]] = []
    seen: set[int] = set()
    for value in funcargs.values():
        if not isinstance(value, LocalCluster) or id(value) in seen:
            continue
        seen.add(id(value))
        for node in sorted(value.procs):
            sections.append(
                (f"node {node} log ({value.log_path(node)})", value.tail(node, FAILURE_LOG_LINES))
            )
    return sections


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
            except TRANSIENT:
                continue
            if p is not None and p.is_local_leader and p.leader_epoch >= min_epoch:
                return n, p.leader_epoch
        return None

    return wait_until(
        probe, timeout_s, f"a leader of {topic}/{partition} among {nodes}", interval=interval_s
    )


def create_and_find_leader(cluster: LocalCluster, topic: str) -> tuple[int, int]:
    """A new one-partition topic; (leader, epoch) of its partition, as the leader says."""
    cluster.create_topic(topic, 1)
    return find_leader(cluster, topic, 0, [cluster.leader_of(topic, 0)])


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


def produce_batches(
    cluster: LocalCluster, topic: str, batches: int, size: int, tag: str
) -> list[Record]:
    """``batches`` batches of ``size`` records ``{tag}-{batch}-{i}`` to partition 0 through
    the cluster's client (acks=quorum, routed to the leader); what was acknowledged."""
    acked: list[Record] = []
    for b in range(batches):
        values = [f"{tag}-{b}-{i}".encode() for i in range(size)]
        res = cluster.produce(topic, 0, values)
        acked.extend((o, e, v) for (o, e), v in zip(res, values, strict=True))
    return acked


def produce_direct(
    cluster: LocalCluster,
    node: int,
    topic: str,
    batches: int,
    size: int,
    tag: str,
    *,
    acks: int = m.ACKS_QUORUM,
    epoch: int | None = None,
    timeout_ms: int = 10000,
) -> list[Record]:
    """As ``produce_batches``, but each batch straight to ``node`` (``produce_to``); each
    must succeed, in leader epoch ``epoch`` if given."""
    out: list[Record] = []
    for b in range(batches):
        values = [f"{tag}-{b}-{i}".encode() for i in range(size)]
        r = produce_to(cluster, node, topic, 0, values, acks=acks, timeout_ms=timeout_ms)
        assert r.error == 0, r
        assert epoch is None or r.leader_epoch == epoch, (r, epoch)
        out.extend((r.base_offset + i, r.leader_epoch, v) for i, v in enumerate(values))
    return out


def uncommitted_tail(
    cluster: LocalCluster, leader: int, topic: str, epoch: int
) -> tuple[list[Record], list[Record]]:
    """Pause every follower of ``leader`` and append acks=leader batches it alone holds:
    (leak, tail). A follower's fetch parked at the leader is answered with the first batch
    appended now, into the stopped follower's socket buffer: that batch (``leak``) may
    still be replicated and committed by the next leader. The ``tail`` cannot be."""
    for f in cluster.ports:
        if f != leader:
            cluster.pause(f)
    leak = produce_direct(cluster, leader, topic, 1, 10, "leak", acks=m.ACKS_LEADER, epoch=epoch)
    tail = produce_direct(cluster, leader, topic, 3, 10, "tail", acks=m.ACKS_LEADER, epoch=epoch)
    return leak, tail


def wait_hwm(cluster: LocalCluster, topic: str, offset: int) -> None:
    wait_until(
        lambda: cluster.client.list_offsets(topic, 0, "latest").offset >= offset,
        ELECTION_BOUND_S,
        f"{topic}/0 high watermark >= {offset}",
    )


#: Under check-quorum's 3 s (1.5 x the 2 s fetch timeout): a stalled leader stays leader
#: while the requests it cannot commit time out and come back to it.
STALL_S = 2.2


def leader_fault(c: LocalCluster, topic: str, partition: int, fault: str) -> None:
    """``stall``: pause the partition leader's followers for STALL_S (it appends but cannot
    commit, so produce requests time out and are sent again to it); ``kill``: kill -9 of
    the leader, restarted at once (what it left unanswered is sent to the next leader,
    which may hold it)."""
    leader = c.wait_for_leader(topic, partition, 30)
    if fault == "kill":
        c.kill(leader)
        time.sleep(0.05)
        c.start_node(leader)
        return
    followers = [n for n in c.procs if n != leader]
    for n in followers:
        c.pause(n)
    try:
        time.sleep(STALL_S)
    finally:
        for n in followers:
            c.resume(n)


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
    wait_until(
        lambda: caught_up(cluster, leader, topic, partition, want),
        timeout_s,
        f"replicas {want} caught up with leader {leader}",
    )


def caught_up(
    cluster: LocalCluster, leader: int, topic: str, partition: int, nodes: list[int]
) -> bool:
    """``leader`` leads and reports every one of ``nodes`` at its own log end offset."""
    d = describe(cluster, leader, topic, partition)
    if d.error != 0:
        return False
    ends = {v.replica_id: v.end_offset for v in d.voters}
    return all(ends.get(n, -1) == ends.get(leader) for n in nodes)


def wait_led_and_caught_up(
    cluster: LocalCluster, topic: str, partition: int, timeout_s: float = 3 * ELECTION_BOUND_S
) -> tuple[int, int]:
    """Until some node leads with every node caught up: (leader, epoch). Leadership may
    move meanwhile (a leader elected while its peers restart can lose its quorum)."""
    nodes = list(cluster.ports)

    def led_and_caught_up() -> tuple[int, int] | None:
        leader, epoch = find_leader(cluster, topic, partition, nodes)
        return (leader, epoch) if caught_up(cluster, leader, topic, partition, nodes) else None

    return wait_until(led_and_caught_up, timeout_s, f"{topic}/{partition} led, all caught up")


def copy_log_dir(cluster: LocalCluster, node: int, topic: str, partition: int, dest: Path) -> Path:
    """A copy of a (dead) node's partition directory, to read without touching the original
    (opening a Log recovers and closes it cleanly, which would hide an unclean restart)."""
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


def assert_tail_truncated(
    cluster: LocalCluster,
    new_leader: int,
    topic: str,
    new_epoch: int,
    *,
    acked: list[Record],
    leak: list[Record],
    tail: list[Record],
    after: list[Record],
) -> LogContents:
    """After an ``uncommitted_tail`` and a new leader that wrote ``after`` over its offsets:
    every replica catches up, the log reads ``acked`` (+ ``leak`` if it was replicated) +
    ``after``; then the cluster is frozen and every replica's files hold exactly that, no
    record of the tail, and the new epoch starts where the old leader's log diverged.
    Returns the replicas' common contents."""
    wait_caught_up(cluster, new_leader, topic, 0, cluster.ports)
    wait_hwm(cluster, topic, after[-1][0] + 1)
    survived = read_all(cluster.client, topic, 0)
    assert survived in (acked + after, acked + leak + after)
    freeze_and_stop(cluster)
    same = assert_replicas_identical(replica_logs(cluster, topic, 0))
    assert same.user_records() == survived
    assert not {v for _, _, v in same.user_records()} & {v for _, _, v in tail}
    assert dict(same.epochs)[new_epoch] in (leak[0][0], tail[0][0])
    return same
