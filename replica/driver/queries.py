"""Answers a partition gives from its log and state without waiting: ListOffsets,
OffsetsForLeaderEpoch, DescribeQuorum (fenced by ``check_leader_epoch`` like a fetch)."""

from __future__ import annotations

from ..constants import UNKNOWN, or_unknown
from ..protocol import ErrorCode
from ..protocol import messages as m
from ..raft import CorruptDataError
from ..raft.state import ReplicaProgress
from .errors import error_response
from .partition import PartitionDriver
from .ready import Ready


def list_offsets(
    p: PartitionDriver, token: int, req: m.ListOffsetsRequest, now: int, ready: Ready
) -> None:
    core, lg = p.core, p.log

    def answer(code: ErrorCode, text: str, offset: int = UNKNOWN, ts: int = UNKNOWN) -> None:
        epoch = lg.epoch_at(offset - 1) if offset > lg.start_offset else UNKNOWN
        resp = m.ListOffsetsResponse(
            error=int(code), error_message=text, offset=offset, leader_epoch=epoch, timestamp=ts
        )
        ready.answers.append((token, resp))

    code = core.check_leader_epoch(req.current_leader_epoch)
    unknown = p.hwm_unknown()
    if code != ErrorCode.NONE:
        answer(code, f"leader epoch {req.current_leader_epoch} vs {core.epoch}")
    elif req.timestamp == m.EARLIEST_TIMESTAMP:
        answer(ErrorCode.NONE, "", lg.start_offset)
    elif unknown is not None:
        answer(ErrorCode.OFFSET_NOT_AVAILABLE, unknown)
    elif req.timestamp == m.LATEST_TIMESTAMP and req.isolation_level == m.READ_COMMITTED:
        try:
            answer(ErrorCode.NONE, "", p.last_stable_offset())
        except CorruptDataError as exc:
            p.on_corruption(exc.offset, now, ready)
            answer(ErrorCode.NOT_LEADER, f"damaged data at offset {exc.offset}")
    elif req.timestamp == m.LATEST_TIMESTAMP:
        answer(ErrorCode.NONE, "", core.high_watermark)
    else:
        try:
            offset, ts = lg.offset_for_timestamp(req.timestamp, core.high_watermark)
        except CorruptDataError as exc:
            p.on_corruption(exc.offset, now, ready)
            answer(ErrorCode.NOT_LEADER, f"damaged data at offset {exc.offset}")
            return
        answer(ErrorCode.NONE, "", offset, ts)


def offsets_for_leader_epoch(
    p: PartitionDriver, token: int, req: m.OffsetsForLeaderEpochRequest, ready: Ready
) -> None:
    code = p.core.check_leader_epoch(req.current_leader_epoch)
    if code != ErrorCode.NONE:
        text = f"leader epoch {req.current_leader_epoch} vs {p.core.epoch}"
        resp = error_response(type(req), code, text)
    else:
        found = p.log.end_offset_for(req.leader_epoch)
        resp = m.OffsetsForLeaderEpochResponse(
            error=0, error_message="", leader_epoch=found.epoch, end_offset=found.end_offset
        )
    ready.answers.append((token, resp))


def describe(p: PartitionDriver, token: int, now: int, ready: Ready) -> None:
    core = p.core
    if not core.is_leader:
        resp = error_response(m.DescribeQuorumRequest, ErrorCode.NOT_LEADER, "not the leader")
    else:
        d = core.describe(now)

        def row(p: ReplicaProgress) -> m.ReplicaStateInfo:
            return m.ReplicaStateInfo(
                replica_id=p.replica_id,
                end_offset=p.end_offset,
                last_fetch_ms=now - p.last_fetch_ms if p.last_fetch_ms >= 0 else UNKNOWN,
                lag=p.lag,
            )

        resp = m.DescribeQuorumResponse(
            error=0,
            error_message="",
            leader_id=or_unknown(d.leader_id),
            leader_epoch=d.leader_epoch,
            high_watermark=d.high_watermark,
            voters=[row(p) for p in d.voters],
            observers=[row(p) for p in d.observers],
            copying=or_unknown(p.copier if p.copier not in core.voters else None),
            catch_up_bytes_per_s=p.throttle.bytes_per_s if p.throttle is not None else 0,
        )
    ready.answers.append((token, resp))
