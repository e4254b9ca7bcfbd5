"""Shared helpers for storage tests: a simulated crash and batch summaries."""

from __future__ import annotations

import os

from quorumlog.replica.storage import FdCache, Log, batches_to_table, encode_batch, iter_batches
from quorumlog.replica.storage.tail import TailBudget


def values_for(base: int, count: int) -> list[bytes]:
    """Deterministic record values, so any record's content is known from its offset."""
    return [b"value-%d" % (base + i) for i in range(count)]


def client_batch(base: int, count: int) -> bytes:
    return encode_batch(values_for(base, count), keys=[b"k%d" % i for i in range(count)])


def follower_batch(base: int, count: int, epoch: int) -> bytes:
    return encode_batch(
        values_for(base, count),
        keys=[b"k%d" % i for i in range(count)],
        base_offset=base,
        leader_epoch=epoch,
    )


def summary(buf: bytes) -> list[tuple[int, int, int]]:
    """(base offset, record count, epoch) of every batch in ``buf``."""
    return [(h.base_offset, h.record_count, h.leader_epoch) for h in iter_batches(buf)]


def crash(log: Log, keep_unflushed: int | None = None) -> None:
    """Simulate a power failure: close the files without the clean-shutdown marker and
    keep only ``keep_unflushed`` bytes (default: all) of what was written past the last
    fsync, counting across segments in offset order; later bytes are lost."""
    segments = list(log._segments)
    for seg in segments:
        seg.close()  # no sync: only what was synced before (or is kept below) survives
    log._closed = True
    if keep_unflushed is None:
        return
    budget = keep_unflushed
    for seg in segments:
        unflushed = seg.size - seg.synced_size
        keep = min(unflushed, budget)
        budget -= keep
        os.truncate(seg.path, seg.synced_size + keep)


def read_all_values(log: Log) -> list[bytes]:
    if log.end_offset == log.start_offset:
        return []
    data = read_everything(log)
    table = batches_to_table(data, include_control=True)
    assert table.column("offset").to_pylist() == list(range(log.start_offset, log.end_offset))
    return [v for v in batches_to_table(data).column("value").to_pylist() if v is not None]


def read_everything(log: Log) -> bytes:
    parts: list[bytes] = []
    offset = log.start_offset
    while offset < log.end_offset:
        chunk = log.read(offset, 1 << 20)
        assert chunk
        parts.append(chunk)
        offset = list(iter_batches(chunk))[-1].next_offset
    return b"".join(parts)


def usable_after_recovery(log: Log, end: int, key: bytes | None = None) -> str:
    """A recovered log (ending at ``end``) takes an append and a clean close, and reopens
    ending just past it: "" when so, else what went wrong. Closes ``log``."""
    keys = None if key is None else [key]
    log.append_as_leader(encode_batch([b"after"], keys=keys), max(log.last_epoch(), 0) + 1)
    log.flush()
    log.close()
    reopened = Log(log.directory, log.config, files=FdCache(8), tail=TailBudget(0))
    again = reopened.end_offset
    reopened.close()
    if again != end + 1:
        return f"after an append and a clean close the log ends at {again}, not {end + 1}"
    return ""
