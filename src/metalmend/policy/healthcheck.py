"""MachineHealthCheck, pure: Cluster API's machine health checking, v1beta1 as Cluster
API release 1.9 behaves (the "MachineHealthCheck" proposal,
https://github.com/kubernetes-sigs/cluster-api/blob/main/docs/proposals/20191030-machine-health-checking.md,
and its controller, ``internal/controllers/machinehealthcheck``).

``decide(view, now, settings)`` reads one check and its targets as observed
(docs/decide-act.md) and returns what to do: the conditions to set on each Machine, the
remediations to request or withdraw, the check's new status, the Events, and the exact
next deadline (a timeout expiring) instead of polling. ``evaluate(check, targets, now)``
is the arithmetic underneath: a verdict per target and the short-circuit.

Verdict of one target, the first rule that applies (each is a test id in
tests/unit/test_policy_healthcheck.py):

1. the annotation ``cluster.x-k8s.io/remediate-machine`` (an operator's manual request)
   makes it unhealthy (HasRemediateMachineAnnotation); the short-circuit still applies;
2. ``status.failureReason`` or ``status.failureMessage`` makes it unhealthy at once
   (MachineHasFailure), whatever its Node says: bare-metal providers report terminal
   provisioning failures this way;
3. a nodeRef naming a Node that does not exist is unhealthy at once (NodeNotFound). Nobody
   clears nodeRef (Cluster API never does, nor does metalmend's node-link), so a Node
   deleted under its Machine is found here, in every set-up. Except after a remediation
   by annotation: machine-remediation deletes the Node, ends the request and stamps the
   Machine ``metalmend.dev/remediation-ended-at``; the server is then booting, and its Node
   missing is *waiting* for ``nodeStartupTimeout`` from that stamp (0: no limit, as for a
   new Machine), NodeNotFound only after. Asking again at once would power-cycle the host
   again as soon as it is read on, before its kubelet can register: a loop that never
   lets the server boot. A stamp that does not parse, or lies in the future (beyond
   ``CLOCK_SKEW``), is read as absent: a tenant can only make its own Machine wait;
4. where its Cluster is known (Cluster API's Cluster kind is served and the check's
   Cluster exists; controllers/clusters.py), a Machine is not judged further while that
   Cluster's InfrastructureReady is not True, nor, unless it is a control-plane Machine,
   while its ControlPlaneInitialized is not True: it is *waiting* (WaitingForCluster), as
   Cluster API does not judge it either;
5. without nodeRef, the Machine is unhealthy once ``nodeStartupTimeout`` (default 10m;
   0 disables) has passed since the latest of: its creation, its own
   InfrastructureReady, its Cluster's InfrastructureReady and ControlPlaneInitialized
   where a Cluster is known (each when True; a BareMetalHost may take longer to provision
   than the timeout), and the end of its last remediation by annotation (rule 3);
6. a Node condition matching an ``unhealthyConditions`` entry (type and status) for at
   least its timeout makes it unhealthy (UnhealthyNode); before that it is *waiting*, with
   the expiry as a deadline. A timeout of 0 is unhealthy as soon as seen (as Cluster API,
   whose v1beta2 ``timeoutSeconds`` has minimum 0); one whose deadline falls beyond the
   calendar (year 9999) never expires;
7. otherwise healthy, except that a Machine being deleted is never healthy (it waits).

Counting, as Cluster API (``healthCheckTargets`` in ``machinehealthcheck_targets.go``:
targets are healthy, unhealthy, or neither, and unhealthy = expected - currentHealthy):
targets being remediated, waiting for their Node, whose condition has not lasted its
timeout yet, or being deleted, are not healthy and so count against the limit. In a
partition Nodes go Unknown seconds apart: the short-circuit sees all of them before the
first timeout expires. ``unhealthyRange`` "[min-max]" takes precedence: remediation only
while min <= unhealthy <= max; otherwise ``maxUnhealthy`` (a count, or a percentage of
expected rounded down; default 100%): remediation only while unhealthy <= maxUnhealthy.
Machines skipped (skip-remediation, paused) and other clusters' Machines are not
targets at all (the controller's selection).

What is done:

- every unhealthy Machine gets ``HealthCheckSucceeded=False`` (its reason and message),
  also while the short-circuit blocks remediation and whatever the remediation method:
  an operator sees which Machines failed exactly when nothing is remediated; every healthy
  Machine gets ``HealthCheckSucceeded=True`` (unless its owner is remediating it by
  conditions: the proposal leaves that Machine's conditions to its owner);
- an unhealthy Machine not already being remediated, and not being deleted, is remediated
  while the short-circuit allows: ``OwnerRemediated=False`` (conditions), an external
  remediation object from the template, or metal3's external-remediation annotation;
- a healthy Machine being remediated by template or annotation has it withdrawn;
- Events as Cluster API names them (MachineMarkedUnhealthy and DetectedUnhealthy on the
  Machine, RemediationRestricted on the check) beside metalmend's own.

Every input the CRD schema admits evaluates; a spec that cannot be honoured raises
``InvalidSpec`` (from ``check_from_spec``/``parse_duration``) or comes back as
``Evaluation.spec_error``, never any other exception.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from metalmend.api import names
from metalmend.api.stamps import stamp
from metalmend.policy.decision import Decision, Event, EventType, TargetEvent
from metalmend.policy.decision import SetStatus as SetStatus  # shared; its controller matches it
from metalmend.policy.interlock import (
    CONDITION_HOST_AVAILABLE,
    REASON_BEING_TORN_DOWN,
    REASON_REMEDIATION_HELD,
)

DEFAULT_NODE_STARTUP_TIMEOUT = 600.0
# ASCII digits only: ``\d`` also matches other scripts' digits, some of which int() refuses.
_RANGE = re.compile(r"^\[([0-9]+)-([0-9]+)\]$")
_PERCENT = re.compile(r"^([0-9]+)%$")
_COUNT = re.compile(r"^[0-9]+$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# A remediation-ended stamp later than now by more than this was not written by
# machine-remediation (it stamps before writing, the check reads after): read as absent.
# The allowance is for clocks of two metalmend processes that differ a little.
CLOCK_SKEW = dt.timedelta(seconds=60)
# Status counters are int32 in the CRD (as in Cluster API): a spec like "[0-99999999999]"
# must not make the status write fail.
INT32_MAX = 2**31 - 1

# Cluster API's names (v1beta1 condition reasons and controller Events).
REASON_REMEDIATE_ANNOTATION = "HasRemediateMachineAnnotation"
REASON_MACHINE_HAS_FAILURE = "MachineHasFailure"
REASON_NODE_NOT_FOUND = "NodeNotFound"
REASON_NODE_STARTUP_TIMEOUT = "NodeStartupTimeout"
REASON_UNHEALTHY_NODE = "UnhealthyNode"
REASON_WAITING_FOR_REMEDIATION = "WaitingForRemediation"
# metalmend's: a Node missing since machine-remediation power-cycled its server (rule 3).
REASON_WAITING_FOR_NODE_AFTER_REMEDIATION = "WaitingForNodeAfterRemediation"
# metalmend's: not judged while its Cluster is not ready (Cluster API only logs this).
REASON_WAITING_FOR_CLUSTER = "WaitingForCluster"
EVENT_MACHINE_MARKED_UNHEALTHY = "MachineMarkedUnhealthy"
EVENT_DETECTED_UNHEALTHY = "DetectedUnhealthy"
EVENT_REMEDIATION_RESTRICTED = "RemediationRestricted"


class InvalidSpec(ValueError):
    """A MachineHealthCheck spec this policy cannot honour; the message says what is wrong
    in the user's terms. The only exception the policy raises."""


@dataclass(frozen=True)
class Settings:
    """What decide needs of the health-check settings (metalmend.settings.HealthCheckSettings
    holds the operator's value)."""

    template_retry: float = 30.0
    """Seconds before looking again for a remediationTemplate that does not exist."""


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
    """One Machine as the check reads it (and its Node, if found)."""

    machine: str  # namespace/name
    created: dt.datetime
    node_ref: str | None = None
    node_exists: bool = False
    conditions: Mapping[str, NodeCondition] = field(default_factory=dict)  # the Node's
    remediating: bool = False  # a remediation (object, annotation or condition) is there
    failure: str = ""  # "FailureReason: ..." / "FailureMessage: ..." from the Machine
    remediation_requested: bool = False  # cluster.x-k8s.io/remediate-machine
    deleting: bool = False  # metadata.deletionTimestamp is set
    infrastructure_ready_at: dt.datetime | None = None  # Machine InfrastructureReady=True
    cluster_ready_at: dt.datetime | None = None  # latest of the Cluster's ready conditions
    # why its Cluster is not ready for its Machines to be judged ("" when it is, or when
    # no Cluster is known): controllers.clusters.Readiness.not_ready
    cluster_not_ready: str = ""
    uid: str = ""
    machine_conditions: tuple[Mapping[str, Any], ...] = ()  # the Machine's status.conditions
    remediation_uid: str = ""  # the external remediation object's uid (template)
    # names.REMEDIATION_ENDED_AT as read (None: absent or not a time): when
    # machine-remediation last ended a remediation of this Machine
    remediation_ended_at: dt.datetime | None = None
    # why the Machine's host may not be remediated now: a teardown claims it
    # (policy.interlock.hold_message; "" when not claimed)
    teardown: str = ""


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    WAITING = "waiting"  # neither: not yet decided (or being deleted)


@dataclass(frozen=True)
class Verdict:
    kind: Health
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
    healthy = sum(1 for v in verdicts.values() if v.kind == Health.HEALTHY)
    unhealthy = expected - healthy
    allowed, remaining, blocked, error = short_circuit(check, expected, unhealthy)
    remaining = min(remaining, INT32_MAX)
    result = Evaluation(verdicts, expected, healthy, unhealthy, allowed, remaining, blocked, error)
    for target in sorted(targets, key=lambda t: t.machine):
        kind = verdicts[target.machine].kind
        # A Machine being deleted is going away anyway: remediating it would only fight
        # its deletion (and Cluster API never marks it OwnerRemediated).
        # A host claimed by a teardown (docs/design.md, invariant 7): its Node going
        # NotReady or away is expected; the Machine is reported, not remediated.
        if (
            kind == Health.UNHEALTHY and allowed and not target.remediating
            and not target.deleting and not target.teardown
        ):  # fmt: skip
            result.remediate.append(target.machine)
        elif kind == Health.HEALTHY and target.remediating:
            result.withdraw.append(target.machine)
    deadlines = [v.deadline for v in verdicts.values() if v.deadline is not None]
    result.next_deadline = min(deadlines) if deadlines else None
    return result


def verdict(check: Check, target: Target, now: dt.datetime) -> Verdict:
    found = _machine_verdict(check, target, now)
    if target.deleting and found.kind == Health.HEALTHY:
        return Verdict(Health.WAITING, "MachineDeleting", "the Machine is being deleted")
    return found


def _machine_verdict(check: Check, target: Target, now: dt.datetime) -> Verdict:
    booting = _booting_after_remediation(check, target, now)
    if booting is not None:
        return booting
    if target.remediation_requested:
        message = f"marked for remediation via the {names.REMEDIATE_MACHINE} annotation"
        return Verdict(Health.UNHEALTHY, REASON_REMEDIATE_ANNOTATION, message)
    if target.failure:
        return Verdict(Health.UNHEALTHY, REASON_MACHINE_HAS_FAILURE, target.failure)
    if target.node_ref is not None and not target.node_exists:
        return _node_missing(check, target, now)
    if target.cluster_not_ready:  # as Cluster API: not judged until its Cluster is ready
        return Verdict(Health.WAITING, REASON_WAITING_FOR_CLUSTER, target.cluster_not_ready)
    if target.node_ref is not None:
        return _conditions(check, target, now)
    return _startup(check, target, now)


def remediation_ended(target: Target, now: dt.datetime) -> dt.datetime | None:
    """When machine-remediation ended the Machine's last remediation, if that stamp can be
    believed: one later than ``now`` by more than CLOCK_SKEW is not machine-remediation's
    (a tenant may write the annotation): absent."""
    ended = target.remediation_ended_at
    if ended is None or ended > now + CLOCK_SKEW:
        return None
    return ended


def _booting_after_remediation(check: Check, target: Target, now: dt.datetime) -> Verdict | None:
    """A server power-cycled by a remediation by annotation that ended less than
    nodeStartupTimeout ago, whose Node is not back: it is booting, whatever else would make
    it unhealthy (a manual request, a failureReason). Asking again now would power it off
    before it can register its Node, and again after each power-on: a loop that never lets
    it boot. Once the window passes, or the Node is back, the other rules apply."""
    node_missing = target.node_ref is None or not target.node_exists
    if not node_missing or remediation_ended(target, now) is None:
        return None
    if not (target.remediation_requested or target.failure):
        return None  # rule 3 and the startup rule wait for it themselves
    found = _node_missing(check, target, now) if target.node_ref else _startup(check, target, now)
    return found if found.kind == Health.WAITING else None


def _node_missing(check: Check, target: Target, now: dt.datetime) -> Verdict:
    """Rule 3: NodeNotFound, unless the server was power-cycled by a remediation that ended
    less than nodeStartupTimeout ago (0: no limit): then it is booting, and waits."""
    ended = remediation_ended(target, now)
    missing = f"Node {target.node_ref} does not exist (deleted?)"
    if ended is None:
        return Verdict(Health.UNHEALTHY, REASON_NODE_NOT_FOUND, missing)
    timeout = _startup_timeout(check)
    since = f"since the remediation that ended {stamp(ended)}"
    deadline = after(ended, timeout) if timeout > 0 else None
    if timeout == 0 or deadline is None:  # 0: no limit, as for a new Machine; or never
        message = f"waiting for Node {target.node_ref} to register again {since} (no limit)"
        return Verdict(Health.WAITING, REASON_WAITING_FOR_NODE_AFTER_REMEDIATION, message)
    if now < deadline:
        message = f"waiting for Node {target.node_ref} to register again {since}"
        return Verdict(Health.WAITING, REASON_WAITING_FOR_NODE_AFTER_REMEDIATION, message, deadline)
    limit = _span(dt.timedelta(seconds=timeout))
    message = f"Node {target.node_ref} not registered again within {limit} {since}"
    return Verdict(Health.UNHEALTHY, REASON_NODE_NOT_FOUND, message)


def startup_began(target: Target, now: dt.datetime) -> tuple[dt.datetime, str]:
    """When the wait for a Node began, and what that moment is: the latest of the
    Machine's creation, its Cluster being ready, its infrastructure being ready and the
    end of its last remediation by annotation (``remediation_ended``)."""
    moments = [
        (target.created, "creation"),
        (target.cluster_ready_at, "its Cluster became ready"),
        (target.infrastructure_ready_at, "its infrastructure became ready"),
        (remediation_ended(target, now), "its last remediation ended"),
    ]
    known = [(moment, what) for moment, what in moments if moment is not None]
    return max(known, key=lambda pair: pair[0])


def _startup(check: Check, target: Target, now: dt.datetime) -> Verdict:
    timeout = _startup_timeout(check)
    if timeout == 0:
        message = "no Node yet; no startup timeout"
        return Verdict(Health.WAITING, "NodeStartupTimeoutDisabled", message)
    began, since = startup_began(target, now)
    deadline = after(began, timeout)
    if deadline is None:
        message = "waiting for a Node (nodeStartupTimeout: never)"
        return Verdict(Health.WAITING, "NodeStartup", message)
    if now >= deadline:
        message = (
            f"Node failed to report startup in {_span(dt.timedelta(seconds=timeout))}"
            f" (no Node {_span(now - began)} after {since})"
        )
        return Verdict(Health.UNHEALTHY, REASON_NODE_STARTUP_TIMEOUT, message)
    return Verdict(Health.WAITING, "NodeStartup", "waiting for a Node", deadline)


def _held(
    check: Check, conditions: Mapping[str, NodeCondition]
) -> Iterator[tuple[UnhealthyCondition, NodeCondition, dt.datetime | None]]:
    """Each of the check's unhealthy conditions a Node's ``conditions`` hold, with the
    Node's condition and when it turns the Node unhealthy (None: beyond the calendar,
    never)."""
    for rule in check.unhealthy_conditions:
        condition = conditions.get(rule.type)
        if condition is not None and condition.status == rule.status:
            yield rule, condition, after(condition.since, rule.timeout)


def verdict_due(
    check: Check, conditions: Mapping[str, NodeCondition], now: dt.datetime
) -> float | None:
    """Seconds from ``now`` until the soonest verdict of unhealthy a Node's ``conditions``
    bring under ``check`` (0: one is due already); None when they hold none of its
    unhealthy conditions (or only ones that never expire). How long a Node's change may
    wait before the check is evaluated (controllers.healthcheck: never past this)."""
    waits = [
        max(0.0, (deadline - now).total_seconds())
        for _, _, deadline in _held(check, conditions)
        if deadline is not None
    ]
    return min(waits, default=None)


def _conditions(check: Check, target: Target, now: dt.datetime) -> Verdict:
    soonest: dt.datetime | None = None
    pending = False
    for rule, condition, deadline in _held(check, target.conditions):
        pending = True
        if deadline is None:  # beyond the calendar: this rule never expires
            continue
        if now >= deadline:
            limit = _span(dt.timedelta(seconds=rule.timeout))
            lasted = _span(now - condition.since)
            message = f"{rule.type}={rule.status} for {lasted} (timeout {limit})"
            return Verdict(Health.UNHEALTHY, REASON_UNHEALTHY_NODE, message)
        soonest = deadline if soonest is None else min(soonest, deadline)
    if pending:
        message = "an unhealthy condition has not lasted its timeout yet"
        return Verdict(Health.WAITING, "ConditionPending", message, soonest)
    return Verdict(Health.HEALTHY)


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
    return scaled(value, expected)


def scaled(value: Any, total: int, round_up: bool = False) -> int | None:
    """A count as is; "N%" as N percent of ``total`` (rounded down, or up); None if it is
    neither (as Kubernetes' IntOrString percentages). Shared with the NodeHealthCheck's
    ``minHealthy`` (rounded up)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _COUNT.match(text):
        return int(text)
    match = _PERCENT.match(text)
    if match is None:
        return None
    # Integer arithmetic: a float product overflows (or rounds) for huge percentages.
    product = int(match.group(1)) * total
    return -(-product // 100) if round_up else product // 100


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


# ---- conditions -------------------------------------------------------------------------

Wanted = Mapping[str, tuple[str, str, str]]  # condition type -> (status, reason, message)


def merge_conditions(
    current: Sequence[Mapping[str, Any]], wanted: Wanted, now: dt.datetime
) -> tuple[dict[str, Any], ...]:
    """``current`` with each wanted (status, reason, message) set; lastTransitionTime moves
    only when the status changes, so an unchanged condition is an unchanged list. The
    order of ``current`` is kept (new types go last): another writer of the same list
    (Cluster API's Machine controller) must not see it reordered on every reconcile."""
    by_type = {str(c.get("type")): dict(c) for c in current if isinstance(c, Mapping)}
    for kind, (status, reason, message) in sorted(wanted.items()):
        old = by_type.get(kind)
        new: dict[str, Any] = {"type": kind, "status": status}
        if reason:
            new["reason"] = reason
        if message:
            new["message"] = message
        if status == "False":
            new["severity"] = "Warning"
        if old is None or old.get("status") != status:
            new["lastTransitionTime"] = stamp(now)
        else:
            new["lastTransitionTime"] = old.get("lastTransitionTime", stamp(now))
        by_type[kind] = new
    return tuple(by_type.values())


def condition_of(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    return next((c for c in conditions if c.get("type") == kind), {})


# ---- the check's status: owns its wire format ----------------------------------------------


@dataclass(frozen=True)
class CheckStatus:
    """``status`` of a MachineHealthCheck (the fields this controller owns)."""

    expected_machines: int | None = None
    current_healthy: int | None = None
    remediations_allowed: int | None = None
    targets: tuple[str, ...] | None = None  # Machine names
    observed_generation: int | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_wire(cls, status: Mapping[str, Any] | None) -> CheckStatus:
        """Tolerant: a field of the wrong shape reads as absent; never raises."""
        status = status if isinstance(status, Mapping) else {}
        targets = status.get("targets")
        conditions = status.get("conditions")
        return cls(
            expected_machines=_int(status.get("expectedMachines")),
            current_healthy=_int(status.get("currentHealthy")),
            remediations_allowed=_int(status.get("remediationsAllowed")),
            targets=tuple(str(t) for t in targets) if isinstance(targets, list) else None,
            observed_generation=_int(status.get("observedGeneration")),
            conditions=tuple(
                dict(c) for c in conditions if isinstance(c, Mapping)
            ) if isinstance(conditions, list) else (),
        )  # fmt: skip

    def to_wire(self, status: Mapping[str, Any] | None) -> dict[str, Any]:
        """The whole new status: our fields replaced (None removes one), others kept."""
        new = dict(status) if isinstance(status, Mapping) else {}
        values: dict[str, Any] = {
            "expectedMachines": self.expected_machines,
            "currentHealthy": self.current_healthy,
            "remediationsAllowed": self.remediations_allowed,
            "targets": list(self.targets) if self.targets is not None else None,
            "observedGeneration": self.observed_generation,
            "conditions": [dict(c) for c in self.conditions] or None,
        }
        for name, value in values.items():
            if value is None:
                new.pop(name, None)
            else:
                new[name] = value
        return new


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---- the view ----------------------------------------------------------------------------


class RemediateBy(StrEnum):
    """How the check asks for remediation."""

    CONDITIONS = "conditions"  # OwnerRemediated=False, for the Machine's owner
    TEMPLATE = "template"  # an external remediation object from remediationTemplate
    ANNOTATION = "annotation"  # metal3's host.metal3.io/external-remediation on the Machine


@dataclass(frozen=True)
class Template:
    """The remediation template, found: what an external remediation object is made of."""

    api_version: str
    kind: str  # of the remediation objects: the template's kind without "Template"
    spec: Mapping[str, Any]  # spec.template.spec


@dataclass(frozen=True)
class View:
    check: Check | None  # None: the spec cannot be honoured (spec_error says why)
    targets: tuple[Target, ...] = ()
    spec_error: str = ""  # never honoured until the spec is edited
    remediate_by: RemediateBy = RemediateBy.CONDITIONS
    template: Template | None = None
    template_missing: str = ""  # why the named template cannot be used now (may appear)
    overlaps: tuple[str, ...] = ()  # other checks selecting some of the same Machines
    status: CheckStatus = CheckStatus()
    generation: int | None = None


# ---- actions, executed in order by controllers.healthcheck ----------------------------------


@dataclass(frozen=True)
class SetMachineConditions:
    """The Machine's whole new ``status.conditions`` (only ever emitted when it differs)."""

    machine: str  # namespace/name
    conditions: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class CreateRemediation:
    """An external remediation object: the Machine's name and namespace, owned by it."""

    machine: str
    machine_uid: str
    api_version: str
    kind: str
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteRemediation:
    machine: str
    api_version: str
    kind: str
    uid: str  # precondition: never a successor created since we looked


@dataclass(frozen=True)
class RequestRemediationByAnnotation:
    machine: str


@dataclass(frozen=True)
class WithdrawAnnotation:
    machine: str


# An Event on the Machine (Cluster API records these there).
MachineEvent = TargetEvent


@dataclass(frozen=True)
class StopUntilEdited:
    """The spec can never be honoured: it is reported; nothing more until it changes."""

    message: str


Action = (
    SetMachineConditions | CreateRemediation | DeleteRemediation | RequestRemediationByAnnotation
    | WithdrawAnnotation | SetStatus[CheckStatus] | MachineEvent | StopUntilEdited | Event
)  # fmt: skip


# ---- decide --------------------------------------------------------------------------------


def decide(view: View, now: dt.datetime, settings: Settings = Settings()) -> Decision[Action]:
    if view.check is None or view.spec_error:
        problem = view.spec_error or "the spec cannot be read"
        decision = _report_blocked(view, names.REASON_INVALID_SPEC, problem, now)
        return decision.do(StopUntilEdited(problem))
    if view.remediate_by == RemediateBy.TEMPLATE and view.template is None:
        # The template usually follows the check within moments (one kubectl apply).
        problem = view.template_missing or "the remediation template cannot be used"
        decision = _report_blocked(view, names.REASON_TEMPLATE_NOT_FOUND, problem, now)
        # (the condition says InvalidSpec, as for any spec that cannot be honoured now)
        return decision.at(now + dt.timedelta(seconds=settings.template_retry))
    evaluation = evaluate(view.check, view.targets, now)
    decision = Decision[Action]()
    for target in sorted(view.targets, key=lambda t: t.machine):
        decision.then(_target(view, target, evaluation, now))
    decision.then(_status(view, evaluation, now))
    return decision.at(evaluation.next_deadline)


def _target(
    view: View, target: Target, evaluation: Evaluation, now: dt.datetime
) -> Decision[Action]:
    found = evaluation.verdicts[target.machine]
    decision = Decision[Action]()
    wanted: dict[str, tuple[str, str, str]] = {}
    remediate = target.machine in evaluation.remediate
    if found.kind == Health.UNHEALTHY:
        wanted[names.CONDITION_HEALTH_CHECK_SUCCEEDED] = ("False", found.reason, found.message)
        if remediate and view.remediate_by == RemediateBy.CONDITIONS:
            message = f"{found.reason}: {found.message}"
            waiting = ("False", REASON_WAITING_FOR_REMEDIATION, message)
            wanted[names.CONDITION_OWNER_REMEDIATED] = waiting
    elif found.kind == Health.HEALTHY and not (
        # The proposal: a passing check after a failed one does not touch the conditions
        # of a Machine its owner is remediating.
        view.remediate_by == RemediateBy.CONDITIONS and target.remediating
    ):
        wanted[names.CONDITION_HEALTH_CHECK_SUCCEEDED] = ("True", "", "")
    newly_held = _teardown_condition(target, wanted) and found.kind == Health.UNHEALTHY
    if wanted:
        conditions = merge_conditions(target.machine_conditions, wanted, now)
        if conditions != tuple(dict(c) for c in target.machine_conditions):
            decision.do(SetMachineConditions(target.machine, conditions))
    if newly_held:
        message = f"{found.reason}: {found.message}; not remediated: {target.teardown}"
        decision.do(MachineEvent(target.machine, EventType.WARNING,
                                 REASON_REMEDIATION_HELD, message))  # fmt: skip
    if remediate:
        _request(view, target, found, decision)
    elif target.machine in evaluation.withdraw:
        _withdraw(view, target, decision)
    elif found.kind == Health.WAITING and found.reason == "ConditionPending":
        message = f"Machine {target.machine} has unhealthy Node {target.node_ref or ''}"
        decision.do(_machine_event(target, EVENT_DETECTED_UNHEALTHY, message))
    return decision


def _teardown_condition(target: Target, wanted: dict[str, tuple[str, str, str]]) -> bool:
    """HostAvailableForRemediation=False while a teardown claims the Machine's host (the
    reason the Machine is not remediated, whatever its health); back to True once the
    claim is gone, on a Machine that had it (no condition on Machines never claimed).
    True when the Machine is newly reported unremediated for it (newly held, or newly
    unhealthy while held): the moment for one Warning."""
    current = condition_of(target.machine_conditions, CONDITION_HOST_AVAILABLE)
    if not target.teardown:
        if current and current.get("status") != "True":
            wanted[CONDITION_HOST_AVAILABLE] = ("True", "", "")
        return False
    wanted[CONDITION_HOST_AVAILABLE] = ("False", REASON_BEING_TORN_DOWN, target.teardown)
    checked = condition_of(target.machine_conditions, names.CONDITION_HEALTH_CHECK_SUCCEEDED)
    return current.get("status") != "False" or checked.get("status") != "False"


def _machine_event(target: Target, reason: str, message: str) -> MachineEvent:
    return MachineEvent(target.machine, EventType.NORMAL, reason, message)


def _request(view: View, target: Target, found: Verdict, decision: Decision[Action]) -> None:
    """Facts first: HealthCheckSucceeded=False is already decided before this."""
    name = target.machine.split("/", 1)[-1]
    if view.remediate_by == RemediateBy.TEMPLATE and view.template is not None:
        template = view.template
        decision.do(
            CreateRemediation(
                target.machine, target.uid, template.api_version, template.kind, template.spec
            )
        )
    elif view.remediate_by == RemediateBy.ANNOTATION:
        decision.do(RequestRemediationByAnnotation(target.machine))
    decision.note(names.REASON_REMEDIATION_REQUESTED, f"{name}: {found.reason}: {found.message}")
    message = f"Machine {target.machine} has been marked as unhealthy"
    decision.do(_machine_event(target, EVENT_MACHINE_MARKED_UNHEALTHY, message))


def _withdraw(view: View, target: Target, decision: Decision[Action]) -> None:
    name = target.machine.split("/", 1)[-1]
    if view.remediate_by == RemediateBy.TEMPLATE and view.template is not None:
        if target.remediation_uid:
            template = view.template
            decision.do(
                DeleteRemediation(
                    target.machine, template.api_version, template.kind, target.remediation_uid
                )
            )
    elif view.remediate_by == RemediateBy.ANNOTATION:
        decision.do(WithdrawAnnotation(target.machine))
    else:
        return  # conditions: the owner ends its remediation itself
    decision.note(names.REASON_REMEDIATION_WITHDRAWN, f"{name}: Node healthy again")


def _status(view: View, evaluation: Evaluation, now: dt.datetime) -> Decision[Action]:
    wanted: dict[str, tuple[str, str, str]] = {}
    if evaluation.allowed:
        wanted[names.CONDITION_REMEDIATION_ALLOWED] = ("True", "", "")
    else:
        problem = evaluation.spec_error or evaluation.blocked_reason
        reason = names.REASON_TOO_MANY_UNHEALTHY
        if evaluation.spec_error:
            reason = names.REASON_INVALID_SPEC
        wanted[names.CONDITION_REMEDIATION_ALLOWED] = ("False", reason, problem)
    counts = CheckStatus(
        expected_machines=evaluation.expected,
        current_healthy=evaluation.healthy,
        remediations_allowed=evaluation.remediations_allowed,
        targets=tuple(sorted(k.split("/", 1)[1] for k in evaluation.verdicts)),
    )
    decision = _write_status(view, counts, wanted, now)
    if _newly_blocked(view, wanted) and evaluation.unhealthy > 0:
        _, reason, message = wanted[names.CONDITION_REMEDIATION_ALLOWED]
        decision.note(reason, message, warning=True)
        if not evaluation.spec_error:  # Cluster API's name for it, beside ours
            restricted = (
                "Remediation restricted due to exceeded number of unhealthy machines"
                f" (total: {evaluation.expected}, unhealthy: {evaluation.unhealthy}): {message}"
            )
            decision.note(EVENT_REMEDIATION_RESTRICTED, restricted, warning=True)
    return decision


def _report_blocked(view: View, reason: str, problem: str, now: dt.datetime) -> Decision[Action]:
    """Remediation cannot be done at all: the condition says why (InvalidSpec), and one
    Warning (``reason``) each time what is wrong changes."""
    wanted = {names.CONDITION_REMEDIATION_ALLOWED: ("False", names.REASON_INVALID_SPEC, problem)}
    decision = _write_status(view, view.status, wanted, now)
    before = condition_of(view.status.conditions, names.CONDITION_REMEDIATION_ALLOWED)
    if before.get("status") != "False" or before.get("message") != problem:
        decision.note(reason, problem, warning=True)
    return decision


def _newly_blocked(view: View, wanted: Wanted) -> bool:
    before = condition_of(view.status.conditions, names.CONDITION_REMEDIATION_ALLOWED)
    now_blocked = wanted[names.CONDITION_REMEDIATION_ALLOWED][0] == "False"
    return now_blocked and before.get("status") != "False"


def _write_status(
    view: View, counts: CheckStatus, wanted: dict[str, tuple[str, str, str]], now: dt.datetime
) -> Decision[Action]:
    """The status with ``counts`` and ``wanted`` conditions (and the overlap condition),
    written only if it differs from what is there."""
    decision = Decision[Action]()
    overlapping = names.REASON_OVERLAPPING
    had_overlap = bool(condition_of(view.status.conditions, overlapping))
    if view.overlaps:
        others = ", ".join(view.overlaps)
        message = f"Machines also selected by {others}: their verdicts may disagree"
        wanted[overlapping] = ("True", overlapping, message)
        if not had_overlap:
            decision.note(overlapping, message, warning=True)
    conditions = merge_conditions(view.status.conditions, wanted, now)
    if not view.overlaps:
        conditions = tuple(c for c in conditions if c.get("type") != overlapping)
    new = replace(counts, observed_generation=view.generation, conditions=conditions)
    if new.to_wire({}) != view.status.to_wire({}):
        decision.do(SetStatus(new))
    return decision
