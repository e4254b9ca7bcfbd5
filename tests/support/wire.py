"""Frames as bytes, for tests that speak the wire protocol by hand (codec round trips,
fuzzing, forged raft traffic, size limits): built and read with the protocol's own
``encode_frame`` / ``frame_length`` / ``decode_frame``, never a copy of them."""

from __future__ import annotations

from typing import Any

from quorumlog.replica.protocol import (
    API_VERSION,
    PREFIX,
    ApiKey,
    Frame,
    FrameError,
    decode_frame,
    encode,
    encode_frame,
    frame_length,
)
from quorumlog.replica.protocol import messages as m
from quorumlog.replica.raft import Message


def frame(
    api: int,
    body: Any,
    payload: bytes = b"",
    *,
    correlation_id: int = 0,
    client_id: str = "test",
    version: int = API_VERSION,
) -> bytes:
    """One whole frame (prefix, msgpack meta, raw payload) as one bytes object."""
    buffers = encode_frame(int(api), version, correlation_id, client_id, body, payload)
    return b"".join(bytes(b) for b in buffers)


def request_frame(api: int, message: Any, **kw: Any) -> bytes:
    """``message`` encoded (body and raw payload) into one frame; ``kw`` as for ``frame``."""
    body, payload = encode(message)
    return frame(api, body, payload, **kw)


def raft_frame(topic: str, partition: int, msg: Message, *, client_id: str = "x") -> bytes:
    """One RAFT frame as a node's PeerLink sends it: the message's body inside a
    RaftEnvelope, its records as the frame's payload (see Node._send_raw)."""
    body, payload = encode(msg)
    env, _ = encode(
        m.RaftEnvelope(topic=topic, partition=partition, kind=type(msg).__name__, body=body)
    )
    return frame(ApiKey.RAFT, env, payload, client_id=client_id)


def read_frame(wire: bytes) -> Frame:
    """The frame ``wire`` holds, exactly (FrameError if it is malformed or its length
    prefix does not cover exactly these bytes)."""
    total, meta_len = frame_length(wire[: PREFIX.size])
    if total + 4 != len(wire):
        raise FrameError(f"the prefix says {total + 4} bytes, the frame has {len(wire)}")
    return decode_frame(wire[PREFIX.size :], meta_len)
