"""Wire protocol: frames, the message codec, request/response types and error codes."""

from .codec import DecodeError, decode_body, encode
from .errors import ErrorCode
from .framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_OVERHEAD_BYTES,
    PREFIX,
    Frame,
    FrameError,
    decode_frame,
    encode_frame,
    frame_length,
    max_batch_bytes,
)
from .messages import API_VERSION, REQUESTS, ApiKey

__all__ = [
    "API_VERSION",
    "DEFAULT_MAX_FRAME_BYTES",
    "FRAME_OVERHEAD_BYTES",
    "PREFIX",
    "REQUESTS",
    "ApiKey",
    "DecodeError",
    "ErrorCode",
    "Frame",
    "FrameError",
    "decode_body",
    "decode_frame",
    "encode",
    "encode_frame",
    "frame_length",
    "max_batch_bytes",
]
