"""Epoch-aware positions and their JSON form.

A position is ``(offset, epoch)``: ``offset`` is the next offset to read and ``epoch`` the
leader epoch of the record just before it (the last one consumed), as in KIP-320's
committed offsets. ``epoch == -1`` means "no epoch known": such a position cannot be
checked for truncation (it is taken on trust until the first batch read after it gives
it an epoch).

JSON form (Spark checkpoints, ``startingOffsets``/``endingOffsets``, ``next_offsets``)::

    {"events": {"0": {"offset": 1200, "epoch": 3}, "1": 980}}

A plain number is an offset without an epoch. As in Spark's Kafka source, offset -2 means
"earliest" and -1 "latest" in ``startingOffsets``/``endingOffsets``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

EARLIEST = -2
LATEST = -1
UNKNOWN_EPOCH = -1

_EXAMPLE = '{"events": {"0": {"offset": 1200, "epoch": 3}, "1": 980}}'


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"


class Position(NamedTuple):
    offset: int
    epoch: int = UNKNOWN_EPOCH

    def describe(self) -> str:
        epoch = "unknown" if self.epoch < 0 else str(self.epoch)
        return f"offset {self.offset} (epoch {epoch})"


Positions = dict[TopicPartition, Position]


class OffsetsFormatError(ValueError):
    """Malformed offsets JSON; the message names the option, the value and the fix."""


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _fail(option: str, text: str, why: str) -> OffsetsFormatError:
    shown = text if len(text) <= 300 else text[:300] + "..."
    return OffsetsFormatError(
        f"Invalid value for option '{option}': {shown!r}: {why}. Accepted: 'earliest', "
        f"'latest' or a JSON object topic -> partition -> offset, e.g. {_EXAMPLE} "
        '(an object {"offset": N, "epoch": E} carries the leader epoch of the record before '
        "offset N; a plain number means no epoch is known, so truncation cannot be checked "
        "for it; -2 = earliest, -1 = latest)"
    )


def parse_offsets_json(
    text: str, *, option: str = "startingOffsets", allow_sentinels: tuple[int, ...] = ()
) -> Positions:
    """Parse offsets JSON. Offsets must be >= 0 except the sentinels in ``allow_sentinels``
    (EARLIEST, LATEST); epochs must be >= -1."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(option, text, f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not raw:
        raise _fail(option, text, "expected a non-empty JSON object of topics")
    out: Positions = {}
    for topic, parts in raw.items():
        if not isinstance(topic, str) or not topic:
            raise _fail(option, text, "topic names must be non-empty strings")
        if not isinstance(parts, dict) or not parts:
            raise _fail(option, text, f"topic {topic!r} must map to an object of partitions")
        for pkey, value in parts.items():
            if not pkey.isdigit():
                raise _fail(option, text, f"partition {pkey!r} of topic {topic!r} is not a number")
            tp = TopicPartition(topic, int(pkey))
            if isinstance(value, dict):
                unknown = set(value) - {"offset", "epoch"}
                if unknown:
                    raise _fail(option, text, f"{tp}: unknown keys {sorted(unknown)}")
                offset = _int(value.get("offset"))
                epoch = _int(value.get("epoch", UNKNOWN_EPOCH))
                if offset is None:
                    raise _fail(option, text, f"{tp}: 'offset' must be an integer")
                if epoch is None or epoch < UNKNOWN_EPOCH:
                    raise _fail(option, text, f"{tp}: 'epoch' must be an integer >= -1")
            else:
                offset = _int(value)
                epoch = UNKNOWN_EPOCH
                if offset is None:
                    raise _fail(option, text, f"{tp}: offset must be an integer or an object")
            if offset < 0 and offset not in allow_sentinels:
                allowed = " or ".join(
                    f"{s} ({'earliest' if s == EARLIEST else 'latest'})" for s in allow_sentinels
                )
                raise _fail(
                    option,
                    text,
                    f"{tp}: offset {offset} is negative"
                    + (
                        f"; the only negative values accepted here are {allowed}" if allowed else ""
                    ),
                )
            if offset < 0 and epoch != UNKNOWN_EPOCH:
                raise _fail(option, text, f"{tp}: an epoch makes no sense with offset {offset}")
            out[tp] = Position(offset, epoch)
    return out


def sort_positions(positions: Mapping[TopicPartition, Position]) -> Positions:
    return {tp: positions[tp] for tp in sorted(positions)}


def to_offset_dict(positions: Mapping[TopicPartition, Position]) -> dict[str, Any]:
    """The dict Spark checkpoints: sorted topics and partitions, so the same positions
    always serialize to the same JSON (Spark compares offsets by their JSON)."""
    out: dict[str, Any] = {}
    for tp in sorted(positions):
        pos = positions[tp]
        out.setdefault(tp.topic, {})[str(tp.partition)] = {
            "offset": int(pos.offset),
            "epoch": int(pos.epoch),
        }
    return out


def from_offset_dict(d: Mapping[str, Any], *, what: str = "offset") -> Positions:
    """Inverse of ``to_offset_dict``; also accepts plain numbers (no epoch)."""
    try:
        return parse_offsets_json(json.dumps(d), option=what) if d else {}
    except OffsetsFormatError as exc:
        raise ValueError(f"Malformed checkpointed {what}: {exc}") from None


def offsets_json(positions: Mapping[TopicPartition, Position]) -> str:
    """Positions as the epoch-aware JSON accepted by ``startingOffsets``."""
    return json.dumps(to_offset_dict(positions), separators=(",", ":"))
