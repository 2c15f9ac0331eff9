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
- a check acts on a host only through a template of that host's namespace (its templates
  are all of one namespace; one is required): a Node whose host is elsewhere is reported
  (status ``notRemediated``, a ``HostOutsideTemplateNamespace`` Event), never remediated.
  The check is cluster-scoped and its creator need have no rights in any namespace, so the
  template's namespace is what says where it may act (docs/security.md);
- ``pauseRequests`` (NHC's): while any is there, no new remediation starts; those in
  flight go on, and those of Nodes healthy again are still deleted.

Escalation and ``healthyDelay`` are NHC's (``resources/templates.go``, ``manager.go`` and
the controller's ``remediate``): the templates in ``order``; the current one is the first
whose kind has no timed-out remediation for the Node; a remediation that has not brought the
Node back within its ``timeout`` (counted from its creation), or whose ``Succeeded`` is
False, gets the timed-out annotation (unless ``Succeeded`` is True) and ``timedOut`` in the
status, and the next template's object is created. Where the escalation stands is stored
twice, so that a restart at any point resumes it: in the status (``timedOut``) and on the
objects (the annotation; the deadline is their creation time). A healthy Node with
remediations is not healthy until they are gone: they are deleted at once, after
``healthyDelay`` (counted from the healthy-delay annotation the first healthy look puts on
them), or, with a negative delay, never automatically; the Node's manually-confirmed-healthy
annotation cuts the delay short and is removed once they are gone.

Every input the CRD schema admits evaluates; a spec that cannot be honoured raises
``InvalidSpec`` from ``check_from_spec`` (the controller reports it: phase Disabled).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metalmend.api import names
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.policy import healthcheck as machine_policy
from metalmend.policy.decision import Decision, Event, EventType, TargetEvent
from metalmend.policy.decision import SetStatus as SetStatus  # shared; its controller matches it
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
EVENT_NO_TEMPLATE_LEFT = "NoTemplateLeft"
# metalmend's own: NHC only logs it.
EVENT_REMEDIATION_TIMED_OUT = "RemediationTimedOut"
# metalmend's own: an unhealthy Node that nothing can fence (no host found).
EVENT_NO_HOST = "NoBareMetalHost"
# metalmend's own: an unhealthy Node whose host is outside the namespace of the check's
# templates (a check acts on a host only through a template of that host's namespace).
EVENT_OTHER_NAMESPACE = "HostOutsideTemplateNamespace"
EVENT_NODE_UNHEALTHY = "NodeUnhealthy"

REMEDIATION_API = "remediation.metal3.io/v1alpha1"
REMEDIATION_KIND = "Metal3Remediation"
FENCE_API = "remediation.metalmend.dev/v1alpha1"
FENCE_KIND = "FenceRemediation"
# The template kinds a NodeHealthCheck may name, with their objects' apiVersion.
TEMPLATE_API = {
    f"{REMEDIATION_KIND}Template": REMEDIATION_API,
    f"{FENCE_KIND}Template": FENCE_API,
}
NO_TEMPLATE = (
    "set remediationTemplate or escalatingRemediations: a check remediates only the hosts of"
    " its template's namespace, and without one it would reach every namespace's"
)
# NHC's webhook: "a minimum of 60s is enforced" (a safeguard against parallel remediations).
MIN_ESCALATION_TIMEOUT = 60.0


@dataclass(frozen=True)
class TemplateRef:
    """A remediationTemplate reference: a Metal3RemediationTemplate or FenceRemediationTemplate."""

    kind: str
    namespace: str
    name: str

    @property
    def remediation_kind(self) -> str:
        return self.kind.removesuffix("Template")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Step:
    """One remediation of the escalation (``ref`` None: metalmend's default, no template;
    ``timeout`` None: a single template, never timed out)."""

    ref: TemplateRef | None = None
    order: int = 0
    timeout: float | None = None

    @property
    def remediation_kind(self) -> str:
        return self.ref.remediation_kind if self.ref is not None else REMEDIATION_KIND


@dataclass(frozen=True)
class Check:
    unhealthy_conditions: tuple[UnhealthyCondition, ...] = DEFAULT_CONDITIONS
    min_healthy: int | str | None = None
    max_unhealthy: int | str | None = None
    pause_requests: tuple[str, ...] = ()
    storm_cooldown: float | None = None  # seconds; None: no cooldown after a storm
    steps: tuple[Step, ...] = (Step(),)  # in order
    healthy_delay: float | None = None  # seconds; negative: never automatically

    @property
    def namespace(self) -> str:
        """The namespace whose hosts the check may remediate: its templates' ("" without
        one: none)."""
        refs = [s.ref for s in self.steps if s.ref is not None]
        return refs[0].namespace if refs else ""


def template_ref(ref: Any, where: str) -> TemplateRef:
    if not isinstance(ref, Mapping):
        raise InvalidSpec(f"{where} must be an object")
    kind = ref.get("kind") or f"{REMEDIATION_KIND}Template"
    if kind not in TEMPLATE_API:
        raise InvalidSpec(f"{where}.kind {kind!r}: one of {', '.join(sorted(TEMPLATE_API))}")
    api = ref.get("apiVersion")
    if api is not None and api != TEMPLATE_API[kind]:
        raise InvalidSpec(f"{where}.apiVersion of a {kind} is {TEMPLATE_API[kind]}, not {api!r}")
    namespace, name = ref.get("namespace"), ref.get("name")
    if not isinstance(namespace, str) or not namespace or not isinstance(name, str) or not name:
        raise InvalidSpec(f"{where} needs a namespace and a name")
    return TemplateRef(kind, namespace, name)


def steps_from_spec(spec: Mapping[str, Any]) -> tuple[Step, ...]:
    """NHC's rules (its webhook): remediationTemplate or escalatingRemediations, not both;
    unique orders; one template per kind (NHC allows several of a kind only for templates
    annotated for it, which metalmend does not name objects for); timeouts of 60s or more."""
    single, escalating = spec.get("remediationTemplate"), spec.get("escalatingRemediations")
    if single is not None and escalating is not None:
        raise InvalidSpec(
            "remediationTemplate and escalatingRemediations are mutually exclusive: set one"
        )
    if escalating is None:
        if not single:
            raise InvalidSpec(NO_TEMPLATE)
        return (Step(template_ref(single, "remediationTemplate")),)
    if not isinstance(escalating, list) or not escalating:
        raise InvalidSpec("escalatingRemediations must be a non-empty list")
    steps = []
    for index, entry in enumerate(escalating):
        where = f"escalatingRemediations[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidSpec(f"{where} must be an object")
        ref = template_ref(entry.get("remediationTemplate"), f"{where}.remediationTemplate")
        order = entry.get("order")
        if not isinstance(order, int) or isinstance(order, bool):
            raise InvalidSpec(f"{where}.order must be an integer")
        timeout = parse_duration(entry.get("timeout"))
        if timeout is None or timeout < MIN_ESCALATION_TIMEOUT:
            raise InvalidSpec(f"{where}.timeout must be at least one minute (60s)")
        steps.append(Step(ref, order, timeout))
    orders = [s.order for s in steps]
    if len(set(orders)) != len(orders):
        raise InvalidSpec("escalatingRemediations: each order must be unique")
    kinds = [s.remediation_kind for s in steps]
    if len(set(kinds)) != len(kinds):
        raise InvalidSpec("escalatingRemediations: one template per kind")
    spaces = sorted({s.ref.namespace for s in steps if s.ref is not None})
    if len(spaces) > 1:
        raise InvalidSpec(
            f"escalatingRemediations: templates of namespaces {', '.join(spaces)}; a check"
            " remediates only the hosts of its templates' namespace, so they must share one"
        )
    return tuple(sorted(steps, key=lambda s: s.order))


def signed_duration(text: Any) -> float | None:
    """healthyDelay: a duration, or a negative one ("-1s": never automatically)."""
    if isinstance(text, str) and text.strip().startswith("-"):
        seconds = parse_duration(text.strip()[1:])
        return -seconds if seconds is not None else None
    return parse_duration(text)


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
        steps=steps_from_spec(spec),
        healthy_delay=signed_duration(spec.get("healthyDelay")),
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
    """A remediation object this check made for a Node (found by its node annotation)."""

    namespace: str
    name: str
    uid: str  # "" while it is being deleted: it still counts, but is not deleted again
    started: dt.datetime | None  # creationTimestamp
    kind: str = REMEDIATION_KIND
    timed_out: dt.datetime | None = None  # its timed-out annotation
    healthy_since: dt.datetime | None = None  # its healthy-delay annotation
    succeeded: bool | None = None  # its Succeeded condition (None: absent or Unknown)
    template: str = ""  # its template-name annotation

    @property
    def api_version(self) -> str:
        return FENCE_API if self.kind == FENCE_KIND else REMEDIATION_API


@dataclass(frozen=True)
class NodeTarget:
    """One selected Node as the check reads it."""

    name: str
    uid: str
    conditions: Mapping[str, NodeCondition] = field(default_factory=dict)
    deleting: bool = False
    host: str = ""  # "namespace/name" of its BareMetalHost ("" none found)
    host_problem: str = ""  # why no host (when ``host`` is "")
    remediations: tuple[Remediation, ...] = ()
    teardown: str = ""  # why its host may not be remediated now (policy.interlock)
    # False: no such Node is selected now, but this check's remediation of it is there
    # (fencing deleted the Node, or the selector changed): reported, never healthy
    exists: bool = True
    confirmed_healthy: bool = False  # the Node's manually-confirmed-healthy annotation


@dataclass(frozen=True)
class Template:
    """What a remediation object is made of: the template's spec.template.spec (or
    metalmend's default), for the step of the same index."""

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
    templates: tuple[Template, ...] = ()  # one per check.steps
    template_missing: str = ""  # a named template not found
    status: NodeCheckStatus = NodeCheckStatus()
    generation: int | None = None


# ---- actions, executed in order by controllers.nodehealthcheck ------------------------------


@dataclass(frozen=True)
class CreateRemediation:
    """A remediation object (``kind``) named after the Node, in its host's namespace, owned
    by the check, carrying the Node's name (names.REMEDIATED_NODE and NHC's node-name) and
    its template's name."""

    node: str
    node_uid: str
    host: str  # namespace/name
    spec: Mapping[str, Any]
    kind: str = REMEDIATION_KIND
    template: str = ""


@dataclass(frozen=True)
class DeleteRemediation:
    node: str
    namespace: str
    name: str
    uid: str  # precondition: never a successor created since we looked
    kind: str = REMEDIATION_KIND


@dataclass(frozen=True)
class AnnotateRemediation:
    """Set NHC's timed-out or healthy-delay annotation on a remediation object (if it still
    has ``uid``)."""

    kind: str
    namespace: str
    name: str
    uid: str
    key: str
    value: str


@dataclass(frozen=True)
class ClearNodeAnnotation:
    """Remove an annotation from a Node (NHC's manually-confirmed-healthy, once used)."""

    node: str
    key: str


# An Event on the Node.
NodeEvent = TargetEvent


Action = (
    CreateRemediation
    | DeleteRemediation
    | AnnotateRemediation
    | ClearNodeAnnotation
    | SetStatus[NodeCheckStatus]
    | NodeEvent
    | Event
)


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
    check = view.check
    if check is None or view.spec_error:
        problem = view.spec_error or "the spec cannot be read"
        return _disabled(view, REASON_INVALID_SPEC, problem, now)
    if view.template_missing or len(view.templates) != len(check.steps):
        problem = view.template_missing or "the remediation template cannot be used"
        return _disabled(view, REASON_TEMPLATE_NOT_FOUND, problem, now)
    verdicts = {t.name: verdict(check, t, now) for t in view.targets}
    expected = len(view.targets)
    # as NHC: a Node is healthy only once no remediation of it is left
    healthy = sum(
        1 for t in view.targets if verdicts[t.name].kind == Health.HEALTHY and not t.remediations
    )
    allowed, _, blocked = short_circuit(check, expected, healthy)
    paused = bool(check.pause_requests)
    decision = Decision[Action]()
    wanted: dict[str, tuple[str, str, str]] = {CONDITION_DISABLED: ("False", REASON_ENABLED, "")}
    cooling = _storm(view, check, allowed, blocked, wanted, decision, now)
    report = _Report(view.status.unhealthy_nodes, check, view.templates, decision, now)
    for target in sorted(view.targets, key=lambda t: t.name):
        found = verdicts[target.name]
        decision.at(found.deadline)
        start = allowed and not paused and not cooling
        report.target(target, found, start)
    remediating = [u for u in report.unhealthy if u.get("remediations")]
    phase, reason = PHASE_ENABLED, "NHC is enabled, no ongoing remediation"
    if paused:
        phase = PHASE_PAUSED
        reason = f"NHC is paused: {', '.join(check.pause_requests)}"
    elif remediating:
        phase, reason = PHASE_REMEDIATING, f"NHC is remediating {len(remediating)} Nodes"
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
    """The unhealthy Nodes of one evaluation, as the status lists them, and what is done
    for each."""

    prior: Sequence[Mapping[str, Any]]  # status.unhealthyNodes as read
    check: Check
    templates: Sequence[Template]
    decision: Decision[Action]
    now: dt.datetime
    unhealthy: list[Mapping[str, Any]] = field(default_factory=list)
    in_flight: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def before(self) -> set[str]:
        """Unhealthy in the status as read: Events only for newcomers."""
        return {str(u.get("name")) for u in self.prior if u.get("name")}

    def earlier(self, node: str) -> Mapping[str, Any]:
        return next((u for u in self.prior if u.get("name") == node), {})

    def target(self, target: NodeTarget, found: machine_policy.Verdict, allowed: bool) -> None:
        decision = self.decision
        remediations = target.remediations
        earlier = self.earlier(target.name)
        timed = _timed_out(earlier, remediations)
        if found.kind == Health.HEALTHY:
            if not remediations:
                if target.confirmed_healthy:  # used: NHC removes it once all are gone
                    decision.do(ClearNodeAnnotation(target.name, names.NHC_CONFIRMED_HEALTHY))
                return
            self.healthy_again(target, earlier, timed)
            return
        if found.kind != Health.UNHEALTHY and not remediations and not timed:
            return  # waiting: not healthy (counted so), not unhealthy yet
        entry: dict[str, Any] = {"name": target.name}
        self.unhealthy.append(entry)
        if found.kind != Health.UNHEALTHY or target.deleting:
            # waiting, gone or being deleted, with remediations: in flight, left alone
            self.listed(entry, target, earlier, timed)
            return
        newly = target.name not in self.before
        why = f"{found.reason}: {found.message}"
        if newly and not remediations:
            message = f"Node {target.name} is unhealthy: {why}"
            decision.do(NodeEvent(target.name, EventType.WARNING, EVENT_NODE_UNHEALTHY, message))
        outside = outside_problem(self.check, target.host)
        if not target.host or outside:
            problem = outside or target.host_problem or "no BareMetalHost found"
            entry["notRemediated"] = problem
            if newly and not remediations:
                reason = EVENT_OTHER_NAMESPACE if outside else EVENT_NO_HOST
                message = f"Node {target.name} is unhealthy ({why}), not remediated: {problem}"
                decision.do(NodeEvent(target.name, EventType.WARNING, reason, message))
                decision.note(reason, message, warning=True)
        elif target.teardown:  # held: nothing new on a host a teardown claims
            if newly and not remediations:
                message = f"Node {target.name} is not remediated: {target.teardown}"
                decision.note(EVENT_REMEDIATION_SKIPPED, message)
        elif not allowed:
            if not remediations and not timed:
                self.skipped.append(target.name)
        else:
            self.escalate(target, timed, why)
        self.listed(entry, target, earlier, timed)

    def escalate(self, target: NodeTarget, timed: dict[str, str], why: str) -> None:
        """NHC's ``remediate``: the current step's object made, or timed out (then the next
        one's made); the timed-out annotation put back on any object the status says timed
        out that lacks it (a restart between the two writes)."""
        decision, now = self.decision, self.now
        by_kind: dict[str, Remediation] = {}
        for remediation in target.remediations:
            by_kind.setdefault(remediation.kind, remediation)
            mark = timed.get(remediation.kind)
            lacking = remediation.uid and remediation.timed_out is None
            if mark and lacking and remediation.succeeded is not True:
                decision.do(_annotate(remediation, names.NHC_TIMED_OUT, mark))
        newly_timed = False
        for step, template in zip(self.check.steps, self.templates, strict=True):
            kind = step.remediation_kind
            if kind in timed:
                continue
            current = by_kind.get(kind)
            if current is None:
                name = step.ref.name if step.ref is not None else ""
                decision.do(CreateRemediation(
                    target.name, target.uid, target.host, dict(template.spec), kind, name
                ))  # fmt: skip
                message = f"Created remediation of Node {target.name} (host {target.host}): {why}"
                if step.timeout is not None:
                    message += f" ({kind}, order {step.order}, timeout {step.timeout:g}s)"
                decision.note(EVENT_REMEDIATION_CREATED, message)
                return
            if step.timeout is None or not current.uid:
                return  # in flight (a single template never times out)
            deadline = machine_policy.after(current.started or now, step.timeout)
            failed = current.succeeded is False
            if not failed and (deadline is None or now < deadline):
                decision.at(deadline)
                return
            mark = stamp(now)
            if current.succeeded is not True:
                decision.do(_annotate(current, names.NHC_TIMED_OUT, mark))
            timed[kind] = mark
            newly_timed = True
            cause = (
                "its Succeeded condition is False"
                if failed
                else (f"the Node is not healthy {step.timeout:g}s after it started")
            )
            message = f"Remediation {kind} {current.namespace}/{current.name} timed out: {cause}"
            decision.note(EVENT_REMEDIATION_TIMED_OUT, message)
        if newly_timed:
            message = f"Remediation timed out, and no template left to try for Node {target.name}"
            decision.note(EVENT_NO_TEMPLATE_LEFT, message, warning=True)

    def healthy_again(
        self, target: NodeTarget, earlier: Mapping[str, Any], timed: dict[str, str]
    ) -> None:
        """NHC's ``HandleHealthyNode``: the remediations deleted at once, after healthyDelay
        or never (negative); the Node counts not healthy until they are gone."""
        decision, now = self.decision, self.now
        delay = None if target.confirmed_healthy else self.check.healthy_delay
        delayed = False
        for remediation in target.remediations:
            if remediation.healthy_since is not None:
                delayed = True
            if not remediation.uid:
                continue  # being deleted
            if delay is not None and delay < 0:
                continue  # never automatically
            if delay:
                since = remediation.healthy_since
                if since is None:
                    decision.do(_annotate(remediation, names.NHC_HEALTHY_DELAY, stamp(now)))
                    delayed = True
                    decision.at(machine_policy.after(now, delay))
                    continue
                until = machine_policy.after(since, delay)
                if until is None or now < until:
                    decision.at(until)
                    continue
            decision.do(DeleteRemediation(
                target.name, remediation.namespace, remediation.name, remediation.uid,
                remediation.kind,
            ))  # fmt: skip
            message = f"Deleted remediation of Node {target.name}: healthy again"
            decision.note(EVENT_REMEDIATION_REMOVED, message)
        entry: dict[str, Any] = {"name": target.name}
        self.unhealthy.append(entry)
        self.listed(entry, target, earlier, timed)
        entry["conditionsHealthyTimestamp"] = earlier.get("conditionsHealthyTimestamp") or stamp(
            now
        )
        if delayed:
            entry["healthyDelayed"] = True

    def listed(
        self,
        entry: dict[str, Any],
        target: NodeTarget,
        earlier: Mapping[str, Any],
        timed: Mapping[str, str],
    ) -> None:
        """``remediations`` of a status entry: the objects there, and the timed-out ones
        that are gone (the escalation remembers them until the Node is healthy)."""
        rows: list[dict[str, Any]] = []
        kinds = set()
        for remediation in target.remediations:
            kinds.add(remediation.kind)
            row: dict[str, Any] = {
                "resource": _resource(remediation),
                "started": stamp(remediation.started or self.now),
            }
            if remediation.template:
                row["templateName"] = remediation.template
            if remediation.kind in timed:
                row["timedOut"] = timed[remediation.kind]
            rows.append(row)
        for old in _rows(earlier):
            kind = str((old.get("resource") or {}).get("kind"))
            if kind not in kinds and old.get("timedOut"):
                kinds.add(kind)
                rows.append(dict(old))
        if rows:
            rows.sort(key=lambda r: str(r.get("started")))
            entry["remediations"] = rows
        started = [r.started for r in target.remediations if r.started is not None]
        if target.remediations:
            self.in_flight[target.name] = stamp(min(started) if started else self.now)


def outside_problem(check: Check, host: str) -> str:
    """Why the check may not act on ``host`` ("namespace/name"): "" when it may (or there
    is no host: another problem)."""
    namespace = check.namespace
    if not host or host.partition("/")[0] == namespace:
        return ""
    return (
        f"host {host} is outside namespace {namespace or '(none)'} of the check's remediation"
        " template: a check remediates only hosts of its template's namespace"
    )


def _rows(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rows = entry.get("remediations")
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def _timed_out(earlier: Mapping[str, Any], remediations: Sequence[Remediation]) -> dict[str, str]:
    """Kind -> when its remediation of this Node timed out: the object's annotation, else
    the status as read (either may be written first; a restart between them loses
    neither)."""
    timed: dict[str, str] = {}
    for row in _rows(earlier):
        kind, when = (row.get("resource") or {}).get("kind"), row.get("timedOut")
        if isinstance(kind, str) and isinstance(when, str) and when:
            timed[kind] = when
    for remediation in remediations:
        if remediation.timed_out is not None:
            timed[remediation.kind] = stamp(remediation.timed_out)
    return timed


def _annotate(remediation: Remediation, key: str, value: str) -> AnnotateRemediation:
    return AnnotateRemediation(
        remediation.kind, remediation.namespace, remediation.name, remediation.uid, key, value
    )


def _resource(remediation: Remediation) -> dict[str, str]:
    return {
        "apiVersion": remediation.api_version,
        "kind": remediation.kind,
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
