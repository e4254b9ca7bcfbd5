"""Fuzz one node's port with random bytes and mutated frames for a bounded, seeded time;
then it must be alive and serve produce, fetch and metadata for everyone else. And flood
one node with malformed and forged raft frames: refused, counted, logged in proportion.

QUORUMLOG_FUZZ_SECONDS (default 12), QUORUMLOG_FUZZ_FRAMES (default 10,000; `make fuzz`
sends 120,000) and QUORUMLOG_FUZZ_SEED reproduce or extend a run."""

from __future__ import annotations

import collections
import os
import random
import re
import socket
import struct
import time
from pathlib import Path

import msgpack
import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.node import RAFT_CLASSES
from quorumlog.replica.node.security import ForgedSender, check_raft_sender
from quorumlog.replica.protocol import (
    API_VERSION,
    PREFIX,
    ApiKey,
    DecodeError,
    FrameError,
    decode_body,
    encode,
)
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import Message
from quorumlog.replica.storage import batches_to_table, encode_batch

from tests.support.cluster import create_and_find_leader, local_view, read_all
from tests.support.forge import connect, leadership_claims, quorum_view, send_raft, sync
from tests.support.messages import consumer_fetch, fetch_request
from tests.support.waits import log_text, wait_for_log
from tests.support.wire import raft_frame, read_frame, request_frame

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

FUZZ_SECONDS = float(os.environ.get("QUORUMLOG_FUZZ_SECONDS", "12"))
SEED = int(os.environ.get("QUORUMLOG_FUZZ_SEED", "595320"))
TOPIC = "fuzz"


def valid_frames(epoch: int) -> list[bytes]:
    """Well-formed requests of every non-destructive API (no create/delete/force-leader:
    a mutation that still decoded would change the cluster under the test)."""
    batch = encode_batch([b"fuzz-value", None], keys=[b"k", None])
    raft_body, _ = encode(m.ApiVersionsRequest())
    reqs: list[tuple[int, object]] = [
        (ApiKey.API_VERSIONS, m.ApiVersionsRequest()),
        (ApiKey.METADATA, m.MetadataRequest(topics=[TOPIC])),
        (ApiKey.METADATA, m.MetadataRequest(topics=None)),
        (
            ApiKey.PRODUCE,
            m.ProduceRequest(
                topic=TOPIC, partition=0, acks=m.ACKS_LEADER, timeout_ms=1000, records=batch
            ),
        ),
        (
            ApiKey.PRODUCE,
            m.ProduceRequest(
                topic=TOPIC, partition=0, acks=m.ACKS_QUORUM, timeout_ms=1000, records=batch
            ),
        ),
        (ApiKey.FETCH, consumer_fetch(topic=TOPIC, current_leader_epoch=epoch, max_bytes=1 << 16)),
        (ApiKey.FETCH, consumer_fetch(topic=TOPIC, fetch_offset=1, max_wait_ms=50, max_bytes=100)),
        (
            ApiKey.LIST_OFFSETS,
            m.ListOffsetsRequest(
                topic=TOPIC, partition=0, current_leader_epoch=epoch, timestamp=m.LATEST_TIMESTAMP
            ),
        ),
        (
            ApiKey.LIST_OFFSETS,
            m.ListOffsetsRequest(topic=TOPIC, partition=0, current_leader_epoch=-1, timestamp=0),
        ),
        (
            ApiKey.OFFSETS_FOR_LEADER_EPOCH,
            m.OffsetsForLeaderEpochRequest(
                topic=TOPIC, partition=0, current_leader_epoch=epoch, leader_epoch=epoch
            ),
        ),
        (ApiKey.DESCRIBE_QUORUM, m.DescribeQuorumRequest(topic=TOPIC, partition=0)),
        (ApiKey.LIST_TOPICS, m.ListTopicsRequest()),
        (
            ApiKey.RAFT,
            m.RaftEnvelope(
                topic=TOPIC, partition=0, kind="VoteRequest", body=raft_body, records=b""
            ),
        ),
        (
            ApiKey.RAFT,
            m.RaftEnvelope(topic=TOPIC, partition=0, kind="NoSuchKind", body=[], records=b""),
        ),
    ]
    return [
        request_frame(api, req, correlation_id=i + 1, client_id="fuzzer")
        for i, (api, req) in enumerate(reqs)
    ]


def random_msgpack(rng: random.Random, depth: int = 0) -> object:
    k = rng.randrange(8 if depth < 3 else 5)
    if k == 0:
        return None
    if k == 1:
        return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64 - 1, rng.randrange(-1000, 1000)])
    if k == 2:
        return rng.randbytes(rng.randrange(20)).decode("latin-1")
    if k == 3:
        return rng.randbytes(rng.randrange(20))
    if k == 4:
        return rng.random()
    if k == 5:
        return [random_msgpack(rng, depth + 1) for _ in range(rng.randrange(7))]
    if k == 6:
        return {str(i): random_msgpack(rng, depth + 1) for i in range(rng.randrange(3))}
    return rng.choice([True, False])


def with_meta(meta: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(4 + len(meta) + len(payload), len(meta)) + meta + payload


def mutate(rng: random.Random, valid: list[bytes], epoch: int) -> tuple[str, bytes, bool]:
    """One fuzz input: (kind, bytes, whether to vanish without reading an answer)."""
    base = rng.choice(valid)
    kind = rng.choice(
        [
            "random",
            "bitflip",
            "bitflip",
            "truncate",
            "wrong-length",
            "oversized",
            "meta-shape",
            "body-shape",
            "unknown-api",
            "wrong-version",
            "pipeline",
            "vanish",
        ]
    )
    vanish = rng.random() < 0.3
    if kind == "random":
        data = rng.randbytes(rng.randrange(1, 300))
    elif kind == "bitflip":
        buf = bytearray(base)
        for _ in range(rng.randrange(1, 6)):
            i = rng.randrange(PREFIX.size, len(buf))  # keep the prefix: reach the decoder
            buf[i] ^= 1 << rng.randrange(8)
        data = bytes(buf)
    elif kind == "truncate":
        data = base[: rng.randrange(1, len(base))]
        vanish = True
    elif kind == "wrong-length":
        total, meta_len = struct.unpack(">II", base[:8])
        delta = rng.choice([-3, -1, 1, 7, 1000, -total + 2])
        data = struct.pack(">II", max(0, total + delta), meta_len) + base[8:]
        vanish = vanish or delta > 0
    elif kind == "oversized":
        data = struct.pack(">II", rng.choice([(64 << 20) + 1, 2**32 - 1]), 4) + base[8:]
    elif kind == "meta-shape":
        data = with_meta(msgpack.packb(random_msgpack(rng), use_bin_type=True))
    elif kind == "body-shape":
        api = rng.choice([int(k) for k in m.REQUESTS if k not in _DESTRUCTIVE])
        meta = msgpack.packb([api, 0, 9, "fuzzer", random_msgpack(rng)], use_bin_type=True)
        data = with_meta(meta, rng.randbytes(rng.randrange(3)))
    elif kind == "unknown-api":
        api = rng.choice([4, 7, 99, 126, 128, -1, 2**31, -(2**40)])
        data = with_meta(msgpack.packb([api, 0, 5, "fuzzer", []]))
    elif kind == "wrong-version":
        api = rng.choice([int(k) for k in m.REQUESTS if k not in _DESTRUCTIVE])
        version = rng.choice([1, 2, -1, 2**31])
        data = with_meta(msgpack.packb([api, version, 5, "fuzzer", [None]]))
    elif kind == "pipeline":
        parts = [rng.choice(valid) for _ in range(rng.randrange(2, 6))]
        parts.insert(rng.randrange(len(parts) + 1), rng.randbytes(rng.randrange(1, 40)))
        data = b"".join(parts)
    else:  # vanish mid-frame, with a RST
        data = base[: rng.randrange(1, len(base))]
        vanish = True
    return kind, data, vanish


_DESTRUCTIVE = {ApiKey.CREATE_TOPIC, ApiKey.DELETE_TOPIC, ApiKey.FORCE_LEADER}


def send_one(
    addr: tuple[str, int], data: bytes, vanish: bool, rst: bool, lingering: list[socket.socket]
) -> None:
    s = socket.create_connection(addr, timeout=1.0)
    try:
        s.sendall(data)
        if vanish:
            if rst:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif len(lingering) < 20:
                # Keep some half-sent frames open for a while: the node holds them too.
                lingering.append(s)
                return
            return
        # Half-close: the node answers what it parsed, then sees EOF and closes.
        s.shutdown(socket.SHUT_WR)
        s.settimeout(1.0)
        try:
            while s.recv(65536):
                pass
        except (TimeoutError, OSError):
            pass
    finally:
        if not lingering or lingering[-1] is not s:
            s.close()


def test_fuzz_one_node_stays_up_and_serves(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with LocalCluster(3, tmp_path) as c:
        target, epoch = create_and_find_leader(c, TOPIC)
        c.create_topic("bystander", 1)
        before = c.produce(TOPIC, 0, [b"before"])
        valid = valid_frames(epoch)
        addr = (c.host, c.ports[target])
        kinds: collections.Counter[str] = collections.Counter()
        lingering: list[socket.socket] = []
        deadline = time.monotonic() + FUZZ_SECONDS
        sent = 0
        try:
            for i in range(50_000):
                if time.monotonic() >= deadline:
                    break
                kind, data, vanish = mutate(rng, valid, epoch)
                try:
                    send_one(addr, data, vanish, rst=rng.random() < 0.5, lingering=lingering)
                except OSError as exc:
                    pytest.fail(f"node {target} stopped accepting after {sent} inputs: {exc}")
                kinds[kind] += 1
                sent += 1
                if len(lingering) >= 20:
                    for s in lingering:
                        s.close()
                    lingering.clear()
                if i % 200 == 199:
                    # Everyone else is still served while the fuzzer runs.
                    assert c.is_running(target), c.tail(target)
                    c.produce("bystander", 0, [f"during-{i}".encode()], timeout_ms=10000)
        finally:
            for s in lingering:
                s.close()
        print(
            f"\nfuzz seed {SEED}: {sent} inputs to node {target} in {FUZZ_SECONDS}s: {dict(kinds)}"
        )
        assert sent > 100

        assert c.is_running(target), f"node {target} died:\n{c.tail(target, 60)}"
        view = local_view(c, target, TOPIC, 0)
        assert view is not None
        with Client(c.bootstrap, request_timeout_ms=15000) as fresh:
            assert TOPIC in fresh.metadata()
            after = fresh.produce(TOPIC, 0, encode_batch([b"after"]))
            got = read_all(fresh, TOPIC, 0)
            values = [v for _, _, v in got]
            assert (before[0].offset, before[0].epoch, b"before") in got
            assert values[-1] == b"after" and got[-1][0] == after.base_offset
            # What the fuzzer got appended is valid data: the whole log decodes with CRCs.
            res = fresh.fetch(TOPIC, 0, 0, max_bytes=64 << 20)
            batches_to_table(res.records, include_control=True, verify_crc=True)
            assert read_all(fresh, "bystander", 0)
        for n in c.ports:
            assert c.is_running(n)
            assert local_view(c, n, TOPIC, 0) is not None
        errors = [ln for ln in c.tail(target, 100_000).splitlines() if " ERROR " in ln]
        print(f"node {target} logged {len(errors)} ERROR lines; first: {errors[:5]}")


# ---- a flood of bad raft frames --------------------------------------------------------

FLOOD_FRAMES = int(os.environ.get("QUORUMLOG_FUZZ_FRAMES", "10000"))
# Frames one fuzzing connection pipelines before it closes (and its summary is logged).
FRAMES_PER_CONNECTION = 5000
LOG_GROWTH_LIMIT = 1_000_000


def forged_messages(
    rng: random.Random, cluster_id: str, target: int, epoch: int, liar: int
) -> list[Message]:
    """Well-formed raft messages to ``target`` claiming to come from node ``liar``, each of
    which would move leadership or the high watermark if applied."""
    high = epoch + rng.randrange(1, 1000)
    claims = leadership_claims(cluster_id, liar, target, epoch, high, pre_vote=rng.random() < 0.5)
    position = {"fetch_offset": rng.randrange(10**6), "last_fetched_epoch": epoch}
    head = {"cluster_id": cluster_id, "replica_id": liar, "dst": target}
    return [*claims, fetch_request(**head, current_leader_epoch=epoch, **position)]


def raft_input(
    rng: random.Random, cluster_id: str, target: int, epochs: dict[str, int], nodes: list[int]
) -> bytes:
    """One RAFT frame that is malformed or forged, its framing intact (so it can be
    pipelined: a bad frame prefix would close the connection)."""
    topic = rng.choice(sorted(epochs))
    epoch = epochs[topic]
    msg = rng.choice(forged_messages(rng, cluster_id, target, epoch, rng.choice(nodes)))
    kind = rng.randrange(5)
    if kind == 0:  # well-formed and forged
        return raft_frame(topic, 0, msg)
    body, _ = encode(msg)
    if kind == 1:  # the envelope is not an envelope
        env: object = random_msgpack(rng)
    elif kind == 2:  # an unknown message kind
        env = [topic, 0, rng.choice(["NoSuchKind", "", "Node", "vote"]), body, None]
    elif kind == 3:  # a known kind with a body of the wrong shape
        shape = random_msgpack(rng)
        env = [topic, 0, type(msg).__name__, shape if rng.random() < 0.5 else body[:-1], None]
    else:  # bit flips in a forged frame's metadata
        buf = bytearray(raft_frame(topic, 0, msg))
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(PREFIX.size, len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        return bytes(buf)
    meta = msgpack.packb([int(ApiKey.RAFT), API_VERSION, 0, "fuzzer", env], use_bin_type=True)
    return with_meta(meta)


def pipelinable(data: bytes, sender: int | None) -> bool:
    """A RAFT frame the node will read as one frame and never apply: the framing decodes,
    and the message does not decode or does not claim ``sender`` (node 3's credentials may
    say what node 3 says; that is not forgery)."""
    try:
        frame = read_frame(data)
    except FrameError:
        return False
    if frame.api_key != ApiKey.RAFT or sender is None:
        return frame.api_key == ApiKey.RAFT
    try:
        env = decode_body(m.RaftEnvelope, frame.body, frame.payload)
        cls = RAFT_CLASSES[env.kind]
        msg = decode_body(cls, env.body, env.records)
    except (DecodeError, KeyError):
        return True
    try:
        check_raft_sender(msg, sender)
    except ForgedSender:
        return True
    return False


def quorum_epochs(c: LocalCluster, topic: str) -> dict[tuple[int, str], tuple[int, int]]:
    out: dict[tuple[int, str], tuple[int, int]] = {}
    for (n, t, p), le in quorum_view(c, topic).items():
        if p == 0:
            out[(n, t)] = le
    return out


def elections_logged(c: LocalCluster) -> int:
    text = "".join(log_text(c, n) for n in c.ports)
    return sum(text.count(s) for s in (": leader in epoch", ": follows node", "resigning"))


@pytest.mark.timeout(900)
def test_flood_of_bad_raft_frames_is_refused_and_logged_in_proportion(tmp_path: Path) -> None:
    """FLOOD_FRAMES malformed and forged raft frames at one node, pipelined on client
    connections and on a connection with node 3's credentials, plus a sprinkle of frames
    that break the framing (one connection each): the node stays up, no epoch changes
    anywhere, and its log grows by less than 1 MB (one line per connection, a budget)."""
    rng = random.Random(SEED)
    with LocalCluster(3, tmp_path / "c") as c:
        target, epoch = create_and_find_leader(c, TOPIC)
        c.create_topic("bystander", 1)
        meta = {n: le for (n, t), le in quorum_epochs(c, TOPIC).items() if t != TOPIC}
        meta_epoch = next(iter(meta.values()))[1]
        epochs = {TOPIC: epoch, "__cluster_metadata": meta_epoch}
        before_view = quorum_epochs(c, TOPIC)
        before_elections = elections_logged(c)
        log_before = c.log_path(target).stat().st_size
        forger = 3 if target != 3 else 2
        valid = valid_frames(epoch)
        sent = collections.Counter[str]()
        t0 = time.monotonic()
        while sum(sent.values()) < FLOOD_FRAMES:
            as_node = forger if rng.random() < 0.5 else None
            conn = connect(c, target, as_node=as_node)
            chunk: list[bytes] = []
            try:
                for _ in range(FRAMES_PER_CONNECTION):
                    if sum(sent.values()) >= FLOOD_FRAMES:
                        break
                    if rng.random() < 0.02:
                        # Framing errors close their connection: one connection each.
                        _, data, vanish = mutate(rng, valid, epoch)
                        send_one((c.host, c.ports[target]), data, vanish, True, [])
                        sent["one-shot"] += 1
                        continue
                    data = raft_input(rng, c.cluster_id, target, epochs, sorted(c.ports))
                    if not pipelinable(data, as_node):
                        continue
                    chunk.append(data)
                    sent["node-3 raft" if as_node else "client raft"] += 1
                    if len(chunk) >= 500:
                        conn._sock.sendall(b"".join(chunk))
                        chunk.clear()
                conn._sock.sendall(b"".join(chunk))
                sync(conn)  # every frame before this answer was handled
            finally:
                conn.close()
            assert c.is_running(target), c.tail(target)
        elapsed = time.monotonic() - t0
        # A last connection whose close summary carries the node-wide totals (again, if
        # the log budget held that line back: it refills within a second).
        totals = None
        for _ in range(40):
            probe = connect(c, target)
            port = probe._sock.getsockname()[1]
            send_raft(probe, TOPIC, 0, *forged_messages(rng, c.cluster_id, target, epoch, 2)[:2])
            sync(probe)
            probe.close()
            mark = f"{port}) closed after 2 problems"
            try:
                line = wait_for_log(c, mark, 0.5, nodes=[target]).split(mark)[-1]
            except AssertionError:
                continue
            totals = re.search(r"node totals: (\d+) refused raft messages, (\d+) bad frames", line)
            break
        assert totals is not None, c.tail(target)
        counted = int(totals[1]) + int(totals[2])
        pipelined = sent["client raft"] + sent["node-3 raft"]
        growth = c.log_path(target).stat().st_size - log_before
        print(
            f"\nflood seed {SEED}: {dict(sent)} to node {target} in {elapsed:.1f}s; node counted "
            f"{totals[1]} refused + {totals[2]} bad; log grew {growth} bytes"
        )
        assert counted >= pipelined + 2
        assert c.is_running(target), c.tail(target)
        assert growth < LOG_GROWTH_LIMIT, f"log grew {growth} bytes"
        grown = log_text(c, target).encode()[log_before:].decode(errors="replace")
        assert "Traceback" not in grown, grown[-3000:]
        # No election anywhere: same leaders and epochs, no role change logged.
        assert quorum_epochs(c, TOPIC) == before_view
        assert elections_logged(c) == before_elections
        c.produce("bystander", 0, [b"after-flood"], timeout_ms=10000)
        res = c.produce(TOPIC, 0, [b"after-flood"], timeout_ms=10000)
        assert res[0].epoch == epoch
