"""Kafka transactions (KIP-98, KIP-447) at the codec level, without a node: the
transaction APIs' schemas at every version served (our codec both ways, and kio's reader
of Kafka's own definitions on our bytes); produced transactional batches stored with the
transactional flag and a producer's control batch refused; stored transactional batches
and commit/abort markers fetched as the Kafka batches a consumer reads (checked with the
reference decoder); a Fetch partition's last stable offset and aborted transactions."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import struct
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader
from quorumlog.replica.kafka import messages as m
from quorumlog.replica.kafka.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    fetched_partition,
)
from quorumlog.replica.kafka.columnar import decode_columns
from quorumlog.replica.kafka.convert import (
    LEADER_CHANGE_CONTROL_KEY,
    from_kafka,
    kafka_to_quorumlog,
    quorumlog_to_kafka,
)
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.records import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    KafkaRecordBatch,
    check_produced,
    decode_batch,
    encode_batch,
    iter_batches,
)
from quorumlog.replica.kafka.schema import Api, Message, _Plan, encode_struct
from quorumlog.replica.kafka.wire import KafkaDecodeError, Writer
from quorumlog.replica.storage.records import (
    TRANSACTIONAL_FLAG,
    Producer,
    TxnMarker,
    encode_control_batch,
    encode_txn_marker,
    parse_header,
)
from quorumlog.replica.storage.records import encode_batch as ql_encode_batch

from .kio_generate import kio_class
from .strategies import HEADERS, OPT_BYTES

# --- the transaction APIs' schemas ------------------------------------------------------

#: (api, versions served): the clients' versions (AddPartitionsToTxn v4+ is KIP-890's
#: broker-side form; kio, like Kafka 4, has no WriteTxnMarkers v0).
TXN_APIS: tuple[tuple[Api, range], ...] = (
    (m.ADD_PARTITIONS_TO_TXN, range(0, 4)),
    (m.ADD_OFFSETS_TO_TXN, range(0, 4)),
    (m.END_TXN, range(0, 4)),
    (m.TXN_OFFSET_COMMIT, range(0, 4)),
    (m.WRITE_TXN_MARKERS, range(1, 2)),
    (m.DESCRIBE_TRANSACTIONS, range(0, 1)),
    (m.LIST_TRANSACTIONS, range(0, 2)),
)


def _add_partitions(v: int) -> tuple[Message, Message]:
    request = {
        "v3_and_below_transactional_id": "tx-1",
        "v3_and_below_producer_id": 4000,
        "v3_and_below_producer_epoch": 3,
        "v3_and_below_topics": [{"name": "orders", "partitions": [0, 2]}],
    }
    partitions = [
        {"partition_index": 0, "partition_error_code": KafkaError.NONE},
        {"partition_index": 2, "partition_error_code": KafkaError.CONCURRENT_TRANSACTIONS},
    ]
    response = {
        "throttle_time_ms": 5,
        "results_by_topic_v3_and_below": [{"name": "orders", "results_by_partition": partitions}],
    }
    return request, response


def _add_offsets(v: int) -> tuple[Message, Message]:
    request = {
        "transactional_id": "tx-1",
        "producer_id": 4000,
        "producer_epoch": 3,
        "group_id": "readers",
    }
    return request, {"throttle_time_ms": 0, "error_code": KafkaError.PRODUCER_FENCED}


def _end_txn(v: int) -> tuple[Message, Message]:
    request = {"transactional_id": "tx-1", "producer_id": 4000, "producer_epoch": 3}
    request["committed"] = True
    return request, {"throttle_time_ms": 0, "error_code": KafkaError.INVALID_TXN_STATE}


def _txn_offset_commit(v: int) -> tuple[Message, Message]:
    partition = {
        "partition_index": 1,
        "committed_offset": 812,
        "committed_leader_epoch": 7 if v >= 2 else -1,
        "committed_metadata": "from tx-1",
    }
    request = {
        "transactional_id": "tx-1",
        "group_id": "readers",
        "producer_id": 4000,
        "producer_epoch": 3,
        # The group's generation and member (KIP-447) from v3; defaults before.
        "generation_id": 5 if v >= 3 else -1,
        "member_id": "member-1" if v >= 3 else "",
        "group_instance_id": "instance-1" if v >= 3 else None,
        "topics": [{"name": "out", "partitions": [partition, {**partition, "partition_index": 2}]}],
    }
    errors = [
        {"partition_index": 1, "error_code": KafkaError.NONE},
        {"partition_index": 2, "error_code": KafkaError.NOT_COORDINATOR},
    ]
    response = {"throttle_time_ms": 0, "topics": [{"name": "out", "partitions": errors}]}
    return request, response


def _write_txn_markers(v: int) -> tuple[Message, Message]:
    marker = {
        "producer_id": 4000,
        "producer_epoch": 3,
        "transaction_result": True,
        "topics": [{"name": "orders", "partition_indexes": [0, 2]}],
        "coordinator_epoch": 9,
    }
    partitions = [
        {"partition_index": 0, "error_code": KafkaError.NONE},
        {"partition_index": 2, "error_code": KafkaError.NOT_LEADER_OR_FOLLOWER},
    ]
    result = {"producer_id": 4000, "topics": [{"name": "orders", "partitions": partitions}]}
    return {"markers": [marker]}, {"markers": [result]}


def _describe_transactions(v: int) -> tuple[Message, Message]:
    ongoing = {
        "error_code": KafkaError.NONE,
        "transactional_id": "tx-1",
        "transaction_state": "Ongoing",
        "transaction_timeout_ms": 60000,
        "transaction_start_time_ms": 1_700_000_000_123,
        "producer_id": 4000,
        "producer_epoch": 3,
        "topics": [{"topic": "orders", "partitions": [0, 2]}],
    }
    unknown = {
        **ongoing,
        "error_code": KafkaError.TRANSACTIONAL_ID_NOT_FOUND,
        "transactional_id": "tx-2",
        "transaction_state": "",
        "transaction_start_time_ms": 0,
        "topics": [],
    }
    request = {"transactional_ids": ["tx-1", "tx-2"]}
    return request, {"throttle_time_ms": 0, "transaction_states": [ongoing, unknown]}


def _list_transactions(v: int) -> tuple[Message, Message]:
    request = {
        "state_filters": ["Ongoing", "Bogus"],
        "producer_id_filters": [4000],
        "duration_filter": 30000 if v >= 1 else -1,  # KIP-994, v1+
    }
    states = [{"transactional_id": "tx-1", "producer_id": 4000, "transaction_state": "Ongoing"}]
    response = {
        "throttle_time_ms": 0,
        "error_code": KafkaError.NONE,
        "unknown_state_filters": ["Bogus"],
        "transaction_states": states,
    }
    return request, response


BODIES: dict[str, Callable[[int], tuple[Message, Message]]] = {
    "AddPartitionsToTxn": _add_partitions,
    "AddOffsetsToTxn": _add_offsets,
    "EndTxn": _end_txn,
    "TxnOffsetCommit": _txn_offset_commit,
    "WriteTxnMarkers": _write_txn_markers,
    "DescribeTransactions": _describe_transactions,
    "ListTransactions": _list_transactions,
}
CASES = [(api, v) for api, versions in TXN_APIS for v in versions]


def test_the_transaction_apis_are_served_at_the_clients_versions() -> None:
    served = {(key, low, high) for key, low, high in m.SUPPORTED_APIS}
    for api, versions in TXN_APIS:
        assert (api.key, versions.start, versions.stop - 1) in served
        assert m.API_BY_KEY[api.key] is api
    keys = {api.name: api.key for api, _ in TXN_APIS}
    assert keys == {
        "AddPartitionsToTxn": 24,
        "AddOffsetsToTxn": 25,
        "EndTxn": 26,
        "WriteTxnMarkers": 27,
        "TxnOffsetCommit": 28,
        "DescribeTransactions": 65,
        "ListTransactions": 66,
    }


@pytest.mark.parametrize(("api", "version"), CASES, ids=[f"{a.name}-v{v}" for a, v in CASES])
def test_each_transaction_api_round_trips_and_kio_reads_it(api: Api, version: int) -> None:
    request, response = BODIES[api.name](version)
    payload = encode_request(api, version, 77, request, "rdkafka")
    header, got_api, got = decode_request(payload)
    assert (header, got_api, got) == ((api.key, version, 77, "rdkafka"), api, request)
    assert decode_response(api, version, encode_response(api, version, 78, response)) == (
        78,
        response,
    )
    # The same bodies as Kafka's definitions read them (kio's classes are generated
    # from them): an independent check of field order, types and flexible encodings.
    for body, kind, request_ in ((request, "request", True), (response, "response", False)):
        w = Writer()
        encode_struct(w, api.plan(version, request_), body)
        ours = w.getvalue()
        parsed, size = entity_reader(kio_class(api.name, version, kind))(ours, 0)
        assert size == len(ours)
        assert _plain(parsed) == _on_the_wire(api.plan(version, request_), body)


def _on_the_wire(plan: _Plan, body: Message) -> Message:
    """``body`` without the fields its version does not have (which kio's class of the
    version lacks; our codec gives them their defaults)."""
    out = {}
    for slot in (*plan.regular, *(s for _, s in plan.tagged)):
        value = body[slot.name]
        if slot.sub is not None and value is not None:
            sub = slot.sub
            value = (
                [_on_the_wire(sub, v) for v in value] if slot.array else _on_the_wire(sub, value)
            )
        out[slot.name] = value
    return out


def _plain(value: Any) -> Any:
    """A kio message as our plain dict: durations and timestamps as ms (and their field
    names with Kafka's ``_ms``), enums as their values, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            in_ms = isinstance(v, datetime.timedelta | datetime.datetime)
            out[f.name + "_ms" if in_ms else f.name] = _plain(v)
        return out
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.datetime):
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
        return (value - epoch) // datetime.timedelta(milliseconds=1)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    return value


def test_error_codes_of_the_transaction_apis_are_kafka_s() -> None:
    expected = {
        "CLUSTER_AUTHORIZATION_FAILED": 31,
        "COORDINATOR_LOAD_IN_PROGRESS": 14,
        "COORDINATOR_NOT_AVAILABLE": 15,
        "NOT_COORDINATOR": 16,
        "INVALID_PRODUCER_EPOCH": 47,
        "INVALID_TXN_STATE": 48,
        "INVALID_PRODUCER_ID_MAPPING": 49,
        "INVALID_TRANSACTION_TIMEOUT": 50,
        "CONCURRENT_TRANSACTIONS": 51,
        "TRANSACTION_COORDINATOR_FENCED": 52,
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 53,
        "UNKNOWN_PRODUCER_ID": 59,
        "PRODUCER_FENCED": 90,
        "TRANSACTIONAL_ID_NOT_FOUND": 105,
    }
    assert {name: int(KafkaError[name]) for name in expected} == expected


# --- produce: Kafka batch -> quorumlog batch --------------------------------------------

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "reference": decode_batch,
    "columnar": decode_columns,
}


@pytest.mark.parametrize("decode", DECODERS.values(), ids=DECODERS.keys())
def test_a_transactional_batch_is_stored_transactional_with_its_producer(
    decode: Callable[[bytes], Any],
) -> None:
    sent = encode_batch(
        [b"a", b"b"],
        [b"k", None],
        [10, 11],
        producer_id=4000,
        producer_epoch=3,
        base_sequence=17,
        attributes=ATTR_TRANSACTIONAL,
    )
    assert from_kafka(decode(sent)).is_transactional
    header = parse_header(kafka_to_quorumlog(decode(sent), leader_epoch=2))
    assert header.flags & TRANSACTIONAL_FLAG and header.is_transactional
    assert not header.is_control and header.marker is None
    assert header.producer == Producer(4000, 3, 17)
    # Idempotent, not transactional: the flag stays clear.
    plain = encode_batch([b"a"], producer_id=4000, producer_epoch=3, base_sequence=19)
    header = parse_header(kafka_to_quorumlog(decode(plain)))
    assert not header.is_transactional and header.producer == Producer(4000, 3, 19)


@pytest.mark.parametrize("decode", DECODERS.values(), ids=DECODERS.keys())
@pytest.mark.parametrize("attributes", [ATTR_CONTROL, ATTR_CONTROL | ATTR_TRANSACTIONAL])
@pytest.mark.parametrize("base_sequence", [-1, 0])
def test_a_producer_s_control_batch_is_refused_as_an_invalid_record(
    decode: Callable[[bytes], Any], attributes: int, base_sequence: int
) -> None:
    # A commit marker as a broker would write it (base sequence -1), sent by a client;
    # with a sequence it would pass for a data batch if it were not refused.
    marker = encode_batch(
        [struct.pack(">hi", 0, 9)],
        [struct.pack(">hh", 0, 1)],
        producer_id=4000,
        producer_epoch=3,
        base_sequence=base_sequence,
        attributes=attributes,
    )
    for convert in (kafka_to_quorumlog, from_kafka, check_produced):
        with pytest.raises(KafkaDecodeError) as info:
            convert(decode(marker))
        assert info.value.error_code == KafkaError.INVALID_RECORD


# --- fetch: quorumlog batch -> Kafka batch ----------------------------------------------

MARKER_KEY = struct.Struct(">hh")  # Kafka's control record key: version, type
MARKER_VALUE = struct.Struct(">hi")  # EndTransactionMarker: version, coordinator epoch


@st.composite
def stored_batches(draw: st.DrawFn) -> tuple[bytes, list[dict[str, Any]]]:
    """Stored batches back to back (data in and out of transactions, commit and abort
    markers, a leader change) and, for each, the Kafka batch a consumer must read."""
    out: list[bytes] = []
    expected: list[dict[str, Any]] = []
    offset = draw(st.integers(0, 2**40))
    epoch = draw(st.integers(0, 2**20))
    pid = draw(st.integers(0, 2**62))
    pepoch = draw(st.integers(0, 2**15 - 1))
    kinds = ["txn", "data", "commit", "abort", "leader"]
    for kind in draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=6)):
        ts = draw(st.integers(0, 2**41))
        if kind in ("commit", "abort"):
            coordinator_epoch = draw(st.integers(0, 2**31 - 1))
            marker = TxnMarker(pid, pepoch, kind == "commit", coordinator_epoch)
            out.append(encode_txn_marker(marker, ts, leader_epoch=epoch, base_offset=offset))
            want = {
                "attributes": ATTR_CONTROL | ATTR_TRANSACTIONAL,
                "producer": (pid, pepoch, -1),
                "keys": [MARKER_KEY.pack(0, 1 if kind == "commit" else 0)],
                "values": [MARKER_VALUE.pack(0, coordinator_epoch)],
                "timestamps": [ts],
                "headers": [[]],
            }
        elif kind == "leader":
            out.append(
                encode_control_batch(1, [1, 2, 3], ts, leader_epoch=epoch, base_offset=offset)
            )
            want = {
                "attributes": ATTR_CONTROL,
                "producer": (-1, -1, -1),
                "keys": [LEADER_CHANGE_CONTROL_KEY],
                "values": None,  # quorumlog's msgpack leader-change record, as stored
                "timestamps": [ts],
                "headers": [[]],
            }
        else:
            n = draw(st.integers(1, 8))
            values = draw(st.lists(OPT_BYTES, min_size=n, max_size=n))
            keys = draw(st.lists(OPT_BYTES, min_size=n, max_size=n))
            headers = draw(st.none() | st.lists(HEADERS, min_size=n, max_size=n))
            stamps = [ts + draw(st.integers(0, 1000)) for _ in range(n)]
            producer = None
            if kind == "txn" or draw(st.booleans()):
                producer = Producer(pid, pepoch, draw(st.integers(0, 2**31 - 1)))
            out.append(
                ql_encode_batch(
                    values,
                    keys,
                    stamps,
                    headers,
                    base_offset=offset,
                    leader_epoch=epoch,
                    producer=producer,
                    transactional=kind == "txn",
                )
            )
            want = {
                "attributes": ATTR_TRANSACTIONAL if kind == "txn" else 0,
                "producer": tuple(producer) if producer else (-1, -1, -1),
                "keys": keys,
                "values": values,
                "timestamps": stamps,
                "headers": headers or [[] for _ in range(n)],
            }
        want.update(base_offset=offset, epoch=epoch)
        expected.append(want)
        offset += len(want["keys"])
    return b"".join(out), expected


@settings(max_examples=60, deadline=None)
@given(stored_batches())
def test_transactional_batches_and_markers_are_fetched_as_kafka_writes_them(
    case: tuple[bytes, list[dict[str, Any]]],
) -> None:
    stored, expected = case
    data = quorumlog_to_kafka(stored)
    got = list(iter_batches(data, verify_crc=True))  # the reference decoder; CRC32C checked
    assert len(got) == len(expected)
    position = 0
    for batch, want in zip(got, expected, strict=True):
        assert isinstance(batch, KafkaRecordBatch)
        crc = struct.unpack_from(">I", data, position + 17)[0]
        assert crc32c(data[position + 21 : position + batch.size]) == crc
        position += batch.size
        assert batch.attributes == want["attributes"]
        assert batch.is_transactional == bool(want["attributes"] & ATTR_TRANSACTIONAL)
        assert batch.is_control == bool(want["attributes"] & ATTR_CONTROL)
        assert (batch.base_offset, batch.partition_leader_epoch) == (
            want["base_offset"],
            want["epoch"],
        )
        assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == want["producer"]
        assert batch.keys == want["keys"]
        if want["values"] is not None:
            assert batch.values == want["values"]
        assert (batch.timestamps, batch.headers) == (want["timestamps"], want["headers"])
    assert position == len(data)


def test_a_commit_marker_is_the_control_batch_kafka_writes() -> None:
    stored = encode_txn_marker(TxnMarker(4000, 3, True, 9), 1234, leader_epoch=5, base_offset=70)
    kafka = quorumlog_to_kafka(stored)
    # Kafka's own bytes for the marker: the reference encoder's control batch.
    assert kafka == encode_batch(
        [MARKER_VALUE.pack(0, 9)],
        [MARKER_KEY.pack(0, 1)],
        [1234],
        base_offset=70,
        partition_leader_epoch=5,
        producer_id=4000,
        producer_epoch=3,
        base_sequence=-1,
        attributes=ATTR_CONTROL | ATTR_TRANSACTIONAL,
    )
    assert struct.unpack_from(">h", kafka, 21)[0] == 0x30
    assert len(kafka) > BATCH_HEADER_SIZE


# --- a Fetch partition's last stable offset and aborted transactions --------------------


@pytest.mark.parametrize("version", range(m.FETCH.min_version, m.FETCH.max_version + 1))
def test_a_fetched_partition_carries_aborted_transactions(version: int) -> None:
    aborted = fetched_partition(
        3, 0, 40, 7, b"batches", last_stable_offset=25, aborted_transactions=[(4000, 12), (41, 20)]
    )
    none_aborted = fetched_partition(
        4, 0, 40, 7, b"", last_stable_offset=40, aborted_transactions=[]
    )
    uncommitted = fetched_partition(5, 0, 40, 7, b"")  # read_uncommitted: as before
    body = m.FETCH.default_response(version)
    partitions = [aborted, none_aborted, uncommitted]
    body["responses"] = [{"topic": "t", "topic_id": uuid.UUID(int=1), "partitions": partitions}]
    _, back = decode_response(m.FETCH, version, encode_response(m.FETCH, version, 1, body))
    got = back["responses"][0]["partitions"]
    assert got[0]["last_stable_offset"] == 25 and got[0]["high_watermark"] == 40
    assert got[0]["aborted_transactions"] == [
        {"producer_id": 4000, "first_offset": 12},
        {"producer_id": 41, "first_offset": 20},
    ]
    assert got[1]["last_stable_offset"] == 40 and got[1]["aborted_transactions"] == []
    assert got[2]["last_stable_offset"] == 40 and got[2]["aborted_transactions"] is None
