"""Length-prefixed frames.

A frame is ``u32 frame_length | u32 meta_length | meta | payload``: ``meta`` is a msgpack
array ``[api_key, api_version, correlation_id, client_id, body]`` and ``payload`` is raw
record-batch bytes carried as-is (never re-encoded, never copied into the msgpack buffer).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from .. import defaults
from .errors import ErrorCode

PREFIX = struct.Struct(">II")
DEFAULT_MAX_FRAME_BYTES = defaults.MAX_FRAME_BYTES
# What a frame carrying one record batch may add around it: prefix, msgpack meta (api
# key, ids, client id) and the body (a raft envelope: topic name <= 200 characters,
# cluster id, epochs, offsets). The real figure is under 1 KiB; the margin keeps "one
# batch of the largest allowed size fits every frame" true whatever path carries it.
FRAME_OVERHEAD_BYTES = 1 << 20


def max_batch_bytes(max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """The largest record batch (and so the ceiling of any ``max.message.bytes``) that
    fits a frame of ``max_frame_bytes`` on every path: produce, replica fetch inside the
    raft envelope, consumer fetch."""
    return max_frame_bytes - FRAME_OVERHEAD_BYTES


class FrameError(Exception):
    """A frame that cannot be parsed; the connection it came from is closed."""

    def __init__(self, message: str, error_code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class Frame:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body: Any
    payload: bytes | memoryview = b""


def encode_frame(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str,
    body: Any,
    payload: bytes | memoryview = b"",
) -> list[bytes | memoryview]:
    """Encode a frame as a list of buffers: the small head, then the payload (if any),
    never copied (see ``transport.write_buffers``)."""
    meta = msgpack.packb([api_key, api_version, correlation_id, client_id, body], use_bin_type=True)
    head = PREFIX.pack(4 + len(meta) + len(payload), len(meta)) + meta
    return [head, payload] if payload else [head]


def frame_length(prefix: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[int, int]:
    """Validate the 8-byte prefix; return (bytes that follow the first u32, meta length)."""
    if len(prefix) != PREFIX.size:
        raise FrameError("truncated frame prefix")
    total, meta_len = PREFIX.unpack(prefix)
    if total > max_frame_bytes:
        raise FrameError(
            f"frame of {total} bytes exceeds the limit of {max_frame_bytes}",
            ErrorCode.MESSAGE_TOO_LARGE,
        )
    if total < 4 or meta_len > total - 4:
        raise FrameError(f"malformed frame prefix (length {total}, meta {meta_len})")
    return total, meta_len


def decode_frame(rest: bytes, meta_len: int) -> Frame:
    """Decode what follows the prefix: ``meta_len`` bytes of msgpack, then the payload."""
    view = memoryview(rest)
    try:
        meta = msgpack.unpackb(view[:meta_len], raw=False, strict_map_key=False)
    except Exception as exc:
        raise FrameError(f"frame metadata is not valid msgpack: {exc}") from exc
    if not isinstance(meta, list) or len(meta) != 5:
        raise FrameError(
            "frame metadata must be [api_key, version, correlation_id, client_id, body]"
        )
    api_key, version, correlation_id, client_id, body = meta
    if not all(isinstance(x, int) for x in (api_key, version, correlation_id)):
        raise FrameError("api key, version and correlation id must be integers")
    if not isinstance(client_id, str):
        raise FrameError("client id must be a string")
    return Frame(api_key, version, correlation_id, client_id, body, view[meta_len:])
