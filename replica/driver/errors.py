"""Error answers to client requests: one shape for every response type."""

from __future__ import annotations

from typing import Any

from ..constants import UNKNOWN
from ..protocol import ErrorCode
from ..protocol import messages as m


def error_response(req_type: type, code: ErrorCode, text: str) -> Any:
    """The response answering a ``req_type`` request with an error: UNKNOWN in
    every field that names an offset, epoch or node."""
    resp_type: type = m.REQUESTS[_API_OF[req_type]][1]
    return resp_type(error=int(code), error_message=text, **_UNKNOWN_FIELDS.get(resp_type, {}))


_API_OF: dict[type, m.ApiKey] = {req: api for api, (req, _) in m.REQUESTS.items()}
# A transaction marker is appended and answered as a produce is.
_API_OF[m.WriteTxnMarkerRequest] = m.ApiKey.PRODUCE
_UNKNOWN_FIELDS: dict[type, dict[str, int]] = {
    m.ProduceResponse: dict.fromkeys(
        ("base_offset", "last_offset", "leader_epoch", "leader_id"), UNKNOWN
    ),
    m.FetchResponse: dict.fromkeys(
        ("leader_id", "leader_epoch", "high_watermark", "log_start_offset"), UNKNOWN
    ),
    m.ListOffsetsResponse: dict.fromkeys(("offset", "leader_epoch", "timestamp"), UNKNOWN),
    m.OffsetsForLeaderEpochResponse: dict.fromkeys(("leader_epoch", "end_offset"), UNKNOWN),
    m.DescribeQuorumResponse: dict.fromkeys(
        ("leader_id", "leader_epoch", "high_watermark"), UNKNOWN
    ),
    m.ForceLeaderResponse: {"leader_epoch": UNKNOWN},
}
