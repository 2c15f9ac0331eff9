"""MachineHealthCheck evaluation (seed 002, Cluster API v1beta1 semantics), pure.

``evaluate(check, targets, now)`` answers, for one MachineHealthCheck: which targets are
healthy, unhealthy (and why) or not yet decided (and when to look again); whether the
short-circuit allows remediation; which targets to remediate now and which remediations
to withdraw because their Node is healthy again; and the next deadline, so that the
controller requeues at the exact next timeout expiry instead of polling.

Rules (each is a test id in tests/unit/test_policy_healthcheck.py):
- a Machine whose nodeRef names a Node that does not exist is unhealthy at once;
- a Machine without nodeRef is unhealthy once ``nodeStartupTimeout`` (default 10m, 0
  disables) has passed since the later of its creation and its last nodeRef loss;
- a Node condition matching an ``unhealthyConditions`` entry (type and status) for at
  least its timeout makes the Machine unhealthy; before that the Machine is *waiting*,
  and the expiry is a deadline;
- unhealthy = expected - healthy, so targets being remediated, targets still waiting for
  their Node, and targets whose unhealthy condition has not lasted its timeout yet, all
  count against the limit. The last is stricter than Cluster API, which counts them
  healthy: in a partition nodes go Unknown seconds apart, and counting only expired ones
  would let the first few be fenced before the short-circuit sees the rest;
- ``unhealthyRange`` "[min-max]" takes precedence: remediation only while
  min <= unhealthy <= max; otherwise ``maxUnhealthy`` (int or percent of expected, rounded
  down; default 100%): remediation only while unhealthy <= maxUnhealthy (as Cluster API);
- targets skipped (skip-remediation, paused) are not targets at all.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_NODE_STARTUP_TIMEOUT = 600.0
_RANGE = re.compile(r"^\[(\d+)-(\d+)\]$")
_PERCENT = re.compile(r"^(\d+)%$")


@dataclass(frozen=True)
class UnhealthyCondition:
    type: str
    status: str
    timeout: float  # seconds


@dataclass(frozen=True)
class Check:
    unhealthy_conditions: tuple[UnhealthyCondition, ...] = ()
    max_unhealthy: int | str | None = None  # None: 100%
    unhealthy_range: str | None = None
    node_startup_timeout: float | None = None  # None: 10m; 0 disables


@dataclass(frozen=True)
class NodeCondition:
    status: str
    since: dt.datetime  # lastTransitionTime


@dataclass(frozen=True)
class Target:
    machine: str  # namespace/name
    created: dt.datetime
    node_ref: str | None = None
    node_ref_lost: dt.datetime | None = None  # when nodeRef was last cleared
    node_exists: bool = False
    conditions: Mapping[str, NodeCondition] = field(default_factory=dict)
    remediating: bool = False  # a remediation object or condition is already there


VerdictKind = Literal["healthy", "unhealthy", "waiting"]


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    reason: str = ""
    message: str = ""
    deadline: dt.datetime | None = None  # when a waiting target must be looked at again


@dataclass
class Evaluation:
    verdicts: dict[str, Verdict]
    expected: int
    healthy: int
    unhealthy: int
    allowed: bool
    remediations_allowed: int
    blocked_reason: str = ""  # why remediation is short-circuited ("" when allowed)
    spec_error: str = ""  # a spec that passed the schema but cannot be honoured
    remediate: list[str] = field(default_factory=list)  # start remediating these now
    withdraw: list[str] = field(default_factory=list)  # healthy again: remove remediation
    next_deadline: dt.datetime | None = None


def evaluate(check: Check, targets: Sequence[Target], now: dt.datetime) -> Evaluation:
    verdicts = {t.machine: verdict(check, t, now) for t in targets}
    expected = len(targets)
    healthy = sum(1 for v in verdicts.values() if v.kind == "healthy")
    unhealthy = expected - healthy
    allowed, remaining, blocked, error = short_circuit(check, expected, unhealthy)
    result = Evaluation(verdicts, expected, healthy, unhealthy, allowed, remaining, blocked, error)
    for target in sorted(targets, key=lambda t: t.machine):
        kind = verdicts[target.machine].kind
        if kind == "unhealthy" and allowed and not target.remediating:
            result.remediate.append(target.machine)
        elif kind == "healthy" and target.remediating:
            result.withdraw.append(target.machine)
    deadlines = [v.deadline for v in verdicts.values() if v.deadline is not None]
    result.next_deadline = min(deadlines) if deadlines else None
    return result


def verdict(check: Check, target: Target, now: dt.datetime) -> Verdict:
    if target.node_ref is not None:
        if not target.node_exists:
            return Verdict("unhealthy", "NodeNotFound", f"Node {target.node_ref} does not exist")
        return _conditions(check, target, now)
    timeout = _startup_timeout(check)
    if timeout == 0:
        return Verdict("waiting", "NodeStartupTimeoutDisabled", "no Node yet; no startup timeout")
    started = max(target.created, target.node_ref_lost or target.created)
    deadline = started + dt.timedelta(seconds=timeout)
    if now >= deadline:
        lost = target.node_ref_lost is not None and target.node_ref_lost > target.created
        since = "losing its Node" if lost else "creation"
        return Verdict(
            "unhealthy", "NodeStartupTimeout", f"no Node {_span(now - started)} after {since}"
        )
    return Verdict("waiting", "NodeStartup", "waiting for a Node", deadline)


def _conditions(check: Check, target: Target, now: dt.datetime) -> Verdict:
    soonest: dt.datetime | None = None
    for rule in check.unhealthy_conditions:
        condition = target.conditions.get(rule.type)
        if condition is None or condition.status != rule.status:
            continue
        deadline = condition.since + dt.timedelta(seconds=rule.timeout)
        if now >= deadline:
            limit = _span(dt.timedelta(seconds=rule.timeout))
            lasted = _span(now - condition.since)
            message = f"{rule.type}={rule.status} for {lasted} (timeout {limit})"
            return Verdict("unhealthy", "UnhealthyNode", message)
        soonest = deadline if soonest is None else min(soonest, deadline)
    if soonest is not None:
        message = "an unhealthy condition has not lasted its timeout yet"
        return Verdict("waiting", "ConditionPending", message, soonest)
    return Verdict("healthy")


def short_circuit(check: Check, expected: int, unhealthy: int) -> tuple[bool, int, str, str]:
    """(allowed, remediations allowed, why blocked, spec error)."""
    if check.unhealthy_range:
        bounds = parse_range(check.unhealthy_range)
        if bounds is None:
            error = f"unhealthyRange {check.unhealthy_range!r} is not of the form [min-max]"
            return False, 0, "InvalidUnhealthyRange", error
        low, high = bounds
        if high < low:
            error = f"unhealthyRange {check.unhealthy_range}: max is below min"
            return False, 0, "InvalidUnhealthyRange", error
        if low <= unhealthy <= high:
            return True, high - unhealthy, "", ""
        return (
            False,
            0,
            f"{unhealthy} unhealthy, outside unhealthyRange {check.unhealthy_range}",
            "",
        )
    limit = max_unhealthy(check.max_unhealthy, expected)
    if limit is None:
        error = f"maxUnhealthy {check.max_unhealthy!r} is neither a count nor a percentage"
        return False, 0, "InvalidMaxUnhealthy", error
    if unhealthy <= limit:
        return True, limit - unhealthy, "", ""
    stated = check.max_unhealthy if check.max_unhealthy is not None else "100%"
    return (
        False,
        0,
        f"{unhealthy} unhealthy, more than maxUnhealthy {stated} ({limit} of {expected})",
        "",
    )


def parse_range(text: str) -> tuple[int, int] | None:
    match = _RANGE.match(text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def max_unhealthy(value: int | str | None, expected: int) -> int | None:
    """An int as is; "N%" as N percent of ``expected``, rounded down; None is 100%."""
    if value is None:
        return expected
    if isinstance(value, int):
        return value if value >= 0 else None
    text = value.strip()
    if text.isdigit():
        return int(text)
    match = _PERCENT.match(text)
    if match is None:
        return None
    return math.floor(int(match.group(1)) * expected / 100)


def parse_duration(text: str | None) -> float | None:
    """Go-style durations as the CRD admits them ("5m", "1h30m", "300s", "0")."""
    if text is None:
        return None
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text)
    if text.strip() == "0":
        return 0.0
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _startup_timeout(check: Check) -> float:
    if check.node_startup_timeout is None:
        return DEFAULT_NODE_STARTUP_TIMEOUT
    return check.node_startup_timeout


def _span(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60}m"
    return f"{seconds}s"
