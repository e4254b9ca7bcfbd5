"""Kafka's classic consumer-group membership protocol as a pure state machine (sans-I/O).

One ``GroupCoordinator`` holds every group a node coordinates. It is stepped with
requests and ``tick(now)``; it reads no clock and owns no timer or socket. A JoinGroup or
SyncGroup that must wait is *parked* under the caller's token and answered later (by
another request or a tick), through ``take_answers()``; every parked request is answered
by a deadline, so the caller never waits unboundedly. The asyncio shell, the offsets
and the ``__consumer_offsets`` topic live in ``replica/kafka_listener/groups.py``.

States and transitions follow Kafka's ``GroupMetadata`` / ``GroupCoordinator``:

* EMPTY: no members. A JoinGroup starts a rebalance, which waits
  ``initial_rebalance_delay_ms`` (group.initial.rebalance.delay.ms) for more members,
  and as long again after each new one, within the rebalance timeout (Kafka's
  InitialDelayedJoin): members that start together share the first generation instead
  of the first taking every partition and a second rebalance following.
* PREPARING_REBALANCE: waiting for every known member to (re)join; members that have not
  by the rebalance timeout (the largest of the members') are removed. Then the
  generation increments, a protocol all members support is chosen (each member votes for
  its first choice among those), the leader (the previous one if it rejoined, else the
  first member to join) gets every member's metadata, the others none.
* COMPLETING_REBALANCE: waiting for the leader's SyncGroup with the assignments; the
  members' SyncGroups are parked until it comes. Members that have not synced within the
  rebalance timeout are removed and a new rebalance starts.
* STABLE: heartbeats answer NONE; a JoinGroup, a LeaveGroup or an expired session
  starts a rebalance.

JoinGroup v4+ with an empty member id is answered MEMBER_ID_REQUIRED with an id the
member must join with (KIP-394); such pending ids expire after the session timeout.
Static membership (``group.instance.id``, KIP-345): a member that names an instance id
joins without MEMBER_ID_REQUIRED, and keeps its place across restarts. When a new
process of a known instance joins (an empty member id), it takes the old member's place
under a new member id: in a Stable group with the same protocols it is answered at once
with the current generation and gets the old member's assignment, so the others see no
rebalance; the old member id is fenced (FENCED_INSTANCE_ID) from then on. A static member
sends no LeaveGroup when it stops (its session timeout removes it if it does not come
back in time), and LeaveGroup may name it by instance id. A group that becomes empty is
forgotten (its committed offsets
are kept elsewhere), so its next generation starts at 1 again; member ids are random, so
an old member cannot pass for a new one.

Bounds: ``max_size`` members (pending ones included) per group, ``max_groups`` groups;
session timeouts within [min, max]; rebalance timeouts capped at
``max_rebalance_timeout_ms``.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .. import defaults
from .errors import KafkaError
from .wire import KafkaDecodeError, Reader

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "Answer",
    "Group",
    "GroupConfig",
    "GroupCoordinator",
    "GroupState",
    "Member",
    "JoinResult",
    "SyncResult",
    "subscribed_topics",
]

#: The protocol type of Kafka's consumers (ConsumerProtocol.PROTOCOL_TYPE).
CONSUMER_PROTOCOL_TYPE = "consumer"


@dataclass(frozen=True)
class GroupConfig:
    """The coordinator's settings (Kafka's names in brackets; see ``replica.defaults``)."""

    min_session_timeout_ms: int = (
        defaults.GROUP_MIN_SESSION_TIMEOUT_MS
    )  # [group.min.session.timeout.ms]
    max_session_timeout_ms: int = (
        defaults.GROUP_MAX_SESSION_TIMEOUT_MS
    )  # [group.max.session.timeout.ms]
    max_size: int = defaults.GROUP_MAX_SIZE  # [group.max.size]
    max_groups: int = defaults.GROUP_MAX_COUNT
    max_rebalance_timeout_ms: int = defaults.GROUP_MAX_REBALANCE_TIMEOUT_MS
    # Used by the node's offsets side (kafka_listener.groups.py).
    offset_metadata_max_bytes: int = (
        defaults.OFFSET_METADATA_MAX_BYTES
    )  # [offset.metadata.max.bytes]
    offsets_commit_timeout_ms: int = (
        defaults.OFFSETS_COMMIT_TIMEOUT_MS
    )  # [offsets.commit.timeout.ms]
    # [group.initial.rebalance.delay.ms]
    initial_rebalance_delay_ms: int = defaults.GROUP_INITIAL_REBALANCE_DELAY_MS


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True)
class JoinResult:
    error: KafkaError
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    # (member id, metadata of the chosen protocol); the leader's answer only.
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class SyncResult:
    error: KafkaError
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


Answer = tuple[int, JoinResult | SyncResult]


@dataclass
class Member:
    member_id: str
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's preference
    session_timeout_ms: int
    rebalance_timeout_ms: int
    session_deadline: int  # removed at this time unless a request of it is parked
    join_token: int | None = None  # its parked JoinGroup
    sync_token: int | None = None  # its parked SyncGroup
    assignment: bytes = b""
    client_id: str = ""  # of its latest JoinGroup, for DescribeGroups
    client_host: str = ""
    group_instance_id: str | None = None  # a static member's (KIP-345)

    def supports(self, name: str) -> bool:
        return any(n == name for n, _ in self.protocols)

    def metadata(self, name: str) -> bytes:
        return next(md for n, md in self.protocols if n == name)

    def subscribed_topics(self) -> set[str]:
        """The topics its consumer-protocol metadata names, under any of its protocols."""
        topics: set[str] = set()
        for _, metadata in self.protocols:
            topics |= subscribed_topics(metadata)
        return topics


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in joining order
    pending: dict[str, int] = field(default_factory=dict)  # id handed out -> expiry
    # PREPARING_REBALANCE: when the join phase ends; COMPLETING_REBALANCE/STABLE: when
    # members still in ``awaiting_sync`` are removed.
    phase_deadline: int = 0
    # PREPARING_REBALANCE out of EMPTY: the join phase ends no sooner than this
    # (group.initial.rebalance.delay.ms after the last new member, within the deadline).
    join_not_before: int = 0
    awaiting_sync: set[str] = field(default_factory=set)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def member_protocol_type(self) -> str:
        """The protocol type its members joined with ("" if it has none yet)."""
        if self.protocol_type is not None:
            return self.protocol_type
        return next((m.protocol_type for m in self.members.values()), "")


def subscribed_topics(metadata: bytes) -> set[str]:
    """The topics of a consumer-protocol subscription (ConsumerProtocolSubscription: INT16
    version, then an array of topic names, the same in every version); none if
    ``metadata`` is not one."""
    try:
        r = Reader(metadata)
        r.int16()
        count = r.int32()
        if count < 0 or count > len(metadata):
            return set()
        return {r.string() for _ in range(count)}
    except KafkaDecodeError:
        return set()


def _forget_static(group: Group, member: Member) -> None:
    """A removed member's instance id no longer names it."""
    iid = member.group_instance_id
    if iid is not None and group.static_members.get(iid) == member.member_id:
        del group.static_members[iid]


def _new_member_id(prefix: str) -> str:
    return f"{prefix or 'member'}-{uuid.uuid4()}"


class GroupCoordinator:
    """Every group this node coordinates; see the module docstring."""

    def __init__(
        self,
        config: GroupConfig | None = None,
        new_member_id: Callable[[str], str] = _new_member_id,
    ) -> None:
        self.config = config or GroupConfig()
        self.new_member_id = new_member_id
        self.groups: dict[str, Group] = {}
        self._answers: list[Answer] = []

    def take_answers(self) -> list[Answer]:
        """Answers to parked (or just made) JoinGroup/SyncGroup requests, by token."""
        out, self._answers = self._answers, []
        return out

    # ------------------------------------------------------------------ JoinGroup
    def join(
        self,
        token: int,
        group_id: str,
        member_id: str,
        protocol_type: str,
        protocols: Iterable[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now: int,
        *,
        require_known_member_id: bool = True,
        client_id: str = "",
        client_host: str = "",
        group_instance_id: str | None = None,
    ) -> None:
        """``require_known_member_id``: JoinGroup v4+ (KIP-394). ``client_id`` and
        ``client_host``: who sent it, as DescribeGroups shows a member.
        ``group_instance_id``: a static member's (KIP-345, JoinGroup v5+)."""
        cfg = self.config
        protos = tuple(protocols)

        def fail(code: KafkaError, mid: str = member_id) -> None:
            self._answers.append((token, JoinResult(code, member_id=mid)))

        if not group_id:
            return fail(KafkaError.INVALID_GROUP_ID)
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return fail(KafkaError.INVALID_SESSION_TIMEOUT)
        if not protocol_type or not protos:
            return fail(KafkaError.INCONSISTENT_GROUP_PROTOCOL)
        if rebalance_timeout_ms < 0:  # JoinGroup v0 has none: the session timeout serves
            rebalance_timeout_ms = session_timeout_ms
        rebalance_timeout_ms = min(rebalance_timeout_ms, cfg.max_rebalance_timeout_ms)
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return fail(KafkaError.UNKNOWN_MEMBER_ID)
            if len(self.groups) >= cfg.max_groups:
                return fail(KafkaError.GROUP_MAX_SIZE_REACHED)
            group = self.groups[group_id] = Group(group_id)
        known = group.static_members.get(group_instance_id) if group_instance_id else None
        if known is not None and member_id and member_id != known:
            return fail(KafkaError.FENCED_INSTANCE_ID)
        if not self._compatible(group, known or member_id, protocol_type, protos):
            self._forget_if_empty(group)
            return fail(KafkaError.INCONSISTENT_GROUP_PROTOCOL)
        if known is not None and not member_id:
            member_id = self._replace_static(group, known, protocol_type)
            back = group.members[member_id]
            if group.state is GroupState.STABLE and back.protocols == protos:
                # The instance is back as it was: its place, generation and assignment
                # stand, and no one else notices.
                back.session_timeout_ms = session_timeout_ms
                back.rebalance_timeout_ms = rebalance_timeout_ms
                back.client_id, back.client_host = client_id, client_host
                back.session_deadline = now + session_timeout_ms
                assert group.protocol_name is not None
                everyone = tuple(
                    (m.member_id, m.metadata(group.protocol_name)) for m in group.members.values()
                )
                result = JoinResult(
                    KafkaError.NONE,
                    member_id=member_id,
                    generation_id=group.generation_id,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    leader=group.leader or "",
                    members=everyone if member_id == group.leader else (),
                )
                self._answers.append((token, result))
                return
        first_static = not member_id and group_instance_id is not None and known is None
        if first_static:
            # A static member's first join: no MEMBER_ID_REQUIRED round (Kafka's as well).
            if len(group.members) + len(group.pending) >= cfg.max_size:
                self._forget_if_empty(group)
                return fail(KafkaError.GROUP_MAX_SIZE_REACHED)
            member_id = self.new_member_id(protocol_type)
            assert group_instance_id is not None
            group.static_members[group_instance_id] = member_id
        elif not member_id:
            if len(group.members) + len(group.pending) >= cfg.max_size:
                self._forget_if_empty(group)
                return fail(KafkaError.GROUP_MAX_SIZE_REACHED)
            member_id = self.new_member_id(protocol_type)
            if require_known_member_id:
                group.pending[member_id] = now + session_timeout_ms
                return fail(KafkaError.MEMBER_ID_REQUIRED, member_id)
        elif member_id in group.pending:
            del group.pending[member_id]
        elif member_id not in group.members:
            return fail(KafkaError.UNKNOWN_MEMBER_ID)
        member = group.members.get(member_id)
        is_new = member is None
        if member is None:
            member = group.members[member_id] = Member(
                member_id, protocol_type, protos, session_timeout_ms, rebalance_timeout_ms, 0
            )
            member.group_instance_id = group_instance_id
        else:
            member.protocols = protos
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
        member.client_id, member.client_host = client_id, client_host
        if member.join_token is not None:  # a retried join: the earlier one is answered
            self._answers.append(
                (member.join_token, JoinResult(KafkaError.REBALANCE_IN_PROGRESS, member_id))
            )
        member.join_token = token
        member.session_deadline = now + session_timeout_ms
        if group.state is GroupState.EMPTY:
            self._prepare_rebalance(group, now)
            group.join_not_before = min(now + cfg.initial_rebalance_delay_ms, group.phase_deadline)
        elif group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, now)
        elif now < group.join_not_before and is_new:
            # Another member while the first rebalance waits: wait for more again.
            group.join_not_before = min(now + cfg.initial_rebalance_delay_ms, group.phase_deadline)
        self._maybe_complete_join(group, now)

    def _replace_static(self, group: Group, old_id: str, protocol_type: str) -> str:
        """A known instance joins again: its member takes a new id, in the same place (its
        assignment, leadership and whether it owes a SyncGroup kept); requests parked under
        the old id are answered FENCED_INSTANCE_ID. Returns the new id."""
        new_id = self.new_member_id(protocol_type)
        old = group.members[old_id]
        for token in (old.join_token, old.sync_token):
            if token is not None:
                fenced: JoinResult | SyncResult = (
                    JoinResult(KafkaError.FENCED_INSTANCE_ID, old_id)
                    if token == old.join_token
                    else SyncResult(KafkaError.FENCED_INSTANCE_ID)
                )
                self._answers.append((token, fenced))
        old.join_token = old.sync_token = None
        old.member_id = new_id
        group.members = {(new_id if mid == old_id else mid): m for mid, m in group.members.items()}
        if group.leader == old_id:
            group.leader = new_id
        if old_id in group.awaiting_sync:
            group.awaiting_sync.discard(old_id)
            group.awaiting_sync.add(new_id)
        assert old.group_instance_id is not None
        group.static_members[old.group_instance_id] = new_id
        return new_id

    def fenced(self, group_id: str, member_id: str, group_instance_id: str | None) -> bool:
        """Whether a request naming ``group_instance_id`` comes from a member id that
        instance no longer has (a restarted static member's predecessor)."""
        if not group_instance_id:
            return False
        group = self.groups.get(group_id)
        known = group.static_members.get(group_instance_id) if group is not None else None
        return known is not None and known != member_id

    def member_of(self, group_id: str, group_instance_id: str) -> str | None:
        """The member id a static instance has now (None: not in the group)."""
        group = self.groups.get(group_id)
        return group.static_members.get(group_instance_id) if group is not None else None

    def _compatible(
        self,
        group: Group,
        member_id: str,
        protocol_type: str,
        protos: tuple[tuple[str, bytes], ...],
    ) -> bool:
        others = [m for mid, m in group.members.items() if mid != member_id]
        if not others:
            return True
        if protocol_type != others[0].protocol_type:
            return False
        return any(all(o.supports(name) for o in others) for name, _ in protos)

    def _prepare_rebalance(self, group: Group, now: int) -> None:
        # Syncs parked for the generation that ends are answered: rejoin.
        for m in group.members.values():
            if m.sync_token is not None:
                self._answers.append((m.sync_token, SyncResult(KafkaError.REBALANCE_IN_PROGRESS)))
                m.sync_token = None
        group.awaiting_sync.clear()
        group.state = GroupState.PREPARING_REBALANCE
        group.phase_deadline = now + group.rebalance_timeout_ms()
        group.join_not_before = 0

    def _maybe_complete_join(self, group: Group, now: int) -> None:
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and now >= group.join_not_before
            and all(m.join_token is not None for m in group.members.values())
        ):
            self._complete_join(group, now)

    def _complete_join(self, group: Group, now: int) -> None:
        group.generation_id += 1
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_type = group.protocol_name = group.leader = None
            self._forget_if_empty(group)
            return
        members = list(group.members.values())
        group.protocol_type = members[0].protocol_type
        if group.leader not in group.members:
            group.leader = members[0].member_id
        group.protocol_name = self._select_protocol(group)
        group.state = GroupState.COMPLETING_REBALANCE
        group.awaiting_sync = set(group.members)
        group.phase_deadline = now + group.rebalance_timeout_ms()
        everyone = tuple((m.member_id, m.metadata(group.protocol_name)) for m in members)
        for m in members:
            assert m.join_token is not None
            result = JoinResult(
                KafkaError.NONE,
                member_id=m.member_id,
                generation_id=group.generation_id,
                protocol_type=group.protocol_type,
                protocol_name=group.protocol_name,
                leader=group.leader,
                members=everyone if m.member_id == group.leader else (),
            )
            self._answers.append((m.join_token, result))
            m.join_token = None
            m.session_deadline = now + m.session_timeout_ms

    @staticmethod
    def _select_protocol(group: Group) -> str:
        """Each member votes for its most preferred protocol that every member supports;
        the most votes win, ties going to the leader's preference."""
        members = list(group.members.values())
        leader = group.members[group.leader or members[0].member_id]
        candidates = [n for n, _ in leader.protocols if all(m.supports(n) for m in members)]
        votes = dict.fromkeys(candidates, 0)
        for m in members:
            choice = next(n for n, _ in m.protocols if n in votes)
            votes[choice] += 1
        return max(candidates, key=lambda n: votes[n])  # max keeps the first of equals

    # ------------------------------------------------------------------ SyncGroup
    def sync(
        self,
        token: int,
        group_id: str,
        generation_id: int,
        member_id: str,
        assignments: Iterable[tuple[str, bytes]],
        now: int,
        *,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        group_instance_id: str | None = None,
    ) -> None:
        def answer(code: KafkaError) -> None:
            self._answers.append((token, SyncResult(code)))

        if self.fenced(group_id, member_id, group_instance_id):
            return answer(KafkaError.FENCED_INSTANCE_ID)
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return answer(KafkaError.UNKNOWN_MEMBER_ID)
        if generation_id != group.generation_id:
            return answer(KafkaError.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return answer(KafkaError.INCONSISTENT_GROUP_PROTOCOL)
        if group.state is GroupState.PREPARING_REBALANCE:
            return answer(KafkaError.REBALANCE_IN_PROGRESS)
        member.session_deadline = now + member.session_timeout_ms
        group.awaiting_sync.discard(member_id)
        if group.state is GroupState.STABLE:
            self._answers.append((token, self._synced(group, member)))
            return
        # COMPLETING_REBALANCE
        if member.sync_token is not None:
            self._answers.append((member.sync_token, SyncResult(KafkaError.REBALANCE_IN_PROGRESS)))
        member.sync_token = token
        if member_id == group.leader:
            given = dict(assignments)
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.state = GroupState.STABLE
            for m in group.members.values():
                if m.sync_token is not None:
                    self._answers.append((m.sync_token, self._synced(group, m)))
                    m.sync_token = None

    @staticmethod
    def _synced(group: Group, member: Member) -> SyncResult:
        return SyncResult(
            KafkaError.NONE, group.protocol_type, group.protocol_name, member.assignment
        )

    # ------------------------------------------------------------------ Heartbeat, LeaveGroup
    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        now: int,
        group_instance_id: str | None = None,
    ) -> KafkaError:
        if self.fenced(group_id, member_id, group_instance_id):
            return KafkaError.FENCED_INSTANCE_ID
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if group.state is GroupState.PREPARING_REBALANCE:
            member.session_deadline = now + member.session_timeout_ms
            return KafkaError.REBALANCE_IN_PROGRESS
        if generation_id != group.generation_id:
            return KafkaError.ILLEGAL_GENERATION
        member.session_deadline = now + member.session_timeout_ms
        return KafkaError.NONE

    def leave(
        self, group_id: str, member_id: str, now: int, group_instance_id: str | None = None
    ) -> KafkaError:
        """``group_instance_id``: a static member may be named by it alone (LeaveGroup v3+,
        an empty member id)."""
        group = self.groups.get(group_id)
        if group is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if group_instance_id:
            known = group.static_members.get(group_instance_id)
            if known is None:
                return KafkaError.UNKNOWN_MEMBER_ID
            if member_id and member_id != known:
                return KafkaError.FENCED_INSTANCE_ID
            member_id = known
        if group.pending.pop(member_id, None) is not None:
            self._forget_if_empty(group)
            return KafkaError.NONE
        if member_id not in group.members:
            return KafkaError.UNKNOWN_MEMBER_ID
        self._remove_members(group, [member_id], now)
        return KafkaError.NONE

    def _remove_members(self, group: Group, member_ids: list[str], now: int) -> None:
        for mid in member_ids:
            m = group.members.pop(mid)
            _forget_static(group, m)
            group.awaiting_sync.discard(mid)
            if m.join_token is not None:
                self._answers.append((m.join_token, JoinResult(KafkaError.UNKNOWN_MEMBER_ID, mid)))
            if m.sync_token is not None:
                self._answers.append((m.sync_token, SyncResult(KafkaError.UNKNOWN_MEMBER_ID)))
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now)
        self._maybe_complete_join(group, now)

    # ------------------------------------------------------------------ OffsetCommit
    def commit_error(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        now: int,
        group_instance_id: str | None = None,
    ) -> KafkaError:
        """Whether an OffsetCommit of this member and generation may be written (Kafka's
        order of checks). Generation -1 commits for an empty group: a consumer that
        assigns partitions itself and only keeps its offsets here."""
        if self.fenced(group_id, member_id, group_instance_id):
            return KafkaError.FENCED_INSTANCE_ID
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.EMPTY:
            if generation_id < 0:
                return KafkaError.NONE
            return KafkaError.UNKNOWN_MEMBER_ID if member_id else KafkaError.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return KafkaError.REBALANCE_IN_PROGRESS
        member = group.members.get(member_id)
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return KafkaError.ILLEGAL_GENERATION
        member.session_deadline = now + member.session_timeout_ms
        return KafkaError.NONE

    # ------------------------------------------------------------------ time
    def tick(self, now: int) -> None:
        """Expire pending member ids and sessions; end join and sync phases at their
        deadlines."""
        for group in list(self.groups.values()):
            for mid in [mid for mid, dl in group.pending.items() if now >= dl]:
                del group.pending[mid]
            expired = [
                m.member_id
                for m in group.members.values()
                if m.join_token is None and m.sync_token is None and now >= m.session_deadline
            ]
            if expired:
                self._remove_members(group, expired, now)
            if group.state is GroupState.PREPARING_REBALANCE and now >= group.phase_deadline:
                late = [m.member_id for m in group.members.values() if m.join_token is None]
                for mid in late:
                    _forget_static(group, group.members.pop(mid))
                self._complete_join(group, now)
            elif group.state is GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(group, now)  # an initial delay may have ended
            elif group.awaiting_sync and now >= group.phase_deadline:
                self._remove_members(group, sorted(group.awaiting_sync), now)
            self._forget_if_empty(group)

    def _forget_if_empty(self, group: Group) -> None:
        if group.state is GroupState.EMPTY and not group.members and not group.pending:
            self.groups.pop(group.group_id, None)

    # ------------------------------------------------------------------ coordinator moves
    def unload(self, group_ids: Iterable[str]) -> None:
        """This node stopped coordinating these groups: their parked requests are answered
        NOT_COORDINATOR (the clients find the new coordinator) and they are forgotten."""
        for gid in list(group_ids):
            group = self.groups.pop(gid, None)
            if group is None:
                continue
            for m in group.members.values():
                if m.join_token is not None:
                    result = JoinResult(KafkaError.NOT_COORDINATOR, m.member_id)
                    self._answers.append((m.join_token, result))
                if m.sync_token is not None:
                    self._answers.append((m.sync_token, SyncResult(KafkaError.NOT_COORDINATOR)))
