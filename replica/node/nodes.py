"""The cluster's nodes as this node knows them: those it was started with (``--voters``,
``--kafka-voters``, or what ``serve --join`` learned) and those registered in the
metadata log since (``register_node`` records), with where each listens, its rack and
whether it is retired (decommissioned: no new replicas). One book per node, updated as the metadata
log is applied; Metadata answers, topic placement, forwarding and raft links read it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..client.balance import rack_problems
from ..storage.fileutil import atomic_write
from .metadata import MetadataState

log = logging.getLogger(__name__)

Address = tuple[str, int]
#: Where ``serve --join`` keeps what it learned, for restarts while no node answers.
JOINED_FILE = "joined.json"


class NodeBook:
    def __init__(
        self,
        node_id: int,
        native: Mapping[int, Address],
        kafka: Mapping[int, Address],
        rack: str | None = None,
    ) -> None:
        """``rack``: this node's own (``serve --rack``), as its addresses: those it
        started with, whatever an earlier registration in the log says."""
        self.node_id = node_id
        self.native: dict[int, Address] = dict(native)
        #: Updated in place: the Kafka handlers hold this dict.
        self.kafka: dict[int, Address] = dict(kafka)
        self.retired: set[int] = set()
        #: Each registered node's rack (``serve --rack``); a node not in it has none.
        self.racks: dict[int, str] = {} if rack is None else {node_id: rack}
        #: Called with a node's id when it is new to the book or moved to another address.
        self.on_moved: Callable[[int], None] | None = None

    def ids(self) -> list[int]:
        """Every node known, retired ones included."""
        return sorted(self.native)

    def placeable(self) -> list[int]:
        """The nodes new replicas may go to."""
        return [n for n in sorted(self.native) if n not in self.retired]

    def placeable_racks(self) -> dict[int, str]:
        """The racks of the placeable nodes that have one (placement's input)."""
        return {n: self.racks[n] for n in self.placeable() if n in self.racks}

    def rack_warning(self, state: MetadataState, topic: str) -> str:
        """What ``topic``'s committed placement could not honour of the racks
        (``balance.rack_problems``), "" if nothing: a create's or growth's answer."""
        t = state.topics.get(topic)
        if t is None:
            return ""
        racks = self.placeable_racks()
        problems = rack_problems({topic: t.replicas}, self.placeable(), racks)
        unknown = [n for n in self.placeable() if n not in state.nodes]
        if racks and unknown:
            problems.append(
                f"nodes {unknown} have not registered yet: their racks are not known, each "
                "was placed as a rack of its own (`quorumlog cluster rebalance` moves "
                "replicas apart once they have)"
            )
        return "; ".join(problems)

    def address(self, node_id: int) -> Address | None:
        return self.native.get(node_id)

    def update(self, state: MetadataState) -> None:
        """Take in the registrations and retirements applied from the metadata log. This
        node's own addresses and rack stay those it started with: a registration of its own in the
        log may be of an earlier start (its next one says where it is now)."""
        for reg in state.nodes.values():
            if reg.node_id == self.node_id:
                continue
            if reg.rack is None:
                self.racks.pop(reg.node_id, None)
            else:
                self.racks[reg.node_id] = reg.rack
            moved = self.native.get(reg.node_id) != reg.address
            self.native[reg.node_id] = reg.address
            if reg.kafka is not None:
                self.kafka[reg.node_id] = reg.kafka
            if moved:
                log.info("node %d is at %s:%d", reg.node_id, *reg.address)
                if self.on_moved is not None:
                    self.on_moved(reg.node_id)
        if state.retired != self.retired:
            self.retired = set(state.retired)


def save_joined(data_dir: Path, doc: Mapping[str, Any]) -> None:
    """What a joining node learned (cluster id, the metadata quorum's first voters, every
    node's addresses): a restart uses it when no node it knows answers."""
    atomic_write(str(data_dir / JOINED_FILE), json.dumps(doc, sort_keys=True).encode())


def load_joined(data_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((data_dir / JOINED_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"quorumlog: cannot read {data_dir / JOINED_FILE}: {exc}") from None
    return doc if isinstance(doc, dict) else None
