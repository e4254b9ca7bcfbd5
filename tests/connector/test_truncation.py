"""Truncation detection as a pure function, and LogTruncationException's facts round trip."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from quorumlog.connector import LogTruncationException, TruncatedPartition
from quorumlog.connector.offsets import Position, TopicPartition
from quorumlog.connector.truncation import (
    Divergence,
    EpochRun,
    check_position,
    first_offset_not_in_log,
)


@pytest.mark.parametrize(
    "position, answer, expected",
    [
        # same epoch, the leader's epoch extends past our offset: consistent
        (Position(100, 3), (3, 150), None),
        (Position(100, 3), (3, 100), None),
        # same epoch ends before our offset: truncated at the answer's end (exact)
        (Position(100, 3), (3, 80), Divergence(80, 3, True)),
        # the leader only knows an older epoch, ending before our offset (Kafka's rule)
        (Position(100, 5), (4, 90), Divergence(90, 4, False)),
        # the leader never had our epoch but has records past our offset written in an
        # older epoch: only the epoch reveals it (log start is the safe point)
        (Position(100, 5), (4, 120), Divergence(0, -1, False)),
        # the leader knows no epoch <= ours
        (Position(100, 5), (-1, -1), Divergence(0, -1, False)),
        # no epoch known: cannot check
        (Position(100, -1), (-1, -1), None),
        # nothing consumed before offset 0
        (Position(0, 2), (-1, -1), None),
    ],
)
def test_check_position(
    position: Position, answer: tuple[int, int], expected: Divergence | None
) -> None:
    assert check_position(position, *answer, log_start_offset=0) == expected


def test_check_position_at_log_start_after_retention_is_not_truncation() -> None:
    assert check_position(Position(50, 1), -1, -1, log_start_offset=50) is None
    assert check_position(Position(60, 1), -1, -1, log_start_offset=50) == Divergence(50, -1, False)


def exc() -> LogTruncationException:
    return LogTruncationException(
        [
            TruncatedPartition("events", 1, 980, 2, 950, 2, True),
            TruncatedPartition("events", 0, 1200, 3, 1100, 3, True),
        ]
    )


def test_message_names_every_fact() -> None:
    text = str(exc())
    assert "2 partition(s)" in text
    assert "events/0: consumed position offset 1200 (epoch 3), log diverges at offset 1100" in text
    assert "events/1: consumed position offset 980 (epoch 2), log diverges at offset 950" in text
    assert "onTruncation=resume" in text
    assert exc().divergence_offsets == {
        TopicPartition("events", 0): 1100,
        TopicPartition("events", 1): 950,
    }


def test_round_trip_from_spark_error_text() -> None:
    original = exc()
    # what a StreamingQueryException carries: the Python traceback inside JVM text
    spark_text = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "stream.py", line 200, in latestOffset\n'
        f"quorumlog.connector.truncation.LogTruncationException: {original}\n"
        "\tat org.apache.spark.api.python.BasePythonRunner..."
    )
    parsed = LogTruncationException.from_spark_error(spark_text)
    assert parsed is not None
    assert parsed.truncations == original.truncations
    # also when quotes were escaped by a JSON/repr layer, and from an exception object
    escaped = spark_text.replace('"', '\\"')
    assert LogTruncationException.from_spark_error(escaped).truncations == original.truncations  # type: ignore[union-attr]
    try:
        raise RuntimeError("wrapper") from RuntimeError(spark_text)
    except RuntimeError as e:
        assert LogTruncationException.from_spark_error(e).truncations == original.truncations  # type: ignore[union-attr]
    assert LogTruncationException.from_spark_error("some other failure") is None


def _log(epochs: dict[int, tuple[int, int]]) -> Callable[[int], tuple[int, int]]:
    """OffsetsForLeaderEpoch of a log whose epochs span ``{epoch: (start, end)}``."""

    def answer(epoch: int) -> tuple[int, int]:
        known = [e for e in epochs if e <= epoch]
        if not known:
            return -1, -1
        return max(known), epochs[max(known)][1]

    return answer


def test_first_offset_not_in_log_walks_the_held_epochs_down() -> None:
    held = [EpochRun(1, 0, 9), EpochRun(3, 11, 19)]  # 10: epoch 3's control record
    # the log has everything held (and more of epoch 3): nothing to replace
    assert first_offset_not_in_log(held, _log({1: (0, 10), 3: (10, 30)})) is None
    # the log's epoch 3 ends inside the held run: exact, from its end
    assert first_offset_not_in_log(held, _log({1: (0, 10), 3: (10, 15), 4: (15, 20)})) == 15
    # a leader that never had epoch 3, whose epoch 2 reaches past where ours began: the
    # answer for epoch 3 says (2, 25), but the table's rows differ from 11 on (its epoch 1
    # ends at 10: everything after the last row it has as held, 9, is the log's)
    log = _log({1: (0, 10), 2: (10, 25), 4: (25, 30)})
    assert log(3) == (2, 25)
    assert first_offset_not_in_log(held, log) == 10
    # epoch 1 truncated inside the held rows too
    assert first_offset_not_in_log(held, _log({1: (0, 6), 2: (6, 25)})) == 6
    # the log has none of the held epochs: everything held is replaced
    assert first_offset_not_in_log(held, _log({5: (0, 40)})) == 0
    assert first_offset_not_in_log([], _log({1: (0, 5)})) is None
