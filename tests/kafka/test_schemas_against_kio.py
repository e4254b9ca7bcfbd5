"""Every message schema the Kafka listener serves, checked against ``kio``'s: its
dataclasses are generated from Kafka's own message definitions and its codec is
round-trip tested against Kafka. A message drawn from our schema and encoded by our
codec must parse with kio's reader of the same api and version to the end, and kio's
writer must give back the very same bytes: field order, types, nullability, tagged
fields and flexible encodings all agree."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from quorumlog.replica.kafka.messages import ALL_APIS
from quorumlog.replica.kafka.schema import Api, _Plan, _Slot, encode_struct
from quorumlog.replica.kafka.wire import Writer

from .kio_generate import kio_class
from .strategies import slot_strategy

# kio reads error codes into its ErrorCode enum: only Kafka's own codes parse.
KNOWN_ERROR_CODES = st.sampled_from(sorted(int(c.value) for c in ErrorCode))
# kio reads durations in milliseconds (session_lifetime_ms, retention_time_ms, ...) into
# datetime.timedelta, exact only within about 2**52 microseconds: int64s stay within 2**40,
# still eight bytes wide.
INT64 = st.integers(-(2**40), 2**40)


def _kio_class(api: Api, version: int, request: bool) -> Any:
    """kio's class for the message; None for a version Kafka's current definitions
    no longer have (Kafka 4 dropped the oldest versions of several APIs)."""
    try:
        return kio_class(api.name, version, "request" if request else "response")
    except ValueError:
        return None


def _strategy(plan: _Plan) -> st.SearchStrategy[dict[str, Any]]:
    def one(slot: _Slot) -> st.SearchStrategy[Any]:
        if slot.sub is not None:
            inner: st.SearchStrategy[Any] = st.deferred(lambda: _strategy(slot.sub))  # type: ignore[arg-type]
            drawn = st.lists(inner, max_size=2) if slot.array else inner
            return st.none() | drawn if slot.nullable else drawn
        if slot.name.endswith("error_code") and slot.kind == "int16" and not slot.array:
            return KNOWN_ERROR_CODES
        if slot.name.endswith("_start_time_ms") and slot.kind == "int64" and not slot.array:
            # kio reads such a field as a datetime: not negative, not past the year 9999.
            return st.integers(0, 253_402_300_799_999)
        if slot.kind == "int64" and not slot.array:
            return st.none() | INT64 if slot.nullable else INT64
        return slot_strategy(slot)

    fixed = {s.name: st.just(s.default) for s in plan.absent}
    drawn = {s.name: one(s) for s in plan.regular}
    drawn.update({s.name: one(s) for _, s in plan.tagged})
    return st.fixed_dictionaries({**fixed, **drawn})


# Produce and Fetch carry record batches that kio parses as records of its own; their
# schemas are checked with the batches as opaque bytes in test_messages.
CASES = [
    (api, version, request)
    for api in ALL_APIS
    if api.name not in ("Produce", "Fetch")
    for version in range(api.min_version, api.max_version + 1)
    for request in (True, False)
    if _kio_class(api, version, request) is not None
]


@pytest.mark.parametrize(
    ("api", "version", "request_"),
    CASES,
    ids=[f"{a.name}-v{v}-{'request' if r else 'response'}" for a, v, r in CASES],
)
def test_our_encoding_is_kio_s(api: Api, version: int, request_: bool) -> None:
    cls = _kio_class(api, version, request_)
    read, write = entity_reader(cls), entity_writer(cls)
    plan = api.plan(version, request_)

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_strategy(plan))
    def check(body: dict[str, Any]) -> None:
        w = Writer()
        encode_struct(w, plan, body)
        ours = w.getvalue()
        parsed, size = read(ours, 0)
        assert size == len(ours)
        out = io.BytesIO()
        write(out, parsed)
        assert out.getvalue() == ours

    check()
