"""The consistent-hash ring that shares hosts between replicas (policy.sharding): balance,
how few keys move when a member joins or leaves, and the sharder's step for one host.
Pure: no API server, no clock."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metalmend.policy.sharding import (
    LEADER_WEIGHT,
    Assign,
    Drain,
    Keep,
    Ring,
    balance,
    loads,
    moves,
    pending,
    placement,
    step,
    weighted_balance,
)
from metalmend.settings import DEFAULTS

# 20,000 hosts spread over a few namespaces, named as an operator would.
KEYS = [f"rack-{i % 13:02d}/server-{i:05d}" for i in range(20_000)]
REPLICAS = [f"metalmend-{i}" for i in range(16)]

member_names = st.text(
    alphabet=string.ascii_lowercase + string.digits + "-", min_size=1, max_size=30
)


def distinct(count: int) -> st.SearchStrategy[list[str]]:
    return st.lists(member_names, min_size=count, max_size=count, unique=True)


@pytest.mark.parametrize("members", [4, 8])
def test_the_busiest_of_the_replicas_holds_at_most_1_15_times_the_mean(members: int) -> None:
    ring = Ring.of(REPLICAS[:members])
    counts = loads(ring, KEYS)
    assert sum(counts.values()) == len(KEYS)
    assert balance(counts) <= 1.15, counts


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.one_of(distinct(4), distinct(8)))
def test_balance_holds_whatever_the_replicas_are_called(names: list[str]) -> None:
    assert balance(loads(Ring.of(names), KEYS)) <= 1.15


def test_every_replica_computes_the_same_owner_whatever_the_order_of_members() -> None:
    one, other = Ring.of(REPLICAS[:5]), Ring.of(list(reversed(REPLICAS[:5])))
    assert all(one.owner(k) == other.owner(k) for k in KEYS[:2000])


def test_no_member_owns_nothing_and_one_member_owns_everything() -> None:
    assert Ring.of([]).owner("ns/host") is None
    assert set(Ring.of(["solo"]).assign(KEYS[:100]).values()) == {"solo"}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=distinct(4))
def test_a_fourth_member_takes_at_most_a_third_of_the_keys_and_only_for_itself(
    names: list[str],
) -> None:
    three, newcomer = names[:3], names[3]
    moved = moves(Ring.of(three), Ring.of(names), KEYS)
    # Ideally a quarter; the ring's spread allows a little more, never past a third.
    assert len(moved) <= len(KEYS) / 3
    assert {new for _, new in moved.values()} <= {newcomer}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=distinct(5), leaving=st.integers(min_value=0, max_value=4))
def test_a_member_leaving_gives_away_only_its_own_keys(names: list[str], leaving: int) -> None:
    gone = names[leaving]
    before, after = Ring.of(names), Ring.of([n for n in names if n != gone])
    moved = moves(before, after, KEYS)
    assert {old for old, _ in moved.values()} <= {gone}
    assert len(moved) == loads(before, KEYS)[gone]


LIVE = frozenset({"a", "b"})
RING = Ring.of(LIVE)
KEY = next(k for k in KEYS if RING.owner(k) == "a")  # a host the ring gives to "a"


@pytest.mark.parametrize(
    ("owner", "draining", "live", "expected", "why"),
    [
        (None, False, LIVE, Assign("a"), "unowned: assigned at once"),
        ("a", False, LIVE, Keep(), "owned by the ring's choice"),
        ("b", False, LIVE, Drain(), "a live owner the ring no longer chooses drains first"),
        ("b", True, LIVE, Keep(), "drain asked: wait for the owner's acknowledgment"),
        (
            "a",
            True,
            LIVE,
            Keep(),
            "the ring chooses the draining owner again: it acknowledges, then gets it back",
        ),
        ("c", False, LIVE, Assign("a"), "an owner no longer live (Lease expired) lost it"),
        ("c", True, LIVE, Assign("a"), "a dead owner's drain is not waited for"),
        ("a", False, frozenset(), Keep(), "no live member: nothing to assign to"),
    ],
)
def test_the_sharders_step_for_one_host(
    owner: str | None, draining: bool, live: frozenset[str], expected: object, why: str
) -> None:
    ring = Ring.of(live)
    assert step(owner, draining, live, ring, KEY) == expected, why


def test_a_ring_needs_a_point_per_member() -> None:
    with pytest.raises(ValueError, match="vnodes"):
        Ring.of(["a"], vnodes=0)


# ---- the leader, lighter on the ring ---------------------------------------------------


def test_the_settings_default_is_the_policys_leader_weight() -> None:
    assert DEFAULTS.runtime.shard_leader_weight == LEADER_WEIGHT


@pytest.mark.parametrize("members", [2, 4, 8])
def test_the_leader_holds_about_its_weight_of_another_replicas_share(members: int) -> None:
    names = REPLICAS[:members]
    counts = loads(placement(names, names[0]), KEYS)
    others = [counts[n] for n in names[1:]]
    share = counts[names[0]] / (sum(others) / len(others))
    assert LEADER_WEIGHT - 0.1 <= share <= LEADER_WEIGHT + 0.1, counts
    # and every replica holds at most 1.15x its fair share (its weight's part of all hosts)
    assert weighted_balance(counts, {names[0]: LEADER_WEIGHT}) <= 1.15, counts


@pytest.mark.parametrize("members", [4, 8])
def test_with_a_lighter_leader_the_busiest_replica_still_holds_at_most_1_15_times_the_mean(
    members: int,
) -> None:
    counts = loads(placement(REPLICAS[:members], REPLICAS[0]), KEYS)
    assert balance(counts) <= 1.15, counts


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=distinct(4), leader=st.integers(min_value=0, max_value=2))
def test_with_a_lighter_leader_a_joining_member_still_takes_keys_only_for_itself(
    names: list[str], leader: int
) -> None:
    three, newcomer = names[:3], names[3]
    moved = moves(placement(three, names[leader]), placement(names, names[leader]), KEYS)
    assert len(moved) <= len(KEYS) / 3
    assert {new for _, new in moved.values()} <= {newcomer}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=distinct(4))
def test_a_change_of_leader_moves_only_keys_to_or_from_the_two_leaders(names: list[str]) -> None:
    old, new = names[0], names[1]
    moved = moves(placement(names, old), placement(names, new), KEYS)
    assert moved, "the two leaders' weights changed"
    # The old leader takes back the points it gave up, the new one gives up as many: every
    # key that moves comes from or goes to one of the two.
    assert all({was, now} & {old, new} for was, now in moved.values()), moved
    # about (1 - weight) of a share each way: well under a share in all
    assert len(moved) <= len(KEYS) / len(names)


def test_a_leader_alone_holds_everything_and_one_not_among_the_members_changes_nothing() -> None:
    assert set(placement(["solo"], "solo").assign(KEYS[:100]).values()) == {"solo"}
    names = REPLICAS[:3]
    assert placement(names, "elsewhere").assign(KEYS[:500]) == Ring.of(names).assign(KEYS[:500])
    assert placement(names, None).assign(KEYS[:500]) == Ring.of(names).assign(KEYS[:500])


def test_a_weight_of_one_is_the_plain_ring() -> None:
    names = REPLICAS[:4]
    assert placement(names, names[0], 1.0).assign(KEYS[:500]) == Ring.of(names).assign(KEYS[:500])


@pytest.mark.parametrize("weight", [0.0, -0.5, 1.5])
def test_a_weight_outside_zero_to_one_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="weights"):
        Ring.of(["a", "b"], weights={"a": weight})


def test_weighted_balance_is_the_busiest_over_its_fair_share() -> None:
    assert weighted_balance({"a": 300, "b": 400, "c": 400}, {"a": 0.75}) == pytest.approx(1.0)
    assert weighted_balance({"a": 100, "b": 100}, {}) == balance({"a": 100, "b": 100}) == 1.0
    assert weighted_balance({}, {}) == 1.0


def test_a_change_of_members_gives_to_write_only_the_dead_owners_hosts_and_the_moves() -> None:
    """After "c" died and "d" joined: "c"'s hosts and unowned ones are assigned, the
    hosts the ring now gives "d" are drained from their live owners, every other host
    (owned by the ring's choice, or already draining) needs no reconcile."""
    before, live = Ring.of(["a", "b", "c"]), frozenset({"a", "b", "d"})
    ring = Ring.of(live)
    hosts = [(k, before.owner(k), False) for k in KEYS[:600]] + [("ns/new", None, False)]
    assign, drain = pending(hosts, live, ring)
    assert set(assign) == {k for k, owner, _ in hosts if owner in (None, "c")}
    assert set(drain) == {
        k for k, owner, _ in hosts if owner in ("a", "b") and ring.owner(k) != owner
    }
    assert all(step(o, d, live, ring, k) == Keep() for k, o, d in hosts
               if k not in assign and k not in drain)  # fmt: skip
    draining = [(k, owner, True) for k, owner, _ in hosts if k in drain]
    assert pending(draining, live, ring) == ([], []), "a drain asked is not asked again"
