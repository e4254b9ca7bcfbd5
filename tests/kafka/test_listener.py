"""The nodes' Kafka listener (``serve --kafka-listen``) with a real librdkafka client
(confluent-kafka) on a 3-node cluster: records cross the boundary both ways, leader
epochs and fencing reach Kafka clients, and what the listener does not serve is
answered with a Kafka error on a connection that stays open."""

from __future__ import annotations

import json
import random
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from crc32c import crc32c
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka import records as kafka_records
from quorumlog.replica.kafka.codec import decode_response, encode_request
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.wire import FrameDecoder, frame
from quorumlog.replica.kafka_listener.handlers import kafka_error
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.config import NodeConfig
from quorumlog.replica.node.security import TlsFiles
from quorumlog.replica.protocol import ErrorCode

from tests.support.cli import QUORUMLOG
from tests.support.cluster import read_all
from tests.support.config import node_config
from tests.support.waits import wait_until

from .test_fuzz import _mutations

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

RECORDS = 1000
BASE_TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("kafka"), kafka=True, log_level="INFO") as c:
        yield c


def _record(i: int) -> tuple[bytes, bytes, list[tuple[str, bytes]], int]:
    return f"key-{i}".encode(), bytes([i % 251]) * 100, [("n", str(i).encode())], BASE_TS + i


def _produce(
    bootstrap: str, topic: str, partitions: int, compression: str = "none"
) -> dict[tuple[int, int], int]:
    """RECORDS records with acks=all; (partition, offset) -> record index, per delivery."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": compression,
            # A batch answered with an error the client retries would otherwise be retried
            # for the default 300 s: fail the test within a minute instead.
            "message.timeout.ms": 60000,
        }
    )
    delivered: dict[tuple[int, int], int] = {}
    errors: list[Any] = []

    def report(i: int) -> Any:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered[(msg.partition(), msg.offset())] = i

        return on_delivery

    for i in range(RECORDS):
        key, value, headers, ts = _record(i)
        producer.produce(
            topic,
            value=value,
            key=key,
            headers=headers,
            timestamp=ts,
            partition=i % partitions,
            on_delivery=report(i),
        )
        producer.poll(0)
    assert producer.flush(60) == 0, "records still queued after 60 s"
    assert not errors, errors[:3]
    assert len(delivered) == RECORDS
    return delivered


def _consume(bootstrap: str, topic: str, partitions: int, n: int) -> list[Any]:
    return consume_assigned({"bootstrap.servers": bootstrap}, topic, partitions, n)


def consume_assigned(conf: dict[str, Any], topic: str, partitions: int, n: int) -> list[Any]:
    """Up to ``n`` records of every partition from offset 0 (assign(), no group), with the
    client configuration ``conf``; within 60 s."""
    consumer = confluent_kafka.Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
        return got
    finally:
        consumer.close()


def test_kafka_clients_produce_and_consume_with_every_record_field(
    kcluster: LocalCluster,
) -> None:
    c = kcluster
    c.create_topic("kevents", 2)
    delivered = _produce(c.kafka_bootstrap, "kevents", 2)
    got = _consume(c.kafka_bootstrap, "kevents", 2, RECORDS)
    assert len(got) == RECORDS
    for msg in got:
        i = delivered[(msg.partition(), msg.offset())]  # the offset the ack named
        key, value, headers, ts = _record(i)
        assert (msg.key(), msg.value(), msg.headers()) == (key, value, headers)
        assert msg.timestamp() == (confluent_kafka.TIMESTAMP_CREATE_TIME, ts)
        assert msg.leader_epoch() is not None and msg.leader_epoch() >= 1
    # The native client reads the same records at the same offsets.
    for p in range(2):
        native = {o: v for o, _, v in read_all(c.client, "kevents", p)}
        mine = {o: _record(i)[1] for (pp, o), i in delivered.items() if pp == p}
        assert native == mine


def test_every_kafka_codec_is_produced_and_read_back(kcluster: LocalCluster) -> None:
    """librdkafka producing with each of Kafka's four codecs: every batch acknowledged,
    and a consumer (and the native client) reads every record back at its offset."""
    c = kcluster
    c.create_topic("kcodecs", 2)
    delivered: dict[tuple[int, int], int] = {}
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        produced = _produce(c.kafka_bootstrap, "kcodecs", 2, compression=codec)
        assert not set(produced) & set(delivered), f"{codec}: offsets acknowledged twice"
        delivered.update(produced)
    got = _consume(c.kafka_bootstrap, "kcodecs", 2, len(delivered))
    assert len(got) == len(delivered) == 4 * RECORDS
    for msg in got:
        key, value, headers, ts = _record(delivered[(msg.partition(), msg.offset())])
        assert (msg.key(), msg.value(), msg.headers()) == (key, value, headers)
        assert msg.timestamp() == (confluent_kafka.TIMESTAMP_CREATE_TIME, ts)
    native = {(p, o): v for p in range(2) for o, _, v in read_all(c.client, "kcodecs", p)}
    assert native == {at: _record(i)[1] for at, i in delivered.items()}


def _disk_bytes(c: LocalCluster, topic: str) -> int:
    """The bytes of ``topic``'s partition 0 on disk, once every replica holds the same."""

    def per_node() -> list[int]:
        return [
            sum(f.stat().st_size for f in (c.node_dir(n) / f"{topic}-0").glob("*.log"))
            for n in sorted(c.procs)
        ]

    wait_until(lambda: len(set(per_node())) == 1, 30, f"every replica of {topic} caught up")
    return per_node()[0]


def test_a_topic_s_compression_type_decides_how_kafka_batches_rest_on_disk(
    kcluster: LocalCluster,
) -> None:
    """The same JSON-like records from an lz4 producer into topics of each
    compression.type: zstd and producer (lz4) ones take a fraction of the uncompressed
    one's disk, and consumers, the native client and Arrow readers see the same records."""
    c = kcluster
    values = [
        json.dumps({"id": i, "user": f"user-{i % 50}", "event": "page_view", "ok": True}).encode()
        for i in range(2000)
    ]
    sizes = {}
    for kind in ("uncompressed", "zstd", "producer"):
        topic = f"kstore-{kind}"
        c.client.create_topic(topic, 1, configs={"compression.type": kind})
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": c.kafka_bootstrap,
                "compression.type": "lz4",
                "linger.ms": 50,
                "batch.num.messages": 1000,
            }
        )
        for v in values:
            producer.produce(topic, value=v, partition=0)
        assert producer.flush(30) == 0
        got = _consume(c.kafka_bootstrap, topic, 1, len(values))
        assert [m.value() for m in got] == values
        assert [v for _, _, v in read_all(c.client, topic, 0)] == values
        sizes[kind] = _disk_bytes(c, topic)
    assert sizes["zstd"] < 0.4 * sizes["uncompressed"], sizes
    assert sizes["producer"] < 0.6 * sizes["uncompressed"], sizes


def test_a_codec_kafka_does_not_define_is_unsupported_not_corrupt(kcluster: LocalCluster) -> None:
    """A batch in a codec we cannot serve is answered UNSUPPORTED_COMPRESSION_TYPE (which
    clients do not retry), not CORRUPT_MESSAGE (which librdkafka retries until its
    message timeout)."""
    c = kcluster
    c.create_topic("kcodec7", 1)
    data = bytearray(kafka_records.encode_batch([b"v"]))
    data[22] = 7  # the low byte of the attributes: codec 7
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    body = km.PRODUCE.default_request(9)
    body.update(
        acks=-1,
        timeout_ms=5000,
        topic_data=[{"name": "kcodec7", "partition_data": [{"index": 0, "records": bytes(data)}]}],
    )
    port = c.kafka_ports[c.wait_for_leader("kcodec7", 0, 30)]
    (answer,) = _exchange(port, [_request(port, km.PRODUCE, 9, body, 1)])
    part = decode_response(km.PRODUCE, 9, answer)[1]["responses"][0]["partition_responses"][0]
    assert part["error_code"] == KafkaError.UNSUPPORTED_COMPRESSION_TYPE
    assert "compression" in part["error_message"]


def test_kafka_consumer_reads_what_a_native_producer_wrote(kcluster: LocalCluster) -> None:
    c = kcluster
    c.create_topic("knative", 1)
    values = [f"native-{i}".encode() for i in range(50)]
    acks = c.produce("knative", 0, values)
    got = _consume(c.kafka_bootstrap, "knative", 1, len(values))
    assert [m.value() for m in got] == values
    assert [m.offset() for m in got] == [a.offset for a in acks]


def _request(port: int, api: Any, version: int, body: dict[str, Any], cid: int) -> bytes:
    return frame(encode_request(api, version, cid, body, client_id="raw"))


def _exchange(port: int, requests: list[bytes]) -> list[bytes]:
    """Send raw requests on one connection; the answers, in order."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for r in requests:
            s.sendall(r)
        frames = FrameDecoder()
        answers: list[bytes] = []
        while len(answers) < len(requests):
            data = s.recv(1 << 16)
            assert data, "the listener closed the connection"
            answers.extend(frames.feed(data))
        return answers


def test_api_versions_lists_every_api_and_sasl_unasked_is_refused_on_a_live_connection(
    kcluster: LocalCluster,
) -> None:
    """ApiVersions lists every API of ``kafka.messages`` at its versions; a SASL handshake
    on a node without authentication gets ILLEGAL_SASL_STATE, and the connection stays."""
    port = next(iter(kcluster.kafka_ports.values()))
    sasl_req = km.SASL_HANDSHAKE.default_request(1)
    sasl_req["mechanism"] = "SCRAM-SHA-256"
    versions_req = km.API_VERSIONS.default_request(3)
    versions_req.update(client_software_name="raw", client_software_version="1")
    versions, refused, again = _exchange(
        port,
        [
            _request(port, km.API_VERSIONS, 3, versions_req, 1),
            _request(port, km.SASL_HANDSHAKE, 1, sasl_req, 2),
            _request(port, km.API_VERSIONS, 3, versions_req, 3),
        ],
    )
    cid, body = decode_response(km.API_VERSIONS, 3, versions)
    listed = {(a["api_key"], a["min_version"], a["max_version"]) for a in body["api_keys"]}
    assert cid == 1 and listed == {(a.key, a.min_version, a.max_version) for a in km.ALL_APIS}
    cid, body = decode_response(km.SASL_HANDSHAKE, 1, refused)
    assert (cid, body["error_code"]) == (2, KafkaError.ILLEGAL_SASL_STATE)
    assert decode_response(km.API_VERSIONS, 3, again)[0] == 3


def test_fetch_is_fenced_by_the_leader_epoch(kcluster: LocalCluster) -> None:
    c = kcluster
    c.create_topic("kfenced", 1)
    c.produce("kfenced", 0, [b"a", b"b"])
    leader = c.leader_of("kfenced", 0)
    epoch = c.client.partition_metadata("kfenced", 0, refresh=True).leader_epoch

    def fetch(current: int, cid: int) -> bytes:
        body = km.FETCH.default_request(12)
        body.update(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
        body["topics"] = [
            {
                "topic": "kfenced",
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": current,
                        "fetch_offset": 0,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                ],
            }
        ]
        return _request(c.kafka_ports[leader], km.FETCH, 12, body, cid)

    answers = _exchange(c.kafka_ports[leader], [fetch(epoch, 1), fetch(epoch + 1, 2)])
    codes = [
        decode_response(km.FETCH, 12, a)[1]["responses"][0]["partitions"][0]["error_code"]
        for a in answers
    ]
    assert codes == [KafkaError.NONE, KafkaError.UNKNOWN_LEADER_EPOCH]


def test_admin_client_creates_and_deletes_topics(kcluster: LocalCluster) -> None:
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kcluster.kafka_bootstrap})

    def outcome(futures: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, fut in futures.items():
            try:
                out[name] = fut.result(30)
            except confluent_kafka.KafkaException as exc:
                out[name] = exc.args[0].code()
        return out

    new = confluent_kafka.admin.NewTopic
    created = outcome(
        admin.create_topics(
            [
                new("kadmin", 3, 3, config={"max.message.bytes": "2000000"}),
                new("kbadconf", 1, 3, config={"cleanup.policy": "compact,shred"}),
            ]
        )
    )
    assert created == {"kadmin": None, "kbadconf": confluent_kafka.KafkaError.INVALID_CONFIG}
    meta = admin.list_topics(timeout=20)
    assert len(meta.topics["kadmin"].partitions) == 3 and "kbadconf" not in meta.topics
    again = outcome(admin.create_topics([new("kadmin", 1, 3)]))
    assert again == {"kadmin": confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS}
    assert outcome(admin.delete_topics(["kadmin"])) == {"kadmin": None}
    assert "kadmin" not in admin.list_topics(timeout=20).topics


def test_a_long_poll_answers_when_one_of_its_partitions_has_data(kcluster: LocalCluster) -> None:
    """A consumer of 4 idle partitions whose fetches wait up to a minute (fetch.wait.max.ms
    60000): a record produced to one of them arrives while the broker's long poll of the
    others still waits. Each poll for it gives up after 20 s, long before that poll's
    minute would end, so a broker that answered only at max_wait_ms fails every round
    whatever the machine's load; no time is measured."""
    c = kcluster
    c.create_topic("kpoll", 4)
    leaders = {p: c.wait_for_leader("kpoll", p, 30) for p in range(4)}
    # a partition whose leader leads another one: its broker's Fetch names both
    shared = next(p for p in leaders if list(leaders.values()).count(leaders[p]) > 1)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 60000,
            "socket.timeout.ms": 120000,  # librdkafka wants it above fetch.wait.max.ms
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("kpoll", p, 0) for p in range(4)])
        assert consumer.poll(4) is None  # settles into long polls of the idle partitions
        for i in range(3):
            value = f"x{i}".encode()
            c.produce("kpoll", shared, [value])
            msg = consumer.poll(20)
            assert msg is not None, f"round {i}: the long poll was not answered for the record"
            assert msg.error() is None and (msg.partition(), msg.value()) == (shared, value)
    finally:
        consumer.close()


def test_kafka_producer_loses_nothing_acknowledged_across_a_leader_kill(
    kcluster: LocalCluster,
) -> None:
    """acks=all with retries while the leader is killed (-9): every record the producer
    was told is written is in the log once the cluster settles (without idempotence a
    retry may write a record twice; that is issue 15's next step)."""
    c = kcluster
    c.create_topic("kfail", 1)
    leader = c.wait_for_leader("kfail", 0, 30)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    acked: list[bytes] = []
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        (failed if err is not None else acked).append(err if err is not None else msg.value())

    try:
        for i in range(4000):
            producer.produce("kfail", f"r{i}".encode(), on_delivery=delivered)
            producer.poll(0)
            if i == 1000:
                producer.flush(30)
                c.kill(leader)
            if i % 100 == 0:
                time.sleep(0.01)
        assert producer.flush(90) == 0
    finally:
        c.start_node(leader)
        c.wait_ready()
    assert not failed, failed[:3]
    logged = [v for _, _, v in read_all(c.client, "kfail", 0)]
    assert len(acked) == 4000 and set(acked) <= set(logged)


def test_native_errors_become_kafka_errors() -> None:
    assert kafka_error(ErrorCode.NOT_LEADER) == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert kafka_error(ErrorCode.FENCED_LEADER_EPOCH) == KafkaError.FENCED_LEADER_EPOCH
    assert kafka_error(ErrorCode.SHUTTING_DOWN) == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert kafka_error(ErrorCode.INVALID_CLUSTER_ID) == KafkaError.UNKNOWN_SERVER_ERROR


def test_the_listener_takes_sasl_in_the_clear_only_when_allowed(tmp_path: Path) -> None:
    """Authentication without TLS would take SASL exchanges in the clear: refused unless
    --allow-insecure; with TLS (SASL_SSL) it is what the listener is for."""

    def config(**security: Any) -> NodeConfig:
        return node_config(tmp_path, kafka_listen=("127.0.0.1", 2), **security)

    with pytest.raises(ValueError, match="in the clear.*--allow-insecure"):
        config(auth_config=tmp_path / "auth.json")
    config(auth_config=tmp_path / "auth.json", allow_insecure=True)
    config(auth_config=tmp_path / "auth.json", tls=TlsFiles("cert", "key", "ca"))
    config(tls=TlsFiles("cert", "key", "ca"))


def test_cluster_up_kafka_prints_a_bootstrap_kafka_clients_use(tmp_path: Path) -> None:
    """``quorumlog cluster up --kafka``, as a user starts it: a Kafka admin client finds
    every node through the bootstrap it prints; Ctrl-C stops the cluster."""
    proc = subprocess.Popen(
        [*QUORUMLOG, "cluster", "up", "--nodes", "3", "--kafka", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        bootstrap = None
        deadline = time.monotonic() + 60
        while bootstrap is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "cluster up ended before printing the Kafka bootstrap"
            if line.startswith("Kafka clients' bootstrap.servers: "):
                bootstrap = line.split(": ", 1)[1].strip()
        assert bootstrap is not None
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
        brokers = admin.list_topics(timeout=20).brokers
        assert sorted(brokers) == [1, 2, 3]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0


FUZZ_FRAMES = 3000


def _fuzz_bases(leader_epoch: int) -> list[tuple[Any, int, dict[str, Any]]]:
    """Valid requests of every served partition and cluster API (topic changes left out:
    a mutated CreateTopics could create thousands of partitions)."""
    versions = km.API_VERSIONS.default_request(3)
    meta = km.METADATA.default_request(12)
    meta["topics"] = [{"topic_id": uuid.UUID(int=0), "name": "kfuzz"}]
    produce = km.PRODUCE.default_request(9)
    produce.update(acks=-1, timeout_ms=1000)
    batch = kafka_records.encode_batch([b"a" * 20, b"b" * 20], [b"k", None])
    produce["topic_data"] = [{"name": "kfuzz", "partition_data": [{"index": 0, "records": batch}]}]
    fetch = km.FETCH.default_request(12)
    fetch.update(max_wait_ms=0, min_bytes=1, max_bytes=1 << 16)
    part = {
        "partition": 0,
        "current_leader_epoch": leader_epoch,
        "fetch_offset": 0,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": 1 << 16,
    }
    fetch["topics"] = [{"topic": "kfuzz", "partitions": [part]}]
    offsets = km.LIST_OFFSETS.default_request(7)
    offsets["topics"] = [
        {
            "name": "kfuzz",
            "partitions": [
                {"partition_index": 0, "current_leader_epoch": leader_epoch, "timestamp": -1}
            ],
        }
    ]
    epochs = km.OFFSET_FOR_LEADER_EPOCH.default_request(4)
    epochs["topics"] = [
        {
            "topic": "kfuzz",
            "partitions": [
                {"partition": 0, "current_leader_epoch": leader_epoch, "leader_epoch": 1}
            ],
        }
    ]
    return [
        (km.API_VERSIONS, 3, versions),
        (km.METADATA, 12, meta),
        (km.PRODUCE, 9, produce),
        (km.FETCH, 12, fetch),
        (km.LIST_OFFSETS, 7, offsets),
        (km.OFFSET_FOR_LEADER_EPOCH, 4, epochs),
    ]


def test_mutated_kafka_requests_do_not_hurt_the_node(kcluster: LocalCluster) -> None:
    """FUZZ_FRAMES mutations of valid requests (bit flips, truncation, junk, extreme
    lengths) to the leader's Kafka port: the node stays up, answers a fresh connection
    after every 100 frames, writes little to its log, and Kafka clients still work."""
    c = kcluster
    c.create_topic("kfuzz", 1)
    leader = c.wait_for_leader("kfuzz", 0, 30)
    epoch = c.client.partition_metadata("kfuzz", 0, refresh=True).leader_epoch
    port = c.kafka_ports[leader]
    log_before = c.log_path(leader).stat().st_size
    rng = random.Random(15)
    bases = [encode_request(api, v, 7, body) for api, v, body in _fuzz_bases(epoch)]
    sock: socket.socket | None = None
    try:
        for i in range(FUZZ_FRAMES):
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            (mutated,) = _mutations(rng, rng.choice(bases), 1)
            try:
                sock.sendall(frame(mutated))
            except OSError:  # the node closed it after an undecodable frame: a new one
                sock.close()
                sock = None
            if i % 100 == 99:
                versions = km.API_VERSIONS.default_request(3)
                versions.update(client_software_name="f", client_software_version="1")
                (answer,) = _exchange(port, [_request(port, km.API_VERSIONS, 3, versions, 9)])
                assert decode_response(km.API_VERSIONS, 3, answer)[0] == 9
    finally:
        if sock is not None:
            sock.close()
    assert all(c.is_running(n) for n in c.ports)
    assert c.log_path(leader).stat().st_size - log_before < 1_000_000
    # Whatever a mutation managed to write is valid; a record produced after comes back.
    c.produce("kfuzz", 0, [b"after"])
    records = read_all(c.client, "kfuzz", 0)
    got = _consume(c.kafka_bootstrap, "kfuzz", 1, len(records))
    assert [m.value() for m in got] == [v for _, _, v in records]
    assert got[-1].value() == b"after"


def test_an_undecodable_request_closes_its_connection_at_once(kcluster: LocalCluster) -> None:
    """A well-framed request whose body does not decode ends the connection (the stream
    cannot be trusted past it): the client sees the close, not a silence, and the
    request queued behind it is dropped."""
    port = next(iter(kcluster.kafka_ports.values()))
    versions = km.API_VERSIONS.default_request(3)
    versions.update(client_software_name="raw", client_software_version="1")
    valid = encode_request(km.API_VERSIONS, 3, 1, versions)
    bad = encode_request(km.METADATA, 12, 2, km.METADATA.default_request(12))[:-2] + b"\xff"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(frame(bad) + frame(valid))
        assert s.recv(1 << 16) == b""  # closed, well before the 5 s timeout


def test_a_fetch_keeps_to_its_max_bytes_across_partitions(kcluster: LocalCluster) -> None:
    """Request max_bytes 1: the first partition with data answers one whole batch
    (KIP-74), the others only their high watermark, even when named many times."""
    c = kcluster
    c.create_topic("kbudget", 1)
    acks = c.produce("kbudget", 0, [b"x" * 1000] * 10)
    hwm = acks[-1].offset + 1
    leader = c.wait_for_leader("kbudget", 0, 30)
    body = km.FETCH.default_request(12)
    body.update(max_wait_ms=0, min_bytes=1, max_bytes=1)
    part = {
        "partition": 0,
        "current_leader_epoch": -1,
        "fetch_offset": 0,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": 1 << 20,
    }
    body["topics"] = [{"topic": "kbudget", "partitions": [part] * 50}]
    port = c.kafka_ports[leader]
    (answer,) = _exchange(port, [_request(port, km.FETCH, 12, body, 1)])
    parts = decode_response(km.FETCH, 12, answer)[1]["responses"][0]["partitions"]
    assert len(parts) == 50 and all(p["high_watermark"] == hwm for p in parts)
    sizes = [len(p["records"] or b"") for p in parts]
    assert sizes[0] > 0 and sizes[1:] == [0] * 49
