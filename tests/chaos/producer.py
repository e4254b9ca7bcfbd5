"""The campaign's plain producer: unique records with acks=quorum through the native
client, every acknowledgement logged."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from quorumlog.replica.client import Client, QuorumLogError
from quorumlog.replica.storage import encode_batch

from .table import TOPIC


@dataclass(frozen=True)
class Ack:
    partition: int
    offset: int
    epoch: int
    value: bytes


class Producer(threading.Thread):
    """Appends unique records (acks=quorum) round-robin over the partitions; logs every
    acknowledgement. A failed produce is indeterminate (it may have been appended) and
    its values are never sent again."""

    def __init__(self, bootstrap: str, partitions: int, tag: str, batch: int = 5) -> None:
        super().__init__(daemon=True, name="chaos-producer")
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.tag = tag
        self.batch = batch
        self.stop_event = threading.Event()
        self.acks: list[Ack] = []
        self.indeterminate = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.bootstrap, request_timeout_ms=4000, retry_backoff_ms=50) as client:
                for seq in range(10_000_000):
                    if self.stop_event.is_set():
                        return
                    for p in range(self.partitions):
                        values = [f"{self.tag}-p{p}-{seq}-{i}".encode() for i in range(self.batch)]
                        try:
                            res = client.produce(TOPIC, p, encode_batch(values), timeout_ms=4000)
                        except (QuorumLogError, OSError):
                            self.indeterminate += len(values)
                            continue
                        for i, v in enumerate(values):
                            self.acks.append(Ack(p, res.base_offset + i, res.leader_epoch, v))
                    self.stop_event.wait(0.02)
        except BaseException as exc:  # surfaced by the campaign
            self.error = exc
