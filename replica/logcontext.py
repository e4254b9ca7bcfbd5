"""The partition a log record is about, for lines that do not name it themselves (the
raft core's "replica 2 leads epoch 5 from offset 10"): the driver steps each partition
``with about(key)``, and the command's log setup (``cli.logformat``) stamps
``topic/partition`` on every record made meanwhile."""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType

#: (topic, partition) of the partition being stepped, or None.
PARTITION: ContextVar[tuple[str, int] | None] = ContextVar("quorumlog_partition", default=None)


class _About:
    __slots__ = ("key", "token")

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key

    def __enter__(self) -> None:
        self.token: Token[tuple[str, int] | None] = PARTITION.set(self.key)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        PARTITION.reset(self.token)


def about(key: tuple[str, int]) -> _About:
    """``with about(key):`` every log record made in the block is about partition ``key``."""
    return _About(key)
