"""MachineHealthCheck specs at the edges of what the schema admits: huge and zero
timeouts, values of the wrong shape. Each either evaluates or raises InvalidSpec."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metalmend.controllers.healthcheck import infrastructure_ready_at, parse_check
from metalmend.policy.healthcheck import (
    INT32_MAX,
    Check,
    InvalidSpec,
    NodeCondition,
    Target,
    UnhealthyCondition,
    after,
    check_from_spec,
    evaluate,
    max_unhealthy,
)

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)


def sick(name: str = "m", since: float = 60, status: str = "Unknown") -> Target:
    return Target(
        machine=f"ns/{name}",
        created=NOW - dt.timedelta(days=1),
        node_ref=name,
        node_exists=True,
        conditions={"Ready": NodeCondition(status, NOW - dt.timedelta(seconds=since))},
    )


def spec(timeout: str, **more: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "Unknown", "timeout": timeout}]
    return {"clusterName": "c", "unhealthyConditions": conditions, **more}


@pytest.mark.parametrize("timeout", ["99999999h", "9999999999999999999999999999999h", "2562047h"])
def test_a_huge_condition_timeout_never_expires_and_does_not_crash(timeout: str) -> None:
    """Issue 18 point 4: 99999999h raised OverflowError on every event."""
    result = evaluate(parse_check(spec(timeout)), [sick(since=10**9)], NOW)
    verdict = result.verdicts["ns/m"]
    assert verdict.kind == "waiting"
    assert result.remediate == []
    if timeout != "2562047h":  # within the calendar: a real deadline (year 2318)
        assert verdict.deadline is None
        assert result.next_deadline is None


def test_a_huge_timeout_does_not_hide_a_shorter_rule() -> None:
    check = Check(
        unhealthy_conditions=(
            UnhealthyCondition("Ready", "Unknown", 1e30),
            UnhealthyCondition("Ready", "Unknown", 300),
        )
    )
    assert evaluate(check, [sick(since=400)], NOW).verdicts["ns/m"].kind == "unhealthy"
    waiting = evaluate(check, [sick(since=100)], NOW)
    assert waiting.next_deadline == NOW + dt.timedelta(seconds=200)


def test_a_huge_node_startup_timeout_waits_forever() -> None:
    check = parse_check({"nodeStartupTimeout": "99999999h"})
    newborn = Target(machine="ns/m", created=NOW - dt.timedelta(days=365))
    result = evaluate(check, [newborn], NOW)
    assert result.verdicts["ns/m"].kind == "waiting"
    assert result.next_deadline is None


def test_a_zero_timeout_is_unhealthy_as_soon_as_the_condition_is_seen() -> None:
    """As Cluster API (v1beta2 timeoutSeconds has minimum 0)."""
    result = evaluate(parse_check(spec("0s")), [sick(since=0)], NOW)
    assert result.verdicts["ns/m"].kind == "unhealthy"
    assert result.remediate == ["ns/m"]


def test_after_is_never_beyond_the_calendar() -> None:
    assert after(NOW, 60) == NOW + dt.timedelta(minutes=1)
    assert after(NOW, 1e20) is None
    assert after(NOW, float("inf")) is None
    assert after(NOW, float("nan")) is None
    assert after(dt.datetime.max.replace(tzinfo=dt.UTC), 1) is None


def test_a_huge_range_keeps_the_status_counter_within_int32() -> None:
    result = evaluate(Check(unhealthy_range="[0-99999999999999999999]"), [sick()], NOW)
    assert result.remediations_allowed == INT32_MAX


def test_a_huge_percentage_is_integer_arithmetic() -> None:
    assert max_unhealthy("9" * 400 + "%", 3) == int("9" * 400) * 3 // 100
    assert max_unhealthy("²", 3) is None  # isdigit() is true for it, int() refuses it


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "soon"}]}, "not a duration"),
        ({"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": 5}]}, "not a duration"),
        ({"unhealthyConditions": [{"type": "Ready", "status": "Unknown"}]}, "needs a timeout"),
        ({"unhealthyConditions": [{"status": "Unknown", "timeout": "5m"}]}, "needs a type and a status"),
        ({"unhealthyConditions": ["Ready"]}, "must be an object"),
        ({"unhealthyConditions": {"type": "Ready"}}, "must be a list"),
        ({"nodeStartupTimeout": "1e9s"}, "not a duration"),
        ({"nodeStartupTimeout": "1" * 400 + "h"}, "too long"),
        ({"maxUnhealthy": True}, "neither a count nor a percentage"),
        ({"maxUnhealthy": 1.5}, "neither a count nor a percentage"),
        ({"unhealthyRange": 3}, "[min-max]"),
    ],
)  # fmt: skip
def test_specs_of_the_wrong_shape_raise_only_invalid_spec(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidSpec, match=None) as caught:
        check_from_spec(bad)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    "stamp", ["yesterday", "2026-13-01T00:00:00Z", "0001-01-01T00:00:00+23:59", "", 5, None]
)
def test_an_unparsable_infrastructure_ready_time_is_ignored(stamp: object) -> None:
    """Anyone may write a Machine's conditions: a time that does not parse means startup
    counts from creation, never a failed reconcile of the whole check."""
    condition = {"type": "InfrastructureReady", "status": "True", "lastTransitionTime": stamp}
    assert infrastructure_ready_at([condition]) is None


def test_infrastructure_ready_is_read_only_when_true() -> None:
    ready = {"type": "InfrastructureReady", "status": "True", "lastTransitionTime": "2026-11-20T12:00:00Z"}  # fmt: skip
    assert infrastructure_ready_at([ready]) == NOW
    assert infrastructure_ready_at([{**ready, "status": "False"}]) is None
