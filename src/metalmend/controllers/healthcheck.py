"""The MachineHealthCheck controller, in the house shape (docs/decide-act.md): ``observe``
builds a frozen view of one check from the informers' caches (its targets: the Machines
of its cluster that its selector picks, and their Nodes; its remediation template and
the remediation objects already there), policy.healthcheck ``decide``s, and ``act`` carries
each action out through the ``Writer``:

- remediation by conditions on the Machine (HealthCheckSucceeded=False, OwnerRemediated=False),
  or, with ``remediationTemplate``, by creating an external remediation object (same name
  and namespace as the Machine, ownerReference to it, kind = template kind without
  "Template") and deleting it once the Node is healthy again (Cluster API's machine
  health checking proposal, external remediation), or by metal3's external-remediation
  annotation;
- the check's status (expectedMachines, currentHealthy, remediationsAllowed, targets,
  conditions) written only when it changed;
- a requeue at the exact next timeout expiry.

Reads come from caches, never from a GET per reconcile: Metal3RemediationTemplate and
Metal3Remediation have informers from the start; any other template kind gets an
informer (for the template kind and its remediation kind, in the watched namespace) the
first time a check names it. Where that informer cannot sync (RBAC grants only ``get``
on that kind, say), the template is read by one GET and the remediation objects by one
list, as before, so a check that worked keeps working.

The check's Cluster (Cluster API's, named by ``spec.clusterName``) is read only where the
API server serves that kind (controllers/clusters.py: discovery, then an informer); its
readiness holds Machines off and starts their startup timeout, and a paused Cluster pauses
the check, as Cluster API. Where the kind is not served, no Cluster is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node

from metalmend.api import indexes, links, names
from metalmend.api.resources import (
    BareMetalHost,
    Machine,
    MachineHealthCheck,
    Metal3Remediation,
    Metal3RemediationTemplate,
)
from metalmend.api.selector import matches
from metalmend.api.stamps import parse_stamp
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers import metrics
from metalmend.controllers.clusters import (
    ClusterCache,
    Readiness,
    is_control_plane,
    paused,
    watched,
)
from metalmend.kube import errors
from metalmend.kube.controller import DONE, Controller, Result, TerminalError
from metalmend.kube.informer import Informer
from metalmend.kube.manager import Manager
from metalmend.kube.own_writes import OwnWrites
from metalmend.kube.store import object_key, split_key
from metalmend.kube.writer import KubeWriter, Writer
from metalmend.log import fields
from metalmend.policy import healthcheck as policy
from metalmend.policy import interlock
from metalmend.policy.decision import Event
from metalmend.policy.healthcheck import (
    Check,
    InvalidSpec,
    NodeCondition,
    RemediateBy,
    Target,
    check_from_spec,
)
from metalmend.settings import RequestRemediationBy, Settings

log = logging.getLogger(__name__)

METAL3_API = "remediation.metal3.io/v1alpha1"
SYNC_WAIT = 5.0  # seconds a new template informer may take to list before we read directly
# Machine condition writes of one evaluation in flight at once: the first verdicts of a
# check over thousands of Machines go out in round trips / WRITES_IN_FLIGHT, while the API
# server is not flooded by one check (host-power keeps up to 20 BMC calls in flight).
WRITES_IN_FLIGHT = 16
# After an evaluation of a check that took T seconds, a Machine change starts the next one
# no sooner than PAUSE_FACTOR * T after it ended: one evaluation reads every Machine the
# check selects, in one stretch of the event loop (most of a second at 5,000 Machines), and
# while node-link links thousands of Machines at start-up each of its writes is a Machine
# change. So a check takes at most 1 / (1 + PAUSE_FACTOR) of the event loop for Machine
# changes (a tenth: the start-up's other work goes on), and a batch of them makes one
# evaluation; a Machine's own change (a manual remediation request, a failureReason) is
# judged within seconds at 5,000 Machines. A Node's change waits the same pause, but never
# past the soonest verdict its conditions bring (policy.healthcheck.verdict_due: an
# unhealthy condition's timeout), and a Node that came, went or began deleting waits for
# nothing: at 5,000 Machines each Node turning unhealthy was a full evaluation at once,
# then another at its expiry, and the expiries of other Nodes waited behind them
# (docs/scale.md, fix 18). A check's own spec changes and a remediation object's are not
# held back (a burst of those makes one evaluation more: the queue holds a key once); at
# tens of Machines the pause is a few milliseconds.
PAUSE_FACTOR = 9.0


def skipped(obj: Any) -> bool:
    annotations = obj.metadata.annotations or {}
    return names.SKIP_REMEDIATION in annotations or names.PAUSED in annotations


def generic(api_version: str, kind: str) -> Any:
    group, _, version = api_version.rpartition("/")
    return create_namespaced_resource(group, version, kind, kind.lower() + "s")


class KindCaches:
    """Informers by (apiVersion, kind) for the template and remediation kinds checks
    name: the ones given at construction, and others started on first use."""

    def __init__(self, client: AsyncClient, namespace: str | None) -> None:
        self.client = client
        self.namespace = namespace
        self.informers: dict[tuple[str, str], Informer] = {}
        self.on_change: list[Callable[[Any | None, Any | None], None]] = []
        self._tasks: list[asyncio.Task[None]] = []

    def preset(self, api_version: str, kind: str, informer: Informer) -> None:
        self.informers[(api_version, kind)] = informer

    async def synced(self, api_version: str, kind: str) -> Informer | None:
        """The informer of that kind, once it has listed; None while it cannot (then read
        directly). A new informer is waited for at most SYNC_WAIT, once."""
        informer = self.informers.get((api_version, kind))
        if informer is None:
            informer = Informer(self.client, generic(api_version, kind), namespace=self.namespace)
            for handler in self.on_change:
                informer.add_handler(handler)
            self.informers[(api_version, kind)] = informer
            self._tasks.append(asyncio.create_task(informer.run(), name=f"informer {kind}"))
            log.info("watching a remediation kind", extra=fields(kind=kind, api=api_version))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(informer.synced.wait(), SYNC_WAIT)
        return informer if informer.synced.is_set() else None

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class HealthCheckController:
    def __init__(self, manager: Manager, settings: Settings, writer: Writer | None = None) -> None:
        self.manager = manager
        self.client = manager.client
        self.clock = manager.clock
        self.writer: Writer = writer or KubeWriter(manager.client, manager.events)
        ns = settings.runtime.namespace
        self.checks = manager.informer(MachineHealthCheck, namespace=ns)
        # Cluster API's Machines (the kind its MachineHealthCheck selects), with CAPM3's links
        self.machines = machine_kinds.capi_informer(
            manager, namespace=ns, indexes=indexes.of(indexes.MACHINES_BY_NODE)
        )
        self.nodes = manager.informer(Node)
        # the Machines' hosts: a teardown's claim holds remediation off (policy.interlock)
        self.hosts = manager.informer(BareMetalHost, namespace=ns)
        self.remediations = manager.informer(Metal3Remediation, namespace=ns)
        self.templates = manager.informer(Metal3RemediationTemplate, namespace=ns)
        self.own_writes = OwnWrites()  # the checks as their status was last written
        # the Machines as their conditions were last written, until the watch brings them
        self.machine_writes = OwnWrites()
        # check key -> (time.monotonic() its last evaluation ended, seconds it took)
        self.evaluated: dict[str, tuple[float, float]] = {}
        self.kinds = KindCaches(manager.client, ns)
        self.kinds.preset(METAL3_API, "Metal3Remediation", self.remediations)
        self.kinds.preset(METAL3_API, "Metal3RemediationTemplate", self.templates)
        manager.on_stop(self.kinds.stop)
        # Cluster API's Clusters, only where the API server serves them (controllers.clusters)
        self.clusters = ClusterCache(manager.client, ns)
        manager.on_stop(self.clusters.stop)
        self.settings = settings.health_checks
        self.policy_settings = policy.Settings(template_retry=self.settings.template_retry)

    # ---- observe ----------------------------------------------------------------------

    def selected(self, check: Any) -> list[Any]:
        """The check's Machines: its namespace, its cluster, its selector (as Cluster API,
        which adds ``cluster.x-k8s.io/cluster-name=<clusterName>`` to the selector)."""
        spec = check.get("spec") or {}
        selector = spec.get("selector") or {}
        ns = check.metadata.namespace
        return [
            m
            for m in self.cached_machines()
            if m.metadata.namespace == ns
            and cluster_of(m) == spec.get("clusterName")
            and matches(selector, m.metadata.labels)
        ]

    def cached_machines(self) -> list[Any]:
        """Every Machine of the cache, those the check wrote as it wrote them while the
        watch has not brought that write back (kube.own_writes). An evaluation in that gap
        (at 5,000 Machines the watch runs seconds behind an evaluation's writes) read the
        versions its writes replaced, decided the same conditions again and wrote them
        again, each refused as a conflict, the evaluation retried with backoff: writes of
        nothing new, and verdicts of other Machines delayed (docs/scale.md, fix 12)."""
        machines = list(self.machines.store.values())
        if not self.machine_writes:
            return machines
        keys = [object_key(m) for m in machines]
        self.machine_writes.retain(set(keys))
        return [self.machine_writes.latest(k, m) or m for k, m in zip(keys, machines, strict=True)]

    def observe(
        self,
        check: Any,
        template: Any | None,
        existing: Mapping[str, str] | None,
        cluster: Any | None = None,
    ) -> policy.View:
        """``template``: the remediation template found (None: not found or none named);
        ``existing``: remediation objects of the template's kind in the check's namespace,
        name -> uid ("" while being deleted); ``cluster``: the check's Cluster (None: not
        served, or not there: no Cluster is known)."""
        spec = check.get("spec") or {}
        status = policy.CheckStatus.from_wire(check.get("status"))
        generation = check.metadata.generation
        try:
            rules = parse_check(spec)
        except InvalidSpec as error:
            return policy.View(None, spec_error=str(error), status=status, generation=generation)
        ref = spec.get("remediationTemplate")
        if ref and (problem := template_elsewhere(check, ref)):
            return policy.View(None, spec_error=problem, status=status, generation=generation)
        remediate_by = self.remediate_by(check)
        machines = [m for m in self.selected(check) if not skipped(m)]
        if remediate_by == RemediateBy.ANNOTATION:  # the Machines carry the request
            existing = {
                m.metadata.name: ""
                for m in machines
                if names.EXTERNAL_REMEDIATION in (m.metadata.annotations or {})
            }
        missing = ""
        if ref and template is None:
            missing = f"remediation template {ref.get('kind')}/{ref.get('name')} not found"
        now = self.clock.now()
        readiness = None
        if cluster is not None:
            key = object_key(cluster)
            readiness = Readiness.from_wire(key, cluster.get("status"), now)
        return policy.View(
            check=rules,
            targets=tuple(self.target(m, existing, remediate_by, now, readiness) for m in machines),
            remediate_by=remediate_by,
            template=template_of(ref, template) if ref else None,
            template_missing=missing,
            overlaps=tuple(self.overlapping(check, machines)),
            status=status,
            generation=generation,
        )

    def remediate_by(self, check: Any) -> RemediateBy:
        if (check.get("spec") or {}).get("remediationTemplate"):
            return RemediateBy.TEMPLATE
        chosen = (check.metadata.annotations or {}).get(names.REQUEST_REMEDIATION_BY)
        if (chosen or self.settings.request_remediation_by) == RequestRemediationBy.ANNOTATION:
            return RemediateBy.ANNOTATION
        return RemediateBy.CONDITIONS

    def target(
        self,
        machine: Any,
        existing: Mapping[str, str] | None,
        remediate_by: RemediateBy,
        now: dt.datetime,
        cluster: Readiness | None = None,
    ) -> Target:
        node_name = next(iter(links.node_of(machine)), None)
        node = self.nodes.store.get(node_name) if node_name else None
        name = machine.metadata.name
        if remediate_by == RemediateBy.CONDITIONS:
            remediating = owner_remediating(machine)
        else:
            remediating = existing is not None and name in existing
        uid = (existing or {}).get(name, "") if remediate_by == RemediateBy.TEMPLATE else ""
        held = self.teardown_hold(machine, node)
        return target_of(
            machine, node, now, remediating, remediation_uid=uid, teardown=held, cluster=cluster
        )

    def teardown_hold(self, machine: Any, node: Any | None) -> str:
        """Why the Machine's host may not be remediated now: a teardown claims it ("" when
        not; docs/design.md, invariant 7)."""
        host = next((self.hosts.store.get(k) for k in links.host_of(machine)), None)
        if host is None:
            return ""
        claim = interlock.teardown_claim(host.metadata.annotations or {})
        if claim is None:
            return ""
        uid = node.metadata.uid if node is not None else None
        name = node.metadata.name if node is not None else None
        stale = interlock.claim_stale(claim, name, uid)
        return interlock.hold_message(object_key(host), claim, stale)

    def overlapping(self, check: Any, machines: list[Any]) -> list[str]:
        key, namespace = object_key(check), check.metadata.namespace
        candidates = [
            other
            for other in self.checks.store.values()
            if object_key(other) != key and other.metadata.namespace == namespace
        ]
        if not candidates:  # the usual case: no set of this check's Machines to build
            return []
        mine = {object_key(m) for m in machines}
        return sorted(
            other.metadata.name
            for other in candidates
            if mine & {object_key(m) for m in self.selected(other)}
        )

    # ---- cached reads of the template and its remediation objects ---------------------------

    async def template(self, check: Any) -> Any | None:
        ref = (check.get("spec") or {}).get("remediationTemplate") or {}
        api_version, kind = ref.get("apiVersion", ""), ref.get("kind", "")
        name = str(ref.get("name", ""))
        namespace = check.metadata.namespace
        try:
            informer = await self.kinds.synced(api_version, kind)
            if informer is not None:
                return informer.store.get(f"{namespace}/{name}")
            return await self.client.get(generic(api_version, kind), name, namespace=namespace)
        except ValueError:  # lightkube cannot model it (the CRD now refuses such references)
            return None
        except ApiError as error:
            if errors.is_not_found(error):
                return None
            raise

    async def existing(self, check: Any) -> dict[str, str]:
        """Remediation objects of the template's kind in the check's namespace: name ->
        uid ("" for one being deleted: it still counts, but is not deleted again)."""
        ref = (check.get("spec") or {}).get("remediationTemplate") or {}
        api_version = ref.get("apiVersion", "")
        kind = str(ref.get("kind", "")).removesuffix("Template")
        namespace = check.metadata.namespace
        informer = await self.kinds.synced(api_version, kind)
        if informer is not None:
            found = [o for o in informer.store.values() if o.metadata.namespace == namespace]
        else:
            resource = generic(api_version, kind)
            found = [o async for o in self.client.list(resource, namespace=namespace)]
        return {
            o.metadata.name: "" if o.metadata.deletionTimestamp else str(o.metadata.uid)
            for o in found
        }

    def pause_before(self, key: str, old: Any | None = None, new: Any | None = None) -> float:
        """Seconds before a Machine change may start the next evaluation of the check
        ``key`` (PAUSE_FACTOR)."""
        ended, took = self.evaluated.get(key, (0.0, 0.0))
        return pause(ended, took, time.monotonic())

    def node_change_wait(self, key: str, old: Any | None, new: Any | None) -> float:
        """Seconds before a Node's change may start the next evaluation of the check
        ``key`` (``node_wait``)."""
        check = self.checks.store.get(key)
        rules = None
        with contextlib.suppress(InvalidSpec):  # the evaluation says so on the check
            rules = parse_check(check.get("spec") or {}) if check is not None else None
        return node_wait(old, new, rules, self.clock.now(), self.pause_before(key))

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        # as we last wrote it, until the watch brings that write back (kube.own_writes): the
        # evaluation before may have held the event loop until now
        check = self.own_writes.latest(key, self.checks.store.get(key))
        if check is None or skipped(check):
            return DONE
        template, existing = None, None
        spec = check.get("spec") or {}
        if spec.get("remediationTemplate") and not template_elsewhere(
            check, spec["remediationTemplate"]
        ):
            template = await self.template(check)
            existing = await self.existing(check) if template is not None else None
        cluster_name = spec.get("clusterName")
        cluster = None
        if isinstance(cluster_name, str) and cluster_name:
            cluster = await self.clusters.get(check.metadata.namespace, cluster_name)
            if cluster is not None and paused(cluster):
                return DONE  # as Cluster API; its unpausing wakes the check
        began = time.monotonic()
        view = self.observe(check, template, existing, cluster)
        decision = policy.decide(view, self.clock.now(), self.policy_settings)
        ended = time.monotonic()
        self.evaluated[key] = (ended, ended - began)
        # Built only when there is something to do: an evaluation that changes nothing
        # (most of them) costs no walk over every Machine of the cache.
        machines = {object_key(m): m for m in self.cached_machines()} if decision.actions else {}
        conditions = [a for a in decision.actions if isinstance(a, policy.SetMachineConditions)]
        await self.set_conditions(conditions, machines)
        for action in decision.actions:
            if not isinstance(action, policy.SetMachineConditions):
                check = await self.act(check, action, machines) or check
        return Result.at(decision.requeue_at) if decision.requeue_at else DONE

    async def set_conditions(
        self, actions: list[policy.SetMachineConditions], machines: dict[str, Any]
    ) -> None:
        """Each Machine's conditions, up to WRITES_IN_FLIGHT writes at a time, before any
        other action (the facts before the remediation they explain; each Machine's later
        writes carry the version this one left). One write at a time, the first verdicts
        of a check over 5,000 Machines were 5,000 round trips in a row: minutes of writes
        after every Machine had its Node when the API server answers in 200 ms
        (docs/scale.md, fix 11). A write that fails does not stop the others; the first
        failure is raised once all are done (a conflict: the check is evaluated again)."""
        slots = asyncio.Semaphore(WRITES_IN_FLIGHT)

        async def one(action: policy.SetMachineConditions) -> None:
            async with slots:
                await self.write_conditions(action, machines)

        outcomes = await asyncio.gather(*(one(a) for a in actions), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def write_conditions(
        self, action: policy.SetMachineConditions, machines: dict[str, Any]
    ) -> None:
        machine = machines[action.machine]
        wanted = dict(machine.get("status") or {})
        wanted["conditions"] = [dict(c) for c in action.conditions]
        written = await self.writer.patch_status(Machine, machine, wanted)
        if written is not None:
            self.machine_writes.wrote(action.machine, machine, written)
        machines[action.machine] = written or machine

    async def act(self, check: Any, action: policy.Action, machines: dict[str, Any]) -> Any | None:
        """Carry one action out; return the check if the action changed it. ``machines``
        (by key) is updated with each Machine an action changes."""
        match action:
            case policy.SetStatus(status=status):
                wire = status.to_wire(check.get("status") or {})
                written = await self.writer.patch_status(MachineHealthCheck, check, wire)
                if written is not None:
                    self.own_writes.wrote(object_key(check), check, written)
                return written
            case policy.SetMachineConditions():
                await self.write_conditions(action, machines)
            case (
                policy.RequestRemediationByAnnotation(machine=key)
                | policy.WithdrawAnnotation(machine=key)
            ):
                asking = isinstance(action, policy.RequestRemediationByAnnotation)
                changes = {names.EXTERNAL_REMEDIATION: "" if asking else None}
                machine = machines[key]
                # Asking is conditional on the Machine decided on: from an older version
                # (before machine-remediation ended the last request and stamped the end),
                # it would ask again at once for a server that is booting.
                changed = await self.writer.patch_metadata(
                    Machine, machine, "annotations", changes, require_version=asking
                )
                if changed is not None:
                    self.machine_writes.wrote(key, machine, changed)
                machines[key] = changed or machine
            case policy.CreateRemediation():
                resource = generic(action.api_version, action.kind)
                await self.writer.create(resource, remediation_object(resource, action))
            case policy.DeleteRemediation(machine=key, api_version=api, kind=kind, uid=uid):
                namespace, name = split_key(key)
                await self.writer.delete_exact(generic(api, kind), name, uid, namespace=namespace)
            case policy.MachineEvent(target=key, type=kind, reason=reason, message=message):
                await self.writer.record_event(machines[key], str(kind), reason, message)
            case Event(type=kind, reason=reason, message=message):
                await self.writer.record_event(check, str(kind), reason, message)
            case policy.StopUntilEdited(message=message):
                raise TerminalError(f"invalid spec: {message}")  # until it is edited
        return None


# ---- between API objects and policy values -------------------------------------------------


def parse_check(spec: dict[str, Any]) -> Check:
    """The spec as policy.healthcheck reads it; InvalidSpec says what is wrong."""
    return check_from_spec(spec)


def cluster_of(machine: Any) -> Any:
    """A Machine's cluster: its ``cluster.x-k8s.io/cluster-name`` label (which Cluster
    API's Machine webhook sets from spec.clusterName); without the label (no webhook
    here), spec.clusterName."""
    label = (machine.metadata.labels or {}).get(names.CLUSTER_NAME_LABEL)
    return label if label else (machine.get("spec") or {}).get("clusterName")


def template_elsewhere(check: Any, ref: Mapping[str, Any]) -> str:
    """As Cluster API's webhook: a check may not copy another namespace's template (also
    refused at admission by deploy/policies/machinehealthcheck-admission.yaml; this is
    for checks stored before, or where that policy is not installed)."""
    elsewhere = ref.get("namespace")
    if elsewhere and elsewhere != check.metadata.namespace:
        return (
            f"remediationTemplate.namespace {elsewhere!r} must be empty or this check's"
            f" own namespace {check.metadata.namespace!r}"
        )
    return ""


def template_of(ref: Mapping[str, Any], template: Any | None) -> policy.Template | None:
    if template is None:
        return None
    body = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
    kind = str(ref.get("kind", "")).removesuffix("Template")
    return policy.Template(str(ref.get("apiVersion", "")), kind, dict(body))


def remediation_object(resource: Any, action: policy.CreateRemediation) -> Any:
    namespace, name = split_key(action.machine)
    owner = OwnerReference(
        apiVersion="cluster.x-k8s.io/v1beta1", kind="Machine", name=name, uid=action.machine_uid
    )
    metadata = ObjectMeta(name=name, namespace=namespace, ownerReferences=[owner])
    return resource(metadata=metadata, spec=dict(action.spec))


def owner_remediating(machine: Any) -> bool:
    """OwnerRemediated=False: the Machine's owner is remediating it (conditions)."""
    conditions = (machine.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == names.CONDITION_OWNER_REMEDIATED and c.get("status") == "False"
        for c in conditions
        if isinstance(c, Mapping)
    )


def _time(text: Any) -> dt.datetime | None:
    """A condition time as written by anyone: one that does not parse is absent."""
    try:
        return parse_stamp(text) if isinstance(text, str) else None
    except (ValueError, OverflowError):
        return None


def failure_of(status: Mapping[str, Any]) -> str:
    """Cluster API's MachineHasFailure: failureReason, else failureMessage."""
    for field, label in (("failureReason", "FailureReason"), ("failureMessage", "FailureMessage")):
        value = status.get(field)
        if value:
            return f"{label}: {value}"
    return ""


def infrastructure_ready_at(conditions: list[Any]) -> dt.datetime | None:
    for c in conditions:
        if isinstance(c, Mapping) and c.get("type") == "InfrastructureReady":
            return _time(c.get("lastTransitionTime")) if c.get("status") == "True" else None
    return None


def node_conditions(node: Any, now: dt.datetime) -> dict[str, NodeCondition]:
    """A Node's conditions as policy.healthcheck reads them: by type, the status and
    since when (the transition, else the heartbeat, else ``now``)."""
    conditions: dict[str, NodeCondition] = {}
    for c in (node.status.conditions if node.status else None) or []:
        since = c.lastTransitionTime or c.lastHeartbeatTime or now
        conditions[c.type] = NodeCondition(c.status, since)
    return conditions


def target_of(
    machine: Any,
    node: Any | None,
    now: dt.datetime,
    remediating: bool,
    remediation_uid: str = "",
    teardown: str = "",
    cluster: Readiness | None = None,
) -> Target:
    """What policy.healthcheck reads of a Machine and its Node (None: not found), and of
    its Cluster (None: no Cluster known)."""
    conditions = node_conditions(node, now) if node is not None else {}
    status = machine.get("status") or {}
    status = status if isinstance(status, Mapping) else {}
    machine_conditions = status.get("conditions") or []
    machine_conditions = machine_conditions if isinstance(machine_conditions, list) else []
    annotations = machine.metadata.annotations or {}
    return Target(
        machine=object_key(machine),
        created=machine.metadata.creationTimestamp or now,
        node_ref=next(iter(links.node_of(machine)), None),
        node_exists=node is not None,
        conditions=conditions,
        remediating=remediating,
        failure=failure_of(status),
        remediation_requested=names.REMEDIATE_MACHINE in annotations,
        deleting=machine.metadata.deletionTimestamp is not None,
        infrastructure_ready_at=infrastructure_ready_at(machine_conditions),
        uid=str(machine.metadata.uid or ""),
        machine_conditions=tuple(dict(c) for c in machine_conditions if isinstance(c, Mapping)),
        remediation_uid=remediation_uid,
        # tenant-writable: a value that is not a time reads as absent (policy says what a
        # time in the future means)
        remediation_ended_at=_time(annotations.get(names.REMEDIATION_ENDED_AT)),
        teardown=teardown,
        cluster_ready_at=cluster.ready_at if cluster is not None else None,
        cluster_not_ready=(
            cluster.not_ready(is_control_plane(machine)) if cluster is not None else ""
        ),
    )


def teardown_claim_changed(old: Any | None, new: Any | None) -> bool:
    """A host event that can change a verdict's remediation: its teardown claim came,
    went or changed (power status writes wake nothing)."""
    claims = [
        (obj.metadata.annotations or {}).get(interlock.TEARDOWN_ANNOTATION) if obj else None
        for obj in (old, new)
    ]
    return claims[0] != claims[1]


# The Machine conditions only a check writes (policy.healthcheck): a change of them alone
# is the check's own write coming back. OwnerRemediated is not one: the owner ends it.
OWN_CONDITIONS = frozenset(
    {names.CONDITION_HEALTH_CHECK_SUCCEEDED, interlock.CONDITION_HOST_AVAILABLE}
)


def pause(ended: float, took: float, now: float) -> float:
    """Seconds from ``now`` until PAUSE_FACTOR times an evaluation that took ``took`` s
    has passed since it ``ended`` (0: at once)."""
    return max(0.0, ended + PAUSE_FACTOR * took - now)


def remediation_changed(old: Any | None, new: Any | None) -> bool:
    """A remediation object's event that can change a verdict: it came, went, was
    replaced (another uid) or began deleting; that is all a check reads of one
    (``existing``). Not its status: a remediation writes its progress there several times
    (fence-remediation: each step), and each woke every check of its namespace for a full
    evaluation of all their Machines. A template's change always counts (its spec is
    what a remediation is made from)."""
    if old is None or new is None:
        return True
    if str(getattr(new, "kind", None) or type(new).__name__).endswith("Template"):
        return True
    return presence(old) != presence(new)


def presence(obj: Any) -> tuple[Any, ...]:
    """Which object it is and whether it is being deleted: uid, name, deleting."""
    meta = obj.metadata
    return meta.uid, meta.name, meta.deletionTimestamp is not None


def node_wait(
    old: Any | None, new: Any | None, rules: Check | None, now: dt.datetime, paused: float
) -> float:
    """Seconds a Node's change (``old`` -> ``new``) may wait before the check with
    ``rules`` (None: unknown, or a spec it cannot honour) is evaluated, when a Machine's
    change would wait ``paused``: as long, but never past the soonest verdict the Node's
    conditions bring, and not at all for a Node that came, went, was replaced or began
    deleting (its Machine's Node is missing: a verdict at once)."""
    if old is None or new is None or rules is None:
        return 0.0
    if presence(old) != presence(new):
        return 0.0
    due = policy.verdict_due(rules, node_conditions(new, now), now)
    return paused if due is None else min(paused, due)


def machine_changed(old: Any | None, new: Any | None) -> bool:
    """A Machine event that can change what a check decides: the Machine came or went, or
    anything of it changed but the check's own conditions (OWN_CONDITIONS) and a write's
    bookkeeping (resourceVersion, managedFields). Its own condition writes woke the check
    for a full evaluation of every Machine it selects after each batch of writes, to
    decide nothing: at 5,000 Machines, most of a second of the event loop each."""
    if old is None or new is None:
        return True
    return machine_read(old) != machine_read(new)


def machine_read(machine: Any) -> dict[str, Any]:
    """The Machine as a check reads it: all of it but OWN_CONDITIONS and a write's
    bookkeeping."""
    body = dict(machine.to_dict() if hasattr(machine, "to_dict") else machine)
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        skip = ("resourceVersion", "managedFields")
        body["metadata"] = {k: v for k, v in metadata.items() if k not in skip}
    status = body.get("status")
    if isinstance(status, Mapping) and isinstance(status.get("conditions"), list):
        kept = [
            c for c in status["conditions"]
            if not (isinstance(c, Mapping) and c.get("type") in OWN_CONDITIONS)
        ]  # fmt: skip
        body["status"] = {**status, "conditions": kept}
    return body


def check_changed(old: Any | None, new: Any | None) -> bool:
    """A check event worth an evaluation: the check came or went, or anything of it but
    its status (the controller's own write) changed."""
    if old is None or new is None:
        return True
    return without_status(old) != without_status(new)


def without_status(obj: Any) -> dict[str, Any]:
    body = dict(obj.to_dict() if hasattr(obj, "to_dict") else obj)
    body.pop("status", None)
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        skip = ("resourceVersion", "managedFields")
        body["metadata"] = {k: v for k, v in metadata.items() if k not in skip}
    return body


def node_health_changed(old: Any | None, new: Any | None) -> bool:
    """A Node event that can change a verdict: the Node came or went (or was replaced:
    another uid), started deleting, or a condition's status or start changed. Not a
    heartbeat: a kubelet (or kwok) rewrites every condition's lastHeartbeatTime every few
    minutes per Node, and each woke every check of the Node's Machines for a full
    evaluation of all their Machines; at 5,000 Nodes that was several evaluations of
    5,000 Machines a second, at rest (benchmarks/scale.py)."""
    if old is None or new is None:
        return True
    return node_health(old) != node_health(new)


def node_health(node: Any) -> tuple[Any, ...]:
    """What a check reads of a Node (``target_of``, ``teardown_hold``): its identity,
    whether it is deleting, and per condition its status and since when (the transition
    time, else the heartbeat: ``target_of`` falls back to it the same way)."""
    conditions = (node.status.conditions if node.status else None) or []
    since = frozenset(
        (c.type, c.status, c.lastTransitionTime or c.lastHeartbeatTime) for c in conditions
    )
    return *presence(node), since


def setup(manager: Manager, settings: Settings) -> None:
    controller = HealthCheckController(manager, settings)
    checks = controller.checks

    def checks_in(namespace: str | None) -> list[str]:
        return [object_key(c) for c in checks.store.values() if c.metadata.namespace == namespace]

    def for_namespace(old: Any, new: Any) -> list[str]:
        obj = new if new is not None else old
        return checks_in(obj.metadata.namespace)

    def for_node(old: Any, new: Any) -> list[str]:
        node = new if new is not None else old
        keys: set[str] = set()
        for machine in controller.machines.store.by_index(
            indexes.MACHINES_BY_NODE.name, node.metadata.name
        ):
            keys.update(checks_in(machine.metadata.namespace))
        return sorted(keys)

    runner = manager.add(Controller("machine-health-check", controller.reconcile, workers=2))
    metrics.from_cache(
        "machine-health-check", lambda: metrics.blocked_check_samples(checks.store.values())
    )
    runner.watch(checks, predicate=check_changed)

    # a batch of Machine changes makes one evaluation (PAUSE_FACTOR), and so does a batch
    # of Node changes, up to the soonest verdict they bring
    machines = controller.machines
    runner.watch(machines, for_namespace, machine_changed, delay=controller.pause_before)
    runner.watch(controller.nodes, for_node, node_health_changed, delay=controller.node_change_wait)
    runner.watch(controller.remediations, for_namespace, predicate=remediation_changed)
    runner.watch(controller.templates, for_namespace)
    runner.watch(controller.hosts, for_namespace, predicate=teardown_claim_changed)

    def other_kind_changed(old: Any, new: Any) -> None:  # an informer started on demand
        if not remediation_changed(old, new):
            return
        for key in for_namespace(old, new):
            runner.queue.add(key)

    controller.kinds.on_change.append(other_kind_changed)

    def cluster_changed(old: Any, new: Any) -> None:  # Clusters: only where served
        if watched(old) == watched(new):
            return
        cluster = new if new is not None else old
        for check in checks.store.values():
            if (
                check.metadata.namespace == cluster.metadata.namespace
                and (check.get("spec") or {}).get("clusterName") == cluster.metadata.name
            ):
                runner.queue.add(object_key(check))

    controller.clusters.on_change.append(cluster_changed)
