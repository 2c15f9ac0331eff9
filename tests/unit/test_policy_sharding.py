"""The consistent-hash ring that shares hosts between replicas (policy.sharding): balance,
how few keys move when a member joins or leaves, and the sharder's step for one host.
Pure: no API server, no clock."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metalmend.policy.sharding import (
    Assign,
    Drain,
    Keep,
    Ring,
    balance,
    loads,
    moves,
    step,
)

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
