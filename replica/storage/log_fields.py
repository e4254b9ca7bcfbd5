"""The state of a ``Log`` that its roles read and write (set in its ``__init__`` and by
recovery), declared once so that every role module type-checks against it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .epoch_cache import LeaderEpochCache
from .fdcache import FdCache
from .producers import ProducerStateTable
from .segment import Segment
from .tail import Tail
from .transactions import TransactionIndex
from .voters_cache import VotersCache

if TYPE_CHECKING:
    from .log import LogConfig


class LogFields:
    directory: str
    config: LogConfig
    device: int
    existed: bool
    flush_order: int
    scrub_passes: int
    scrubbed_bytes: int
    _close_deleted: Callable[[int], None] | None
    _files: FdCache
    _tail: Tail
    _repair: bool
    _lock: threading.Lock
    _flush_lock: threading.Lock
    _segments: list[Segment]
    _bases: list[int]
    _dir_dirty: bool
    _closed: bool
    _rebuild_cache: bool
    _rebuild_voters: bool
    _producers: ProducerStateTable | None
    _txns: TransactionIndex | None
    _unmade: bool
    _parent_dirty: bool
    _recovery_point_path: str
    _catch_up_path: str
    _log_start_path: str
    _recovery_point: int
    _catch_up_offset: int
    _log_start: int
    _cleaner_offset_path: str
    _cleaned_end: int
    _truncations: int  # truncations so far: a clean prepared before one is dropped
    _scrub_at: tuple[int, int, int]
    _cache: LeaderEpochCache
    _voters: VotersCache
    _end_offset: int
    _durable_end_offset: int
