"""Client: metadata cache, produce, fenced fetch, list offsets, offsets-for-epoch, describe."""

from .client import (
    Client,
    FetchResult,
    PartitionMetadata,
    ProduceResult,
    TopicMetadata,
    parse_bootstrap,
)
from .errors import (
    AuthenticationError,
    AuthorizationError,
    BootstrapUnreachableError,
    FencedLeaderEpochError,
    InvalidRequestError,
    LeaderNotAvailableError,
    NotLeaderError,
    OffsetOutOfRangeError,
    QuorumLogError,
    RequestTimeoutError,
    SecurityError,
    TlsError,
    TopicExistsError,
    UnknownLeaderEpochError,
    UnknownTopicError,
)
from .security import ClientSecurity

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BootstrapUnreachableError",
    "Client",
    "ClientSecurity",
    "FencedLeaderEpochError",
    "FetchResult",
    "InvalidRequestError",
    "LeaderNotAvailableError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "PartitionMetadata",
    "ProduceResult",
    "QuorumLogError",
    "RequestTimeoutError",
    "SecurityError",
    "TlsError",
    "TopicExistsError",
    "TopicMetadata",
    "UnknownLeaderEpochError",
    "UnknownTopicError",
    "parse_bootstrap",
]
