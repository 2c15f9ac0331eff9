"""redeploy_server's steps, decided purely (docs/site-actions.md, "redeploy_server").

Airship's node teardown spec ("Shipyard redeploy_server Action", airship-specs
``specs/approved/workflow_node-teardown.rst``) has Shipyard decommission the node through
Promenade, destroy it through Drydock (``preserve-local-storage`` passed on) and remove it
from the cluster; the spec stops there, and operators expect the server back, so a last
step deploys it again from the same design revision. This module holds the rules of the
two steps that keep a record across restarts:

- ``destroy``: the Drydock task's id is recorded BEFORE the task is created, so a restart
  finds the task instead of creating a second one (a second wipe);
- ``deploy_server``: apply the host's documents, wait for the provisioner to report the host
  provisioned and host-power to report it on, wait for its Node to be Ready, apply the
  design's labels, bring its etcd members back (``policy.etcd.decide_add``: only while
  quorum allows, looked up by peer URL before any add), each phase recorded as it is
  reached.

Inputs are frozen views; nothing here reads a clock, the API server or etcd.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from metalmend.policy.decision import Decision

# Steps as the action lists them (redeploy_server's step list, STEPS below).
PREFLIGHT = "preflight"
DESIGN_LOOKUP = "design_lookup"
VALIDATION = "validation"
DECOMMISSION = "decommission"
DESTROY = "destroy"
REMOVE_FROM_CLUSTER = "remove_from_cluster"
DEPLOY_SERVER = "deploy_server"
STEPS = (
    PREFLIGHT, DESIGN_LOOKUP, VALIDATION, DECOMMISSION, DESTROY, REMOVE_FROM_CLUSTER,
    DEPLOY_SERVER,
)  # fmt: skip


def event_reason(step: str) -> str:
    """The Event reason a step leaves on the objects it touches: ``ShipyardDeployServer``."""
    return "Shipyard" + "".join(part.capitalize() for part in step.split("_"))


@dataclass(frozen=True)
class RedeploySettings:
    """How long redeploy_server's steps wait (section ``redeploy``), in seconds."""

    destroy_timeout: float = 86400.0
    """How long the Drydock destroy task may run (a secure erase of large disks: hours)."""

    provision_timeout: float = 3600.0
    """From the host's documents applied to the provisioner reporting it ``provisioned``
    and host-power reporting it on (an image written to disk, a reboot)."""

    node_ready_timeout: float = 1800.0
    """From the host provisioned to its Node registered and Ready (the OS boots, the
    kubelet joins)."""

    etcd_timeout: float = 1800.0
    """For each etcd member to be added back and seen started and healthy (waiting for
    quorum to allow the add included)."""

    poll_interval: float = 2.0
    """How often the host, the Node and the destroy task are looked at."""


def _time(raw: object) -> dt.datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(raw)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _text(raw: object, limit: int = 128) -> str | None:
    return raw if isinstance(raw, str) and 0 < len(raw) <= limit else None


# ---- destroy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DestroyRecord:
    """The destroy step's record: the Drydock task it created (or is about to)."""

    task_id: str | None = None
    started: dt.datetime | None = None

    @classmethod
    def from_wire(cls, record: Mapping[str, Any]) -> DestroyRecord:
        return cls(_text(record.get("task_id")), _time(record.get("started")))

    def to_wire(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "started": self.started.isoformat() if self.started else None,
        }


class TaskOutcome(StrEnum):
    RUNNING = "running"  # not complete yet
    DESTROYED = "destroyed"
    FAILED = "failed"


@dataclass(frozen=True)
class DestroyView:
    record: DestroyRecord
    task_found: bool
    outcome: TaskOutcome | None  # None: no such task
    summary: str  # the task's result message, for the operator


@dataclass(frozen=True)
class RecordTask:
    """Save the task id in the step's record; nothing is created before this is stored."""

    record: DestroyRecord


@dataclass(frozen=True)
class CreateTask:
    task_id: str


@dataclass(frozen=True)
class Succeed:
    note: str


@dataclass(frozen=True)
class Fail:
    message: str


DestroyAction = RecordTask | CreateTask | Succeed | Fail


def decide_destroy(
    view: DestroyView, now: dt.datetime, settings: RedeploySettings, new_id: str, node: str
) -> Decision[DestroyAction]:
    """Record the id, then create the task under it, then wait for its outcome. A restart
    after the record and before the create finds no task and creates it under the same
    id; after the create it finds the task: a node is never given a second destroy."""
    decision: Decision[DestroyAction] = Decision()
    record = view.record
    if record.task_id is None:
        return decision.do(RecordTask(DestroyRecord(new_id, now)))
    if not view.task_found:
        return decision.do(CreateTask(record.task_id))
    match view.outcome:
        case TaskOutcome.DESTROYED:
            return decision.do(Succeed(f"Drydock task {record.task_id}: {view.summary}"))
        case TaskOutcome.FAILED:
            return decision.do(Fail(f"Drydock task {record.task_id} failed: {view.summary}"))
    started = record.started or now
    if now >= started + dt.timedelta(seconds=settings.destroy_timeout):
        return decision.do(
            Fail(
                f"Drydock task {record.task_id} did not destroy {node} within"
                f" {settings.destroy_timeout:g}s: {view.summary}"
            )
        )
    return decision.at(now + dt.timedelta(seconds=settings.poll_interval))


# ---- deploy_server -----------------------------------------------------------------------


class DeployPhase(StrEnum):
    APPLY = "apply"  # the host's documents to apply
    PROVISION = "provision"  # waiting for provisioned and powered on
    NODE = "node"  # waiting for the Node to register and be Ready
    LABELS = "labels"  # the design's labels to apply
    ETCD = "etcd"  # etcd members to bring back
    DONE = "done"


@dataclass(frozen=True)
class DeployRecord:
    phase: DeployPhase = DeployPhase.APPLY
    since: dt.datetime | None = None  # when this phase began (its timeout counts from it)
    # Clusters a MemberAdd was requested for, recorded before the call (for the operator and
    # the restart's note; the add itself is found again by the member's peer URLs).
    member_add_requested: tuple[str, ...] = ()
    # The mark of the error the host showed when its documents were applied (None: none):
    # that error, unchanged, does not fail the wait for it (``fails_wait``).
    known_error: str | None = None

    @classmethod
    def from_wire(cls, record: Mapping[str, Any]) -> DeployRecord:
        try:
            phase = DeployPhase(str(record.get("phase")))
        except ValueError:
            phase = DeployPhase.APPLY  # absent or unknown: start over (every phase is idempotent)
        raw = record.get("member_add_requested")
        clusters = tuple(c for c in raw[:64] if _text(c)) if isinstance(raw, list) else ()
        known = record.get("known_error")
        return cls(phase, _time(record.get("since")), clusters, _text(known, 512))

    def to_wire(self) -> dict[str, Any]:
        return {
            "phase": str(self.phase),
            "since": self.since.isoformat() if self.since else None,
            "member_add_requested": list(self.member_add_requested),
            "known_error": self.known_error,
        }

    def at(self, phase: DeployPhase, now: dt.datetime) -> DeployRecord:
        return replace(self, phase=phase, since=now)

    def add_requested(self, cluster: str) -> DeployRecord:
        if cluster in self.member_add_requested:
            return self
        return replace(self, member_add_requested=(*self.member_add_requested, cluster))


# ---- a host in error ------------------------------------------------------------------------

# The provisioner's error states (baremetal-operator's names).
FAILED_STATES = frozenset({"registration error", "provisioning error", "power management error"})
OPERATIONAL_ERROR = "error"


@dataclass(frozen=True)
class HostError:
    """What a BareMetalHost's status says went wrong: upstream metal3's ``errorType`` (or
    the provisioner's error state), ``errorMessage`` and ``errorCount`` (failed attempts in
    a row, written by host-power and baremetal-operator)."""

    kind: str
    message: str
    count: int = 0

    @property
    def mark(self) -> str:
        """The error as one string: two marks differ when anything happened since."""
        return f"{self.count}|{self.kind}|{self.message}"

    def describe(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


def host_error(status: Mapping[str, Any]) -> HostError | None:
    """The host's error (None: not in error). In error: ``errorType`` set,
    ``operationalStatus: error``, or a provisioning error state."""
    provisioning = status.get("provisioning")
    state = provisioning.get("state") if isinstance(provisioning, Mapping) else None
    kind, message = status.get("errorType"), status.get("errorMessage")
    count = status.get("errorCount")
    failed = state in FAILED_STATES
    if not (kind or status.get("operationalStatus") == OPERATIONAL_ERROR or failed):
        return None
    named = kind if isinstance(kind, str) and kind else state if failed else "operational error"
    return HostError(
        str(named),
        message[:300] if isinstance(message, str) else "",
        count if isinstance(count, int) and not isinstance(count, bool) else 0,
    )


def fails_wait(error: HostError | None, known: str | None) -> bool:
    """Whether a host's error fails a wait for it, given ``known``: the mark of the error it
    showed when the wait began (None: none). An error fails the wait at once, except that
    same error, unchanged: the design just applied may be what fixes it (host-power tries
    again at once when ``spec.bmc`` or ``online`` changes, and clears the error when it
    works); the next failed attempt (``errorCount`` grown) or any other error fails it."""
    return error is not None and error.mark != known


@dataclass(frozen=True)
class HostFacts:
    """The node's BareMetalHost as the provisioner and host-power report it."""

    name: str
    provisioning: str  # status.provisioning.state ("" not reported)
    powered_on: bool | None  # status.poweredOn
    error: str  # status.errorMessage ("" none)
    problem: HostError | None = None  # host_error(status)


@dataclass(frozen=True)
class DeployView:
    node: str
    record: DeployRecord
    host_documents: int  # the design's documents for this host (BareMetalHost, Machine)
    host: HostFacts | None  # None: not found (yet)
    node_ready: bool | None  # None: no Node registered
    labels_missing: tuple[str, ...]  # design label keys the Node lacks (or holds otherwise)
    etcd_clusters: tuple[str, ...]  # clusters the design puts a member on this node in


@dataclass(frozen=True)
class ApplyHostDocuments:
    """Server-side apply of the host's documents (field manager metalmend-shipyard)."""


@dataclass(frozen=True)
class ApplyNodeLabels:
    keys: tuple[str, ...]


@dataclass(frozen=True)
class BringEtcdBack:
    """Add the node's member back to each cluster (policy.etcd.decide_add, looped)."""

    clusters: tuple[str, ...]


@dataclass(frozen=True)
class ReleaseTeardownClaim:
    """The server is back in service: remove the teardown claim decommission put on its
    host (docs/teardown.md: the claim stays until the server is "back in service or
    gone"), so that remediation watches it again."""


@dataclass(frozen=True)
class SetRecord:
    record: DeployRecord
    note: str  # what the operator reads in the step's notes


DeployAction = (
    ApplyHostDocuments
    | ApplyNodeLabels
    | BringEtcdBack
    | ReleaseTeardownClaim
    | SetRecord
    | Succeed
    | Fail
)

PROVISIONED = "provisioned"


def decide_deploy(
    view: DeployView, now: dt.datetime, settings: RedeploySettings
) -> Decision[DeployAction]:
    """The next thing deploy_server does, from its record and what is seen now. Each
    phase's work is idempotent (server-side apply, a member looked up by its peer URLs
    before any add); the record moves on only once the work is done."""
    decision: Decision[DeployAction] = Decision()
    record, node = view.record, view.node
    since = record.since or now
    match record.phase:
        case DeployPhase.APPLY:
            if view.host_documents == 0:
                return decision.do(
                    Fail(f"the design revision has no BareMetalHost for {node}: nothing to deploy")
                )
            problem = view.host.problem if view.host is not None else None
            known = problem.mark if problem is not None else None
            return decision.do(
                ApplyHostDocuments(),
                SetRecord(
                    replace(record.at(DeployPhase.PROVISION, now), known_error=known),
                    f"{view.host_documents} document(s) of {node} applied; waiting for the"
                    " provisioner",
                ),
            )
        case DeployPhase.PROVISION:
            return _provision(view, since, now, settings, decision)
        case DeployPhase.NODE:
            if view.node_ready:
                return decision.do(
                    SetRecord(record.at(DeployPhase.LABELS, now), f"Node {node} is Ready")
                )
            waited = _late(since, now, settings.node_ready_timeout)
            if waited:
                seen = "not registered" if view.node_ready is None else "registered, not Ready"
                return decision.do(Fail(f"Node {node} not Ready within {waited}: {seen}"))
            return decision.at(now + dt.timedelta(seconds=settings.poll_interval))
        case DeployPhase.LABELS:
            if view.labels_missing:
                decision.do(ApplyNodeLabels(view.labels_missing))
            done = f"Node {node}: the design's labels applied ({len(view.labels_missing)} set)"
            return decision.do(SetRecord(record.at(DeployPhase.ETCD, now), done))
        case DeployPhase.ETCD:
            if view.etcd_clusters:
                decision.do(BringEtcdBack(view.etcd_clusters))
            back = ", ".join(view.etcd_clusters) or "none: the design puts no member there"
            return decision.do(
                ReleaseTeardownClaim(),
                SetRecord(record.at(DeployPhase.DONE, now), f"etcd member(s) back: {back}"),
            )
        case DeployPhase.DONE:
            return decision.do(Succeed(f"{node} redeployed: provisioned, on, Ready, labelled"))
    raise AssertionError(record.phase)  # pragma: no cover (every phase is matched)


def _provision(
    view: DeployView,
    since: dt.datetime,
    now: dt.datetime,
    settings: RedeploySettings,
    decision: Decision[DeployAction],
) -> Decision[DeployAction]:
    host = view.host
    if host is not None and host.provisioning == PROVISIONED and host.powered_on:
        return decision.do(
            SetRecord(
                view.record.at(DeployPhase.NODE, now),
                f"BareMetalHost {host.name} provisioned and powered on",
            )
        )
    if host is not None and host.provisioning in FAILED_STATES and host.problem is None:
        return decision.do(
            Fail(f"BareMetalHost {host.name} is in {host.provisioning}: {host.error or '?'}")
        )
    problem = host.problem if host is not None else None
    if host is not None and problem is not None and fails_wait(problem, view.record.known_error):
        return decision.do(Fail(f"BareMetalHost {host.name} is in error: {problem.describe()}"))
    waited = _late(since, now, settings.provision_timeout)
    if waited:
        seen = (
            "not found"
            if host is None
            else f"{host.provisioning or 'no state'}, powered"
            f" {'on' if host.powered_on else 'off' if host.powered_on is False else '?'}"
        )
        return decision.do(Fail(f"{view.node} not provisioned and on within {waited}: {seen}"))
    return decision.at(now + dt.timedelta(seconds=settings.poll_interval))


def _late(since: dt.datetime, now: dt.datetime, timeout: float) -> str | None:
    """ "Ns" once ``timeout`` has passed since ``since``; None before."""
    return f"{timeout:g}s" if now >= since + dt.timedelta(seconds=timeout) else None


# ---- the design's documents for one host ---------------------------------------------------

KUBERNETES_OBJECT = "metalmend/KubernetesObject/v1"  # the design's Kubernetes objects


@dataclass(frozen=True)
class HostDocuments:
    """What the design says about one server: its BareMetalHost and the Machine that
    consumes it (applied as they are), and the labels of its Node (applied once the
    kubelet has registered it)."""

    node: str
    host: Mapping[str, Any] | None
    machine: Mapping[str, Any] | None
    labels: Mapping[str, str]

    @property
    def objects(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(o for o in (self.host, self.machine) if o is not None)

    @property
    def host_key(self) -> tuple[str, str] | None:
        """(namespace, name) of the BareMetalHost."""
        if self.host is None:
            return None
        meta = self.host.get("metadata") or {}
        return str(meta.get("namespace") or "default"), str(meta.get("name"))


def _objects(documents: Iterable[Any]) -> list[Mapping[str, Any]]:
    return [
        d["data"]
        for d in documents
        if isinstance(d, Mapping)
        and d.get("schema") == KUBERNETES_OBJECT
        and isinstance(d.get("data"), Mapping)
        and isinstance(d["data"].get("metadata"), Mapping)
    ]


# The only kinds redeploy applies, at the only versions it knows (anything else in the
# design is not this host's: it is never applied from here).
HOST_KINDS = {
    "BareMetalHost": "metal3.io/v1alpha1",
    "Machine": "cluster.x-k8s.io/v1beta1",
    "Node": "v1",
}


def _is(obj: Mapping[str, Any], kind: str) -> bool:
    return obj.get("kind") == kind and obj.get("apiVersion") == HOST_KINDS[kind]


def _named(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or "default"), str(meta.get("name"))


def host_documents(documents: Iterable[Any], node: str) -> HostDocuments:
    """The host of ``node`` is the BareMetalHost of that name: the spec's assumption that
    "node_id is the hostname of the server, and is also the identifier that both Drydock
    and Promenade use"; its Machine is the one its ``spec.consumerRef`` names; its labels
    are those of the design's ``v1 Node`` of that name."""
    objects = _objects(documents)
    host = next((o for o in objects if _is(o, "BareMetalHost") and _named(o)[1] == node), None)
    machine = None
    if host is not None:
        spec = host.get("spec")
        ref = spec.get("consumerRef") if isinstance(spec, Mapping) else None
        if isinstance(ref, Mapping) and ref.get("kind") == "Machine":
            wanted = (str(ref.get("namespace") or _named(host)[0]), str(ref.get("name")))
            machine = next((o for o in objects if _is(o, "Machine") and _named(o) == wanted), None)
    node_doc = next((o for o in objects if _is(o, "Node") and _named(o)[1] == node), None)
    raw = node_doc["metadata"].get("labels") if node_doc is not None else None
    labels = (
        {str(k): str(v) for k, v in raw.items() if isinstance(v, str)}
        if isinstance(raw, Mapping)
        else {}
    )
    return HostDocuments(node, host, machine, labels)


def labels_missing(wanted: Mapping[str, str], present: Mapping[str, str]) -> tuple[str, ...]:
    """The design's label keys the Node lacks or holds with another value."""
    return tuple(sorted(k for k, v in wanted.items() if present.get(k) != v))
