"""A node's configuration as tests build it, to check what NodeConfig accepts: one node
voting for itself, on ports nothing opens; every other field NodeConfig's default unless
a test names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quorumlog.replica.node.config import NodeConfig


def node_config(data_dir: Path, **fields: Any) -> NodeConfig:
    """Node 1 of a one-voter cluster "c", its data in ``data_dir``, with ``fields`` set."""
    return NodeConfig(
        node_id=1,
        host="127.0.0.1",
        port=1,
        voters={1: ("127.0.0.1", 1)},
        data_dir=data_dir,
        cluster_id="c",
        **fields,
    )
