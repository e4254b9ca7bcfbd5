"""Kafka's transaction admin APIs on the Kafka listener: DescribeTransactions (an id's
state, producer, partitions and start time, from its coordinator) and ListTransactions
(the ids of the partitions this node coordinates, filtered by state, producer id or
duration; Kafka's admin client asks every node and merges), for
``kafka-transactions.sh describe / list``."""

from __future__ import annotations

from ..kafka import messages as km
from ..kafka.coordinators import TXN_STATE_TOPIC
from ..kafka.errors import KafkaError
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from ..kafka.txn import TxnState
from .txn_coordinator import Handler, TransactionCoordinator, wall_ms


class TxnAdmin:
    """The transaction admin handlers over a node's coordinator ``c``."""

    def __init__(self, c: TransactionCoordinator) -> None:
        self.c = c
        self.handlers: dict[int, Handler] = {
            km.DESCRIBE_TRANSACTIONS.key: self.describe_transactions,
            km.LIST_TRANSACTIONS.key: self.list_transactions,
        }

    async def describe_transactions(self, api: KafkaApi, version: int, body: Message) -> Message:
        out = api.default_response(version)
        states = []
        for tid in body["transactional_ids"]:
            part, code = await self.c._coordinate(tid)
            meta = part.txns.get(tid) if part is not None else None
            if part is not None and meta is None:
                code = KafkaError.TRANSACTIONAL_ID_NOT_FOUND
            by_topic: dict[str, list[int]] = {}
            for name, p in sorted(meta.partitions if meta else ()):
                by_topic.setdefault(name, []).append(p)
            states.append(
                {
                    "error_code": int(code),
                    "transactional_id": tid,
                    "transaction_state": meta.state.kafka_name if meta else "",
                    "transaction_timeout_ms": meta.timeout_ms if meta else 0,
                    "transaction_start_time_ms": meta.started_ms if meta else -1,
                    "producer_id": meta.producer_id if meta else -1,
                    "producer_epoch": meta.producer_epoch if meta else -1,
                    "topics": [{"topic": n, "partitions": ps} for n, ps in by_topic.items()],
                }
            )
        out["transaction_states"] = states
        return out

    async def list_transactions(self, api: KafkaApi, version: int, body: Message) -> Message:
        """The ids of the partitions this node coordinates (Kafka's admin client asks
        every node and merges)."""
        out = api.default_response(version)
        states = set(body["state_filters"] or [])
        pids = set(body["producer_id_filters"] or [])
        min_ms = body["duration_filter"]
        now = wall_ms()
        listed = []
        count = self.c.topic.count() or 0
        for p in range(count):
            part, _ = (
                await self.c._loaded(p)
                if self.c.api.driver.get((TXN_STATE_TOPIC, p))
                else (None, None)
            )
            if part is None:
                continue
            for meta in part.txns.values():
                if states and meta.state.kafka_name not in states:
                    continue
                if pids and meta.producer_id not in pids:
                    continue
                if (
                    min_ms is not None
                    and min_ms >= 0
                    and (meta.started_ms < 0 or now - meta.started_ms < min_ms)
                ):
                    continue
                listed.append(
                    {
                        "transactional_id": meta.transactional_id,
                        "producer_id": meta.producer_id,
                        "transaction_state": meta.state.kafka_name,
                    }
                )
        out["unknown_state_filters"] = sorted(s for s in states if s not in _STATE_NAMES)
        out["transaction_states"] = listed
        return out


_STATE_NAMES = frozenset(s.kafka_name for s in TxnState)
