"""Typed client exceptions; each carries the error code and the facts in its message."""

from __future__ import annotations

from ..protocol.errors import ErrorCode


class QuorumLogError(Exception):
    error_code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, error_code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code


class NotLeaderError(QuorumLogError):
    error_code = ErrorCode.NOT_LEADER


class LeaderNotAvailableError(QuorumLogError):
    error_code = ErrorCode.LEADER_NOT_AVAILABLE


class FencedLeaderEpochError(QuorumLogError):
    error_code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(QuorumLogError):
    error_code = ErrorCode.UNKNOWN_LEADER_EPOCH


class OffsetOutOfRangeError(QuorumLogError):
    error_code = ErrorCode.OFFSET_OUT_OF_RANGE


class UnknownTopicError(QuorumLogError):
    error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class TopicExistsError(QuorumLogError):
    error_code = ErrorCode.TOPIC_ALREADY_EXISTS


class BootstrapUnreachableError(QuorumLogError):
    error_code = ErrorCode.NETWORK_EXCEPTION


class RequestTimeoutError(QuorumLogError):
    error_code = ErrorCode.REQUEST_TIMED_OUT


class InvalidRequestError(QuorumLogError):
    error_code = ErrorCode.INVALID_REQUEST


class RecordTooLargeError(QuorumLogError):
    """A record batch over the topic's max.message.bytes (Kafka's
    RecordTooLargeException). Raised before sending when the client knows the limit, or
    on the node's MESSAGE_TOO_LARGE answer; never retried: the same batch fails again."""

    error_code = ErrorCode.MESSAGE_TOO_LARGE


class SecurityError(QuorumLogError):
    """TLS or authentication failed on connect; retrying with the same settings will not help."""


class TlsError(SecurityError):
    error_code = ErrorCode.NETWORK_EXCEPTION


class AuthenticationError(SecurityError):
    error_code = ErrorCode.SASL_AUTHENTICATION_FAILED


class AuthorizationError(QuorumLogError):
    error_code = ErrorCode.AUTHORIZATION_FAILED


_BY_CODE: dict[ErrorCode, type[QuorumLogError]] = {
    ErrorCode.AUTHORIZATION_FAILED: AuthorizationError,
    ErrorCode.SASL_AUTHENTICATION_FAILED: AuthenticationError,
    ErrorCode.ILLEGAL_SASL_STATE: AuthenticationError,
    ErrorCode.NOT_LEADER: NotLeaderError,
    ErrorCode.NOT_QUORUM_LEADER: NotLeaderError,
    ErrorCode.LEADER_NOT_AVAILABLE: LeaderNotAvailableError,
    ErrorCode.FENCED_LEADER_EPOCH: FencedLeaderEpochError,
    ErrorCode.UNKNOWN_LEADER_EPOCH: UnknownLeaderEpochError,
    ErrorCode.OFFSET_OUT_OF_RANGE: OffsetOutOfRangeError,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicError,
    ErrorCode.TOPIC_ALREADY_EXISTS: TopicExistsError,
    ErrorCode.REQUEST_TIMED_OUT: RequestTimeoutError,
    ErrorCode.INVALID_REQUEST: InvalidRequestError,
    ErrorCode.MESSAGE_TOO_LARGE: RecordTooLargeError,
}


def error_for(code: int, message: str) -> QuorumLogError:
    try:
        ec = ErrorCode(code)
    except ValueError:
        return QuorumLogError(f"unknown error code {code}: {message}")
    cls = _BY_CODE.get(ec, QuorumLogError)
    return cls(f"{ec.name}: {message}" if message else ec.name, ec)
