"""SASL/SCRAM over TLS on the Kafka listener of a 3-node TLS + SCRAM cluster, with a real
librdkafka client (confluent-kafka, ``security.protocol=SASL_SSL``) and with raw requests:
both mechanisms produce and consume, wrong credentials get Kafka's authentication error,
nothing but ApiVersions and the SASL exchange is answered before it succeeds, and each
principal may use only the topics its native rules grant."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from kafka.protocol.admin import AlterConfigsRequest, CreatePartitionsRequest
from prometheus_client.parser import text_string_to_metric_families
from quorumlog.replica.client import Client
from quorumlog.replica.client.errors import TransactionalIdAuthorizationError
from quorumlog.replica.client.producer import Producer
from quorumlog.replica.kafka import messages as km
from quorumlog.replica.kafka.codec import decode_response, encode_request
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.schema import Api, Message
from quorumlog.replica.kafka.wire import FrameDecoder, frame
from quorumlog.replica.kafka_listener.auth import RESOURCE_TOPIC
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.node.transport import AUTH_TIMEOUT_S
from quorumlog.replica.protocol import scram

from tests.support.waits import wait_until

from .test_listener import consume_assigned
from .test_topic_admin import ask_node, controller_id

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

PRINCIPALS: dict[str, tuple[str, list[str]] | tuple[str, list[str], list[str]]] = {
    "ingest": ("producer", ["granted*"]),
    "etl": ("producer", ["granted*"], ["etl-*"]),
    "reader": ("consumer", ["granted*"]),
}
RECORDS = 200


@pytest.fixture(scope="module")
def scluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        3,
        tmp_path_factory.mktemp("ksasl"),
        secure=True,
        principals=PRINCIPALS,
        kafka=True,
        metrics=True,
    ) as c:
        c.create_topic("granted", 2)
        c.create_topic("other", 1)
        c.produce("other", 0, [b"secret"])
        yield c


def _kafka_config(
    c: LocalCluster, principal: str, mechanism: str = "SCRAM-SHA-256", password: str | None = None
) -> dict[str, Any]:
    assert c.ca_file is not None
    return {
        "bootstrap.servers": c.kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": c.ca_file,
        "sasl.mechanism": mechanism,
        "sasl.username": principal,
        "sasl.password": c.secrets[principal] if password is None else password,
    }


def _produce(conf: dict[str, Any], topic: str, n: int) -> tuple[list[Any], list[Any]]:
    """(delivered messages, delivery errors) of ``n`` records with acks=all."""
    producer = confluent_kafka.Producer({**conf, "acks": "all", "linger.ms": 5})
    delivered: list[Any] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        (errors if err is not None else delivered).append(err if err is not None else msg)

    for i in range(n):
        producer.produce(
            topic,
            key=f"k{i}".encode(),
            value=f"v{i}".encode(),
            partition=i % 2,
            on_delivery=on_delivery,
        )
        producer.poll(0)
    assert producer.flush(60) == 0, "records still queued after 60 s"
    return delivered, errors


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_clients_produce_and_consume_over_sasl_ssl(
    scluster: LocalCluster, mechanism: str
) -> None:
    topic = f"granted-{mechanism.lower()}"
    scluster.create_topic(topic, 2)
    delivered, errors = _produce(_kafka_config(scluster, "ingest", mechanism), topic, RECORDS)
    assert not errors and len(delivered) == RECORDS
    sent = {(m.partition(), m.offset()): (m.key(), m.value()) for m in delivered}
    got = consume_assigned(_kafka_config(scluster, "reader", mechanism), topic, 2, RECORDS)
    assert {(m.partition(), m.offset()): (m.key(), m.value()) for m in got} == sent


def _auth_errors(conf: dict[str, Any], within_s: float = 30) -> list[Any]:
    """The errors a producer with ``conf`` reports until the first authentication error."""
    errors: list[Any] = []
    producer = confluent_kafka.Producer({**conf, "error_cb": errors.append})
    producer.produce("granted", value=b"never")
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        producer.poll(0.2)
        if any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors):
            break
    producer.purge()
    producer.flush(5)
    return errors


@pytest.mark.parametrize(
    ("principal", "mechanism"),
    [("ingest", "SCRAM-SHA-256"), ("ingest", "SCRAM-SHA-512"), ("nobody", "SCRAM-SHA-256")],
)
def test_a_wrong_password_or_unknown_user_gets_the_kafka_authentication_error(
    scluster: LocalCluster, principal: str, mechanism: str
) -> None:
    secret_guess = "not-the-secret-4711"
    conf = _kafka_config(scluster, "admin", mechanism)
    conf["sasl.username"], conf["sasl.password"] = principal, secret_guess
    errors = _auth_errors(conf)
    auth = [e for e in errors if e.code() == confluent_kafka.KafkaError._AUTHENTICATION]
    assert auth, f"no authentication error within 30 s: {errors}"
    assert "invalid credentials" in auth[0].str() and secret_guess not in auth[0].str()


# ---- raw requests ----------------------------------------------------------------------


class Raw:
    """One TLS connection to a node's Kafka listener, one request at a time."""

    def __init__(self, c: LocalCluster) -> None:
        self.node, port = next(iter(c.kafka_ports.items()))
        ctx = ssl.create_default_context(cafile=c.ca_file)
        self.sock = ctx.wrap_socket(
            socket.create_connection((c.host, port), timeout=10), server_hostname=c.host
        )
        self.frames = FrameDecoder()
        self.answers: list[bytes] = []
        self.cid = 0

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(frame(payload))

    def receive(self) -> bytes | None:
        """The next answer's payload; None if the listener closed the connection."""
        while not self.answers:
            try:
                data = self.sock.recv(1 << 16)
            except (ConnectionError, ssl.SSLError):
                data = b""
            if not data:
                return None
            self.answers.extend(self.frames.feed(data))
        return self.answers.pop(0)

    def request(self, api: Api, version: int, body: Message) -> Message | None:
        self.cid += 1
        self.send_raw(encode_request(api, version, self.cid, body, "raw"))
        payload = self.receive()
        if payload is None:
            return None
        cid, answer = decode_response(api, version, payload)
        assert cid == self.cid
        return answer

    def handshake(self, mechanism: str, version: int = 1) -> Message | None:
        req = km.SASL_HANDSHAKE.default_request(version)
        req["mechanism"] = mechanism
        return self.request(km.SASL_HANDSHAKE, version, req)

    def authenticate(self, token: bytes, version: int = 2) -> Message | None:
        req = km.SASL_AUTHENTICATE.default_request(version)
        req["auth_bytes"] = token
        return self.request(km.SASL_AUTHENTICATE, version, req)

    def login(self, principal: str, secret: str, mechanism: str = "SCRAM-SHA-512") -> None:
        client = scram.ScramClient(principal, secret, mechanism=scram.MECHANISMS[mechanism])
        answer = self.handshake(mechanism)
        assert answer is not None and answer["error_code"] == 0
        first = self.authenticate(client.first_message())
        assert first is not None and first["error_code"] == 0, first
        final = self.authenticate(client.final_message(first["auth_bytes"]))
        assert final is not None and final["error_code"] == 0, final
        client.verify_server_final(final["auth_bytes"])

    def metadata(self, *topics: str) -> Message | None:
        req = km.METADATA.default_request(12)
        req["topics"] = (
            [{"name": t, "topic_id": uuid.UUID(int=0)} for t in topics] if topics else None
        )
        return self.request(km.METADATA, 12, req)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(scluster: LocalCluster) -> Iterator[Raw]:
    conn = Raw(scluster)
    try:
        yield conn
    finally:
        conn.close()


def test_nothing_but_api_versions_and_sasl_is_answered_before_authentication(
    scluster: LocalCluster, raw: Raw
) -> None:
    versions = raw.request(km.API_VERSIONS, 3, km.API_VERSIONS.default_request(3))
    assert versions is not None and versions["error_code"] == 0
    listed = {a["api_key"] for a in versions["api_keys"]}
    assert {km.SASL_HANDSHAKE.key, km.SASL_AUTHENTICATE.key} <= listed
    assert raw.metadata() is None, "Metadata before authenticating must close the connection"
    # And as the very first request, on a new connection.
    again = Raw(scluster)
    try:
        assert again.metadata("granted") is None
    finally:
        again.close()


def _auth_timeouts(c: LocalCluster, node: int) -> float:
    """The node's count of Kafka connections closed for not authenticating in time."""
    context = ssl.create_default_context(cafile=c.ca_file)
    with urllib.request.urlopen(c.metrics_urls[node], timeout=10, context=context) as resp:
        text = resp.read().decode()
    found = {
        s.labels.get("reason"): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "quorumlog_kafka_rejected_requests_total"
    }
    return found.get("authentication_timeout", 0.0)


def test_a_connection_that_does_not_authenticate_in_time_is_closed(
    scluster: LocalCluster, raw: Raw
) -> None:
    """A connection that never authenticates is closed after AUTH_TIMEOUT_S (10 s), so
    idle unauthenticated connections do not pile up on the node: it is served (an
    ApiVersions answered), then, left silent, the node closes it (end of stream, not our
    socket's timeout, which would raise) and counts it as an authentication timeout. How
    long that took is not judged here: a loaded machine can stretch it either way."""
    before = _auth_timeouts(scluster, raw.node)
    versions = raw.request(km.API_VERSIONS, 3, km.API_VERSIONS.default_request(3))
    assert versions is not None and versions["error_code"] == 0
    raw.sock.settimeout(AUTH_TIMEOUT_S + 50)  # bounds the wait only
    assert raw.receive() is None
    wait_until(
        lambda: _auth_timeouts(scluster, raw.node) > before, 30, "the timeout counted", interval=0.2
    )


def test_a_failed_exchange_answers_sasl_authentication_failed_and_closes(raw: Raw) -> None:
    client = scram.ScramClient("ingest", "not-the-secret", mechanism=scram.SCRAM_SHA_512)
    assert raw.handshake("SCRAM-SHA-512") is not None
    first = raw.authenticate(client.first_message())
    assert first is not None and first["error_code"] == 0
    final = raw.authenticate(client.final_message(first["auth_bytes"]))
    assert final is not None
    assert final["error_code"] == KafkaError.SASL_AUTHENTICATION_FAILED
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in final["error_message"]
    assert raw.receive() is None  # then the connection closes


def test_an_unoffered_mechanism_is_refused_with_the_offered_ones(raw: Raw) -> None:
    answer = raw.handshake("PLAIN")
    assert answer is not None
    assert answer["error_code"] == KafkaError.UNSUPPORTED_SASL_MECHANISM
    assert answer["mechanisms"] == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert raw.receive() is None


def test_handshake_v0_exchanges_bare_tokens(scluster: LocalCluster, raw: Raw) -> None:
    client = scram.ScramClient("reader", scluster.secrets["reader"])
    answer = raw.handshake("SCRAM-SHA-256", version=0)
    assert answer is not None and answer["error_code"] == 0
    raw.send_raw(client.first_message())
    server_first = raw.receive()
    assert server_first is not None
    raw.send_raw(client.final_message(server_first))
    server_final = raw.receive()
    assert server_final is not None
    client.verify_server_final(server_final)
    meta = raw.metadata("granted")
    assert meta is not None and meta["topics"][0]["error_code"] == 0


def test_a_second_exchange_on_an_authenticated_connection_is_illegal(
    scluster: LocalCluster, raw: Raw
) -> None:
    raw.login("reader", scluster.secrets["reader"])
    again = raw.handshake("SCRAM-SHA-256")
    assert again is not None and again["error_code"] == KafkaError.ILLEGAL_SASL_STATE
    assert raw.metadata("granted") is not None  # the connection stays


def test_metadata_shows_a_principal_only_its_topics(scluster: LocalCluster, raw: Raw) -> None:
    raw.login("reader", scluster.secrets["reader"])
    every = raw.metadata()
    assert every is not None
    names = {t["name"] for t in every["topics"]}
    assert "granted" in names and "other" not in names
    named = raw.metadata("granted", "other")
    assert named is not None
    codes = {t["name"]: t["error_code"] for t in named["topics"]}
    assert codes == {"granted": 0, "other": KafkaError.TOPIC_AUTHORIZATION_FAILED}
    assert next(t for t in named["topics"] if t["name"] == "other")["partitions"] == []


def test_a_consumer_principal_may_not_produce(scluster: LocalCluster, raw: Raw) -> None:
    """The native kind rules hold per topic: a consumer may read ``granted``, not write it."""
    raw.login("reader", scluster.secrets["reader"])
    req = km.PRODUCE.default_request(9)
    req.update(acks=-1, timeout_ms=5000)
    req["topic_data"] = [{"name": "granted", "partition_data": [{"index": 0, "records": b""}]}]
    answer = raw.request(km.PRODUCE, 9, req)
    assert answer is not None
    part = answer["responses"][0]["partition_responses"][0]
    assert part["error_code"] == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "may not call PRODUCE" in part["error_message"]


def test_only_producers_and_admins_get_a_producer_id(scluster: LocalCluster, raw: Raw) -> None:
    """InitProducerId needs the right to write (Kafka's IdempotentWrite)."""
    raw.login("reader", scluster.secrets["reader"])
    req = km.INIT_PRODUCER_ID.default_request(4)
    req.update(transactional_id=None, transaction_timeout_ms=60000)
    answer = raw.request(km.INIT_PRODUCER_ID, 4, req)
    assert answer is not None
    assert answer["error_code"] == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_transactional_ids_follow_the_principal(scluster: LocalCluster, raw: Raw) -> None:
    """A producer principal uses only the transactional ids its ``transactional_ids``
    grant: another is refused TRANSACTIONAL_ID_AUTHORIZATION_FAILED, before the
    coordinator is asked. One it may use runs whole transactions over SASL_SSL (the
    coordinator's markers going between nodes as their node principals)."""
    raw.login("ingest", scluster.secrets["ingest"])
    req = km.INIT_PRODUCER_ID.default_request(4)
    req.update(transactional_id="etl-1", transaction_timeout_ms=60000)
    answer = raw.request(km.INIT_PRODUCER_ID, 4, req)
    assert answer is not None
    assert answer["error_code"] == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    producer = confluent_kafka.Producer(
        {**_kafka_config(scluster, "etl"), "transactional.id": "etl-1"}
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(10):
        producer.produce("granted", f"txn-{i}".encode(), partition=i % 2)
    producer.commit_transaction(60)
    denied = confluent_kafka.Producer(
        {**_kafka_config(scluster, "etl"), "transactional.id": "other-1"}
    )
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        denied.init_transactions(30)
    assert (
        failed.value.args[0].code()
        == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )


def test_native_transactions_follow_the_principal(scluster: LocalCluster) -> None:
    """The native producer reaches the coordinator over the native listener (in Kafka
    envelopes), authorized as the principal it authenticated as there: the same
    ``transactional_ids`` grants as on the Kafka listener."""
    with Client(scluster.bootstrap, security=scluster.client_security("etl")) as client:
        producer = Producer(client, transactional_id="etl-native")
        producer.begin()
        producer.send("granted", b"native-txn", partition=0)
        producer.commit()
        producer.close()
        denied = Producer(client, transactional_id="other-native")
        with pytest.raises(TransactionalIdAuthorizationError):
            denied.init_transactions()
    with Client(scluster.bootstrap, security=scluster.client_security("ingest")) as client:
        with pytest.raises(TransactionalIdAuthorizationError):
            Producer(client, transactional_id="etl-native").init_transactions()


def test_only_admins_delete_groups_or_their_offsets(scluster: LocalCluster, raw: Raw) -> None:
    """DeleteGroups and OffsetDelete need the right to delete (Kafka's DELETE on the
    group): a consumer principal is refused before the coordinator is asked."""
    raw.login("reader", scluster.secrets["reader"])
    req = km.DELETE_GROUPS.default_request(2)
    req["groups_names"] = ["g1", "g2"]
    answer = raw.request(km.DELETE_GROUPS, 2, req)
    assert answer is not None
    assert [(r["group_id"], r["error_code"]) for r in answer["results"]] == [
        ("g1", KafkaError.GROUP_AUTHORIZATION_FAILED),
        ("g2", KafkaError.GROUP_AUTHORIZATION_FAILED),
    ]
    req = km.OFFSET_DELETE.default_request(0)
    req.update(group_id="g1", topics=[{"name": "granted", "partitions": [{"partition_index": 0}]}])
    answer = raw.request(km.OFFSET_DELETE, 0, req)
    assert answer is not None
    assert answer["error_code"] == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_topic_authorization_reaches_kafka_clients(scluster: LocalCluster) -> None:
    delivered, errors = _produce(_kafka_config(scluster, "ingest"), "other", 2)
    assert not delivered and errors
    assert {e.code() for e in errors} == {confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED}

    reader = confluent_kafka.admin.AdminClient(_kafka_config(scluster, "reader"))
    assert set(reader.list_topics(timeout=30).topics) >= {"granted"}
    assert "other" not in reader.list_topics(timeout=30).topics
    hidden = reader.list_topics("other", timeout=30).topics["other"]
    assert hidden.error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED

    admin = confluent_kafka.admin.AdminClient(_kafka_config(scluster, "ingest"))
    futures = admin.create_topics([confluent_kafka.admin.NewTopic("granted-new", 1, 1)])
    with pytest.raises(confluent_kafka.KafkaException) as info:
        futures["granted-new"].result(30)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_describe_configs_follows_the_principal(scluster: LocalCluster) -> None:
    from confluent_kafka.admin import ConfigResource

    def describe(principal: str, resource: ConfigResource) -> Any:
        admin = confluent_kafka.admin.AdminClient(_kafka_config(scluster, principal))
        return admin.describe_configs([resource])[resource].result(30)

    granted = describe("reader", ConfigResource("topic", "granted"))
    assert granted["cleanup.policy"].value == "delete"
    for principal, resource, code in [
        ("reader", ConfigResource("topic", "other"), "TOPIC_AUTHORIZATION_FAILED"),
        ("reader", ConfigResource("broker", "1"), "CLUSTER_AUTHORIZATION_FAILED"),
    ]:
        with pytest.raises(confluent_kafka.KafkaException) as info:
            describe(principal, resource)
        assert info.value.args[0].name() == code
    assert describe("admin", ConfigResource("broker", "1"))["node.id"].value == "1"


def _partition_requests(version_topic_ids: bool, ids: dict[str, uuid.UUID]) -> list[Any]:
    """(api, version, request, answer topics key, answer partitions key) for Fetch,
    ListOffsets and OffsetForLeaderEpoch of partition 0 of ``granted`` then ``other``."""
    fetch_version = 13 if version_topic_ids else 12
    fetch = km.FETCH.default_request(fetch_version)
    fetch.update(max_wait_ms=0, min_bytes=1, max_bytes=1 << 20)
    fetch["topics"] = [
        {
            "topic": name,
            "topic_id": ids[name],
            "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}],
        }
        for name in ("granted", "other")
    ]
    offsets = km.LIST_OFFSETS.default_request(7)
    offsets["topics"] = [
        {"name": name, "partitions": [{"partition_index": 0, "timestamp": -1}]}
        for name in ("granted", "other")
    ]
    epochs = km.OFFSET_FOR_LEADER_EPOCH.default_request(4)
    epochs["topics"] = [
        {"topic": name, "partitions": [{"partition": 0, "leader_epoch": 1}]}
        for name in ("granted", "other")
    ]
    return [
        (km.FETCH, fetch_version, fetch, "responses", "partitions"),
        (km.LIST_OFFSETS, 7, offsets, "topics", "partitions"),
        (km.OFFSET_FOR_LEADER_EPOCH, 4, epochs, "topics", "partitions"),
    ]


@pytest.mark.parametrize("topic_ids", [False, True])
def test_reads_of_topics_not_granted_are_refused_and_the_rest_answered(
    scluster: LocalCluster, raw: Raw, topic_ids: bool
) -> None:
    admin = Raw(scluster)
    try:
        admin.login("admin", scluster.secrets["admin"])
        meta = admin.metadata("granted", "other")
        assert meta is not None
        ids = {t["name"]: t["topic_id"] for t in meta["topics"]}
    finally:
        admin.close()
    raw.login("reader", scluster.secrets["reader"], "SCRAM-SHA-256")
    for api, version, req, topics_key, parts_key in _partition_requests(topic_ids, ids):
        answer = raw.request(api, version, req)
        assert answer is not None, api.name
        codes = [t[parts_key][0]["error_code"] for t in answer[topics_key]]
        assert codes[1] == KafkaError.TOPIC_AUTHORIZATION_FAILED, (api.name, codes)
        assert codes[0] != KafkaError.TOPIC_AUTHORIZATION_FAILED, (api.name, codes)
        if api is km.FETCH and topic_ids:
            assert [t["topic_id"] for t in answer[topics_key]] == [ids["granted"], ids["other"]]


def _kafka_python_sasl(c: LocalCluster, principal: str) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": c.ca_file,
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": principal,
        "sasl_plain_password": c.secrets[principal],
    }


def test_a_node_that_is_not_the_controller_forwards_an_admin_s_topic_changes(
    scluster: LocalCluster,
) -> None:
    """The node forwards as its node principal, which the controller lets change topics;
    the client's own principal is authorized first, where it asked: a producer is refused
    there and nothing reaches the controller."""
    c = scluster
    admin = confluent_kafka.admin.AdminClient(_kafka_config(c, "admin"))
    controller = controller_id(admin)
    node = min(n for n in c.kafka_ports if n != controller)
    bootstrap = f"{c.host}:{c.kafka_ports[node]}"
    c.create_topic("granted-fwd", 1)
    grow = CreatePartitionsRequest[1](
        topic_partitions=[("granted-fwd", (2, None))], timeout=30_000, validate_only=False
    )
    alter = AlterConfigsRequest[1](
        resources=[(RESOURCE_TOPIC, "granted-fwd", [("retention.ms", "7200000")])],
        validate_only=False,
    )
    refused = ask_node(bootstrap, node, [grow, alter], **_kafka_python_sasl(c, "ingest"))
    denied = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert [e[1] for e in refused[0].topic_errors] == [denied]
    assert [r[0] for r in refused[1].resources] == [denied]
    assert len(c.client.metadata(["granted-fwd"])["granted-fwd"].partitions) == 1

    grown, altered = ask_node(bootstrap, node, [grow, alter], **_kafka_python_sasl(c, "admin"))
    assert grown.topic_errors == [("granted-fwd", 0, None)]
    assert [r[:2] for r in altered.resources] == [(0, None)]

    def changed() -> bool:
        # Every node learns the change from the metadata log: the one asked may lag.
        t = c.client.metadata(["granted-fwd"])["granted-fwd"]
        return len(t.partitions) == 2 and t.configs == {"retention.ms": "7200000"}

    wait_until(changed, 30, "granted-fwd's 2 partitions and retention.ms")
