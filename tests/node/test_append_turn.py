"""A node hands its driver the appends of one turn of its event loop together
(``Driver.request_many``, where a partition's plain batches become one append): produce
requests and transaction markers, from every connection, in the order they came. Node
is real (not started); its driver has no partitions, so each request is answered
UNKNOWN_TOPIC_OR_PARTITION at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from quorumlog.replica.node.node import Node
from quorumlog.replica.protocol import ErrorCode
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.storage.records import encode_batch

from tests.support.config import node_config

RECORDS = encode_batch([b"v"])


def _produce(partition: int) -> m.ProduceRequest:
    return m.ProduceRequest(
        topic="t", partition=partition, acks=m.ACKS_QUORUM, timeout_ms=0, records=RECORDS
    )


def _marker(partition: int) -> m.WriteTxnMarkerRequest:
    return m.WriteTxnMarkerRequest(
        topic="t",
        partition=partition,
        producer_id=7,
        producer_epoch=0,
        commit=True,
        coordinator_epoch=0,
        timeout_ms=1000,
        timestamp_ms=0,
    )


def test_a_turns_appends_reach_the_driver_together_and_in_order(tmp_path: Path) -> None:
    reqs: list[Any] = [_produce(0), _produce(1), _marker(0), _produce(0)]

    async def run() -> tuple[list[list[Any]], int, list[Any]]:
        node = Node(node_config(tmp_path))
        handed: list[list[Any]] = []
        request_many = node.driver.request_many

        def recorded(items: Any, now: int) -> Any:
            handed.append([req for _token, _key, req in items])
            return request_many(items, now)

        node.driver.request_many = recorded  # type: ignore[method-assign]
        futures = [node._request(("t", r.partition), r)[1] for r in reqs]
        before = len(handed)  # nothing yet: the driver has them at the loop's next turn
        answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
        return handed, before, answers

    handed, before, answers = asyncio.run(run())
    assert before == 0
    assert handed == [reqs]
    assert [a.error for a in answers] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * len(reqs)


def test_appends_the_driver_fails_on_fail_with_its_error_not_silence(tmp_path: Path) -> None:
    """A bug in the driver's append path fails each request of the turn, as one handed
    alone would (its handler answers the client), rather than leaving it unanswered."""

    async def run() -> list[BaseException | Any]:
        node = Node(node_config(tmp_path))

        def broken(items: Any, now: int) -> Any:
            raise RuntimeError("broken on purpose")

        node.driver.request_many = broken  # type: ignore[method-assign]
        futures = [node._request(("t", p), _produce(p))[1] for p in (0, 1)]
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)

    outcomes = asyncio.run(run())
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert isinstance(outcome, RuntimeError) and "broken on purpose" in str(outcome)
