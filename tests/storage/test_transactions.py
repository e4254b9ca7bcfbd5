"""Transactions in a partition's log (``storage.transactions``, the producer state's
marker rules, and ``Log``): the index against a naive model, the read_committed filter,
and a real log's transactions across reopen, truncation into a transaction, and
retention."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from quorumlog.replica.storage import Log, LogConfig, Producer, encode_batch
from quorumlog.replica.storage.producers import (
    InvalidProducerEpoch,
    OutOfOrderSequence,
    ProducerBatch,
    ProducerStateTable,
)
from quorumlog.replica.storage.records import TxnMarker
from quorumlog.replica.storage.transactions import (
    AbortedTxn,
    TransactionIndex,
    committed_batches,
)


class H(NamedTuple):
    """A batch as the index reads it."""

    producer_id: int
    base_offset: int
    is_control: bool
    is_transactional: bool
    marker: bool | None


def data(pid: int, at: int) -> H:
    return H(pid, at, False, True, None)


def mark(pid: int, at: int, commit: bool) -> H:
    return H(pid, at, True, True, commit)


# A log as a list of events: (producer, kind) with kind "data" / "commit" / "abort".
EVENTS = st.lists(
    st.tuples(st.integers(1, 3), st.sampled_from(["data", "data", "commit", "abort"])),
    max_size=40,
)


def _headers(events: list[tuple[int, str]]) -> list[H]:
    return [
        data(pid, at) if kind == "data" else mark(pid, at, kind == "commit")
        for at, (pid, kind) in enumerate(events)
    ]


def _model(headers: list[H]) -> tuple[dict[int, int], list[AbortedTxn], list[tuple[int, int]]]:
    """Open transactions, aborted ones, and every ended one (first offset, marker)."""
    open_: dict[int, int] = {}
    aborted, ended = [], []
    for h in headers:
        if h.marker is None:
            open_.setdefault(h.producer_id, h.base_offset)
        elif h.producer_id in open_:
            first = open_.pop(h.producer_id)
            ended.append((first, h.base_offset))
            if not h.marker:
                aborted.append(AbortedTxn(h.producer_id, first, h.base_offset))
    return open_, aborted, ended


@given(EVENTS, st.integers(0, 45), st.integers(0, 45), st.integers(0, 45))
@example([(1, "data"), (1, "commit")], 1, 0, 2)
def test_the_index_agrees_with_a_naive_model(
    events: list[tuple[int, str]], hwm: int, start: int, length: int
) -> None:
    headers = _headers(events)
    index = TransactionIndex.of(headers)
    open_, aborted, ended = _model(headers)
    assert index.open_transactions == open_
    assert list(index.aborted) == aborted
    end = start + length
    overlapping = sorted(
        (a for a in aborted if a.last_offset >= start and a.first_offset < end),
        key=lambda a: a.first_offset,
    )
    assert index.aborted_between(start, end) == overlapping
    # Open, or ended by a marker the high watermark has not passed yet.
    unstable = list(open_.values()) + [first for first, marker in ended if marker >= hwm]
    assert index.first_unstable_offset(hwm) == (min(unstable) if unstable else None)


def test_a_transaction_whose_marker_is_above_the_high_watermark_is_still_unstable() -> None:
    index = TransactionIndex.of([data(1, 0), data(1, 1), mark(1, 2, True)])
    assert index.open_transactions == {}
    assert index.first_unstable_offset(2) == 0  # the marker is not committed yet
    assert index.first_unstable_offset(3) is None


def test_retention_forgets_aborts_wholly_below_the_log_start() -> None:
    index = TransactionIndex.of(
        [data(1, 0), mark(1, 1, False), data(2, 2), mark(2, 3, False), data(3, 4)]
    )
    index.drop_before(2)
    assert list(index.aborted) == [AbortedTxn(2, 2, 3)]
    assert index.open_transactions == {3: 4}


@given(EVENTS)
def test_read_committed_sees_committed_and_plain_batches_only(
    events: list[tuple[int, str]],
) -> None:
    """With the aborted transactions a fetch is told of, the filter drops exactly the
    batches of aborted transactions (and every control batch)."""
    headers = _headers(events)
    index = TransactionIndex.of(headers)
    aborted = [(a.producer_id, a.first_offset) for a in index.aborted]
    seen = {h.base_offset for h in committed_batches(headers, aborted)}
    doomed = {
        h.base_offset
        for a in index.aborted
        for h in headers
        if h.producer_id == a.producer_id
        and a.first_offset <= h.base_offset < a.last_offset
        and h.marker is None
    }
    assert seen == {h.base_offset for h in headers if h.marker is None} - doomed


def test_markers_move_the_producer_epoch() -> None:
    table = ProducerStateTable()
    table.apply(5, ProducerBatch(0, 0, 2, 0, 2))
    table.check_marker(5, 0)
    table.apply_marker(5, 0)  # a commit in the same epoch: sequences go on
    table.check(5, 0, 3, 3)
    table.apply_marker(5, 1)  # an abort with the epoch bumped: a new start
    with pytest.raises(InvalidProducerEpoch):
        table.check_marker(5, 0)
    with pytest.raises(InvalidProducerEpoch):
        table.check(5, 0, 3, 3)  # the fenced producer
    with pytest.raises(OutOfOrderSequence):
        table.check(5, 1, 3, 3)
    table.check(5, 1, 0, 0)


def _txn_batch(pid: int, epoch: int, seq: int, n: int = 2) -> bytes:
    values = [b"v%d" % i for i in range(n)]
    return encode_batch(values, producer=Producer(pid, epoch, seq), transactional=True)


def test_a_logs_transactions_survive_reopen_and_rewind_with_truncation(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=2000)
    log = Log(str(tmp_path / "t-0"), config)
    log.append_as_leader(_txn_batch(1, 0, 0), 1)  # 0-1: producer 1's transaction
    log.append_as_leader(_txn_batch(2, 0, 0), 1)  # 2-3: producer 2's
    log.append_markers([TxnMarker(1, 0, False, 0)], 1, 0)  # 4: 1 aborts
    log.append_as_leader(encode_batch([b"plain"]), 1)  # 5
    log.append_markers([TxnMarker(2, 0, True, 0)], 1, 0)  # 6: 2 commits
    log.append_as_leader(_txn_batch(1, 0, 2), 1)  # 7-8: producer 1's next
    log.flush()
    before = log.transactions().state()
    assert before == ({1: 7}, (AbortedTxn(1, 0, 4),))
    assert log.transactions().first_unstable_offset(9) == 7
    log.close()
    log = Log(str(tmp_path / "t-0"), config)
    assert log.transactions().state() == before
    # Truncating into the middle of producer 2's transaction rewinds its marker and
    # the abort: both are open again.
    log.truncate_to(4)
    assert log.transactions().state() == ({1: 0, 2: 2}, ())
    assert log.transactions().first_unstable_offset(4) == 0
    log.close()


def test_a_marker_of_a_fenced_epoch_is_refused(tmp_path: Path) -> None:
    log = Log(str(tmp_path / "t-0"), LogConfig())
    log.append_as_leader(_txn_batch(1, 3, 0), 1)
    log.append_markers([TxnMarker(1, 4, False, 0)], 1, 0)
    end = log.end_offset
    with pytest.raises(InvalidProducerEpoch):
        log.append_markers([TxnMarker(1, 3, True, 0)], 1, 0)
    assert log.end_offset == end
    log.close()
