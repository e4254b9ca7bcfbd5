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
    BootstrapUnreachableError,
    FencedLeaderEpochError,
    InvalidRequestError,
    LeaderNotAvailableError,
    NotLeaderError,
    OffsetOutOfRangeError,
    QuorumLogError,
    RequestTimeoutError,
    TopicExistsError,
    UnknownLeaderEpochError,
    UnknownTopicError,
)

__all__ = [
    "BootstrapUnreachableError",
    "Client",
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
    "TopicExistsError",
    "TopicMetadata",
    "UnknownLeaderEpochError",
    "UnknownTopicError",
    "parse_bootstrap",
]
