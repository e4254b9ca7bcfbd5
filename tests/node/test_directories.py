"""Data-directory ids: what a node remembers of its peers, and when it learns that its
own directory replaced a lost one (no processes: the exchange itself is covered by
tests/node/test_replaced_disk.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from quorumlog.replica.node.directories import (
    PEER_DIRECTORIES_FILE,
    DirectoryIds,
    decode_statement,
    encode_statement,
    new_directory_id,
)


def test_peers_are_remembered_across_restarts_and_a_different_id_means_replaced(
    tmp_path: Path,
) -> None:
    own, old = new_directory_id(), new_directory_id()
    replaced: list[tuple[int, str]] = []
    dirs = DirectoryIds(tmp_path, own, lambda peer, r: replaced.append((peer, r)))
    assert dirs.remembered(2) is None
    dirs.check_own(2, None)  # a peer that never knew us: nothing
    dirs.check_own(2, own)
    assert replaced == []
    dirs.check_own(3, old)
    assert replaced == [(3, old)]
    p2 = new_directory_id()
    dirs.learn(2, p2)
    assert (tmp_path / PEER_DIRECTORIES_FILE).read_text() == f"2 {p2}\n"
    again = DirectoryIds(tmp_path, own, lambda peer, r: None)
    assert again.remembered(2) == p2 and again.remembered(3) is None


def test_statements_round_trip_and_garbage_is_refused() -> None:
    a, b = new_directory_id(), new_directory_id()
    assert decode_statement(encode_statement(a, b)) == (a, b)
    assert decode_statement(encode_statement(a, None)) == (a, None)
    for bad in (b"", b"- -", b"x y", a.encode(), f"{a} {b} {a}".encode(), b"\xff\xfe"):
        with pytest.raises(ValueError):
            decode_statement(bad)
