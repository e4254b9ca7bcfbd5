"""Option parsing: one test per option error (the messages name option, value, accepted)."""

from __future__ import annotations

from typing import Any

import pytest
from quorumlog.connector import QuorumLogOptionError, parse_options
from quorumlog.connector.offsets import Position, TopicPartition

BASE = {"bootstrap": "127.0.0.1:9092", "topic": "events"}


def bad(match: str, **options: str) -> None:
    with pytest.raises(QuorumLogOptionError, match=match):
        parse_options({**BASE, **options})


def test_defaults() -> None:
    o = parse_options(BASE)
    assert o.topics == ("events",)
    assert o.starting_offsets is None and o.ending_offsets is None
    assert o.on_truncation == "fail" and o.fail_on_data_loss is True
    assert o.max_offsets_per_trigger is None
    assert o.fetch_max_bytes == 8 << 20 and o.request_timeout_ms == 30000


def test_keys_are_case_insensitive_and_values_parsed() -> None:
    o = parse_options(
        {
            "BOOTSTRAP": "a:1,b:2",
            "Topic": "x, y",
            "STARTINGOFFSETS": '{"x": {"0": {"offset": 5, "epoch": 2}, "1": 7}}',
            "maxoffsetspertrigger": "100",
            "onTruncation": "Resume",
            "failOnDataLoss": "FALSE",
            "fetchMaxBytes": "1024",
            "requestTimeoutMs": "500",
        }
    )
    assert o.topics == ("x", "y")
    assert o.starting_offsets == {
        TopicPartition("x", 0): Position(5, 2),
        TopicPartition("x", 1): Position(7, -1),
    }
    assert (o.max_offsets_per_trigger, o.on_truncation, o.fail_on_data_loss) == (
        100,
        "resume",
        False,
    )
    assert (o.fetch_max_bytes, o.request_timeout_ms) == (1024, 500)


def test_bootstrap_missing() -> None:
    with pytest.raises(QuorumLogOptionError, match="Missing required option 'bootstrap'"):
        parse_options({"topic": "events"})


def test_topic_and_pattern_missing() -> None:
    with pytest.raises(QuorumLogOptionError, match="Exactly one of the options 'topic'"):
        parse_options({"bootstrap": "h:1"})


def test_topic_pattern_bad() -> None:
    with pytest.raises(QuorumLogOptionError, match=r"option 'topicPattern': 'ev\['.*regular"):
        parse_options({"bootstrap": "h:1", "topicPattern": "ev["})


def test_min_partitions_and_max_records_per_partition() -> None:
    o = parse_options({**BASE, "minPartitions": "8", "maxRecordsPerPartition": "1000"})
    assert (o.min_partitions, o.max_records_per_partition) == (8, 1000)


def test_timestamp_options() -> None:
    o = parse_options({**BASE, "startingTimestamp": "1700000000000", "endingTimestamp": "5"})
    assert (o.starting_timestamps, o.ending_timestamps) == (1700000000000, 5)
    o = parse_options({**BASE, "startingOffsetsByTimestamp": '{"events": {"0": 10, "1": 20}}'})
    assert o.starting_timestamps == {
        TopicPartition("events", 0): 10,
        TopicPartition("events", 1): 20,
    }
    assert o.timestamp_for(TopicPartition("events", 1), ending=False) == 20
    assert o.timestamp_for(TopicPartition("events", 2), ending=False) is None
    # the single timestamp wins over the per-partition one, as in Spark
    o = parse_options(
        {**BASE, "endingTimestamp": "7", "endingOffsetsByTimestamp": '{"events": {"0": 1}}'}
    )
    assert o.ending_timestamps == 7


def test_min_offsets_per_trigger_and_max_trigger_delay() -> None:
    o = parse_options(BASE)
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (None, 15 * 60 * 1000)
    o = parse_options({**BASE, "minOffsetsPerTrigger": "100", "maxTriggerDelay": "30s"})
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (100, 30000)
    assert parse_options({**BASE, "maxTriggerDelay": "250"}).max_trigger_delay_ms == 250
    assert parse_options({**BASE, "maxTriggerDelay": "2min"}).max_trigger_delay_ms == 120000


def test_include_headers() -> None:
    assert parse_options(BASE).include_headers is False  # Spark's default
    assert parse_options({**BASE, "includeHeaders": "TRUE"}).include_headers is True


def test_attempt_timeout_ms_reaches_the_tasks() -> None:
    from quorumlog.connector.fetch import QuorumLogPartition

    assert parse_options(BASE).attempt_timeout_ms == 1500
    o = parse_options({**BASE, "attemptTimeoutMs": "250"})
    assert o.attempt_timeout_ms == 250
    tp = TopicPartition("events", 0)
    task = QuorumLogPartition.for_range(o, tp, Position(0, -1), Position(5, 1), 1)
    assert task.attempt_timeout_ms == 250


def case(match: str, **options: str) -> Any:
    """One bad option value (or combination) and what its error must say."""
    return pytest.param(options, match, id="-".join(options))


BAD_OPTIONS = [
    case(r"option 'bootstrap': 'nohostport'.*host:port", bootstrap="nohostport"),
    case("both were given", topicPattern="ev.*"),
    case(r"option 'topic': 'a,,b'.*comma-separated", topic="a,,b"),
    case(r"option 'startingOffsets': 'first'.*'earliest', 'latest'", startingOffsets="first"),
    case(r"option 'startingOffsets'.*not valid JSON", startingOffsets='{"events": {0: 1}'),
    case(
        r"option 'startingOffsets'.*'epoch' must be an integer >= -1",
        startingOffsets='{"events": {"0": {"offset": 1, "epoch": -5}}}',
    ),
    case(
        r"option 'startingOffsets'.*offset -3 is negative", startingOffsets='{"events": {"0": -3}}'
    ),
    case(r"option 'startingOffsets'.*not subscribed", startingOffsets='{"other": {"0": 1}}'),
    case(r"option 'endingOffsets': 'earliest'.*not an end", endingOffsets="earliest"),
    case(
        r"option 'endingOffsets'.*-2 is negative.*-1 \(latest\)",
        endingOffsets='{"events": {"0": -2}}',
    ),
    case(r"option 'maxOffsetsPerTrigger': '0'.*positive integer", maxOffsetsPerTrigger="0"),
    case(r"option 'maxOffsetsPerTrigger': 'ten'", maxOffsetsPerTrigger="ten"),
    case(r"option 'minPartitions': '0'.*positive integer", minPartitions="0"),
    case(
        r"option 'maxRecordsPerPartition': 'many'.*positive integer", maxRecordsPerPartition="many"
    ),
    case(r"option 'startingTimestamp': 'yesterday'.*milliseconds", startingTimestamp="yesterday"),
    case(r"option 'endingTimestamp': '-5'.*milliseconds", endingTimestamp="-5"),
    case(
        r"option 'startingOffsetsByTimestamp': '\{\"events\": 5\}'.*JSON object of timestamps",
        startingOffsetsByTimestamp='{"events": 5}',
    ),
    case(
        r"option 'endingOffsetsByTimestamp'.*subscribed topics \(not \['other'\]\)",
        endingOffsetsByTimestamp='{"other": {"0": 5}}',
    ),
    case(r"option 'minOffsetsPerTrigger': '-1'.*positive integer", minOffsetsPerTrigger="-1"),
    case(r"option 'maxTriggerDelay': 'soon'.*duration like '15m'", maxTriggerDelay="soon"),
    case(
        r"option 'minOffsetsPerTrigger': '50'.*at most maxOffsetsPerTrigger \(10\)",
        minOffsetsPerTrigger="50",
        maxOffsetsPerTrigger="10",
    ),
    case(r"option 'includeHeaders': 'yes'.*'true' or 'false'", includeHeaders="yes"),
    case(r"option 'onTruncation': 'ignore'.*'fail'.*'resume'", onTruncation="ignore"),
    case(r"option 'failOnDataLoss': 'yes'.*'true' or 'false'", failOnDataLoss="yes"),
    case(r"option 'fetchMaxBytes': '-1'.*positive integer", fetchMaxBytes="-1"),
    case(r"option 'requestTimeoutMs': '1.5'.*positive integer", requestTimeoutMs="1.5"),
    case(r"Unknown option 'subscribe'.*did you mean 'topic'", subscribe="events"),
    case(r"Unknown option 'startingoffset'.*Accepted options", startingOffset="earliest"),
    case(r"option 'attemptTimeoutMs': '0'.*positive integer", attemptTimeoutMs="0"),
]


@pytest.mark.parametrize("options, match", BAD_OPTIONS)
def test_bad_option_names_option_value_and_accepted(options: dict[str, str], match: str) -> None:
    bad(match, **options)
