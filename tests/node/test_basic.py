"""Election on start, acks=quorum produce read back, and KIP-320 fencing of Fetch,
ListOffsets and OffsetsForLeaderEpoch, on one shared 3-node cluster."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import (
    FencedLeaderEpochError,
    UnknownLeaderEpochError,
)
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey, ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage import encode_batch

from tests.support.cluster import find_leader, local_view, node_request, read_all
from tests.support.messages import consumer_fetch
from tests.support.waits import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TOPIC = "basic"


@pytest.fixture(scope="module")
def cluster(cluster: LocalCluster) -> LocalCluster:
    """The module's cluster (tests/support), with TOPIC's three partitions."""
    cluster.create_topic(TOPIC, 3)
    return cluster


def test_every_partition_elects_a_leader_on_start(cluster: LocalCluster) -> None:
    meta = cluster.client.wait_for_leaders(TOPIC, 20000)
    assert sorted(meta.partitions) == [0, 1, 2]
    for p, pm in meta.partitions.items():
        assert pm.leader_id in (1, 2, 3)
        assert pm.leader_epoch >= 1
        assert sorted(pm.replicas) == [1, 2, 3]
        # The leader itself agrees (asked directly, not through the merged view).
        leader, epoch = find_leader(cluster, TOPIC, p, [pm.leader_id])
        assert (leader, epoch) == (pm.leader_id, pm.leader_epoch)
    # Preferred replicas stand first, so leadership spreads over the nodes. On a loaded
    # machine one hold-off (2 x election timeout) may expire first, so ask for a spread,
    # not for every partition on its preferred replica.
    preferred = sum(pm.leader_id == pm.replicas[0] for pm in meta.partitions.values())
    print(f"\n{preferred}/3 partitions led by their preferred replica")
    assert len({pm.leader_id for pm in meta.partitions.values()}) >= 2


def test_produce_quorum_and_read_back(cluster: LocalCluster) -> None:
    expected = []
    for batch in range(5):
        values = [f"p0-{batch}-{i}".encode() for i in range(20)]
        acked = cluster.produce(TOPIC, 0, values)
        assert len(acked) == len(values)
        offsets = [a.offset for a in acked]
        assert offsets == list(range(offsets[0], offsets[0] + len(values)))
        expected.extend((a.offset, a.epoch, v) for a, v in zip(acked, values, strict=True))
    # Offsets increase across batches; the epoch is the leader's.
    assert [o for o, _, _ in expected] == sorted({o for o, _, _ in expected})
    pm = cluster.client.partition_metadata(TOPIC, 0, refresh=True)
    assert {e for _, e, _ in expected} == {pm.leader_epoch}
    # acks=quorum: the high watermark already covers every acknowledged offset.
    assert pm.high_watermark > expected[-1][0]
    got = read_all(cluster.client, TOPIC, 0)
    assert got[-len(expected) :] == expected
    # A fenced read with the right epoch sees the same records.
    res = cluster.client.fetch(TOPIC, 0, expected[0][0], current_leader_epoch=pm.leader_epoch)
    table = res.to_arrow(start_offset=expected[0][0])
    assert table.column("value").to_pylist()[: len(expected)] == [v for _, _, v in expected]
    # ListOffsets latest = HWM, with the epoch of the record before it.
    latest = cluster.client.list_offsets(TOPIC, 0, "latest", current_leader_epoch=pm.leader_epoch)
    assert latest.offset == res.high_watermark == expected[-1][0] + 1
    assert latest.epoch == pm.leader_epoch
    earliest = cluster.client.list_offsets(TOPIC, 0, "earliest")
    assert earliest.offset == 0


def test_keys_and_separate_partitions(cluster: LocalCluster) -> None:
    a = cluster.produce(TOPIC, 1, [b"v1", b"v2"], keys=[b"k1", None])
    b = cluster.produce(TOPIC, 2, [b"w1"])
    res = cluster.client.fetch(TOPIC, 1, a[0].offset)
    rows = res.to_arrow(start_offset=a[0].offset).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [(b"k1", b"v1"), (None, b"v2")]
    assert [(r["offset"], r["leaderEpoch"]) for r in rows] == [tuple(x) for x in a]
    assert read_all(cluster.client, TOPIC, 2)[-1] == (b[0].offset, b[0].epoch, b"w1")


# ---- KIP-320 fencing ---------------------------------------------------------------------


def _leader_and_epoch(cluster: LocalCluster, partition: int) -> tuple[int, int]:
    pm = cluster.client.partition_metadata(TOPIC, partition, refresh=True)
    leader, epoch = find_leader(cluster, TOPIC, partition, [pm.leader_id])
    return leader, epoch


@pytest.mark.parametrize("call", ["fetch", "list_offsets", "offsets_for_leader_epoch"])
def test_fenced_and_unknown_leader_epoch(cluster: LocalCluster, call: str) -> None:
    cluster.produce(TOPIC, 0, [b"fence-me"])
    _, epoch = _leader_and_epoch(cluster, 0)
    c = cluster.client

    def do(current: int) -> object:
        if call == "fetch":
            return c.fetch(TOPIC, 0, 0, current_leader_epoch=current)
        if call == "list_offsets":
            return c.list_offsets(TOPIC, 0, "latest", current_leader_epoch=current)
        return c.offsets_for_leader_epoch(TOPIC, 0, epoch, current_leader_epoch=current)

    with pytest.raises(FencedLeaderEpochError) as fenced:
        do(epoch - 1)
    assert fenced.value.error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert str(epoch - 1) in str(fenced.value) and "FENCED_LEADER_EPOCH" in str(fenced.value)
    with pytest.raises(UnknownLeaderEpochError) as unknown:
        do(epoch + 1)
    assert unknown.value.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    # The right epoch and the "no epoch" sentinel both pass.
    do(epoch)
    if call == "fetch":
        c.fetch(TOPIC, 0, 0)


def test_offsets_for_leader_epoch_answers(cluster: LocalCluster) -> None:
    cluster.produce(TOPIC, 0, [b"x"])
    _, epoch = _leader_and_epoch(cluster, 0)
    hwm = cluster.client.list_offsets(TOPIC, 0, "latest").offset
    # The current epoch ends at the log end offset (leader's LEO; acks=quorum so == HWM).
    ans = cluster.client.offsets_for_leader_epoch(TOPIC, 0, epoch, current_leader_epoch=epoch)
    assert ans.epoch == epoch and ans.end_offset >= hwm
    # An epoch above the leader's is unknown: (-1, -1) as in KIP-101.
    ans = cluster.client.offsets_for_leader_epoch(TOPIC, 0, epoch + 5, current_leader_epoch=epoch)
    assert tuple(ans) == (-1, -1)


@pytest.mark.parametrize("api", ["fetch", "list_offsets", "offsets_for_leader_epoch"])
def test_requests_to_a_follower_answer_not_leader(cluster: LocalCluster, api: str) -> None:
    leader, epoch = _leader_and_epoch(cluster, 0)
    follower = next(n for n in (1, 2, 3) if n != leader)
    # Both with the current epoch and with the "no epoch" sentinel.
    for current in (epoch, m.NO_EPOCH):
        if api == "fetch":
            resp = node_request(
                cluster,
                follower,
                ApiKey.FETCH,
                consumer_fetch(topic=TOPIC, current_leader_epoch=current),
                m.FetchResponse,
            )
            # The follower names the leader it knows, so a client can re-route at once.
            assert resp.leader_id == leader and resp.leader_epoch == epoch
            assert resp.records == b""
        elif api == "list_offsets":
            resp = node_request(
                cluster,
                follower,
                ApiKey.LIST_OFFSETS,
                m.ListOffsetsRequest(
                    topic=TOPIC,
                    partition=0,
                    current_leader_epoch=current,
                    timestamp=m.LATEST_TIMESTAMP,
                ),
                m.ListOffsetsResponse,
            )
        else:
            resp = node_request(
                cluster,
                follower,
                ApiKey.OFFSETS_FOR_LEADER_EPOCH,
                m.OffsetsForLeaderEpochRequest(
                    topic=TOPIC, partition=0, current_leader_epoch=current, leader_epoch=epoch
                ),
                m.OffsetsForLeaderEpochResponse,
            )
        assert resp.error == ErrorCode.NOT_LEADER, resp


def test_client_reroutes_after_not_leader(cluster: LocalCluster) -> None:
    """A client whose cached leader is a follower gets NOT_LEADER, refreshes and retries,
    even for fenced requests (NOT_LEADER is not a fencing error)."""
    leader, epoch = _leader_and_epoch(cluster, 0)
    follower = next(n for n in (1, 2, 3) if n != leader)
    with Client(cluster.bootstrap, request_timeout_ms=10000) as c:
        c.metadata([TOPIC])
        key = (TOPIC, 0)
        c._leaders[key] = dataclasses.replace(c._leaders[key], leader_id=follower)
        res = c.fetch(TOPIC, 0, 0, current_leader_epoch=epoch)
        assert res.leader_epoch == epoch
        assert c._leaders[key].leader_id == leader
        c._leaders[key] = dataclasses.replace(c._leaders[key], leader_id=follower)
        assert c.list_offsets(TOPIC, 0, "latest", current_leader_epoch=epoch).offset >= 1
        c._leaders[key] = dataclasses.replace(c._leaders[key], leader_id=follower)
        assert c.produce(TOPIC, 0, _batch(b"rerouted")).leader_epoch == epoch


def test_fetch_out_of_range(cluster: LocalCluster) -> None:
    from quorumlog.replica.client.errors import OffsetOutOfRangeError

    hwm = cluster.client.list_offsets(TOPIC, 0, "latest").offset
    with pytest.raises(OffsetOutOfRangeError):
        cluster.client.fetch(TOPIC, 0, hwm + 10_000)
    # At the HWM: an empty answer, not an error.
    assert cluster.client.fetch(TOPIC, 0, hwm).records == b""


def test_long_poll_fetch_wakes_on_produce(cluster: LocalCluster) -> None:
    """A consumer fetch at the HWM with max_wait parks and returns once new records commit."""
    import threading

    hwm = cluster.client.list_offsets(TOPIC, 0, "latest").offset
    result: list[object] = []
    with Client(cluster.bootstrap, request_timeout_ms=15000) as reader:

        def poll() -> None:
            result.append(reader.fetch(TOPIC, 0, hwm, max_wait_ms=8000))

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        cluster.produce(TOPIC, 0, [b"wake-up"])
        t.join(15)
        assert not t.is_alive()
    res = result[0]
    rows = res.to_arrow(start_offset=hwm).to_pylist()  # type: ignore[attr-defined]
    assert [r["value"] for r in rows] == [b"wake-up"]


def _batch(value: bytes) -> bytes:
    from quorumlog.replica.storage import encode_batch

    return encode_batch([value])


def test_followers_learn_the_high_watermark(cluster: LocalCluster) -> None:
    """After each acks=quorum produce, every follower learns the HWM that covers it
    (followers apply committed metadata, topic create/delete, by it). That the fetch
    which moves the HWM is answered at once rather than parked for a long-poll is
    tests/driver/test_driver.py's
    test_the_fetch_that_moves_the_hwm_is_answered_at_once_not_parked."""
    leader, _ = _leader_and_epoch(cluster, 0)
    followers = [n for n in (1, 2, 3) if n != leader]
    for i in range(5):
        end = cluster.produce(TOPIC, 0, [f"hwm-{i}".encode()])[-1].offset + 1
        for f in followers:

            def learned(f: int = f, end: int = end) -> bool:
                v = local_view(cluster, f, TOPIC, 0)
                return v is not None and v.high_watermark >= end

            wait_until(learned, 30, f"follower {f} to learn HWM {end}", interval=0.005)


def test_produce_many_answers_each_partition_as_its_own_produce(cluster: LocalCluster) -> None:
    """A ProduceMany frame (one topic, batches for many partitions) is answered item by
    item, each as its batch's own Produce would be; sizes that do not add up to the
    payload are an INVALID_REQUEST of the whole frame."""
    pm = cluster.client.partition_metadata(TOPIC, 0, refresh=True)
    leader, _ = find_leader(cluster, TOPIC, 0, pm.replicas)
    follower = next(r for r in pm.replicas if r != leader)
    good = encode_batch([b"many-a", b"many-b"])
    corrupt = bytearray(encode_batch([b"many-corrupt"]))
    corrupt[-9] ^= 0xFF  # in the payload: its CRC no longer matches

    def produce_many(node: int, items: list[tuple[int, bytes]], pad: bytes = b"") -> Any:
        req = m.ProduceManyRequest(
            topic=TOPIC,
            partitions=[p for p, _ in items],
            sizes=[len(r) for _, r in items],
            acks=m.ACKS_QUORUM,
            timeout_ms=10_000,
            records=b"".join(r for _, r in items) + pad,
        )
        return node_request(cluster, node, ApiKey.PRODUCE_MANY, req, m.ProduceManyResponse, 15)

    resp = produce_many(leader, [(0, good), (99, good), (0, bytes(corrupt))])
    assert resp.error == ErrorCode.NONE
    ok, unknown, bad = resp.answers
    assert ok.error == ErrorCode.NONE and ok.last_offset == ok.base_offset + 1
    assert unknown.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert bad.error == ErrorCode.CORRUPT_MESSAGE
    (moved,) = produce_many(follower, [(0, good)]).answers
    assert moved.error == ErrorCode.NOT_LEADER and moved.leader_id == leader
    whole = produce_many(leader, [(0, good)], pad=b"extra")
    assert whole.error == ErrorCode.INVALID_REQUEST and not whole.answers
    assert "sizes do not add up" in whole.error_message
    values = [v for _, _, v in read_all(cluster.client, TOPIC, 0, ok.base_offset)]
    assert values == [b"many-a", b"many-b"], "the good batch once; nothing of the others"
