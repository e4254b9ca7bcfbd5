"""Data-directory ids (KIP-853's directory ids, simplified): how a node learns that its
data directory replaced a lost one.

A node cannot tell alone that its empty directory replaced a lost one; its peers can.
Each data directory has a random ``directory.id`` (``meta.properties``). When two nodes
connect, after authenticating as node principals, each states its own directory id and
the one it remembers for the other (``<data-dir>/peer-directories``):

    client -> server  DIRECTORY  "<client's id> <id it remembers for the server or ->"
    server -> client  DIRECTORY  "<server's id> <id it remembers for the client or ->"
    client -> server  DIRECTORY-ACK (no answer)

A side told a remembered id other than its own was replaced: it marks itself (durably)
before it answers or acknowledges, and before any raft frame of that connection is
applied. Each side records the other's new id only after the other's next step, which
the other sends only once its mark is durable: so a crash can never leave a peer having
forgotten the old id while the replaced node has not yet marked itself.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from ..storage.fileutil import atomic_write

log = logging.getLogger(__name__)

PEER_DIRECTORIES_FILE = "peer-directories"
DIRECTORY_MECHANISM = "QUORUMLOG-DIRECTORY"
DIRECTORY_ACK_MECHANISM = "QUORUMLOG-DIRECTORY-ACK"
NONE = "-"


def new_directory_id() -> str:
    return uuid.UUID(bytes=os.urandom(16), version=4).hex


def encode_statement(own: str, remembered: str | None) -> bytes:
    return f"{own} {remembered or NONE}".encode()


def decode_statement(data: bytes) -> tuple[str, str | None]:
    """(the sender's directory id, the id it remembers for the receiver or None)."""
    parts = data.decode("ascii").split()
    if len(parts) != 2 or not all(p == NONE or (len(p) == 32 and p.isalnum()) for p in parts):
        raise ValueError(f"malformed directory statement {data[:80]!r}")
    if parts[0] == NONE:
        raise ValueError("a directory statement without the sender's id")
    return parts[0], None if parts[1] == NONE else parts[1]


class DirectoryIds:
    """This node's directory id and those it remembers of its peers, persisted.

    ``on_replaced(peer, remembered)`` is called (synchronously, it must make the mark
    durable before returning) when a peer remembers another directory id for this node."""

    def __init__(self, data_dir: Path, own: str, on_replaced: Callable[[int, str], None]) -> None:
        self.own = own
        self._path = data_dir / PEER_DIRECTORIES_FILE
        self._on_replaced = on_replaced
        self._lock = threading.Lock()
        self._peers: dict[int, str] = {}
        try:
            text = self._path.read_text()
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            try:
                nid, did = line.split()
                self._peers[int(nid)] = did
            except ValueError:
                log.warning("%s: ignoring malformed line %r", self._path, line)

    def remembered(self, peer: int) -> str | None:
        return self._peers.get(peer)

    def check_own(self, peer: int, remembered_for_me: str | None) -> None:
        """A peer told us the directory id it remembers for this node."""
        if remembered_for_me is not None and remembered_for_me != self.own:
            log.warning(
                "node %d remembers data directory %s for this node, which is directory %s: "
                "this directory replaced a lost one",
                peer,
                remembered_for_me,
                self.own,
            )
            self._on_replaced(peer, remembered_for_me)

    def learn(self, peer: int, directory_id: str) -> None:
        """Record the peer's directory id (it has made any replacement mark durable)."""
        with self._lock:
            if self._peers.get(peer) == directory_id:
                return
            self._peers[peer] = directory_id
            text = "".join(f"{n} {d}\n" for n, d in sorted(self._peers.items()))
            atomic_write(str(self._path), text.encode())
        log.info("node %d has data directory %s", peer, directory_id)
