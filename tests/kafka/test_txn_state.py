"""The transaction coordinator's pure rules (``replica.kafka.txn``): each request's
decision from a transactional id's state, and the state's record format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.txn import (
    MAX_PRODUCER_EPOCH,
    TxnMetadata,
    TxnState,
    add_partitions,
    begin_abort_on_timeout,
    complete,
    decode_txn_record,
    encode_txn_key,
    encode_txn_value,
    end_txn,
    expired,
    init_producer_id,
)

TID = "tid"
PARTS = frozenset({("t", 0), ("t", 1)})


def _meta(state: TxnState = TxnState.EMPTY, epoch: int = 3, **kw: object) -> TxnMetadata:
    fields: dict = dict(partitions=frozenset(), started_ms=-1, updated_ms=0)
    fields.update(kw)
    return TxnMetadata(TID, 42, epoch, 60_000, state, **fields)


def test_init_gives_a_new_id_then_bumps_its_epoch() -> None:
    first = init_producer_id(None, TID, 60_000, (-1, -1), 42, 1)
    assert first.error == KafkaError.NONE and first.write is not None
    assert (first.write.producer_id, first.write.producer_epoch) == (42, 0)
    again = init_producer_id(first.write, TID, 60_000, (-1, -1), 99, 2)
    assert again.write is not None
    assert (again.write.producer_id, again.write.producer_epoch) == (42, 1)
    assert again.write.state == TxnState.EMPTY


def test_init_past_the_last_epoch_takes_a_new_id() -> None:
    decision = init_producer_id(_meta(epoch=MAX_PRODUCER_EPOCH), TID, 1000, (-1, -1), 7, 1)
    assert decision.write is not None
    assert (decision.write.producer_id, decision.write.producer_epoch) == (7, 0)


def test_init_while_a_decision_is_carried_out_is_retried() -> None:
    for state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
        assert init_producer_id(_meta(state), TID, 1000, (-1, -1), 7, 1).error == (
            KafkaError.CONCURRENT_TRANSACTIONS
        )


def test_init_naming_another_epoch_is_fenced() -> None:
    """KIP-360: a producer re-initialising names the id and epoch it had."""
    meta = _meta(epoch=5)
    assert init_producer_id(meta, TID, 1000, (42, 4), 7, 1).error == KafkaError.PRODUCER_FENCED
    ok = init_producer_id(meta, TID, 1000, (42, 5), 7, 1)
    assert ok.write is not None and ok.write.producer_epoch == 6


def test_add_partitions_starts_the_transaction_once() -> None:
    decision = add_partitions(_meta(), 42, 3, PARTS, 100)
    assert decision.write is not None
    assert decision.write.state == TxnState.ONGOING and decision.write.started_ms == 100
    assert add_partitions(decision.write, 42, 3, frozenset({("t", 1)}), 200).write is None
    more = add_partitions(decision.write, 42, 3, frozenset({("u", 0)}), 200).write
    assert more is not None and more.partitions == PARTS | {("u", 0)} and more.started_ms == 100


def test_a_completed_transactions_partitions_are_not_carried_over() -> None:
    done = complete(_meta(TxnState.PREPARE_COMMIT, partitions=PARTS, started_ms=5), 10)
    assert done.state == TxnState.COMPLETE_COMMIT and done.partitions == frozenset()
    again = add_partitions(done, 42, 3, frozenset({("u", 0)}), 20).write
    assert again is not None and again.partitions == {("u", 0)} and again.started_ms == 20


@pytest.mark.parametrize(
    ("pid", "epoch", "error"),
    [(41, 3, KafkaError.INVALID_PRODUCER_ID_MAPPING), (42, 2, KafkaError.PRODUCER_FENCED)],
)
def test_requests_of_another_producer_are_refused(pid: int, epoch: int, error: KafkaError) -> None:
    ongoing = _meta(TxnState.ONGOING, partitions=PARTS, started_ms=0)
    assert add_partitions(ongoing, pid, epoch, PARTS, 1).error == error
    assert end_txn(ongoing, pid, epoch, True, 1).error == error
    assert add_partitions(None, 42, 3, PARTS, 1).error == KafkaError.INVALID_PRODUCER_ID_MAPPING


def test_end_txn_decides_once_and_a_retry_succeeds() -> None:
    ongoing = _meta(TxnState.ONGOING, partitions=PARTS, started_ms=0)
    decided = end_txn(ongoing, 42, 3, True, 5).write
    assert decided is not None and decided.state == TxnState.PREPARE_COMMIT
    assert decided.partitions == PARTS  # the markers' partitions
    assert end_txn(decided, 42, 3, True, 6).error == KafkaError.CONCURRENT_TRANSACTIONS
    assert end_txn(decided, 42, 3, False, 6).error == KafkaError.INVALID_TXN_STATE
    done = complete(decided, 7)
    retry = end_txn(done, 42, 3, True, 8)
    assert retry.error == KafkaError.NONE and retry.write is None
    assert end_txn(done, 42, 3, False, 8).error == KafkaError.INVALID_TXN_STATE
    assert end_txn(_meta(), 42, 3, True, 8).error == KafkaError.INVALID_TXN_STATE


def test_a_timed_out_transaction_is_aborted_with_the_epoch_bumped() -> None:
    ongoing = _meta(TxnState.ONGOING, partitions=PARTS, started_ms=1000)
    assert not expired(ongoing, 1000 + 60_000)
    assert expired(ongoing, 1000 + 60_001)
    assert not expired(_meta(TxnState.COMPLETE_COMMIT, started_ms=0), 10**9)
    aborting = begin_abort_on_timeout(ongoing, 70_000)
    assert aborting.state == TxnState.PREPARE_ABORT and aborting.producer_epoch == 4
    assert aborting.partitions == PARTS
    # The producer that began it is fenced from here on.
    assert end_txn(aborting, 42, 3, True, 70_001).error == KafkaError.PRODUCER_FENCED


def test_state_names_are_kafkas() -> None:
    assert [s.kafka_name for s in TxnState] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
    ]


@given(
    st.text(max_size=20),
    st.integers(0, 2**62),
    st.integers(0, MAX_PRODUCER_EPOCH),
    st.sampled_from(list(TxnState)),
    st.frozensets(st.tuples(st.text(max_size=8), st.integers(0, 1000)), max_size=5),
)
def test_records_round_trip(
    tid: str, pid: int, epoch: int, state: TxnState, parts: frozenset[tuple[str, int]]
) -> None:
    meta = TxnMetadata(tid, pid, epoch, 1234, state, parts, 5, 6)
    assert decode_txn_record(encode_txn_key(tid), encode_txn_value(meta)) == (tid, meta)
    assert decode_txn_record(encode_txn_key(tid), None) == (tid, None)
