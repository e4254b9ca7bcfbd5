"""Fuzz one node's port with random bytes and mutated frames for a bounded, seeded time;
then it must be alive and serve produce, fetch and metadata for everyone else.

QUORUMLOG_FUZZ_SECONDS (default 12) and QUORUMLOG_FUZZ_SEED reproduce or extend a run."""

from __future__ import annotations

import collections
import os
import random
import socket
import struct
import time
from pathlib import Path

import msgpack
import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import API_VERSION, PREFIX, ApiKey, encode, encode_frame
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage import batches_to_table, encode_batch

from .helpers import find_leader, local_view, read_all

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

FUZZ_SECONDS = float(os.environ.get("QUORUMLOG_FUZZ_SECONDS", "12"))
SEED = int(os.environ.get("QUORUMLOG_FUZZ_SEED", "595320"))
TOPIC = "fuzz"


def frame_bytes(api: int, req: object, version: int = API_VERSION, cid: int = 1) -> bytes:
    body, payload = encode(req)
    return b"".join(bytes(b) for b in encode_frame(api, version, cid, "fuzzer", body, payload))


def valid_frames(epoch: int) -> list[bytes]:
    """Well-formed requests of every non-destructive API (no create/delete/force-leader:
    a mutation that still decoded would change the cluster under the test)."""
    batch = encode_batch([b"fuzz-value", None], keys=[b"k", None])
    raft_body, _ = encode(m.ApiVersionsRequest())
    reqs: list[tuple[int, object]] = [
        (ApiKey.API_VERSIONS, m.ApiVersionsRequest()),
        (ApiKey.METADATA, m.MetadataRequest([TOPIC])),
        (ApiKey.METADATA, m.MetadataRequest(None)),
        (ApiKey.PRODUCE, m.ProduceRequest(TOPIC, 0, m.ACKS_LEADER, 1000, batch)),
        (ApiKey.PRODUCE, m.ProduceRequest(TOPIC, 0, m.ACKS_QUORUM, 1000, batch)),
        (ApiKey.FETCH, m.FetchRequest(TOPIC, 0, epoch, 0, 0, 1, 1 << 16)),
        (ApiKey.FETCH, m.FetchRequest(TOPIC, 0, -1, 1, 50, 1, 100)),
        (ApiKey.LIST_OFFSETS, m.ListOffsetsRequest(TOPIC, 0, epoch, m.LATEST_TIMESTAMP)),
        (ApiKey.LIST_OFFSETS, m.ListOffsetsRequest(TOPIC, 0, -1, 0)),
        (
            ApiKey.OFFSETS_FOR_LEADER_EPOCH,
            m.OffsetsForLeaderEpochRequest(TOPIC, 0, epoch, epoch),
        ),
        (ApiKey.DESCRIBE_QUORUM, m.DescribeQuorumRequest(TOPIC, 0)),
        (ApiKey.LIST_TOPICS, m.ListTopicsRequest()),
        (ApiKey.RAFT, m.RaftEnvelope(TOPIC, 0, "VoteRequest", raft_body, b"")),
        (ApiKey.RAFT, m.RaftEnvelope(TOPIC, 0, "NoSuchKind", [], b"")),
    ]
    return [frame_bytes(int(api), req, cid=i + 1) for i, (api, req) in enumerate(reqs)]


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
        c.create_topic(TOPIC, 1)
        c.create_topic("bystander", 1)
        target, epoch = find_leader(c, TOPIC, 0, [c.leader_of(TOPIC, 0)])
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
