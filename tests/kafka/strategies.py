"""Hypothesis strategies for Kafka messages, built from the codec's compiled plans."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from quorumlog.replica.kafka.schema import Api, _Plan, _Slot

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
# A record's key or value (or a header's value): null, empty or a few bytes.
OPT_BYTES = st.none() | st.binary(max_size=40)
# A record's headers: a few (name, optional value) pairs.
HEADERS = st.lists(st.tuples(TEXT, OPT_BYTES), max_size=3)
# A record batch's producer and placement fields, as encode_batch names them, each over
# its whole range (-1: none); a test adds the attributes or compression it is about.
BATCH_HEADER: dict[str, st.SearchStrategy[int]] = {
    "base_offset": st.integers(0, 2**62),
    "partition_leader_epoch": st.integers(-1, 2**31 - 1),
    "producer_id": st.integers(-1, 2**62),
    "producer_epoch": st.integers(-1, 2**15 - 1),
    "base_sequence": st.integers(-1, 2**31 - 1),
}
SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float64": st.floats(allow_nan=False),
    "bool": st.booleans(),
    "uuid": st.uuids(),
    "string": TEXT,
    "bytes": st.binary(max_size=16),
    "records": st.binary(max_size=16),
}


def slot_strategy(slot: _Slot) -> st.SearchStrategy[Any]:
    if slot.sub is not None:
        elem: st.SearchStrategy[Any] = st.deferred(lambda: plan_strategy(slot.sub))  # type: ignore[arg-type]
    else:
        elem = SCALARS[slot.kind]
    if slot.array:
        strategy: st.SearchStrategy[Any] = st.lists(elem, max_size=3)
    else:
        strategy = elem
    if slot.nullable:
        strategy = st.none() | strategy
    return strategy


def plan_strategy(plan: _Plan) -> st.SearchStrategy[dict[str, Any]]:
    fixed = {s.name: st.just(s.default) for s in plan.absent}
    drawn = {s.name: slot_strategy(s) for s in plan.regular}
    drawn.update({s.name: slot_strategy(s) for _, s in plan.tagged})
    return st.fixed_dictionaries({**fixed, **drawn})


def message_strategy(api: Api, version: int, request: bool) -> st.SearchStrategy[dict[str, Any]]:
    return plan_strategy(api.plan(version, request))


def api_versions() -> list[tuple[Api, int]]:
    from quorumlog.replica.kafka.messages import ALL_APIS

    return [(api, v) for api in ALL_APIS for v in range(api.min_version, api.max_version + 1)]
