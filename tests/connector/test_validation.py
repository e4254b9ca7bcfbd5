"""The consumer-validation core's decisions (onTruncation x failOnDataLoss) and the one
retry policy, as plain functions: the readers' cluster tests (test_reader_logic.py) show
them at work on real faults; here every cell of the table is checked directly."""

from __future__ import annotations

import logging

import pytest
from quorumlog.connector import LogTruncationException, QuorumLogSourceError
from quorumlog.connector.offsets import Position, TopicPartition
from quorumlog.connector.retry import Backoff
from quorumlog.connector.truncation import Divergence, TruncatedPartition, check_position
from quorumlog.connector.validation import (
    below_log_start,
    data_loss,
    divergence_position,
    settle_truncations,
)
from quorumlog.replica.client import Client

TP = TopicPartition("events", 0)
LOG_START = 40


def plan(on_truncation: str, fail_on_data_loss: bool, position: Position) -> Position:
    """What a planning step does with a checkpointed ``position`` when the leader's answer
    to OffsetsForLeaderEpoch(epoch 3) is (epoch 3, end 50) and its log starts at 40."""
    truncations: list[TruncatedPartition] = []
    divergence = check_position(position, 3, 50, LOG_START)
    if divergence is not None:
        truncations.append(TruncatedPartition.of(TP, position, divergence))
        position = divergence_position(divergence)
    position = below_log_start(fail_on_data_loss, TP, position, LOG_START)
    settle_truncations(on_truncation, truncations, "Found by the table test.")
    return position


TRUNCATED = Position(60, 3)  # consumed up to 60 in epoch 3; the log ends epoch 3 at 50
RETAINED_AWAY = Position(10, -1)  # below the log start, nothing to validate
INTACT = Position(45, 3)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
@pytest.mark.parametrize(
    "on_truncation, position, outcome",
    [
        ("fail", TRUNCATED, LogTruncationException),
        ("resume", TRUNCATED, Position(50, 3)),  # re-read from the divergence
        ("fail", INTACT, INTACT),
        ("resume", INTACT, INTACT),
    ],
)
def test_on_truncation_decides_truncations_whatever_fail_on_data_loss(
    on_truncation: str,
    position: Position,
    outcome: object,
    fail_on_data_loss: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="quorumlog.connector.validation")
    if outcome is LogTruncationException:
        with pytest.raises(LogTruncationException) as info:
            plan(on_truncation, fail_on_data_loss, position)
        (t,) = info.value.truncations
        assert (t.position_offset, t.divergence_offset, t.exact) == (60, 50, True)
        assert "Found by the table test." in str(info.value)
        return
    assert plan(on_truncation, fail_on_data_loss, position) == outcome
    resumed = position == TRUNCATED
    assert ("onTruncation=resume" in caplog.text) == resumed
    if resumed:  # the warning carries the same facts as the exception would
        assert "events/0: consumed position offset 60 (epoch 3)" in caplog.text


@pytest.mark.parametrize("on_truncation", ["fail", "resume"])
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_fail_on_data_loss_decides_retention_losses_whatever_on_truncation(
    on_truncation: str, fail_on_data_loss: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="quorumlog.connector.validation")
    if fail_on_data_loss:
        with pytest.raises(
            QuorumLogSourceError,
            match=r"events/0: position offset 10 is below the log start offset 40; offsets "
            r"\[10, 40\) were removed from the log \(retention\).*Set failOnDataLoss=false",
        ):
            plan(on_truncation, fail_on_data_loss, RETAINED_AWAY)
        return
    assert plan(on_truncation, fail_on_data_loss, RETAINED_AWAY) == Position(LOG_START, -1)
    assert "failOnDataLoss=false: going on to continue from the log start" in caplog.text


def test_a_divergence_below_the_log_start_is_both_a_truncation_and_a_loss() -> None:
    # resume moves to the divergence, which retention has removed since: failOnDataLoss
    # then decides, before the truncation is reported
    divergence = Divergence(20, 2, True)
    resumed = divergence_position(divergence)
    assert resumed == Position(20, 2)
    with pytest.raises(QuorumLogSourceError, match="below the log start offset 40"):
        below_log_start(True, TP, resumed, LOG_START)
    assert below_log_start(False, TP, resumed, LOG_START) == Position(40, -1)
    # an inexact divergence (log start, no epoch) resumes without an epoch to check
    assert divergence_position(Divergence(0, -1, False)) == Position(0, -1)


def test_data_loss_names_the_option_and_what_happens_instead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="quorumlog.connector.validation")
    with pytest.raises(
        QuorumLogSourceError, match=r"^t/0 is gone\. Set failOnDataLoss=false to drop it\.$"
    ):
        data_loss(True, "t/0 is gone.", "drop it")
    data_loss(False, "t/0 is gone.", "drop it")
    assert "t/0 is gone. failOnDataLoss=false: going on to drop it." in caplog.text


def test_settle_without_truncations_does_nothing(caplog: pytest.LogCaptureFixture) -> None:
    settle_truncations("fail", [], "nothing")
    settle_truncations("resume", [], "nothing")
    assert caplog.text == ""


def test_backoff_spends_its_budget_then_raises_and_progress_renews_it() -> None:
    client = Client("127.0.0.1:1", retry_backoff_ms=5, retry_backoff_max_ms=10)
    backoff = Backoff(client, timeout_ms=100)
    with pytest.raises(QuorumLogSourceError, match="still failing"):
        for _ in range(1000):  # bounded: ~10 ms each, the budget is 100 ms
            backoff.wait(QuorumLogSourceError("still failing"))
    # It slept before giving up (a budget's first failure never raises), and at most as
    # often as back-offs of at least 4 ms (5 ms, then 10 ms, +-20 %) fit its 100 ms: no
    # sleep ends early, so this holds at any load (a slow machine only makes it fewer).
    assert 1 <= backoff.attempt <= 25
    backoff.progress()
    assert backoff.attempt == 0
    backoff.wait(QuorumLogSourceError("not yet"))  # a fresh budget: sleeps, does not raise
    assert backoff.attempt == 1
