from __future__ import annotations

import struct

import cramjam
import pyarrow as pa
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
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
    COMPRESSION_LZ4,
    COMPRESSION_NAMES,
    COMPRESSION_ZSTD,
    MAX_DECOMPRESSED,
    InvalidRecord,
    KafkaRecordBatch,
    UnsupportedCompression,
    check_produced,
    decode_batch,
    encode_batch,
    iter_batches,
)
from quorumlog.replica.kafka.wire import KafkaDecodeError
from quorumlog.replica.storage.records import (
    HEADER_SIZE,
    Producer,
    batches_to_table,
    encode_control_batch,
    parse_header,
    restamp_header,
)
from quorumlog.replica.storage.records import (
    encode_batch as ql_encode_batch,
)

from .strategies import BATCH_HEADER, HEADERS, OPT_BYTES


@st.composite
def record_columns(draw: st.DrawFn) -> dict[str, list]:
    n = draw(st.integers(1, 30))
    base = draw(st.integers(0, 2**41))
    return {
        "keys": draw(st.lists(OPT_BYTES, min_size=n, max_size=n)),
        "values": draw(st.lists(OPT_BYTES, min_size=n, max_size=n)),
        "timestamps": [
            base + d for d in draw(st.lists(st.integers(-(10**6), 10**9), min_size=n, max_size=n))
        ],
        "headers": draw(st.lists(HEADERS, min_size=n, max_size=n)),
    }


def test_crc32c_known_vectors() -> None:
    # RFC 3720 B.4 and the classic check value.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"\x00" * 32) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E


def test_known_batch_layout() -> None:
    batch = encode_batch(
        [b"v"],
        [b"k"],
        [1000],
        [[("h", b"x")]],
        base_offset=7,
        partition_leader_epoch=3,
        producer_id=9,
        producer_epoch=1,
        base_sequence=5,
    )
    record = b"\x00" + b"\x00" + b"\x00" + b"\x02k" + b"\x02v" + b"\x02" + b"\x02h" + b"\x02x"
    assert batch[BATCH_HEADER_SIZE:] == bytes([len(record) * 2]) + record
    fields = struct.unpack_from(">qiibIhiqqqhii", batch)
    assert fields[0] == 7 and fields[1] == len(batch) - 12 and fields[2] == 3 and fields[3] == 2
    assert fields[4] == crc32c(batch[21:])
    assert fields[6:] == (0, 1000, 1000, 9, 1, 5, 1)


# A batch's header fields, as encode_batch names them and the decoded batch reads them back.
BATCH_HEADER_FIELDS = st.fixed_dictionaries(
    {**BATCH_HEADER, "compression": st.sampled_from(sorted(COMPRESSION_NAMES))}
)


@settings(max_examples=100, deadline=None)
@given(record_columns(), BATCH_HEADER_FIELDS, st.sampled_from([0, ATTR_TRANSACTIONAL]))
def test_record_batch_round_trip(cols: dict[str, list], header: dict[str, int], attrs: int) -> None:
    columns = (cols["values"], cols["keys"], cols["timestamps"], cols["headers"])
    data = encode_batch(*columns, **header, attributes=attrs)
    batch = decode_batch(data)
    assert batch.size == len(data)
    assert (batch.values, batch.keys, batch.timestamps, batch.headers) == columns
    assert batch.offset_deltas == list(range(len(cols["values"])))
    assert {name: getattr(batch, name) for name in header} == header
    assert batch.is_transactional == bool(attrs)
    assert batch.max_timestamp == max(cols["timestamps"])
    base_offset = header["base_offset"]
    assert batch.next_offset == base_offset + len(cols["values"])
    # Two batches back to back, the second cut short: a fetch response may end that way.
    assert [b.base_offset for b in iter_batches(data + data[:-3], allow_partial_tail=True)] == [
        base_offset
    ]


def test_crc_mismatch_and_bad_magic_are_decode_errors() -> None:
    data = bytearray(encode_batch([b"a" * 10]))
    data[-1] ^= 1
    with pytest.raises(KafkaDecodeError, match="CRC32C") as info:
        decode_batch(bytes(data))
    assert info.value.error_code == KafkaError.CORRUPT_MESSAGE
    data = bytearray(encode_batch([b"a"]))
    data[16] = 1
    with pytest.raises(KafkaDecodeError, match="magic"):
        decode_batch(bytes(data))
    with pytest.raises(KafkaDecodeError):
        list(iter_batches(encode_batch([b"a"])[:-1]))


def _with_codec(data: bytes, codec: int, payload: bytes | None = None) -> bytes:
    """``data`` (one batch) relabelled as compressed with ``codec`` (and its records
    replaced by ``payload``), the CRC32C made right again."""
    if payload is not None:
        data = data[:BATCH_HEADER_SIZE] + payload
    out = bytearray(data)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, 21, codec)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_codecs_kafka_does_not_define_are_reported_unsupported(codec: int) -> None:
    with pytest.raises(UnsupportedCompression) as info:
        decode_batch(_with_codec(encode_batch([b"a"]), codec))
    assert info.value.codec == codec
    assert info.value.error_code == KafkaError.UNSUPPORTED_COMPRESSION_TYPE
    with pytest.raises(UnsupportedCompression):
        encode_batch([b"a"], compression=codec)


@pytest.mark.parametrize("codec", [COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_lz4_and_zstd_frames_inflate_only_up_to_the_bound(codec: int) -> None:
    """A frame that inflates past MAX_DECOMPRESSED (a bomb in a small request) is a
    decode error, however little it weighs; one just inside the bound decodes."""
    module = cramjam.lz4 if codec == COMPRESSION_LZ4 else cramjam.zstd
    plain = encode_batch([b"x" * 100])
    records = plain[BATCH_HEADER_SIZE:]
    bomb = bytes(module.compress(records + b"\0" * MAX_DECOMPRESSED))
    with pytest.raises(KafkaDecodeError, match="inflating past"):
        decode_batch(_with_codec(plain, codec, bomb))
    fits = bytes(module.compress(records))
    assert decode_batch(_with_codec(plain, codec, fits)).values == [b"x" * 100]
    with pytest.raises(KafkaDecodeError, match="corrupt"):
        decode_batch(_with_codec(plain, codec, fits[:-5]))


def test_frames_written_by_other_writers_decode() -> None:
    """Kafka's Java client writes lz4 frames with independent blocks and no content
    size, zstd frames from a stream: streaming compressors' output decodes too."""
    plain = encode_batch([b"v" * 5000, b"w" * 7000], [b"k1", None], [1, 2])
    records = plain[BATCH_HEADER_SIZE:]
    for codec, module in ((COMPRESSION_LZ4, cramjam.lz4), (COMPRESSION_ZSTD, cramjam.zstd)):
        compressor = module.Compressor()
        for i in range(0, len(records), 1000):
            compressor.compress(records[i : i + 1000])
        framed = bytes(compressor.finish())
        got = decode_batch(_with_codec(plain, codec, framed))
        assert got.values == [b"v" * 5000, b"w" * 7000] and got.keys == [b"k1", None]


@settings(max_examples=50, deadline=None)
@given(record_columns(), st.integers(0, 2**40), st.integers(0, 2**20))
def test_kafka_to_quorumlog_and_back_keeps_every_field(
    cols: dict[str, list], base_offset: int, epoch: int
) -> None:
    produced = decode_batch(
        encode_batch(
            cols["values"],
            cols["keys"],
            cols["timestamps"],
            cols["headers"],
            producer_id=11,
            producer_epoch=2,
            base_sequence=40,
        )
    )
    converted = from_kafka(produced)
    assert converted[1:] == (11, 2, 40, False)
    assert converted.records.column("value").to_pylist() == cols["values"]
    stored = kafka_to_quorumlog(produced, leader_epoch=epoch)
    header = parse_header(stored)
    assert header.producer == Producer(11, 2, 40)
    stored = restamp_header(header, base_offset, epoch) + stored[HEADER_SIZE:]
    table = batches_to_table(stored)
    assert table.column("offset").to_pylist() == [
        base_offset + i for i in range(len(cols["values"]))
    ]
    fetched = decode_batch(quorumlog_to_kafka(stored))
    assert fetched.base_offset == base_offset and fetched.partition_leader_epoch == epoch
    assert (fetched.keys, fetched.values, fetched.timestamps, fetched.headers) == (
        cols["keys"],
        cols["values"],
        cols["timestamps"],
        cols["headers"],
    )
    assert not fetched.is_control
    assert (fetched.producer_id, fetched.producer_epoch, fetched.base_sequence) == (11, 2, 40)


def test_native_batches_become_kafka_batches_with_offsets_epochs_and_controls() -> None:
    control = encode_control_batch(1, [1, 2, 3], 1234, leader_epoch=4, base_offset=0)
    native = ql_encode_batch(
        [b"a", None, b"c"],
        keys=[None, b"k", b"k2"],
        timestamps=[10, 11, 12],
        headers=[[("h", b"1")], None, []],
        base_offset=1,
        leader_epoch=4,
    )
    out = list(iter_batches(quorumlog_to_kafka(control + native)))
    assert [(b.base_offset, b.partition_leader_epoch, b.is_control) for b in out] == [
        (0, 4, True),
        (1, 4, False),
    ]
    assert out[0].attributes & ATTR_CONTROL and out[0].keys == [LEADER_CHANGE_CONTROL_KEY]
    data = out[1]
    assert isinstance(data, KafkaRecordBatch)
    assert data.values == [b"a", None, b"c"] and data.keys == [None, b"k", b"k2"]
    assert data.timestamps == [10, 11, 12] and data.headers == [[("h", b"1")], [], []]
    assert data.producer_id == -1


def test_records_without_headers_map_to_null_headers() -> None:
    produced = decode_batch(encode_batch([b"a", b"b"]))
    column = from_kafka(produced).records.column("headers")
    assert column.null_count == 2 and column.type == pa.list_(column.type.value_type)


def test_xerial_framed_snappy_as_the_java_client_writes_it() -> None:
    plain = decode_batch(encode_batch([b"a" * 30, b"b" * 30], [b"k", None], [5, 6]))
    raw = encode_batch([b"a" * 30, b"b" * 30], [b"k", None], [5, 6], compression=2)
    block = raw[BATCH_HEADER_SIZE:]
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    data = bytearray(raw[:BATCH_HEADER_SIZE] + framed)
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    got = decode_batch(bytes(data))
    assert (got.keys, got.values, got.timestamps) == (plain.keys, plain.values, plain.timestamps)


def test_check_produced_refuses_what_a_broker_refuses() -> None:
    check_produced(
        decode_batch(encode_batch([b"a", b"b"], producer_id=3, producer_epoch=0, base_sequence=0))
    )
    control = decode_batch(encode_batch([b"a"], attributes=ATTR_CONTROL))
    with pytest.raises(InvalidRecord, match="control") as info:
        check_produced(control)
    assert info.value.error_code == KafkaError.INVALID_RECORD
    gap = decode_batch(encode_batch([b"a", b"b"]))
    gap.offset_deltas[1] = 5
    with pytest.raises(InvalidRecord, match="offset deltas"):
        check_produced(gap)
    half = decode_batch(encode_batch([b"a"], producer_id=3, producer_epoch=-1))
    with pytest.raises(InvalidRecord, match="producer id"):
        check_produced(half)
