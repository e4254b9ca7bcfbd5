"""Typed client exceptions; each carries the error code and the facts in its message.

A class names the code it stands for in its header (``code=``, plus ``also=`` for codes
that mean the same to a client; ``local=True`` for errors the client raises itself and
no answer maps to); ``error_for`` maps an answer's code to its class from those headers,
so the code of a class is written once.
"""

from __future__ import annotations

from typing import Any

from ..protocol.errors import ErrorCode

_BY_CODE: dict[ErrorCode, type[QuorumLogError]] = {}


class QuorumLogError(Exception):
    error_code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init_subclass__(
        cls,
        code: ErrorCode | None = None,
        also: tuple[ErrorCode, ...] = (),
        local: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.error_code = code
            if not local:
                for c in (code, *also):
                    _BY_CODE[c] = cls

    def __init__(self, message: str, error_code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code


class NotLeaderError(
    QuorumLogError, code=ErrorCode.NOT_LEADER, also=(ErrorCode.NOT_QUORUM_LEADER,)
):
    """The node asked does not lead the partition: refresh metadata, retry at the leader."""


class LeaderNotAvailableError(QuorumLogError, code=ErrorCode.LEADER_NOT_AVAILABLE):
    """The partition has no leader right now (an election is running): retry."""


class FencedLeaderEpochError(QuorumLogError, code=ErrorCode.FENCED_LEADER_EPOCH):
    """The request's leader epoch is older than the leader's (KIP-320): refresh, revalidate."""


class UnknownLeaderEpochError(QuorumLogError, code=ErrorCode.UNKNOWN_LEADER_EPOCH):
    """The request's leader epoch is newer than the node knows (KIP-320): retry."""


class OffsetOutOfRangeError(QuorumLogError, code=ErrorCode.OFFSET_OUT_OF_RANGE):
    """The offset is below the log start or above the log end."""


class OffsetNotAvailableError(QuorumLogError, code=ErrorCode.OFFSET_NOT_AVAILABLE):
    """The leader was just elected and has not yet committed an entry of its epoch, so it
    does not know the high watermark its predecessor reached (KIP-207): retry."""


class UnknownTopicError(QuorumLogError, code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
    """No such topic or partition."""


class TopicExistsError(QuorumLogError, code=ErrorCode.TOPIC_ALREADY_EXISTS):
    """CreateTopic of a name that is taken."""


class BootstrapUnreachableError(QuorumLogError, code=ErrorCode.NETWORK_EXCEPTION, local=True):
    """No bootstrap address answered."""


class RequestTimeoutError(QuorumLogError, code=ErrorCode.REQUEST_TIMED_OUT):
    """A call did not finish within its request timeout, retries included."""


class InvalidRequestError(
    QuorumLogError,
    code=ErrorCode.INVALID_REQUEST,
    also=(ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_PARTITIONS),
):
    """The node refused the request as malformed or not allowed in this state (a topic
    config or partition count it cannot take among them)."""


class DuplicateNodeError(QuorumLogError, code=ErrorCode.DUPLICATE_BROKER_REGISTRATION):
    """A node tried to register an id that a live node with another data directory holds."""


class RecordTooLargeError(QuorumLogError, code=ErrorCode.MESSAGE_TOO_LARGE):
    """A record batch over the topic's max.message.bytes (Kafka's
    RecordTooLargeException). Raised before sending when the client knows the limit, or
    on the node's MESSAGE_TOO_LARGE answer; never retried: the same batch fails again."""


class InvalidRecordError(QuorumLogError, code=ErrorCode.INVALID_RECORD):
    """The node refused a record of the batch (Kafka's InvalidRecordException): a record
    without a key produced to a compacted topic. Never retried: the same batch fails
    again."""


class OutOfOrderSequenceError(QuorumLogError, code=ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER):
    """The leader does not hold the idempotent producer's previous batch: its sequence
    numbers are in doubt (Kafka's OutOfOrderSequenceException). The producer starts a
    new epoch, whose sequences start again at 0."""


class UnknownProducerIdError(QuorumLogError, code=ErrorCode.UNKNOWN_PRODUCER_ID):
    """The partition holds none of the idempotent producer's batches (retention deleted
    them) and the batch did not start at sequence 0: it was not appended. The producer
    moves to a new epoch of its id (sequences start again at 0) and sends it again."""


class InvalidProducerEpochError(QuorumLogError, code=ErrorCode.INVALID_PRODUCER_EPOCH):
    """A newer epoch of this producer id has written to the partition: this producer
    is fenced (a zombie) and must not write with the old epoch."""


class ProducerFencedError(InvalidProducerEpochError, code=ErrorCode.PRODUCER_FENCED):
    """Another producer took this transactional id (its InitProducerId bumped the epoch):
    this one is fenced for good (Kafka's ProducerFencedException)."""


class CoordinatorNotAvailableError(
    QuorumLogError,
    code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
    also=(ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
):
    """The coordinator of a transactional id or group moved, is being elected or is
    loading its state: the client asks again (retried within the call's timeout)."""


class ConcurrentTransactionsError(QuorumLogError, code=ErrorCode.CONCURRENT_TRANSACTIONS):
    """The id's previous transaction is still being ended: retried within the call's
    timeout."""


class InvalidTxnStateError(QuorumLogError, code=ErrorCode.INVALID_TXN_STATE):
    """The transaction is not in a state that allows this (e.g. a commit of a transaction
    the coordinator has already aborted on its timeout)."""


class InvalidTransactionTimeoutError(QuorumLogError, code=ErrorCode.INVALID_TRANSACTION_TIMEOUT):
    """``transaction_timeout_ms`` is over the nodes' ``--transaction-max-timeout-ms``."""


class TransactionAbortableError(QuorumLogError, local=True):
    """A batch of the open transaction failed: the transaction cannot commit. ``abort()``
    it and begin again (Kafka's abortable errors)."""


class TransactionStateError(QuorumLogError, code=ErrorCode.INVALID_TXN_STATE, local=True):
    """The producer's transactional calls out of order: a send outside ``begin()`` ...
    ``commit()``/``abort()``, a ``begin()`` inside a transaction, a call after it was
    fenced."""


class SecurityError(QuorumLogError):
    """TLS or authentication failed on connect; retrying with the same settings will not help."""


class TlsError(SecurityError, code=ErrorCode.NETWORK_EXCEPTION, local=True):
    """The TLS handshake failed (certificate, CA or protocol)."""


class AuthenticationError(
    SecurityError,
    code=ErrorCode.SASL_AUTHENTICATION_FAILED,
    also=(ErrorCode.ILLEGAL_SASL_STATE,),
):
    """The SCRAM exchange failed: wrong principal or secret."""


class AuthorizationError(QuorumLogError, code=ErrorCode.AUTHORIZATION_FAILED):
    """The authenticated principal may not do this."""


class TransactionalIdAuthorizationError(
    AuthorizationError, code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
):
    """The principal may not use this transactional id (its ``transactional_ids``)."""


def error_for(code: int, message: str) -> QuorumLogError:
    try:
        ec = ErrorCode(code)
    except ValueError:
        return QuorumLogError(f"unknown error code {code}: {message}")
    cls = _BY_CODE.get(ec, QuorumLogError)
    return cls(f"{ec.name}: {message}" if message else ec.name, ec)
