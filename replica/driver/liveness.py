"""What a node knows of its peers' processes: one heartbeat per pair of nodes stands for
the fetches of every quiesced partition between them (see ``RaftReplica``'s
quiescence), so an idle partition costs no frames and no timers of its own."""

from __future__ import annotations

from dataclasses import dataclass, field

# The key node-level messages travel under in ``Ready.send`` (no partition's).
NODE_KEY: tuple[str, int] = ("", -1)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeHeartbeat:
    """One-way, every ``heartbeat_ms`` from each node to each peer. ``incarnation`` is
    drawn at the sender's start: a new one tells the peer the process restarted (what
    its old heartbeats vouched for is gone, however short the gap)."""

    cluster_id: str
    src: int
    dst: int
    incarnation: int


@dataclass(slots=True)
class PeerLiveness:
    """When each peer was last heard from (any frame, monotonic ms; from when a first
    partition shared with it opened), its incarnation and when that was first heard,
    which peers are stale (silent for ``stale_after_ms`` at two ticks in a row), and
    which refused a connection since last heard. ``seen`` is the mapping the cores read
    (``RaftReplica.peer_seen``).

    The first tick that finds a peer silent only suspects it: a node whose loop was busy
    (thousands of partitions) may hold that peer's frames unread in its socket, and its
    tick may come before its reads do. The next tick comes after the node has read some
    of what waits (at least a frame from each connection): a peer still unheard then is
    silent, not this node behind."""

    stale_after_ms: int
    seen: dict[int, int] = field(default_factory=dict)
    incarnations: dict[int, int] = field(default_factory=dict)
    since: dict[int, int] = field(default_factory=dict)  # its incarnation first heard
    stale: set[int] = field(default_factory=set)
    suspect: set[int] = field(default_factory=set)
    refused: set[int] = field(default_factory=set)

    def heard(self, peer: int, now: int) -> bool:
        """Record a frame from ``peer``; True if it was stale (it is back)."""
        self.seen[peer] = now
        self.suspect.discard(peer)
        self.refused.discard(peer)
        if peer in self.stale:
            self.stale.discard(peer)
            return True
        return False

    def restarted(self, peer: int, incarnation: int, now: int) -> bool:
        """Record ``peer``'s incarnation; True if it differs from a known one."""
        old = self.incarnations.get(peer)
        if old != incarnation:
            self.incarnations[peer] = incarnation
            self.since[peer] = now
        return old is not None and old != incarnation

    def settled(self, peer: int, now: int) -> bool:
        """``peer``'s process runs and has for ``stale_after_ms`` at least: its current
        incarnation was first heard that long ago, and it is neither silent (stale or
        suspect) nor refusing connections. A process younger than that may not follow its
        partitions' leaders yet (a replica that led when its node stopped learns the new
        leader only at its election timeout), so it may never take a hint about them."""
        since = self.since.get(peer)
        return (
            since is not None
            and now - since >= self.stale_after_ms
            and peer not in self.stale
            and peer not in self.suspect
            and peer not in self.refused
        )

    def newly_stale(self, peers: set[int], now: int) -> list[int]:
        """Peers not stale yet that were silent for ``stale_after_ms`` at the last tick
        and still are (now they are stale); those silent for the first time become
        suspects. Called once per tick."""
        found = []
        for peer in sorted(peers - self.stale):
            if now - self.seen.get(peer, now) < self.stale_after_ms:
                continue
            if peer in self.suspect:
                self.suspect.discard(peer)
                self.stale.add(peer)
                found.append(peer)
            else:
                self.suspect.add(peer)
        return found

    def next_stale_ms(self, peers: set[int]) -> int | None:
        times = [self.seen[p] for p in peers - self.stale if p in self.seen]
        return min(times) + self.stale_after_ms if times else None
