"""MachineHealthCheck evaluation: one case per rule, percent rounding, range edges, and
properties over random pools."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metalmend.policy.healthcheck import (
    Check,
    NodeCondition,
    Target,
    UnhealthyCondition,
    evaluate,
    max_unhealthy,
    parse_duration,
    verdict,
)

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
READY_UNKNOWN_5M = UnhealthyCondition("Ready", "Unknown", 300)
READY_FALSE_5M = UnhealthyCondition("Ready", "False", 300)
CHECK = Check(unhealthy_conditions=(READY_UNKNOWN_5M, READY_FALSE_5M))


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def target(name: str = "m", ready: str = "True", since: float = 3600, **changes: object) -> Target:
    base = dict(
        machine=f"ns/{name}",
        created=ago(7200),
        node_ref=name,
        node_exists=True,
        conditions={"Ready": NodeCondition(ready, ago(since))},
    )
    base.update(changes)
    return Target(**base)  # type: ignore[arg-type]


VERDICTS = [
    ("a Ready Node is healthy", target(), "healthy", None),
    ("Ready=Unknown for longer than its timeout is unhealthy", target(ready="Unknown", since=301), "unhealthy", "UnhealthyNode"),
    ("Ready=False for longer than its timeout is unhealthy", target(ready="False", since=600), "unhealthy", "UnhealthyNode"),
    ("a condition exactly at its timeout is unhealthy", target(ready="Unknown", since=300), "unhealthy", "UnhealthyNode"),
    ("a condition within its timeout is waiting, not healthy", target(ready="Unknown", since=299), "waiting", "ConditionPending"),
    ("a status no rule names is healthy", target(ready="Maybe", since=9999), "healthy", None),
    ("nodeRef naming a missing Node is unhealthy at once", target(node_exists=False), "unhealthy", "NodeNotFound"),
    ("no nodeRef past nodeStartupTimeout (10m by default) is unhealthy", target(node_ref=None, created=ago(601)), "unhealthy", "NodeStartupTimeout"),
    ("no nodeRef within nodeStartupTimeout is waiting", target(node_ref=None, created=ago(60)), "waiting", "NodeStartup"),
    ("startup is counted from the last nodeRef loss", target(node_ref=None, created=ago(9999), node_ref_lost=ago(60)), "waiting", "NodeStartup"),
    ("a lost nodeRef past the startup timeout is unhealthy", target(node_ref=None, created=ago(9999), node_ref_lost=ago(700)), "unhealthy", "NodeStartupTimeout"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "kind", "reason"), [pytest.param(t, k, r, id=i) for i, t, k, r in VERDICTS]
)
def test_verdicts(state: Target, kind: str, reason: str | None) -> None:
    result = verdict(CHECK, state, NOW)
    assert result.kind == kind
    if reason is not None:
        assert result.reason == reason


def test_node_startup_timeout_zero_disables_it() -> None:
    result = verdict(Check(node_startup_timeout=0), target(node_ref=None, created=ago(99999)), NOW)
    assert result.kind == "waiting"
    assert result.deadline is None


def test_next_deadline_is_the_earliest_expiry() -> None:
    pool = [
        target("a", ready="Unknown", since=200),
        target("b", ready="False", since=250),
        target("c"),
    ]
    result = evaluate(CHECK, pool, NOW)
    assert result.next_deadline == ago(250) + dt.timedelta(seconds=300)  # b expires first
    assert result.remediate == []


@pytest.mark.parametrize(
    ("value", "expected", "limit"),
    [
        pytest.param("40%", 6, 2, id="40% of 6 rounds down to 2"),
        pytest.param("40%", 5, 2, id="40% of 5 is 2"),
        pytest.param("33%", 3, 0, id="33% of 3 rounds down to 0"),
        pytest.param("100%", 7, 7, id="100% is all"),
        pytest.param(None, 4, 4, id="default is 100%"),
        pytest.param(3, 10, 3, id="an integer is a count"),
        pytest.param("2", 10, 2, id="a numeric string is a count"),
        pytest.param("abc", 10, None, id="garbage is refused"),
    ],
)
def test_max_unhealthy(value: int | str | None, expected: int, limit: int | None) -> None:
    assert max_unhealthy(value, expected) == limit


def pool(unhealthy: int, total: int) -> list[Target]:
    return [
        target(f"m{i}", ready="Unknown" if i < unhealthy else "True", since=400)
        for i in range(total)
    ]


SHORT_CIRCUIT = [
    ("within maxUnhealthy: remediate", Check(CHECK.unhealthy_conditions, max_unhealthy="40%"), 2, 5, True, 0),
    ("over maxUnhealthy: blocked", Check(CHECK.unhealthy_conditions, max_unhealthy="40%"), 3, 5, False, 0),
    ("remediations allowed is what is left", Check(CHECK.unhealthy_conditions, max_unhealthy=3), 1, 5, True, 2),
    ("unhealthyRange lower edge", Check(CHECK.unhealthy_conditions, unhealthy_range="[1-2]"), 1, 5, True, 1),
    ("unhealthyRange upper edge", Check(CHECK.unhealthy_conditions, unhealthy_range="[1-2]"), 2, 5, True, 0),
    ("above unhealthyRange: blocked", Check(CHECK.unhealthy_conditions, unhealthy_range="[1-2]"), 3, 5, False, 0),
    ("below unhealthyRange: blocked", Check(CHECK.unhealthy_conditions, unhealthy_range="[2-3]"), 1, 5, False, 0),
    ("unhealthyRange takes precedence over maxUnhealthy", Check(CHECK.unhealthy_conditions, max_unhealthy=0, unhealthy_range="[1-3]"), 2, 5, True, 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("check", "bad", "total", "allowed", "left"),
    [pytest.param(c, b, t, a, r, id=i) for i, c, b, t, a, r in SHORT_CIRCUIT],
)
def test_short_circuit(check: Check, bad: int, total: int, allowed: bool, left: int) -> None:
    result = evaluate(check, pool(bad, total), NOW)
    assert result.unhealthy == bad
    assert result.allowed is allowed
    assert result.remediations_allowed == left
    assert len(result.remediate) == (bad if allowed else 0)
    assert bool(result.blocked_reason) is not allowed


def test_a_range_with_max_below_min_is_a_spec_error() -> None:
    result = evaluate(Check(CHECK.unhealthy_conditions, unhealthy_range="[3-1]"), pool(2, 5), NOW)
    assert not result.allowed
    assert "max is below min" in result.spec_error
    assert result.remediate == []


def test_targets_being_remediated_count_against_the_limit() -> None:
    """A limit must not be bypassed by remediations in flight (OCP MAO #898)."""
    check = Check(CHECK.unhealthy_conditions, max_unhealthy=1)
    targets = pool(2, 5)
    targets[0] = Target(**{**targets[0].__dict__, "remediating": True})
    result = evaluate(check, targets, NOW)
    assert result.unhealthy == 2
    assert not result.allowed
    assert result.remediate == []


def test_conditions_not_yet_expired_count_against_the_limit() -> None:
    """A partition: three Nodes go Unknown seconds apart. When the first one's timeout
    expires, the other two count too, and the short-circuit holds (Cluster API would
    count them healthy and fence the first)."""
    check = Check(CHECK.unhealthy_conditions, max_unhealthy="40%")
    targets = [
        target("a", ready="Unknown", since=301),
        target("b", ready="Unknown", since=299),
        target("c", ready="Unknown", since=298),
        target("d"),
        target("e"),
    ]
    result = evaluate(check, targets, NOW)
    assert result.unhealthy == 3
    assert not result.allowed
    assert result.remediate == []


def test_targets_waiting_for_a_node_count_as_not_healthy() -> None:
    targets = [*pool(0, 3), target("new", node_ref=None, created=ago(30))]
    result = evaluate(CHECK, targets, NOW)
    assert (result.expected, result.healthy, result.unhealthy) == (4, 3, 1)
    assert result.remediate == []


def test_already_remediating_is_not_remediated_twice_and_healthy_again_is_withdrawn() -> None:
    sick = Target(**{**target("a", ready="Unknown", since=400).__dict__, "remediating": True})
    well = Target(**{**target("b").__dict__, "remediating": True})
    result = evaluate(CHECK, [sick, well], NOW)
    assert result.remediate == []
    assert result.withdraw == ["ns/b"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300), ("300s", 300), ("1h30m", 5400), ("0", 0), ("1.5h", 5400), ("250ms", 0.25)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


# ---- properties ------------------------------------------------------------------------

targets_strategy = st.lists(
    st.builds(
        lambda i, ready, since, remediating, has_node: target(
            f"m{i}",
            ready=ready,
            since=since,
            remediating=remediating,
            node_ref=f"m{i}" if has_node else None,
        ),
        st.integers(0, 10_000),
        st.sampled_from(["True", "False", "Unknown"]),
        st.integers(0, 1000),
        st.booleans(),
        st.booleans(),
    ),
    max_size=30,
    unique_by=lambda t: t.machine,
)
checks = st.builds(
    lambda m, r: Check(CHECK.unhealthy_conditions, max_unhealthy=m, unhealthy_range=r),
    st.one_of(st.none(), st.integers(0, 10), st.sampled_from(["0%", "40%", "50%", "100%"])),
    st.one_of(
        st.none(), st.builds(lambda a, b: f"[{a}-{b}]", st.integers(0, 10), st.integers(0, 10))
    ),
)


@settings(max_examples=300, deadline=None)
@given(check=checks, targets=targets_strategy)
def test_remediation_never_exceeds_what_the_short_circuit_allows(
    check: Check, targets: list[Target]
) -> None:
    result = evaluate(check, targets, NOW)
    if not result.allowed:
        assert result.remediate == []
    assert len(result.remediate) <= result.unhealthy
    assert all(result.verdicts[m].kind == "unhealthy" for m in result.remediate)
    assert result.healthy + result.unhealthy == result.expected == len(targets)


@settings(max_examples=200, deadline=None)
@given(check=checks, targets=targets_strategy, seed=st.integers())
def test_verdicts_do_not_depend_on_the_order_of_inputs(
    check: Check, targets: list[Target], seed: int
) -> None:
    shuffled = list(targets)
    random.Random(seed).shuffle(shuffled)
    first, second = evaluate(check, targets, NOW), evaluate(check, shuffled, NOW)
    assert first.verdicts == second.verdicts
    assert first.remediate == second.remediate
    assert first.withdraw == second.withdraw
    assert first.next_deadline == second.next_deadline
