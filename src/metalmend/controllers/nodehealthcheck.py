"""The NodeHealthCheck controller ("node-health-check"), in the house shape
(docs/decide-act.md): ``observe`` builds a frozen view of one check from the informers'
caches (the Nodes its selector picks, each with its BareMetalHost and the Metal3Remediation
made for it), policy.nodehealthcheck ``decide``s, and ``act`` carries each action out.

A Node's host is the one that confirms it (api/links.node_host): the host whose uid its
providerID carries, or the host that names it (``metalmend.dev/node-name: <node>`` on the
BareMetalHost); on OpenShift, also the host of the Machine its
``machine.openshift.io/machine`` annotation names, when that Machine names the Node back
and its host confirms the Machine (api/links.node_host_through_machine); never the Node's
own word alone, which its kubelet writes. A Node without
one, or whose host is outside the namespace of the check's templates, is reported, never
remediated; so is every Node that shares its host with another selected Node.

Remediation goes through metalmend's fence-first flow: a Metal3Remediation (or, from a
FenceRemediationTemplate, a FenceRemediation) named after the Node in its host's namespace,
annotated with the Node's name (names.REMEDIATED_NODE, NHC's node-name) and its template's,
labelled with the check's name and owned by the check; metal3-remediation (fence-remediation)
fences the host (power off, confirm off, out-of-service taint or Node deletion, per its
settings, under the teardown interlock). With escalatingRemediations, one object per step,
the timed-out one annotated as NHC does. Deleted once the Node is healthy again (after
healthyDelay). Stateless: every fact is read again from the caches and the check's status,
and the objects it makes have fixed names, so a restart at any point resumes where the
objects and the status say.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node

from metalmend.api import indexes, links, names
from metalmend.api.resources import (
    BareMetalHost,
    FenceRemediation,
    FenceRemediationTemplate,
    Metal3Remediation,
    Metal3RemediationTemplate,
    NodeHealthCheck,
)
from metalmend.api.selector import matches
from metalmend.api.stamps import parse_stamp
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers.healthcheck import check_changed, node_health
from metalmend.controllers.tenancy import node_host_of
from metalmend.kube.admission import PolicyInForce
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.own_writes import OwnWrites
from metalmend.kube.store import object_key
from metalmend.kube.writer import KubeWriter, Writer
from metalmend.policy import interlock
from metalmend.policy import nodehealthcheck as policy
from metalmend.policy.decision import Event
from metalmend.policy.healthcheck import InvalidSpec, NodeCondition
from metalmend.settings import Settings

log = logging.getLogger(__name__)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

API_VERSION = "healthcheck.metalmend.dev/v1alpha1"
ESCALATE_REFUSED = (
    "remediation template {ref}: strategy escalate deletes the Machine, and Nodes checked"
    " by a NodeHealthCheck have none; use strategy reboot"
)
# The remediation kinds a check makes, and their templates.
KINDS: Mapping[str, Any] = {
    policy.REMEDIATION_KIND: Metal3Remediation,
    policy.FENCE_KIND: FenceRemediation,
}


class NodeHealthCheckController:
    def __init__(self, manager: Manager, settings: Settings, writer: Writer | None = None) -> None:
        self.clock = manager.clock
        self.writer: Writer = writer or KubeWriter(manager.client, manager.events)
        ns = settings.runtime.namespace
        self.checks = manager.informer(NodeHealthCheck)
        self.nodes = manager.informer(Node)
        self.hosts = manager.informer(
            BareMetalHost,
            namespace=ns,
            indexes=indexes.of(indexes.HOSTS_BY_NODE, indexes.HOSTS_BY_UID),
        )
        # OpenShift's Machines, where served: a Node's machine.openshift.io/machine annotation
        self.openshift_machines = machine_kinds.openshift_informer(manager, namespace=ns)
        self.remediations = {
            kind: manager.informer(resource, namespace=ns) for kind, resource in KINDS.items()
        }
        self.templates = {
            f"{policy.REMEDIATION_KIND}Template": manager.informer(
                Metal3RemediationTemplate, namespace=ns
            ),
            f"{policy.FENCE_KIND}Template": manager.informer(
                FenceRemediationTemplate, namespace=ns
            ),
        }
        # who may write the hosts' word on their Node (api/links.node_host)
        self.node_name_guard = PolicyInForce(manager, names.NODE_NAME_POLICY)
        self.own_writes = OwnWrites()

    # ---- observe ----------------------------------------------------------------------

    def observe(self, check: Any) -> policy.View:
        spec = check.get("spec") or {}
        status = policy.NodeCheckStatus.from_wire(check.get("status"))
        generation = check.metadata.generation
        templates: list[policy.Template] = []
        missing = ""
        try:
            rules = policy.check_from_spec(spec)
            for step in rules.steps:
                template = self.template(step.ref)
                if template is None and step.ref is not None:
                    missing = missing or f"{step.ref.kind} {step.ref.key} not found"
                elif template is not None:
                    templates.append(template)
        except InvalidSpec as error:
            return policy.View(None, spec_error=str(error), status=status, generation=generation)
        selector = spec.get("selector") or {}
        mine = self.made_by(check.metadata.name)
        targets = [
            self.target(node, mine.get(node.metadata.name))
            for node in self.nodes.store.values()
            if matches(selector, node.metadata.labels)
        ]
        targets = one_node_per_host(targets)
        selected = {t.name for t in targets}
        # its remediations of Nodes no longer selected (judged until their remediation
        # ends) or gone (deleted by fencing: reported, never healthy)
        for name, obj in sorted(mine.items()):
            if name in selected:
                continue
            node = self.nodes.store.get(name)
            if node is not None:
                targets.append(self.target(node, obj))
            else:
                gone = policy.NodeTarget(
                    name=name,
                    uid="",
                    remediations=tuple(obj),
                    exists=False,
                )
                targets.append(gone)
        return policy.View(
            check=rules,
            targets=tuple(targets),
            templates=tuple(templates),
            template_missing=missing,
            status=status,
            generation=generation,
        )

    def template(self, ref: policy.TemplateRef | None) -> policy.Template | None:
        """The spec remediations of a step are made with; None: the named template is not
        there. InvalidSpec: one that cannot be used for Nodes."""
        if ref is None:
            return None  # never from a spec as read: a check names its templates
        template = self.templates[ref.kind].store.get(ref.key)
        if template is None:
            return None
        body = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
        if body.get("strategy") == "escalate":
            raise InvalidSpec(ESCALATE_REFUSED.format(ref=f"{ref.kind} {ref.key}"))
        return policy.Template(dict(body))

    def made_by(self, check_name: str) -> dict[str, list[policy.Remediation]]:
        """The remediation objects (of both kinds) this check made, by Node name."""
        found: dict[str, list[policy.Remediation]] = {}
        for kind, informer in self.remediations.items():
            for obj in informer.store.values():
                labels = obj.metadata.labels or {}
                node = node_of(obj)
                if node and labels.get(names.NODE_HEALTH_CHECK_LABEL) == check_name:
                    found.setdefault(node, []).append(remediation_of(obj, kind))
        return found

    def host_of(self, node: Any) -> tuple[Any | None, str]:
        """The Node's BareMetalHost, as its hosts confirm it (api/links.node_host), or why
        none."""
        machines = self.openshift_machines
        found = node_host_of(
            node, self.hosts, self.node_name_guard, machines.store.get if machines else None
        )
        if found.key is None:
            return None, found.problem
        host = self.hosts.store.get(found.key)
        if host is None:  # the index and the store are one cache: gone meanwhile
            return None, f"BareMetalHost {found.key} not found"
        return host, ""

    def target(self, node: Any, remediations: list[policy.Remediation] | None) -> policy.NodeTarget:
        now = self.clock.now()
        conditions: dict[str, NodeCondition] = {}
        for c in (node.status.conditions if node.status else None) or []:
            since = c.lastTransitionTime or c.lastHeartbeatTime or now
            conditions[c.type] = NodeCondition(c.status, since)
        host, problem = self.host_of(node)
        teardown = ""
        if host is not None:
            claim = interlock.teardown_claim(host.metadata.annotations or {})
            if claim is not None:
                stale = interlock.claim_stale(claim, node.metadata.name, node.metadata.uid)
                teardown = interlock.hold_message(object_key(host), claim, stale)
        found = tuple(remediations or ())
        return policy.NodeTarget(
            name=node.metadata.name,
            uid=str(node.metadata.uid or ""),
            conditions=conditions,
            deleting=node.metadata.deletionTimestamp is not None,
            host=object_key(host) if host is not None else "",
            host_problem=problem,
            remediations=found,
            teardown=teardown,
            confirmed_healthy=names.NHC_CONFIRMED_HEALTHY in (node.metadata.annotations or {}),
        )

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        check = self.own_writes.latest(key, self.checks.store.get(key))
        if check is None:
            return DONE
        decision = policy.decide(self.observe(check), self.clock.now())
        for action in decision.actions:
            check = await self.act(check, action) or check
        return Result.at(decision.requeue_at) if decision.requeue_at else DONE

    async def act(self, check: Any, action: policy.Action) -> Any | None:
        match action:
            case policy.SetStatus(status=status):
                wire = status.to_wire(check.get("status") or {})
                written = await self.writer.patch_status(NodeHealthCheck, check, wire)
                if written is not None:
                    self.own_writes.wrote(object_key(check), check, written)
                return written
            case policy.CreateRemediation(kind=kind):
                await self.writer.create(KINDS[kind], remediation_object(check, action))
            case policy.DeleteRemediation(namespace=namespace, name=name, uid=uid, kind=kind):
                await self.writer.delete_exact(KINDS[kind], name, uid, namespace=namespace)
            case policy.AnnotateRemediation(kind=kind, key=annotation, value=value):
                found = self.remediations[kind].store.get(f"{action.namespace}/{action.name}")
                if found is not None and str(found.metadata.uid) == action.uid:
                    await self.writer.patch_metadata(
                        KINDS[kind], found, "annotations", {annotation: value}
                    )
            case policy.ClearNodeAnnotation(node=name, key=annotation):
                node = self.nodes.store.get(name)
                if node is not None:
                    await self.writer.patch_metadata(Node, node, "annotations", {annotation: None})
            case policy.NodeEvent(target=name, type=kind, reason=reason, message=message):
                node = self.nodes.store.get(name)
                if node is not None:
                    await self.writer.record_event(node, str(kind), reason, message)
            case Event(type=kind, reason=reason, message=message):
                await self.writer.record_event(check, str(kind), reason, message)
        return None


def one_node_per_host(targets: list[policy.NodeTarget]) -> list[policy.NodeTarget]:
    """Two Nodes confirmed by one host (two providerIDs carrying its uid): neither is that
    host's for sure, so neither is remediated through it (each is reported)."""
    by_host: dict[str, list[str]] = {}
    for target in targets:
        if target.host:
            by_host.setdefault(target.host, []).append(target.name)
    shared = {host: sorted(nodes) for host, nodes in by_host.items() if len(nodes) > 1}
    return [
        replace(
            t,
            host="",
            host_problem=f"Nodes {', '.join(shared[t.host])} all claim host {t.host}: none is"
            " trusted",
        )
        if t.host in shared
        else t
        for t in targets
    ]


def node_of(obj: Any) -> str | None:
    """The Node a remediation object this controller made is for."""
    annotations = obj.metadata.annotations or {}
    return annotations.get(names.REMEDIATED_NODE) or annotations.get(names.NHC_NODE_NAME)


def remediation_of(obj: Any, kind: str) -> policy.Remediation:
    """A remediation as the policy reads it (uid "" while it is being deleted: it still
    counts, but is not deleted again). Annotations and conditions anyone may have written
    badly read as absent."""
    meta = obj.metadata
    deleting = meta.deletionTimestamp is not None
    uid = "" if deleting else str(meta.uid or "")
    annotations = meta.annotations or {}
    conditions = (obj.get("status") or {}).get("conditions")
    succeeded = None
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, Mapping) and condition.get("type") == "Succeeded":
            status = condition.get("status")
            succeeded = True if status == "True" else False if status == "False" else None
    return policy.Remediation(
        meta.namespace,
        meta.name,
        uid,
        meta.creationTimestamp,
        kind=kind,
        timed_out=_when(annotations, names.NHC_TIMED_OUT),
        healthy_since=_when(annotations, names.NHC_HEALTHY_DELAY),
        succeeded=succeeded,
        template=annotations.get(names.NHC_TEMPLATE_NAME, ""),
    )


def _when(annotations: Mapping[str, str], key: str) -> dt.datetime | None:
    """An annotation's time; present but unreadable: now-ish is not guessed, the epoch is
    (a timed-out mark stays a mark; a healthy-delay start long past)."""
    if key not in annotations:
        return None
    try:
        return parse_stamp(annotations[key]) or EPOCH
    except (ValueError, OverflowError):
        return EPOCH


def remediation_object(check: Any, action: policy.CreateRemediation) -> Any:
    namespace = action.host.partition("/")[0]
    owner = OwnerReference(
        apiVersion=API_VERSION,
        kind="NodeHealthCheck",
        name=check.metadata.name,
        uid=str(check.metadata.uid),
    )
    annotations = {names.REMEDIATED_NODE: action.node, names.NHC_NODE_NAME: action.node}
    if action.template:
        annotations[names.NHC_TEMPLATE_NAME] = action.template
    metadata = ObjectMeta(
        name=action.node,
        namespace=namespace,
        annotations=annotations,
        labels={names.NODE_HEALTH_CHECK_LABEL: check.metadata.name},
        ownerReferences=[owner],
    )
    return KINDS[action.kind](metadata=metadata, spec=dict(action.spec))


def node_read(node: Any) -> tuple[Any, ...]:
    """What a check reads of a Node: its health (as the MachineHealthCheck), its labels
    (the selector) and how it names its host."""
    annotations = node.metadata.annotations or {}
    return (
        node_health(node),
        tuple(sorted((node.metadata.labels or {}).items())),
        annotations.get(names.NODE_HOST),
        annotations.get(names.OPENSHIFT_NODE_MACHINE),
        links.node_provider_id(node),
        names.NHC_CONFIRMED_HEALTHY in annotations,
    )


def node_changed(old: Any | None, new: Any | None) -> bool:
    if old is None or new is None:
        return True
    return node_read(old) != node_read(new)


def host_changed(old: Any | None, new: Any | None) -> bool:
    """A host came or went, or its teardown claim, the Node it names or the consumer it
    confirms changed (power writes wake nothing)."""
    if old is None or new is None:
        return True
    read = [
        (
            (obj.metadata.annotations or {}).get(interlock.TEARDOWN_ANNOTATION),
            (obj.metadata.annotations or {}).get(names.HOST_NODE),
            (obj.get("spec") or {}).get("consumerRef"),
        )
        for obj in (old, new)
    ]
    return read[0] != read[1]


def machine_changed(old: Any | None, new: Any | None) -> bool:
    """An OpenShift Machine came or went, or what links it to a Node and a host changed."""
    if old is None or new is None:
        return True
    return links.node_machine_facts(old) != links.node_machine_facts(new)


def setup(manager: Manager, settings: Settings) -> None:
    controller = NodeHealthCheckController(manager, settings)
    checks = controller.checks

    def every_check(old: Any, new: Any) -> list[str]:
        del old, new
        return sorted(object_key(c) for c in checks.store.values())

    def made_by_check(old: Any, new: Any) -> list[str]:
        obj = new if new is not None else old
        name = (obj.metadata.labels or {}).get(names.NODE_HEALTH_CHECK_LABEL)
        return [name] if name else []

    runner = manager.add(Controller("node-health-check", controller.reconcile, workers=1))
    runner.watch(checks, predicate=check_changed)
    runner.watch(controller.nodes, every_check, predicate=node_changed)
    runner.watch(controller.hosts, every_check, predicate=host_changed)
    guard = controller.node_name_guard
    runner.watch(guard.policies, every_check, predicate=guard.concerns)
    runner.watch(guard.bindings, every_check, predicate=guard.concerns)
    if controller.openshift_machines is not None:
        runner.watch(controller.openshift_machines, every_check, predicate=machine_changed)
    for informer in controller.remediations.values():
        runner.watch(informer, made_by_check)
    for informer in controller.templates.values():
        runner.watch(informer, every_check)
