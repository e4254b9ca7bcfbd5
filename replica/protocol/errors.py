"""The one error-code enum shared by node, raft core and client (names as in the KIPs)."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    NETWORK_EXCEPTION = 13
    INVALID_TOPIC = 17
    NOT_ENOUGH_REPLICAS = 19
    INVALID_REQUEST = 42
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    CLUSTER_AUTHORIZATION_FAILED = 31
    AUTHORIZATION_FAILED = 29
    ILLEGAL_SASL_STATE = 34
    SASL_AUTHENTICATION_FAILED = 58
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    INCONSISTENT_VOTER_SET = 81
    INVALID_QUORUM_STATE = 82
    INVALID_CLUSTER_ID = 104
    NOT_FOLLOWER = 105
    NOT_QUORUM_LEADER = 106
    SHUTTING_DOWN = 107

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE


_RETRIABLE = frozenset(
    {
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NOT_QUORUM_LEADER,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
)
