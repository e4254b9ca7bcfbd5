"""Native error codes as the Kafka listener answers them."""

from __future__ import annotations

from ..kafka.errors import KafkaError
from ..protocol import ErrorCode

#: Native error codes up to here are Kafka's own numbers and meanings (protocol/errors.py);
#: the quorum ones above map in ``kafka_error``.
_KAFKA_NUMBERED = 80
_LEADER_MOVED = frozenset(
    {ErrorCode.NOT_FOLLOWER, ErrorCode.NOT_QUORUM_LEADER, ErrorCode.SHUTTING_DOWN}
)


def kafka_error(code: int) -> int:
    """The Kafka error code for a native one (same number where Kafka has that error)."""
    if -1 <= code <= _KAFKA_NUMBERED or code == ErrorCode.INVALID_RECORD:
        return code
    if code in _LEADER_MOVED:
        return int(KafkaError.NOT_LEADER_OR_FOLLOWER)
    return int(KafkaError.UNKNOWN_SERVER_ERROR)


def admin_error(code: ErrorCode) -> int:
    """Topic administration on a node that is not the metadata leader: NOT_CONTROLLER, so
    the client asks Metadata for the controller and goes there."""
    if code == ErrorCode.NOT_LEADER:
        return int(KafkaError.NOT_CONTROLLER)
    return kafka_error(code)
