from __future__ import annotations

import json

import pytest
from quorumlog.connector.offsets import (
    OffsetsFormatError,
    Position,
    TopicPartition,
    from_offset_dict,
    offsets_json,
    parse_offsets_json,
    to_offset_dict,
)

E0, E1, F0 = TopicPartition("events", 0), TopicPartition("events", 1), TopicPartition("f", 0)


def test_parse_with_and_without_epochs() -> None:
    got = parse_offsets_json(
        '{"events": {"0": {"offset": 1200, "epoch": 3}, "1": 980}, "f": {"0": {"offset": 4}}}'
    )
    assert got == {E0: Position(1200, 3), E1: Position(980, -1), F0: Position(4, -1)}


def test_sentinels_only_where_allowed() -> None:
    assert parse_offsets_json('{"events": {"0": -2, "1": -1}}', allow_sentinels=(-2, -1)) == {
        E0: Position(-2),
        E1: Position(-1),
    }
    with pytest.raises(OffsetsFormatError, match="negative"):
        parse_offsets_json('{"events": {"0": -1}}')
    with pytest.raises(OffsetsFormatError, match="epoch makes no sense"):
        parse_offsets_json('{"events": {"0": {"offset": -2, "epoch": 1}}}', allow_sentinels=(-2,))


@pytest.mark.parametrize(
    "text, why",
    [
        ("[]", "non-empty JSON object"),
        ('{"events": 5}', "must map to an object"),
        ('{"events": {"x": 5}}', "is not a number"),
        ('{"events": {"0": true}}', "offset must be an integer"),
        ('{"events": {"0": {"offset": 1, "leaderEpoch": 2}}}', "unknown keys"),
    ],
)
def test_malformed(text: str, why: str) -> None:
    with pytest.raises(OffsetsFormatError, match=why):
        parse_offsets_json(text)


def test_serialized_form_is_sorted_and_round_trips() -> None:
    positions = {E1: Position(980, 2), F0: Position(1, -1), E0: Position(1200, 3)}
    d = to_offset_dict(positions)
    assert json.dumps(d) == json.dumps(to_offset_dict(dict(reversed(list(positions.items())))))
    assert list(d) == ["events", "f"] and list(d["events"]) == ["0", "1"]
    assert d["events"]["0"] == {"offset": 1200, "epoch": 3}
    assert from_offset_dict(d) == positions
    assert parse_offsets_json(offsets_json(positions)) == positions
