"""``plain_span``: which client batches an append may take with other requests' (the
driver's ``request_many``), and the offsets they span there."""

from __future__ import annotations

from quorumlog.replica.storage.batch_header import HEADER_SIZE, Producer, plain_span
from quorumlog.replica.storage.records import encode_batch, encode_control_batch


def test_plain_batches_span_their_records() -> None:
    records = encode_batch([b"a"] * 7) + encode_batch([b"b", None, b"c"], keys=[b"k"] * 3)
    assert plain_span(records) == 10
    assert plain_span(encode_batch([b"x" * 10_000])) == 1


def test_a_producers_control_or_partial_batch_is_not_plain() -> None:
    plain = encode_batch([b"a", b"b"])
    numbered = encode_batch([b"a"], producer=Producer(7, 0, 0))
    transactional = encode_batch([b"a"], producer=Producer(7, 0, 0), transactional=True)
    control = encode_control_batch(1, [1, 2, 3], 0)
    for other in (numbered, transactional, control):
        assert plain_span(plain + other) is None  # one batch not plain: the request alone
    assert plain_span(plain[:-1]) is None  # not whole: the append says what is wrong
    assert plain_span(plain + plain[:HEADER_SIZE]) is None
    assert plain_span(b"") is None
    assert plain_span(b"QLB\x01" + plain[4:]) is None  # another format
