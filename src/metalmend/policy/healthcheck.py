"""MachineHealthCheck evaluation (Cluster API's machine health checking proposal, v1beta1
semantics), pure.

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
- targets skipped (skip-remediation, paused) are not targets at all;
- a timeout so long that its deadline falls beyond the calendar (year 9999) never
  expires: the target waits, with no deadline to requeue at. The CRD refuses durations
  longer than Kubernetes can represent (about 292 years), but objects stored before that
  rule, or written around it, must not crash the check;
- a timeout of 0 makes a matching condition unhealthy as soon as it is seen (as Cluster
  API, whose v1beta2 ``timeoutSeconds`` has minimum 0).

Every input the CRD schema admits evaluates; a spec that cannot be honoured raises
``InvalidSpec`` (from ``check_from_spec``/``parse_duration``) or comes back as
``Evaluation.spec_error``, never any other exception.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_NODE_STARTUP_TIMEOUT = 600.0
# ASCII digits only: ``\d`` also matches other scripts' digits, some of which int() refuses.
_RANGE = re.compile(r"^\[([0-9]+)-([0-9]+)\]$")
_PERCENT = re.compile(r"^([0-9]+)%$")
_COUNT = re.compile(r"^[0-9]+$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# Status counters are int32 in the CRD (as in Cluster API): a spec like "[0-99999999999]"
# must not make the status write fail.
INT32_MAX = 2**31 - 1


class InvalidSpec(ValueError):
    """A MachineHealthCheck spec this policy cannot honour; the message says what is wrong
    in the user's terms. The only exception the policy raises."""


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
    remaining = min(remaining, INT32_MAX)
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
    deadline = after(started, timeout)
    if deadline is None:
        return Verdict("waiting", "NodeStartup", "waiting for a Node (nodeStartupTimeout: never)")
    if now >= deadline:
        lost = target.node_ref_lost is not None and target.node_ref_lost > target.created
        since = "losing its Node" if lost else "creation"
        return Verdict(
            "unhealthy", "NodeStartupTimeout", f"no Node {_span(now - started)} after {since}"
        )
    return Verdict("waiting", "NodeStartup", "waiting for a Node", deadline)


def _conditions(check: Check, target: Target, now: dt.datetime) -> Verdict:
    soonest: dt.datetime | None = None
    pending = False
    for rule in check.unhealthy_conditions:
        condition = target.conditions.get(rule.type)
        if condition is None or condition.status != rule.status:
            continue
        pending = True
        deadline = after(condition.since, rule.timeout)
        if deadline is None:  # beyond the calendar: this rule never expires
            continue
        if now >= deadline:
            limit = _span(dt.timedelta(seconds=rule.timeout))
            lasted = _span(now - condition.since)
            message = f"{rule.type}={rule.status} for {lasted} (timeout {limit})"
            return Verdict("unhealthy", "UnhealthyNode", message)
        soonest = deadline if soonest is None else min(soonest, deadline)
    if pending:
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
    if _COUNT.match(text):
        return int(text)
    match = _PERCENT.match(text)
    if match is None:
        return None
    # Integer arithmetic: a float product overflows (or rounds) for huge percentages.
    return int(match.group(1)) * expected // 100


def parse_duration(text: Any) -> float | None:
    """Go-style durations as the CRD admits them ("5m", "1h30m", "300s", "0"), in seconds;
    may be huge (see ``after``). InvalidSpec for anything else."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidSpec(f"not a duration: {text!r}")
    stripped = text.strip()
    if stripped == "0":
        return 0.0
    parts = _DURATION_PART.findall(stripped)
    if not parts or "".join(n + u for n, u in parts) != stripped:
        raise InvalidSpec(f"not a duration: {text!r}")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds):  # only a string far longer than the schema admits
        raise InvalidSpec(f"duration {text[:40]!r} is too long")
    return seconds


def after(start: dt.datetime, seconds: float) -> dt.datetime | None:
    """``start`` plus ``seconds``; None when that is beyond the calendar (never)."""
    try:
        return start + dt.timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # past year 9999, or not a finite number
        return None


def check_from_spec(spec: Mapping[str, Any]) -> Check:
    """A MachineHealthCheck spec (as stored) as this policy reads it; InvalidSpec says
    what is wrong. Reads only what ``evaluate`` uses; the selector and template are the
    controller's."""
    if not isinstance(spec, Mapping):
        raise InvalidSpec("spec must be an object")
    conditions = spec.get("unhealthyConditions") or []
    if not isinstance(conditions, list):
        raise InvalidSpec("unhealthyConditions must be a list")
    rules = []
    for index, entry in enumerate(conditions):
        if not isinstance(entry, Mapping):
            raise InvalidSpec(f"unhealthyConditions[{index}] must be an object")
        kind, status = entry.get("type"), entry.get("status")
        if not isinstance(kind, str) or not isinstance(status, str) or not kind or not status:
            raise InvalidSpec(f"unhealthyConditions[{index}] needs a type and a status")
        timeout = parse_duration(entry.get("timeout"))
        if timeout is None:
            raise InvalidSpec(f"unhealthyConditions[{index}] needs a timeout")
        rules.append(UnhealthyCondition(kind, status, timeout))
    limit = spec.get("maxUnhealthy")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | str)):
        raise InvalidSpec(f"maxUnhealthy {limit!r} is neither a count nor a percentage")
    window = spec.get("unhealthyRange")
    if window is not None and not isinstance(window, str):
        raise InvalidSpec(f"unhealthyRange {window!r} is not of the form [min-max]")
    return Check(
        unhealthy_conditions=tuple(rules),
        max_unhealthy=limit,
        unhealthy_range=window,
        node_startup_timeout=parse_duration(spec.get("nodeStartupTimeout")),
    )


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
