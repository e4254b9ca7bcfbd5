"""LocalCluster whose nodes reach each other through a ProxyNet (real partitions)."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.storage import HEADER_SIZE, iter_batches

from .proxy import Mode, Pair, ProxyNet


class ProxiedCluster(LocalCluster):
    """Raft traffic from node i to node j goes through the proxy of (i, j); clients
    (producer, Spark) still reach the nodes directly at their --voters addresses."""

    def __init__(self, nodes: int = 3, *args: Any, **kwargs: Any) -> None:
        super().__init__(nodes, *args, **kwargs)
        self.net = ProxyNet(dict(self.ports), self.host)
        self._net_started = False

    def command(self, node: int) -> list[str]:
        peers = ",".join(
            f"{j}@{self.host}:{self.net.port(node, j)}" for j in self.ports if j != node
        )
        return [*super().command(node), "--peer-address", peers]

    def start(self) -> ProxiedCluster:
        if not self._net_started:
            self.net.start()
            self._net_started = True
        try:
            super().start()
        except BaseException:
            self.net.stop()
            self._net_started = False
            raise
        return self

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._net_started:
                self.net.stop()
                self._net_started = False

    # ---- partitions -----------------------------------------------------------------
    def isolate(self, node: int, mode: Mode = Mode.BLACKHOLE) -> list[Pair]:
        """Cut ``node`` off from every peer, both ways."""
        pairs = [(node, j) for j in self.ports if j != node]
        pairs += [(j, node) for j in self.ports if j != node]
        self.net.set_mode(pairs, mode)
        return pairs

    def cut(self, pairs: Iterable[Pair], mode: Mode = Mode.BLACKHOLE) -> list[Pair]:
        chosen = list(pairs)
        self.net.set_mode(chosen, mode)
        return chosen

    def heal(self) -> None:
        self.net.heal()


def damage_sealed_batch(cluster: ProxiedCluster, node: int, topic: str, rng: random.Random) -> str:
    """Flip one payload byte of a random batch in a random sealed segment of one of the
    (stopped) node's partition replicas; says what it did."""
    dirs = sorted(cluster.node_dir(node).glob(f"{topic}-*"))
    rng.shuffle(dirs)
    for d in dirs:
        sealed = sorted(p for p in d.iterdir() if p.suffix == ".log")[:-1]
        if not sealed:
            continue
        seg = rng.choice(sealed)
        batches = list(iter_batches(seg.read_bytes()))
        if not batches:
            continue
        batch = rng.choice(batches)
        at = batch.position + HEADER_SIZE + rng.randrange(batch.payload_length)
        with open(seg, "r+b") as fh:
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ 0xFF]))
        return f"damaged the batch at offset {batch.base_offset} in {d.name}/{seg.name}"
    return "no sealed segment to damage yet"
