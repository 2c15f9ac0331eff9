"""Draining a Node, decided purely (docs/teardown.md, docs/decide-act.md).

What is evicted and what is left follows ``kubectl drain --force --delete-emptydir-data
--ignore-daemonsets``, the command Airship's node teardown spec ("Promenade Drain Node",
airship-specs ``specs/approved/workflow_node-teardown.rst``) names, with kubectl's filters
(kubernetes/kubectl ``pkg/drain/filters.go``):

- mirror (static) pods are left, silently: the kubelet owns them, the API cannot delete them;
- DaemonSet pods are left (their DaemonSet tolerates the cordon and would put them back),
  unless their DaemonSet is gone, when ``--force`` deletes them;
- pods with local storage (an ``emptyDir``) are evicted: their scratch data is lost;
- pods with no controller are evicted: nothing will recreate them;
- finished pods (Succeeded, Failed) are evicted (the API server deletes them at once).

``decide`` is called again on every change of the Node's pods and at every deadline, and
returns what to do now: cordon, evict the pods not yet asked (all at once), retry the
evictions a disruption budget refused once their retry is due, and, at the end, report
the Node drained or the drain failed, naming every pod still there and why.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from metalmend.policy.decision import Decision, Event
from metalmend.teardown.policy.settings import TeardownSettings

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class Disposition(StrEnum):
    """What a drain does with one pod."""

    EVICT = "evict"
    LEAVE_MIRROR = "leave-mirror"
    LEAVE_DAEMONSET = "leave-daemonset"


@dataclass(frozen=True)
class Requirement:
    """One requirement of a node-affinity term: on a label, or (``field``) on the Node's
    ``metadata.name``, the only field Kubernetes allows there."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()
    field: bool = False


@dataclass(frozen=True)
class PodFacts:
    """One pod bound to the Node, as the drain rules read it."""

    namespace: str
    name: str
    uid: str
    phase: str = "Running"
    deleting: bool = False  # metadata.deletionTimestamp is set: the kubelet is stopping it
    mirror: bool = False
    controller_kind: str | None = None  # kind of the ownerReference with controller: true
    controller_name: str | None = None
    emptydir: bool = False
    daemonset_missing: bool = False  # its DaemonSet no longer exists (filled in by observe)
    node_selector: tuple[tuple[str, str], ...] = ()  # spec.nodeSelector
    # spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: the terms
    # (any may match), each a tuple of requirements (all must match).
    node_affinity: tuple[tuple[Requirement, ...], ...] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_wire(cls, pod: Mapping[str, Any]) -> PodFacts:
        """Read a pod (its JSON form); anything missing or malformed reads as absent."""
        meta = _mapping(pod.get("metadata"))
        spec = _mapping(pod.get("spec"))
        status = _mapping(pod.get("status"))
        owner = next(
            (
                _mapping(o)
                for o in _list(meta.get("ownerReferences"))
                if _mapping(o).get("controller") is True
            ),
            None,
        )
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            phase=str(status.get("phase") or "Pending"),
            deleting=bool(meta.get("deletionTimestamp")),
            mirror=MIRROR_ANNOTATION in _mapping(meta.get("annotations")),
            controller_kind=str(owner.get("kind")) if owner else None,
            controller_name=str(owner.get("name")) if owner else None,
            emptydir=any("emptyDir" in _mapping(v) for v in _list(spec.get("volumes"))),
            node_selector=tuple(
                sorted((str(k), str(v)) for k, v in _mapping(spec.get("nodeSelector")).items())
            ),
            node_affinity=_required_terms(spec),
        )


def _required_terms(spec: Mapping[str, Any]) -> tuple[tuple[Requirement, ...], ...] | None:
    affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return None
    terms = []
    for term in _list(required.get("nodeSelectorTerms")):
        requirements = [
            Requirement(
                key=str(_mapping(e).get("key") or ""),
                operator=str(_mapping(e).get("operator") or ""),
                values=tuple(str(v) for v in _list(_mapping(e).get("values"))),
                field=kind == "matchFields",
            )
            for kind in ("matchExpressions", "matchFields")
            for e in _list(_mapping(term).get(kind))
        ]
        terms.append(tuple(requirements))
    return tuple(terms)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def disposition(pod: PodFacts) -> tuple[Disposition, str | None]:
    """Evict or leave ``pod``, and the warning kubectl would print for it (or None)."""
    if pod.mirror:
        return Disposition.LEAVE_MIRROR, None
    finished = pod.phase in ("Succeeded", "Failed")
    if pod.controller_kind == "DaemonSet" and not finished:
        if pod.daemonset_missing:
            return Disposition.EVICT, "deleting a Pod whose DaemonSet is gone"
        return Disposition.LEAVE_DAEMONSET, "ignoring DaemonSet-managed Pods"
    if finished:
        return Disposition.EVICT, None
    if pod.emptydir:
        return Disposition.EVICT, "deleting Pods with local storage"
    if pod.controller_kind is None:
        return Disposition.EVICT, "deleting Pods that declare no controller"
    return Disposition.EVICT, None


@dataclass(frozen=True)
class Refusal:
    """The last answer that refused a pod's eviction."""

    message: str  # the API server's words, the budget named when it was one
    retry_at: dt.datetime | None  # None: asking again cannot help (two budgets, RBAC)


@dataclass(frozen=True)
class DrainView:
    node: str
    cordoned: bool
    pods: tuple[PodFacts, ...]
    deadline: dt.datetime
    grace_period: int | None  # seconds passed on to each eviction; None: the pod's own
    evicted: frozenset[str] = frozenset()  # uids whose eviction the API server accepted
    refusals: Mapping[str, Refusal] = field(default_factory=dict)  # by uid
    pods_unknown: str | None = None  # why the pods could not be listed (yet)


# ---- actions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cordon:
    """Mark the Node unschedulable (``spec.unschedulable: true``)."""

    node: str


@dataclass(frozen=True)
class Evict:
    """Ask the Eviction API to remove the pod (budgets respected), only if it still has
    ``uid``; ``grace_period`` None leaves the pod's own terminationGracePeriodSeconds."""

    namespace: str
    name: str
    uid: str
    grace_period: int | None
    warning: str | None = None


@dataclass(frozen=True)
class Drained:
    """Every pod to be evicted is gone; ``left`` are the pods left by rule."""

    left: tuple[tuple[str, Disposition], ...]


@dataclass(frozen=True)
class DrainFailed:
    """The drain ends without success; one line per pod still there and why."""

    problems: tuple[str, ...]


Action = Cordon | Evict | Drained | DrainFailed | Event


def decide(view: DrainView, now: dt.datetime, settings: TeardownSettings) -> Decision[Action]:
    del settings  # the retry instants are in the refusals already
    decision: Decision[Action] = Decision()
    if not view.cordoned:
        # First, so that nothing new is scheduled onto the Node while it empties.
        decision.do(Cordon(view.node))
    if view.pods_unknown is not None:
        if now >= view.deadline:
            return decision.do(DrainFailed((f"cannot list the pods: {view.pods_unknown}",)))
        return decision.at(view.deadline)
    staying = []
    remaining = []
    for pod in view.pods:
        verdict, warning = disposition(pod)
        if verdict is not Disposition.EVICT:
            staying.append((pod.key, verdict))
            continue
        remaining.append(pod)
        if now < view.deadline and _eviction_due(view, pod, now):
            decision.do(Evict(pod.namespace, pod.name, pod.uid, view.grace_period, warning))
        else:
            decision.at(_retry_at(view, pod))
    if not remaining:
        return decision.do(Drained(tuple(sorted(staying))))
    hopeless = all(_refused_for_good(view, pod) for pod in remaining)
    if now >= view.deadline or hopeless:
        return decision.do(DrainFailed(tuple(why_still_there(view, pod) for pod in remaining)))
    return decision.at(view.deadline)


def _eviction_due(view: DrainView, pod: PodFacts, now: dt.datetime) -> bool:
    """Not yet asked (a pod already terminating needs no eviction), or refused and due."""
    if pod.deleting or pod.uid in view.evicted:
        return False
    refusal = view.refusals.get(pod.uid)
    return refusal is None or (refusal.retry_at is not None and refusal.retry_at <= now)


def _retry_at(view: DrainView, pod: PodFacts) -> dt.datetime | None:
    refusal = view.refusals.get(pod.uid)
    if refusal is None or pod.deleting or pod.uid in view.evicted:
        return None  # waiting for the watch to see it go
    return refusal.retry_at


def _refused_for_good(view: DrainView, pod: PodFacts) -> bool:
    refusal = view.refusals.get(pod.uid)
    return (
        refusal is not None
        and refusal.retry_at is None
        and not pod.deleting
        and pod.uid not in view.evicted
    )


def why_still_there(view: DrainView, pod: PodFacts) -> str:
    """One line for the operator: the pod, and what kept it."""
    refusal = view.refusals.get(pod.uid)
    if pod.deleting or pod.uid in view.evicted:
        reason = "evicted, still terminating (its grace period has not run out)"
    elif refusal is not None:
        reason = f"eviction refused: {refusal.message}"
    else:
        reason = "not evicted yet"
    return f"pod {pod.key}: {reason}"


def eviction_refusal(
    code: int,
    message: str,
    causes: tuple[tuple[str, str], ...],
    now: dt.datetime,
    settings: TeardownSettings,
) -> Refusal | None:
    """What an eviction's error answer means, after the rules kubectl follows: None when
    the pod is gone already (404: success); a retry for a budget's 429, a namespace being
    terminated (403 with that cause) or a passing server failure (5xx); else for good
    (a pod under two budgets answers 500 with that message, RBAC 403). ``causes`` are
    the Status's ``details.causes`` as (type, message): a budget's 429 names it there."""
    if code == 404:
        return None
    text = "; ".join([message, *(words for _, words in causes if words)])
    retry_at = now + dt.timedelta(seconds=settings.eviction_retry)
    if code == 429 or (code == 403 and any(kind == "NamespaceTerminating" for kind, _ in causes)):
        return Refusal(text, retry_at)
    if code >= 500 and "more than one PodDisruptionBudget" not in message:
        return Refusal(text, retry_at)
    return Refusal(text, None)
