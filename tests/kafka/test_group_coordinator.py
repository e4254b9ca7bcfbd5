"""The consumer-group state machine (``replica.kafka.groups``) stepped by hand with a
fake clock, and the pure parts of the node's coordinator (``kafka_listener.groups`` and ``offsets``): the
group -> partition hash and the ``__consumer_offsets`` record format."""

from __future__ import annotations

import itertools
from pathlib import Path

import msgpack
import pytest
from quorumlog.replica.kafka.coordinators import java_string_hash, partition_for
from quorumlog.replica.kafka.errors import KafkaError
from quorumlog.replica.kafka.groups import (
    GroupConfig,
    GroupCoordinator,
    GroupState,
    JoinResult,
    SyncResult,
)
from quorumlog.replica.kafka_listener.offsets import (
    Committed,
    decode_offset_record,
    encode_offset_key,
    encode_offset_value,
)

from tests.support.config import node_config

SESSION = 10_000
REBALANCE = 30_000
PROTOCOLS = [("range", b"range-meta"), ("roundrobin", b"rr-meta")]


class Harness:
    """A coordinator with deterministic member ids and a token per request."""

    def __init__(self, config: GroupConfig | None = None) -> None:
        # No initial rebalance delay unless a test asks for one: joins complete at once.
        config = config or GroupConfig(initial_rebalance_delay_ms=0)
        ids = itertools.count(1)
        self.c = GroupCoordinator(config, new_member_id=lambda prefix: f"{prefix}-{next(ids)}")
        self.tokens = itertools.count(1)
        self.answers: dict[int, JoinResult | SyncResult] = {}

    def _collect(self) -> None:
        for token, result in self.c.take_answers():
            assert token not in self.answers, f"token {token} answered twice"
            self.answers[token] = result

    def join(
        self,
        member_id: str = "",
        now: int = 0,
        group: str = "g",
        protocols: list[tuple[str, bytes]] | None = None,
        protocol_type: str = "consumer",
        session: int = SESSION,
        v4: bool = True,
        instance: str | None = None,
    ) -> int:
        token = next(self.tokens)
        self.c.join(
            token,
            group,
            member_id,
            protocol_type,
            PROTOCOLS if protocols is None else protocols,
            session,
            REBALANCE,
            now,
            require_known_member_id=v4,
            group_instance_id=instance,
        )
        self._collect()
        return token

    def sync(
        self,
        member_id: str,
        generation: int,
        now: int = 0,
        assignments: dict[str, bytes] | None = None,
        group: str = "g",
        instance: str | None = None,
    ) -> int:
        token = next(self.tokens)
        self.c.sync(
            token,
            group,
            generation,
            member_id,
            (assignments or {}).items(),
            now,
            group_instance_id=instance,
        )
        self._collect()
        return token

    def tick(self, now: int) -> None:
        self.c.tick(now)
        self._collect()

    def unload(self, groups: list[str]) -> None:
        self.c.unload(groups)
        self._collect()

    def joined(self, token: int) -> JoinResult:
        result = self.answers[token]
        assert isinstance(result, JoinResult)
        return result

    def synced(self, token: int) -> SyncResult:
        result = self.answers[token]
        assert isinstance(result, SyncResult)
        return result

    def new_member(self, now: int = 0, group: str = "g") -> str:
        """A member id handed out by MEMBER_ID_REQUIRED (KIP-394)."""
        result = self.joined(self.join("", now, group))
        assert result.error == KafkaError.MEMBER_ID_REQUIRED
        return result.member_id

    def stable_pair(self) -> tuple[str, str]:
        """Members a (leader) and b of group g, generation 2, STABLE at time 0."""
        a = self.new_member()
        assert self.joined(self.join(a)).generation_id == 1
        b = self.new_member()
        tb = self.join(b)
        assert tb not in self.answers  # parked: a must rejoin first
        ta = self.join(a)
        assert self.joined(ta).generation_id == self.joined(tb).generation_id == 2
        self.sync(b, 2)
        self.sync(a, 2, assignments={a: b"A", b: b"B"})
        assert self.c.groups["g"].state is GroupState.STABLE
        return a, b


def test_a_first_join_needs_a_member_id_then_forms_generation_1() -> None:
    h = Harness()
    first = h.joined(h.join(""))
    assert first.error == KafkaError.MEMBER_ID_REQUIRED and first.member_id == "consumer-1"
    assert first.generation_id == -1
    joined = h.joined(h.join(first.member_id))
    assert joined == JoinResult(
        KafkaError.NONE,
        member_id="consumer-1",
        generation_id=1,
        protocol_type="consumer",
        protocol_name="range",
        leader="consumer-1",
        members=(("consumer-1", b"range-meta"),),
    )
    assert h.c.groups["g"].state is GroupState.COMPLETING_REBALANCE


def test_a_join_before_v4_gets_its_member_id_with_the_answer() -> None:
    h = Harness()
    joined = h.joined(h.join("", v4=False))
    assert joined.error == KafkaError.NONE and joined.member_id == "consumer-1"
    assert joined.generation_id == 1


def test_a_new_member_waits_until_the_known_ones_rejoin_and_the_leader_gets_all() -> None:
    h = Harness()
    a = h.new_member()
    h.join(a)
    h.sync(a, 1, assignments={a: b"all"})
    b = h.new_member()
    tb = h.join(b, now=10)
    assert tb not in h.answers
    assert h.c.heartbeat("g", 1, a, 20) == KafkaError.REBALANCE_IN_PROGRESS
    ta = h.join(a, now=30)
    leader, follower = h.joined(ta), h.joined(tb)
    assert leader.generation_id == follower.generation_id == 2
    assert leader.leader == follower.leader == a
    assert leader.members == ((a, b"range-meta"), (b, b"range-meta")) and follower.members == ()


def test_followers_wait_for_the_leaders_assignment() -> None:
    h = Harness()
    a = h.new_member()
    h.join(a)
    b = h.new_member()
    tb = h.join(b)
    h.join(a)
    follower_sync = h.sync(b, 2)
    assert follower_sync not in h.answers
    assert h.c.commit_error("g", 2, b, 0) == KafkaError.REBALANCE_IN_PROGRESS
    leader_sync = h.sync(a, 2, assignments={a: b"pa", b: b"pb"})
    assert h.synced(follower_sync) == SyncResult(KafkaError.NONE, "consumer", "range", b"pb")
    assert h.synced(leader_sync).assignment == b"pa"
    assert h.joined(tb).generation_id == 2
    # Stable: a later SyncGroup is answered at once with the same assignment.
    assert h.synced(h.sync(b, 2)).assignment == b"pb"
    assert h.c.heartbeat("g", 2, b, 0) == KafkaError.NONE


def test_an_old_generation_is_fenced_everywhere() -> None:
    h = Harness()
    a, b = h.stable_pair()
    assert h.c.heartbeat("g", 1, a, 0) == KafkaError.ILLEGAL_GENERATION
    assert h.synced(h.sync(a, 1)).error == KafkaError.ILLEGAL_GENERATION
    assert h.c.commit_error("g", 1, a, 0) == KafkaError.ILLEGAL_GENERATION
    assert h.c.commit_error("g", 2, a, 0) == KafkaError.NONE
    assert h.c.commit_error("g", 2, "stranger", 0) == KafkaError.UNKNOWN_MEMBER_ID
    assert h.c.heartbeat("g", 2, "stranger", 0) == KafkaError.UNKNOWN_MEMBER_ID
    assert h.synced(h.sync("stranger", 2)).error == KafkaError.UNKNOWN_MEMBER_ID
    assert h.joined(h.join("stranger")).error == KafkaError.UNKNOWN_MEMBER_ID
    # A consumer without membership (generation -1) may not commit into a live group...
    assert h.c.commit_error("g", -1, "", 0) == KafkaError.UNKNOWN_MEMBER_ID
    # ...only into one without members (a consumer that assigns partitions itself).
    assert h.c.commit_error("solo", -1, "", 0) == KafkaError.NONE
    assert h.c.commit_error("solo", 3, "", 0) == KafkaError.ILLEGAL_GENERATION
    assert h.c.heartbeat("solo", 1, a, 0) == KafkaError.UNKNOWN_MEMBER_ID


def test_an_expired_session_removes_the_member_and_the_rest_rebalance() -> None:
    h = Harness()
    a, b = h.stable_pair()
    assert h.c.heartbeat("g", 2, a, SESSION - 1) == KafkaError.NONE
    h.tick(SESSION - 1)
    assert set(h.c.groups["g"].members) == {a, b}
    h.tick(SESSION)  # b's session ends; a heartbeated
    assert set(h.c.groups["g"].members) == {a}
    assert h.c.heartbeat("g", 2, a, SESSION + 1) == KafkaError.REBALANCE_IN_PROGRESS
    rejoined = h.joined(h.join(a, now=SESSION + 2))
    assert rejoined.generation_id == 3 and rejoined.members == ((a, b"range-meta"),)
    assert h.c.heartbeat("g", 2, b, SESSION + 3) == KafkaError.UNKNOWN_MEMBER_ID


def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_dropped() -> None:
    h = Harness()
    a, b = h.stable_pair()
    ta = h.join(a, now=100)
    for now in range(1000, REBALANCE, 5000):  # b heartbeats (so keeps its session)...
        assert h.c.heartbeat("g", 2, b, now) == KafkaError.REBALANCE_IN_PROGRESS
        h.tick(now)
    assert ta not in h.answers
    h.tick(100 + REBALANCE)  # ...but never rejoins
    assert h.joined(ta).generation_id == 3 and h.joined(ta).members == ((a, b"range-meta"),)
    assert h.c.heartbeat("g", 3, b, 100 + REBALANCE) == KafkaError.UNKNOWN_MEMBER_ID


def test_a_leader_that_never_syncs_is_removed_and_the_waiting_followers_rejoin() -> None:
    h = Harness()
    long = 2 * REBALANCE  # sessions outlast the sync phase: its own deadline removes a
    a = h.new_member()
    h.join(a, session=long)
    b = h.new_member()
    tb = h.join(b, session=long)
    h.join(a, session=long)
    follower_sync = h.sync(b, 2, now=5)
    assert h.joined(tb).generation_id == 2 and follower_sync not in h.answers
    h.tick(REBALANCE - 1)
    assert follower_sync not in h.answers
    h.tick(REBALANCE)
    assert h.synced(follower_sync).error == KafkaError.REBALANCE_IN_PROGRESS
    assert set(h.c.groups["g"].members) == {b}
    assert h.joined(h.join(b, now=REBALANCE + 1)).leader == b


def test_leaving_rebalances_the_rest_and_the_last_one_out_forgets_the_group() -> None:
    h = Harness()
    a, b = h.stable_pair()
    assert h.c.leave("g", b, 0) == KafkaError.NONE
    assert h.c.leave("g", b, 0) == KafkaError.UNKNOWN_MEMBER_ID
    assert h.c.heartbeat("g", 2, a, 0) == KafkaError.REBALANCE_IN_PROGRESS
    assert h.joined(h.join(a)).generation_id == 3
    assert h.c.leave("g", a, 0) == KafkaError.NONE
    assert "g" not in h.c.groups
    assert h.c.leave("g", a, 0) == KafkaError.UNKNOWN_MEMBER_ID


def test_a_member_leaving_during_a_rebalance_completes_it_for_the_others() -> None:
    h = Harness()
    a, b = h.stable_pair()
    ta = h.join(a)
    assert ta not in h.answers
    h.c.leave("g", b, 0)
    h._collect()
    assert h.joined(ta).generation_id == 3


def test_member_ids_handed_out_but_never_used_expire() -> None:
    h = Harness()
    pending = h.new_member(now=0)
    h.tick(SESSION)
    assert h.joined(h.join(pending, now=SESSION)).error == KafkaError.UNKNOWN_MEMBER_ID
    assert h.c.groups == {}


def test_incompatible_joins_are_refused() -> None:
    h = Harness()
    a = h.new_member()
    h.join(a)
    other = h.joined(h.join("", protocols=[("sticky", b"")]))
    assert other.error == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    connect = h.joined(h.join("", protocol_type="connect"))
    assert connect.error == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    assert h.joined(h.join("", group="")).error == KafkaError.INVALID_GROUP_ID
    assert h.joined(h.join("", session=1000)).error == KafkaError.INVALID_SESSION_TIMEOUT
    assert h.joined(h.join("", protocols=[], group="x")).error == (
        KafkaError.INCONSISTENT_GROUP_PROTOCOL
    )


def test_the_protocol_most_members_prefer_wins() -> None:
    h = Harness()
    both = [("range", b"r"), ("roundrobin", b"rr")]
    rr_first = [("roundrobin", b"rr"), ("range", b"r")]
    a = h.new_member()
    h.join(a, protocols=both)
    b, c = h.new_member(), h.new_member()
    h.join(b, protocols=rr_first)
    h.join(c, protocols=rr_first)
    result = h.joined(h.join(a, protocols=both))
    assert result.protocol_name == "roundrobin"
    assert result.members == ((a, b"rr"), (b, b"rr"), (c, b"rr"))


def test_groups_and_members_are_bounded() -> None:
    h = Harness(GroupConfig(max_size=2, max_groups=2, initial_rebalance_delay_ms=0))
    h.new_member()
    h.new_member()
    assert h.joined(h.join("")).error == KafkaError.GROUP_MAX_SIZE_REACHED
    h.new_member(group="g2")
    assert h.joined(h.join("", group="g3")).error == KafkaError.GROUP_MAX_SIZE_REACHED
    assert "g3" not in h.c.groups


def test_rebalance_timeouts_are_capped_so_every_parked_join_ends() -> None:
    h = Harness(GroupConfig(max_rebalance_timeout_ms=1000, initial_rebalance_delay_ms=0))
    a, b = h.stable_pair()
    ta = h.join(a, now=0)
    h.tick(999)
    assert ta not in h.answers
    h.tick(1000)
    assert h.joined(ta).error == KafkaError.NONE


def test_a_new_group_s_first_rebalance_waits_for_members_that_start_together() -> None:
    # group.initial.rebalance.delay.ms: each new member restarts the wait (Kafka's
    # InitialDelayedJoin), so both land in generation 1 together.
    h = Harness(GroupConfig(initial_rebalance_delay_ms=3000))
    a = h.new_member(now=0)
    ta = h.join(a, now=0)
    h.tick(2000)
    assert ta not in h.answers
    b = h.new_member(now=2500)
    tb = h.join(b, now=2500)
    h.tick(3000)  # a's delay is over, but b's has restarted it
    assert ta not in h.answers and tb not in h.answers
    h.tick(5500)
    ja, jb = h.joined(ta), h.joined(tb)
    assert (ja.error, jb.error) == (KafkaError.NONE, KafkaError.NONE)
    assert ja.generation_id == jb.generation_id == 1
    assert {m for m, _ in ja.members} == {a, b}


def test_the_initial_delay_ends_by_the_rebalance_timeout_and_spares_later_rebalances() -> None:
    h = Harness(GroupConfig(initial_rebalance_delay_ms=3000, max_rebalance_timeout_ms=1000))
    a = h.new_member(now=0)
    ta = h.join(a, now=0)
    h.tick(999)
    assert ta not in h.answers
    h.tick(1000)
    assert h.joined(ta).generation_id == 1
    h.sync(a, 1, now=1000)
    # A stable group's rebalance (a member joins) waits for no delay.
    b = h.new_member(now=2000)
    tb = h.join(b, now=2000)
    h.join(a, now=2000)
    assert h.joined(tb).generation_id == 2


def test_moving_the_coordinator_answers_parked_requests_not_coordinator() -> None:
    h = Harness()
    a, b = h.stable_pair()
    ta = h.join(a)
    h.unload(["g"])
    assert h.joined(ta).error == KafkaError.NOT_COORDINATOR
    assert h.c.groups == {}
    assert h.c.heartbeat("g", 2, b, 0) == KafkaError.UNKNOWN_MEMBER_ID


def test_a_retried_join_answers_the_earlier_one() -> None:
    h = Harness()
    a, b = h.stable_pair()
    first = h.join(a)
    second = h.join(a)
    assert h.joined(first).error == KafkaError.REBALANCE_IN_PROGRESS
    assert second not in h.answers
    h.join(b)
    assert h.joined(second).generation_id == 3


# ---------------------------------------------------------------------- node side, pure parts
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE: Kafka's Utils.abs gives 0
        ("\U0001f600", 31 * 0xD83D + 0xDE00),  # a surrogate pair: two UTF-16 code units
    ],
)
def test_group_hash_is_javas_string_hash_code(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_groups_map_to_partitions_as_kafkas_partition_for() -> None:
    assert partition_for("polygenelubricants", 8) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("a", 8) == 97 % 8


def test_offset_records_round_trip_and_foreign_keys_are_skipped() -> None:
    c = Committed(offset=42, leader_epoch=3, metadata="m", commit_timestamp=1_700_000_000_000)
    key = encode_offset_key("g", "t", 5)
    assert decode_offset_record(key, encode_offset_value(c)) == (("g", "t", 5), c)
    assert decode_offset_record(key, None) == (("g", "t", 5), None)
    assert decode_offset_record(None, b"x") is None
    assert decode_offset_record(msgpack.packb([2, "g", "t", 5]), b"") is None


def test_the_offsets_topic_partition_count_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--offsets-topic-partitions must be 1..10000"):
        node_config(tmp_path, offsets_topic_partitions=0)


def _static_pair(h: Harness) -> tuple[str, str]:
    """Static members a (instance "ia", leader) and b ("ib") of g, generation 2, STABLE."""
    first = h.joined(h.join("", instance="ia"))
    assert first.error == KafkaError.NONE  # no MEMBER_ID_REQUIRED round for a static member
    a = first.member_id
    h.sync(a, 1, assignments={a: b"all"}, instance="ia")
    tb = h.join("", now=10, instance="ib")
    assert tb not in h.answers
    ta = h.join(a, now=20, instance="ia")
    b = h.joined(tb).member_id
    assert h.joined(ta).generation_id == h.joined(tb).generation_id == 2
    h.sync(b, 2, instance="ib")
    h.sync(a, 2, assignments={a: b"A", b: b"B"}, instance="ia")
    assert h.c.groups["g"].state is GroupState.STABLE
    return a, b


def test_a_restarted_static_member_takes_its_place_without_a_rebalance() -> None:
    h = Harness()
    a, b = _static_pair(h)
    # b's process restarts: a new member id, the same generation, its assignment kept.
    back = h.joined(h.join("", now=1000, instance="ib"))
    assert back.error == KafkaError.NONE and back.member_id not in (a, b)
    assert (back.generation_id, back.leader, back.members) == (2, a, ())
    assert h.synced(h.sync(back.member_id, 2, now=1010, instance="ib")).assignment == b"B"
    group = h.c.groups["g"]
    assert group.state is GroupState.STABLE and group.generation_id == 2
    assert h.c.heartbeat("g", 2, a, 1020, "ia") == KafkaError.NONE  # a noticed nothing
    # The old process is fenced wherever it shows up.
    assert h.c.heartbeat("g", 2, b, 1030, "ib") == KafkaError.FENCED_INSTANCE_ID
    assert h.c.commit_error("g", 2, b, 1030, "ib") == KafkaError.FENCED_INSTANCE_ID
    assert h.joined(h.join(b, now=1030, instance="ib")).error == KafkaError.FENCED_INSTANCE_ID
    assert h.synced(h.sync(b, 2, now=1030, instance="ib")).error == KafkaError.FENCED_INSTANCE_ID


def test_a_restarted_static_leader_keeps_leading_and_a_changed_one_rebalances() -> None:
    h = Harness()
    a, b = _static_pair(h)
    back = h.joined(h.join("", now=1000, instance="ia"))
    assert back.leader == back.member_id and back.generation_id == 2
    assert [mid for mid, _ in back.members] == [back.member_id, b]
    # Other protocols: the group must agree on them again, so it rebalances.
    changed = h.join("", now=2000, instance="ib", protocols=[("range", b"other")])
    assert changed not in h.answers
    assert h.c.groups["g"].state is GroupState.PREPARING_REBALANCE


def test_a_static_member_leaves_by_instance_id_or_when_its_session_ends() -> None:
    h = Harness()
    a, b = _static_pair(h)
    assert h.c.leave("g", "", 100, "nobody") == KafkaError.UNKNOWN_MEMBER_ID
    assert h.c.leave("g", "stale-id", 100, "ib") == KafkaError.FENCED_INSTANCE_ID
    assert h.c.leave("g", "", 100, "ib") == KafkaError.NONE
    assert "ib" not in h.c.groups["g"].static_members
    h.tick(100 + SESSION + REBALANCE + 1)  # a, never heard from again, expires too
    assert "g" not in h.c.groups
