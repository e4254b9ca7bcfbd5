"""``VotersCache.latest`` and ``LeaderEpochCache.latest_epoch`` are read without their
locks (every raft step, every append reads them): each must follow every change as
``entries`` does, on reopening too, and when the checkpoint could not be written (the
change is in memory then, as before)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quorumlog.replica.constants import UNKNOWN
from quorumlog.replica.storage import LeaderEpochCache
from quorumlog.replica.storage.voters_cache import VotersCache

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["assign", "truncate_from_end", "truncate_from_start", "clear"]),
        st.integers(0, 40),
        st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True),
    ),
    max_size=12,
)


def _expected(cache: VotersCache) -> tuple[int, tuple[int, ...]] | None:
    entries = cache.entries
    return entries[-1] if entries else None


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_latest_follows_every_change_and_a_reopen(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, list[int]]]
) -> None:
    path = str(tmp_path_factory.mktemp("voters") / "voters-checkpoint")
    cache = VotersCache(path)
    assert cache.latest is None
    for op, offset, voters in ops:
        if op == "assign":
            cache.assign(offset, tuple(voters))
        elif op == "clear":
            cache.clear()
        else:
            getattr(cache, op)(offset)
        assert cache.latest == _expected(cache)
    assert VotersCache(path).latest == _expected(cache)


def test_latest_shows_a_change_whose_checkpoint_failed(tmp_path: Path) -> None:
    home = tmp_path / "log"
    home.mkdir()
    cache = VotersCache(str(home / "voters-checkpoint"))
    cache.assign(5, (1, 2, 3))
    shutil.rmtree(home)  # the checkpoint cannot be written any more
    with pytest.raises(OSError):
        cache.assign(9, (1, 2, 4))
    assert cache.latest == (9, (1, 2, 4)) == _expected(cache)


_EPOCH_OPS = st.lists(
    st.tuples(
        st.sampled_from(["assign", "truncate_from_end", "truncate_from_start", "clear"]),
        st.integers(0, 30),
        st.integers(0, 200),
    ),
    max_size=15,
)


@settings(max_examples=60, deadline=None)
@given(ops=_EPOCH_OPS)
def test_latest_epoch_follows_every_change_and_a_reopen(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]]
) -> None:
    """``LeaderEpochCache.latest_epoch`` is read without the lock too (several times an
    append): it is the last entry's epoch after any change, as ``entries`` says."""
    path = str(tmp_path_factory.mktemp("epochs") / "leader-epoch-checkpoint")
    cache = LeaderEpochCache(path)

    def expected(c: LeaderEpochCache) -> int:
        entries = c.entries
        return entries[-1].epoch if entries else UNKNOWN

    assert cache.latest_epoch == UNKNOWN
    for op, epoch, offset in ops:
        if op == "assign":
            cache.assign(epoch, offset)
        elif op == "clear":
            cache.clear()
        else:
            getattr(cache, op)(offset)
        assert cache.latest_epoch == expected(cache)
    assert LeaderEpochCache(path).latest_epoch == expected(cache)
