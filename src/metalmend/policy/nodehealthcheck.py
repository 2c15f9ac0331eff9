"""NodeHealthCheck, pure: a health check of Nodes for clusters without Cluster API
Machines (kubeadm, k3s, Talos on bare metal), on the model of medik8s's NodeHealthCheck
(node-healthcheck-operator, ``api/v1alpha1``), in metalmend's own group
``healthcheck.metalmend.dev`` (docs/healthcheck.md, "NodeHealthCheck").

``decide(view, now)`` reads one check and the Nodes it selects, as observed, and returns
what to do: the remediations to create (a Metal3Remediation in the Node's host's
namespace, named after the Node, so that the fence-first flow of metal3-remediation runs
it) or to delete (the Node is healthy again), the check's status as NHC reports it, the
Events, and the next deadline (an unhealthy condition reaching its duration).

Shared with the MachineHealthCheck (policy.healthcheck), because the semantics are the
same: the duration parser, a condition's timeout (``verdict`` of a Target whose Node
exists: rule 6 there), the percentage arithmetic of ``maxUnhealthy`` (rounded down), the
condition merge. What differs, and why:

- ``minHealthy`` (NHC's): remediation only while healthy >= minHealthy (a count, or a
  percentage of the selected Nodes rounded up, as NHC); ``maxUnhealthy`` (a count or a
  percentage rounded down): only while unhealthy <= maxUnhealthy. At most one of them
  (the schema refuses both); neither: minHealthy 51%, NHC's default;
- healthy counts as in the MachineHealthCheck: a Node whose unhealthy condition has not
  lasted its duration yet, or that is being deleted, is *not* healthy (NHC counts it
  healthy). In a partition Nodes go NotReady seconds apart; counting them healthy would
  let the first expiries through before the short-circuit sees the rest;
- a Node without a BareMetalHost (no operator link, no metal3 providerID naming one, or
  a host that does not confirm it) is reported unhealthy (status, Event) and never
  remediated: there is nothing metalmend can fence it with;
- a Node whose host a teardown claims is reported, not remediated (docs/design.md,
  invariant 7), as in the MachineHealthCheck;
- ``pauseRequests`` (NHC's): while any is there, no new remediation starts; those in
  flight go on, and those of Nodes healthy again are still deleted.

Every input the CRD schema admits evaluates; a spec that cannot be honoured raises
``InvalidSpec`` from ``check_from_spec`` (the controller reports it: phase Disabled).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metalmend.api.stamps import parse_stamp, stamp
from metalmend.policy import healthcheck as machine_policy
from metalmend.policy.decision import Decision, Event, EventType
from metalmend.policy.healthcheck import (
    INT32_MAX,
    Health,
    InvalidSpec,
    NodeCondition,
    Target,
    UnhealthyCondition,
    merge_conditions,
    parse_duration,
    scaled,
)

DEFAULT_MIN_HEALTHY = "51%"  # NHC's default
# NHC's default unhealthyConditions: Ready False or Unknown for 300 s.
DEFAULT_CONDITIONS = (
    UnhealthyCondition("Ready", "False", 300.0),
    UnhealthyCondition("Ready", "Unknown", 300.0),
)

# NHC's phases, condition and Event reasons (node-healthcheck-operator, api/v1alpha1 and
# its controller).
PHASE_DISABLED = "Disabled"
PHASE_PAUSED = "Paused"
PHASE_REMEDIATING = "Remediating"
PHASE_ENABLED = "Enabled"
CONDITION_DISABLED = "Disabled"
CONDITION_STORM_ACTIVE = "StormActive"
REASON_STORM_STARTED = "StormStarted"
REASON_STORM_ENDED = "StormEnded"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_TEMPLATE_NOT_FOUND = "RemediationTemplateNotFound"
REASON_ENABLED = "Enabled"
EVENT_REMEDIATION_CREATED = "RemediationCreated"
EVENT_REMEDIATION_REMOVED = "RemediationRemoved"
EVENT_REMEDIATION_SKIPPED = "RemediationSkipped"
EVENT_DISABLED = "Disabled"
EVENT_ENABLED = "Enabled"
# metalmend's own: an unhealthy Node that nothing can fence (no host found).
EVENT_NO_HOST = "NoBareMetalHost"
EVENT_NODE_UNHEALTHY = "NodeUnhealthy"

REMEDIATION_API = "remediation.metal3.io/v1alpha1"
REMEDIATION_KIND = "Metal3Remediation"


@dataclass(frozen=True)
class Check:
    unhealthy_conditions: tuple[UnhealthyCondition, ...] = DEFAULT_CONDITIONS
    min_healthy: int | str | None = None
    max_unhealthy: int | str | None = None
    pause_requests: tuple[str, ...] = ()
    storm_cooldown: float | None = None  # seconds; None: no cooldown after a storm


def check_from_spec(spec: Mapping[str, Any]) -> Check:
    """A NodeHealthCheck spec (as stored) as this policy reads it; InvalidSpec says what is
    wrong. The selector and the template are the controller's."""
    if not isinstance(spec, Mapping):
        raise InvalidSpec("spec must be an object")
    entries = spec.get("unhealthyConditions")
    rules = []
    if entries is not None:
        if not isinstance(entries, list):
            raise InvalidSpec("unhealthyConditions must be a list")
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise InvalidSpec(f"unhealthyConditions[{index}] must be an object")
            kind, status = entry.get("type"), entry.get("status")
            if not isinstance(kind, str) or not isinstance(status, str) or not kind or not status:
                raise InvalidSpec(f"unhealthyConditions[{index}] needs a type and a status")
            duration = parse_duration(entry.get("duration"))
            if duration is None:
                raise InvalidSpec(f"unhealthyConditions[{index}] needs a duration")
            rules.append(UnhealthyCondition(kind, status, duration))
    minimum, maximum = spec.get("minHealthy"), spec.get("maxUnhealthy")
    for label, value in (("minHealthy", minimum), ("maxUnhealthy", maximum)):
        if value is not None and scaled(value, 0) is None:
            raise InvalidSpec(f"{label} {value!r} is neither a count nor a percentage")
    if minimum is not None and maximum is not None:
        raise InvalidSpec("minHealthy and maxUnhealthy are mutually exclusive: set one")
    pauses = spec.get("pauseRequests") or []
    if not isinstance(pauses, list) or not all(isinstance(p, str) for p in pauses):
        raise InvalidSpec("pauseRequests must be a list of strings")
    return Check(
        unhealthy_conditions=tuple(rules) if entries is not None else DEFAULT_CONDITIONS,
        min_healthy=minimum,
        max_unhealthy=maximum,
        pause_requests=tuple(pauses),
        storm_cooldown=parse_duration(spec.get("stormCooldownDuration")),
    )


def short_circuit(check: Check, expected: int, healthy: int) -> tuple[bool, int, str]:
    """(allowed, remediations still allowed, why blocked)."""
    unhealthy = expected - healthy
    if check.max_unhealthy is not None:
        # the MachineHealthCheck's arithmetic, the same field
        allowed, left, why, _ = machine_policy.short_circuit(
            machine_policy.Check(max_unhealthy=check.max_unhealthy), expected, unhealthy
        )
        return allowed, min(left, INT32_MAX), why
    wanted = check.min_healthy if check.min_healthy is not None else DEFAULT_MIN_HEALTHY
    minimum = scaled(wanted, expected, round_up=True) or 0
    if healthy >= minimum:
        return True, min(healthy - minimum, INT32_MAX), ""
    return (
        False,
        0,
        (
            f"{healthy} of {expected} selected Nodes healthy, fewer than minHealthy {wanted}"
            f" ({minimum})"
        ),
    )


@dataclass(frozen=True)
class Remediation:
    """A Metal3Remediation made for a Node (found by its node annotation)."""

    namespace: str
    name: str
    uid: str
    started: dt.datetime | None  # creationTimestamp


@dataclass(frozen=True)
class NodeTarget:
    """One selected Node as the check reads it."""

    name: str
    uid: str
    conditions: Mapping[str, NodeCondition] = field(default_factory=dict)
    deleting: bool = False
    host: str = ""  # "namespace/name" of its BareMetalHost ("" none found)
    host_problem: str = ""  # why no host (when ``host`` is "")
    remediation: Remediation | None = None
    teardown: str = ""  # why its host may not be remediated now (policy.interlock)
    # False: no such Node is selected now, but this check's remediation of it is there
    # (fencing deleted the Node, or the selector changed): reported, never healthy
    exists: bool = True


@dataclass(frozen=True)
class Template:
    """What a Metal3Remediation is made of: the template's spec.template.spec (or
    metalmend's default)."""

    spec: Mapping[str, Any]


@dataclass(frozen=True)
class NodeCheckStatus:
    """``status`` of a NodeHealthCheck, as NHC writes it (the fields this controller owns)."""

    observed_nodes: int | None = None
    healthy_nodes: int | None = None
    unhealthy_nodes: tuple[Mapping[str, Any], ...] = ()
    in_flight: Mapping[str, str] = field(default_factory=dict)
    phase: str | None = None
    reason: str | None = None
    observed_generation: int | None = None
    conditions: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_wire(cls, status: Mapping[str, Any] | None) -> NodeCheckStatus:
        """Tolerant: a field of the wrong shape reads as absent; never raises."""
        status = status if isinstance(status, Mapping) else {}
        unhealthy = status.get("unhealthyNodes")
        flights = status.get("inFlightRemediations")
        conditions = status.get("conditions")
        return cls(
            observed_nodes=_int(status.get("observedNodes")),
            healthy_nodes=_int(status.get("healthyNodes")),
            unhealthy_nodes=tuple(
                dict(u) for u in unhealthy if isinstance(u, Mapping)
            ) if isinstance(unhealthy, list) else (),
            in_flight={
                str(k): str(v) for k, v in flights.items()
            } if isinstance(flights, Mapping) else {},
            phase=status.get("phase") if isinstance(status.get("phase"), str) else None,
            reason=status.get("reason") if isinstance(status.get("reason"), str) else None,
            observed_generation=_int(status.get("observedGeneration")),
            conditions=tuple(
                dict(c) for c in conditions if isinstance(c, Mapping)
            ) if isinstance(conditions, list) else (),
        )  # fmt: skip

    def to_wire(self, status: Mapping[str, Any] | None) -> dict[str, Any]:
        """The whole new status: our fields replaced (None or empty removes one)."""
        new = dict(status) if isinstance(status, Mapping) else {}
        values: dict[str, Any] = {
            "observedNodes": self.observed_nodes,
            "healthyNodes": self.healthy_nodes,
            "unhealthyNodes": [dict(u) for u in self.unhealthy_nodes] or None,
            "inFlightRemediations": dict(self.in_flight) or None,
            "phase": self.phase,
            "reason": self.reason,
            "observedGeneration": self.observed_generation,
            "conditions": [dict(c) for c in self.conditions] or None,
        }
        for name, value in values.items():
            if value is None:
                new.pop(name, None)
            else:
                new[name] = value
        return new

    def unhealthy_names(self) -> set[str]:
        return {str(u.get("name")) for u in self.unhealthy_nodes if u.get("name")}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class View:
    check: Check | None  # None: the spec cannot be honoured (spec_error says why)
    targets: tuple[NodeTarget, ...] = ()
    spec_error: str = ""
    template: Template | None = None  # None with template_missing: named but not found
    template_missing: str = ""
    status: NodeCheckStatus = NodeCheckStatus()
    generation: int | None = None


# ---- actions, executed in order by controllers.nodehealthcheck ------------------------------


@dataclass(frozen=True)
class CreateRemediation:
    """A Metal3Remediation named after the Node, in its host's namespace, owned by the
    check, carrying the Node's name (names.REMEDIATED_NODE) for metal3-remediation."""

    node: str
    node_uid: str
    host: str  # namespace/name
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteRemediation:
    node: str
    namespace: str
    name: str
    uid: str  # precondition: never a successor created since we looked


@dataclass(frozen=True)
class SetStatus:
    status: NodeCheckStatus


@dataclass(frozen=True)
class NodeEvent:
    """An Event on the Node."""

    node: str
    type: EventType
    reason: str
    message: str


Action = CreateRemediation | DeleteRemediation | SetStatus | NodeEvent | Event


# ---- decide --------------------------------------------------------------------------------


def verdict(check: Check, target: NodeTarget, now: dt.datetime) -> machine_policy.Verdict:
    """The MachineHealthCheck's condition rule (its rule 6) on the Node; a Node being
    deleted is never healthy (it waits)."""
    as_machine = Target(
        machine=target.name,
        created=now,
        node_ref=target.name,
        node_exists=True,
        conditions=target.conditions,
        deleting=target.deleting,
    )
    rules = machine_policy.Check(unhealthy_conditions=check.unhealthy_conditions)
    found = machine_policy.verdict(rules, as_machine, now)
    if not target.exists:
        message = "the Node is not there (or no longer selected); its remediation goes on"
        return machine_policy.Verdict(Health.WAITING, "NodeNotFound", message)
    if found.kind == Health.WAITING and target.deleting:
        return machine_policy.Verdict(Health.WAITING, "NodeDeleting", "the Node is being deleted")
    return found


def decide(view: View, now: dt.datetime) -> Decision[Action]:
    if view.check is None or view.spec_error or view.template is None:
        if view.check is None or view.spec_error:
            reason, problem = REASON_INVALID_SPEC, view.spec_error or "the spec cannot be read"
        else:
            reason = REASON_TEMPLATE_NOT_FOUND
            problem = view.template_missing or "the remediation template cannot be used"
        return _disabled(view, reason, problem, now)
    check, template = view.check, view.template
    verdicts = {t.name: verdict(check, t, now) for t in view.targets}
    expected = len(view.targets)
    healthy = sum(1 for v in verdicts.values() if v.kind == Health.HEALTHY)
    allowed, _, blocked = short_circuit(check, expected, healthy)
    paused = bool(check.pause_requests)
    decision = Decision[Action]()
    wanted: dict[str, tuple[str, str, str]] = {CONDITION_DISABLED: ("False", REASON_ENABLED, "")}
    cooling = _storm(view, check, allowed, blocked, wanted, decision, now)
    report = _Report(view.status.unhealthy_names())
    for target in sorted(view.targets, key=lambda t: t.name):
        found = verdicts[target.name]
        decision.at(found.deadline)
        start = allowed and not paused and not cooling
        report.target(target, found, start, template, decision, now)
    phase, reason = PHASE_ENABLED, "NHC is enabled, no ongoing remediation"
    if paused:
        phase = PHASE_PAUSED
        reason = f"NHC is paused: {', '.join(check.pause_requests)}"
    elif report.in_flight:
        phase, reason = PHASE_REMEDIATING, f"NHC is remediating {len(report.in_flight)} Nodes"
    if cooling and not paused:
        reason = f"{reason}; no new remediation: {cooling}"
    status = NodeCheckStatus(
        observed_nodes=min(expected, INT32_MAX),
        healthy_nodes=min(healthy, INT32_MAX),
        unhealthy_nodes=tuple(report.unhealthy),
        in_flight=report.in_flight,
        phase=phase,
        reason=reason,
        observed_generation=view.generation,
        conditions=_conditions(view.status.conditions, wanted, now),
    )
    newly_skipped = [n for n in report.skipped if n not in report.before]
    if newly_skipped:
        why = (
            "there are pause requests" if paused
            else f"it is short-circuited: {blocked}" if not allowed
            else cooling
        )  # fmt: skip
        nodes = ", ".join(newly_skipped)
        decision.note(EVENT_REMEDIATION_SKIPPED, f"Skipped remediation of {nodes}: {why}")
    if view.status.phase == PHASE_DISABLED:
        decision.note(EVENT_ENABLED, "the check can be honoured again")
    return _write(view, status, decision)


def _storm(
    view: View,
    check: Check,
    allowed: bool,
    blocked: str,
    wanted: dict[str, tuple[str, str, str]],
    decision: Decision[Action],
    now: dt.datetime,
) -> str:
    """NHC's storm recovery, where ``stormCooldownDuration`` is set: while the
    short-circuit blocks, a storm is on (StormActive=True); once it lets remediation
    through again, no new remediation starts for the cooldown (counted from StormActive's
    transition to False, which the status keeps: a restart does not shorten it). Remediations
    made in the storm's last moments may still be bringing Nodes back. Returns why new
    remediations wait ("" when they may start)."""
    if check.storm_cooldown is None:
        return ""
    before = machine_policy.condition_of(view.status.conditions, CONDITION_STORM_ACTIVE)
    if not allowed:
        wanted[CONDITION_STORM_ACTIVE] = ("True", REASON_STORM_STARTED, blocked)
        return ""
    if before.get("status") != "True" and not before:
        return ""  # never a storm
    ended = now if before.get("status") == "True" else _time(before.get("lastTransitionTime"))
    wanted[CONDITION_STORM_ACTIVE] = ("False", REASON_STORM_ENDED, "")
    until = machine_policy.after(ended or now, check.storm_cooldown)
    if until is None or now < until:
        decision.at(until)
        return f"a storm ended at {stamp(ended or now)}; cooling down until" + (
            f" {stamp(until)}" if until else " further notice"
        )
    return ""


def _time(text: Any) -> dt.datetime | None:
    try:
        return parse_stamp(text) if isinstance(text, str) else None
    except (ValueError, OverflowError):
        return None


@dataclass
class _Report:
    """The unhealthy Nodes of one evaluation, as the status lists them."""

    before: set[str]  # unhealthy in the status as read: Events only for newcomers
    unhealthy: list[Mapping[str, Any]] = field(default_factory=list)
    in_flight: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def target(
        self,
        target: NodeTarget,
        found: machine_policy.Verdict,
        allowed: bool,
        template: Template,
        decision: Decision[Action],
        now: dt.datetime,
    ) -> None:
        remediation = target.remediation
        if found.kind == Health.HEALTHY:
            if remediation is not None and remediation.uid:
                decision.do(DeleteRemediation(
                    target.name, remediation.namespace, remediation.name, remediation.uid
                ))  # fmt: skip
                message = f"Deleted remediation of Node {target.name}: healthy again"
                decision.note(EVENT_REMEDIATION_REMOVED, message)
            return
        if found.kind != Health.UNHEALTHY and remediation is None:
            return  # waiting: not healthy (counted so), not unhealthy yet
        entry: dict[str, Any] = {"name": target.name}
        self.unhealthy.append(entry)
        if remediation is not None:
            started = stamp(remediation.started or now)
            entry["remediations"] = [{"resource": _resource(remediation), "started": started}]
            self.in_flight[target.name] = started
            return
        newly = target.name not in self.before
        why = f"{found.reason}: {found.message}"
        if newly:
            message = f"Node {target.name} is unhealthy: {why}"
            decision.do(NodeEvent(target.name, EventType.WARNING, EVENT_NODE_UNHEALTHY, message))
        if not target.host:
            if newly:
                problem = target.host_problem or "no BareMetalHost found"
                message = f"Node {target.name} is unhealthy ({why}), not remediated: {problem}"
                decision.do(NodeEvent(target.name, EventType.WARNING, EVENT_NO_HOST, message))
                decision.note(EVENT_NO_HOST, message, warning=True)
        elif target.teardown:
            if newly:
                message = f"Node {target.name} is not remediated: {target.teardown}"
                decision.note(EVENT_REMEDIATION_SKIPPED, message)
        elif target.deleting:
            return
        elif not allowed:
            self.skipped.append(target.name)
        else:
            spec = dict(template.spec)
            decision.do(CreateRemediation(target.name, target.uid, target.host, spec))
            message = f"Created remediation of Node {target.name} (host {target.host}): {why}"
            decision.note(EVENT_REMEDIATION_CREATED, message)


def _resource(remediation: Remediation) -> dict[str, str]:
    return {
        "apiVersion": REMEDIATION_API,
        "kind": REMEDIATION_KIND,
        "namespace": remediation.namespace,
        "name": remediation.name,
        "uid": remediation.uid,
    }


def _conditions(
    current: Sequence[Mapping[str, Any]], wanted: machine_policy.Wanted, now: dt.datetime
) -> tuple[Mapping[str, Any], ...]:
    merged = merge_conditions(current, wanted, now)
    # Kubernetes' condition shape (no Cluster API severity); reason is required there.
    return tuple({k: v for k, v in c.items() if k != "severity"} for c in merged)


def _disabled(view: View, reason: str, problem: str, now: dt.datetime) -> Decision[Action]:
    """The check cannot be honoured: phase Disabled and the Disabled condition say why;
    one Warning each time what is wrong changes. Remediations in flight are left alone."""
    wanted = {CONDITION_DISABLED: ("True", reason, problem)}
    status = NodeCheckStatus(
        observed_nodes=view.status.observed_nodes,
        healthy_nodes=view.status.healthy_nodes,
        unhealthy_nodes=view.status.unhealthy_nodes,
        in_flight=view.status.in_flight,
        phase=PHASE_DISABLED,
        reason=f"{reason}: {problem}",
        observed_generation=view.generation,
        conditions=_conditions(view.status.conditions, wanted, now),
    )
    decision = Decision[Action]()
    if view.status.phase != PHASE_DISABLED or view.status.reason != status.reason:
        decision.note(EVENT_DISABLED, f"{reason}: {problem}", warning=True)
    return _write(view, status, decision)


def _write(view: View, status: NodeCheckStatus, decision: Decision[Action]) -> Decision[Action]:
    """Status first (the facts), then the rest; written only if it differs."""
    if status.to_wire({}) != view.status.to_wire({}):
        return Decision[Action]().do(SetStatus(status)).then(decision)
    return decision
