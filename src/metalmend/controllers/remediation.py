"""The Metal3Remediation controller ("metal3-remediation"): fence first (metal3's
Metal3Remediation proposal).

Observe the remediation object, its Machine, host and Node from the caches; ask
policy.remediation what to do; carry the actions out in order. Every action is idempotent
and every phase re-asserts its own preconditions, so a kill between any two actions is
resumed by the next reconcile. Writes to our own object carry the resourceVersion the
decision was made on (a concurrent change is a 409: re-read, decide again).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.storage_v1 import VolumeAttachment

from metalmend.api import indexes, links, names
from metalmend.api.resources import BareMetalHost, Metal3Remediation, machine_resource
from metalmend.bmc import BmcError, Busy
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers import metrics
from metalmend.controllers.powerreads import BmcPowerReader, PowerReader
from metalmend.controllers.tenancy import node_host_of, report
from metalmend.kube.admission import PolicyInForce
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writer import KubeWriter, Writer
from metalmend.log import fields
from metalmend.policy import fenceremediation as fence
from metalmend.policy import remediation as policy
from metalmend.settings import Settings

log = logging.getLogger(__name__)

HARD = json.dumps({"mode": "hard"})
OUT_OF_SERVICE = {"key": names.OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}


def reboot_key(remediation: Any) -> str:
    """The reboot annotation key this remediation holds its host off with (one per object:
    policy.fencing tells ours from another's)."""
    return f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{remediation.metadata.uid}"


class Evacuations(Protocol):
    async def left_on(self, node: str) -> policy.Evacuation:
        """What still ties ``node`` to its workloads (policy.remediation.Evacuation)."""


class KubeEvacuations:
    """Pods bound to the Node (listed, not cached: there may be very many) that the taint
    removes, and VolumeAttachments naming it."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def left_on(self, node: str) -> policy.Evacuation:
        pods = []
        async for pod in self.client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
            tolerations = [t.to_dict() for t in (pod.spec.tolerations if pod.spec else None) or []]
            deleting = pod.metadata is not None and pod.metadata.deletionTimestamp is not None
            if policy.blocks_evacuation(deleting, tolerations):
                pods.append(object_key(pod))
        attachments = [
            object_key(a)
            async for a in self.client.list(VolumeAttachment)
            if a.spec.nodeName == node
        ]
        return policy.Evacuation(tuple(sorted(pods)), tuple(sorted(attachments)))


@dataclass(frozen=True)
class Planned:
    """One reconcile's decision and what it was made on."""

    remediation: Any
    host: Any | None  # the host object as observed (versioned writes carry its version)
    seen: policy.Seen
    decision: policy.Decision

    @property
    def observed(self) -> policy.Observed:
        """The snapshot as the rules read it (``policy.remediation.view``)."""
        return policy.view(self.seen)


class RemediationController:
    # The kind of the remediation objects (FenceRemediationController: its own kind).
    resource: Any = Metal3Remediation
    # The ``controller`` label of its metrics (FenceRemediationController: its own).
    metrics_name = metrics.METAL3_REMEDIATION

    def __init__(
        self,
        manager: Manager,
        settings: Settings,
        writer: Writer | None = None,
        *,
        reader: PowerReader | None = None,
        evacuations: Evacuations | None = None,
    ) -> None:
        self.writer = writer or KubeWriter(manager.client, manager.events)
        self.clock = manager.clock
        self.awake_since: dt.datetime | None = None  # set by the first reconcile
        taint = settings.remediation.fence == policy.FenceMethod.OUT_OF_SERVICE_TAINT
        bmo = settings.remediation.power_owner == policy.PowerOwner.BAREMETAL_OPERATOR
        # Only the taint strategy, and fencing beside baremetal-operator, read BMCs
        # themselves; only the taint lists pods (policy.remediation).
        if reader is None and (taint or bmo):
            reader = BmcPowerReader(manager, settings)
        if evacuations is None and taint:
            evacuations = KubeEvacuations(manager.client)
        self.reader, self.evacuations = reader, evacuations
        ns = settings.runtime.namespace
        self.remediations = manager.informer(
            self.resource, namespace=ns, indexes=indexes.of(indexes.REMEDIATIONS_BY_NODE)
        )
        self.machines = machine_kinds.informer(
            manager,
            namespace=ns,
            indexes=indexes.of(indexes.MACHINES_BY_HOST, indexes.MACHINES_BY_NODE),
        )
        self.hosts = manager.informer(
            BareMetalHost,
            namespace=ns,
            indexes=indexes.of(indexes.HOSTS_BY_NODE, indexes.HOSTS_BY_UID),
        )
        self.nodes = manager.informer(Node)
        # who may write the hosts' word on their Node (api/links.node_host)
        self.node_name_guard = PolicyInForce(manager, names.NODE_NAME_POLICY)
        self.settings = settings.remediation

    # ---- observe ------------------------------------------------------------------------

    def machine_of(self, remediation: Any) -> Any | None:
        namespace = remediation.metadata.namespace
        for owner in remediation.metadata.ownerReferences or []:
            if owner.kind == "Machine":
                key = f"{namespace}/{owner.name}"
                return machine_kinds.find(self.machines, key, owner.apiVersion or "")
        return self.machines.store.get(object_key(remediation))  # the proposal: same name

    def host_object(self, remediation: Any) -> Any | None:
        """The Machine's host (of its own namespace only: api/links.py); without one, the
        host we recorded putting our key on (so that deleting the Machine first, or changing
        its annotation, never leaves its host held off). A remediation of a Node without a
        Machine keeps to the host it recorded: should another host confirm the Node since,
        observe_node_target finds the Node is not this one's and releases it."""
        machine = self.machine_of(remediation)
        hosts = links.host_of(machine) if machine is not None else []
        recorded = (remediation.get("status") or {}).get("host")
        # status is writable by whoever may update the status subresource: a recorded host
        # outside this namespace is none of ours (and none of this remediation's business).
        if recorded and not links.key_in_namespace(recorded, remediation.metadata.namespace):
            recorded = None
        if machine is None and self.remediated_node(remediation):
            named = self.node_target_host(remediation)
            hosts = [recorded] if recorded else [named] if named else []
        if not hosts and recorded:
            hosts = [recorded]
        return self.hosts.store.get(hosts[0]) if hosts else None

    def remediated_node(self, remediation: Any) -> str | None:
        """The Node a remediation without a Machine is made for (names.REMEDIATED_NODE, by
        the NodeHealthCheck; FenceRemediationController: the external remediation
        contract's Node target)."""
        return (remediation.metadata.annotations or {}).get(names.REMEDIATED_NODE) or None

    def node_targets_of_host(self, key: str) -> set[str]:
        """Remediations of Nodes without a Machine (the NodeHealthCheck's, a Node-targeted
        FenceRemediation) that act on host ``key``: the host they recorded, or the one
        their Node names. A host's report (off for our key) must wake them: a hung Node is
        silent, so without it the fence waited for powerOffTimeoutSeconds."""
        return {
            object_key(remediation)
            for remediation in self.remediations.store.values()
            if (remediation.get("status") or {}).get("host") == key
            or (self.remediated_node(remediation) and self.node_target_host(remediation) == key)
        }

    def node_target_host(self, remediation: Any) -> str:
        """A remediation without a Machine, made for a Node (names.REMEDIATED_NODE, by the
        NodeHealthCheck): the host that confirms the Node (api/links.node_host; the Node
        gone: the one host that names it), if of this object's namespace ("" otherwise: no
        host to act on)."""
        node_name = self.remediated_node(remediation)
        if not node_name:
            return ""
        node = self.nodes.store.get(node_name)
        if node is not None:
            key = self.node_host(node).key or ""
        else:
            naming = self.hosts.store.by_index(indexes.HOSTS_BY_NODE.name, node_name)
            key = object_key(naming[0]) if len(naming) == 1 else ""
        return key if links.key_in_namespace(key, remediation.metadata.namespace) else ""

    def node_host(self, node: Any) -> links.NodeHost:
        """The host that confirms a Node without a Machine of its own remediation, as the
        NodeHealthCheck finds it (controllers/tenancy.node_host_of: its hosts' word, and on
        OpenShift the Machine its annotation names, when that Machine confirms it)."""
        return node_host_of(
            node, self.hosts, self.node_name_guard, machine_kinds.openshift_lookup(self.machines)
        )

    def observe(self, remediation: Any, found: Any | None) -> policy.Seen:
        """The snapshot of one reconcile, read from the caches and not parsed (the policy
        reads it: ``policy.remediation.view``). ``found``: the host object, as
        ``host_object`` returned it for this decision."""
        if self.machine_of(remediation) is None and self.remediated_node(remediation):
            return self.observe_node_target(remediation, found)
        machine = self.machine_of(remediation)
        problem, link_problem = "", ""
        link = links.host_link_of(machine) if machine is not None else links.HostLink(None)
        if machine is None:
            problem = "the Machine to remediate does not exist"  # still release its host
        elif link.refused or not link.key:
            problem = link.refusal or no_host_link(machine)
            link_problem = problem  # the host we recorded: release what we hold on it
        elif found is None:
            problem = f"host {link.key} not found"
        machine_node = next(iter(links.node_of(machine)), None) if machine is not None else None
        node_name = policy.recorded_node(remediation.get("status") or {}) or machine_node
        node = self.nodes.store.get(node_name) if node_name else None
        if node is not None and found is not None and machine is not None:
            provider = links.node_provider_id(node)
            refusal = links.node_fence_refusal(
                node.metadata.name, provider, links.host_facts(found)
            )
            if refusal:  # never fenced, tainted, evicted or restored: not this host's Node
                node, link_problem = None, refusal
        return self.seen(
            remediation, found, problem, node,
            machine_found=machine is not None, machine_node=machine_node,
            link_problem=link_problem,
        )  # fmt: skip

    def observe_node_target(self, remediation: Any, found: Any | None) -> policy.Seen:
        """A remediation of a Node without a Machine (the NodeHealthCheck's): the Node is
        the target (``machine_found``: the target is known; ``machine_node``: the Node). It
        is fenced only if this host confirms the Node (api/links.node_host: the host names
        it, or the Node's providerID carries the host's uid); the object's annotation alone
        proves nothing, since whoever may create one in this namespace may write it. A Node
        that no longer is this host's, or that is gone while the host does not name it (and
        this remediation did not delete it itself: the policy reads that), stops the
        remediation: whatever it holds on the host is released. (Strategy escalate, which
        needs a Machine, is refused by the policy too.)"""
        target = self.remediated_node(remediation) or ""
        problem, link_problem, gone_unnamed = "", "", ""
        if found is None:
            problem = (
                f"Node {target} names no BareMetalHost of namespace"
                f" {remediation.metadata.namespace} that confirms it (the host's"
                f" {names.HOST_NODE}: {target}, a providerID carrying the host's uid, or"
                f" the host of the OpenShift Machine its {names.OPENSHIFT_NODE_MACHINE}"
                " names, when that Machine names the Node back)"
            )
        node_name = policy.recorded_node(remediation.get("status") or {}) or target
        node = self.nodes.store.get(node_name) if node_name else None
        if node is not None and found is not None:
            key = object_key(found)
            confirmed = self.node_host(node)
            if confirmed.key != key:
                why = confirmed.problem or f"its host is {confirmed.key}"
                node, link_problem = (
                    None,
                    f"Node {node_name} is not a Node of host {key} ({why}): refusing to fence"
                    " it; the host is released",
                )
        elif node is None and found is not None and node_name not in links.host_named_node(found):
            gone_unnamed = (
                f"Node {node_name} is gone, and host {object_key(found)} does not name it"
                f" ({names.HOST_NODE}): stopping; the host is released"
            )
        return self.seen(
            remediation, found, problem, node,
            machine_found=bool(target), machine_node=target or None,
            link_problem=link_problem, node_target=True, node_gone_unnamed=gone_unnamed,
        )  # fmt: skip

    def seen(
        self, remediation: Any, found: Any | None, problem: str, node: Any | None, **target: Any
    ) -> policy.Seen:
        """The snapshot: the object and its host as written, what was found of the target."""
        return policy.Seen(
            spec=remediation.get("spec") or {},
            status=remediation.get("status") or {},
            annotations=dict(remediation.metadata.annotations or {}),
            # (objects built without one, as a test's world builds them, have none)
            created=getattr(remediation.metadata, "creationTimestamp", None),
            has_finalizer=names.REMEDIATION_FINALIZER in (remediation.metadata.finalizers or []),
            deleting_since=remediation.metadata.deletionTimestamp,
            host=host_wire(found) if found is not None else None,
            reboot_key=reboot_key(remediation),
            host_problem=problem,
            node=node_view(node) if node is not None else None,
            awake_since=self.awake_since,
            **target,
        )

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        if self.awake_since is None:
            # The first reconcile: this replica leads and its caches are synced. What a
            # phase begun under another leader, or before a restart, counts its timeout
            # from (policy.remediation.Seen.awake_since).
            self.awake_since = self.clock.now()
        planned = await self.plan(key)
        if planned is None:
            return DONE
        remediation = planned.remediation
        for action in planned.decision.actions:
            remediation = await self.act(remediation, action, planned.host) or remediation
        await self.after(remediation, planned)
        return Result.at(planned.decision.requeue_at)

    async def after(self, remediation: Any, planned: Planned) -> None:
        """Once the decision is carried out (FenceRemediationController: its conditions)."""

    def decide(self, seen: policy.Seen) -> policy.Decision:
        """policy.fenceremediation.decide_seen: policy.remediation's rules, or, once a
        NodeHealthCheck's timed-out annotation is on the object, the stop that releases
        everything, for both kinds."""
        return fence.decide_seen(seen, self.clock.now(), self.settings)

    async def plan(self, key: str) -> Planned | None:
        """Observe from the caches and decide (after telling the Machine whether its host
        link is refused). None when the object is gone."""
        remediation = self.remediations.store.get(key)
        if remediation is None:
            return None
        # The host as decided on: adding our key is conditional on this very version, so
        # that two remediations that both saw a free host cannot both take it.
        host = self.host_object(remediation)
        machine = self.machine_of(remediation)
        if machine is not None:  # the Machine's own word on its host link (api/links.py)
            link = links.host_link_of(machine)
            await report(self.writer, self.clock, machine,
                         names.CONDITION_HOST_LINK, link.refusal, link.reason)  # fmt: skip
        seen = await self.look(self.observe(remediation, host), host)
        return Planned(remediation, host, seen, self.decide(seen))

    async def look(self, seen: policy.Seen, host: Any | None) -> policy.Seen:
        """What the taint strategy needs beyond the caches, when the policy asks for it:
        a BMC read of our own, the fenced Node's leftovers."""
        if (
            host is not None
            and self.reader is not None
            and policy.reads_power(seen, self.clock.now(), self.settings)
        ):
            try:
                read = policy.PowerRead(off=await self.reader.is_off(host))
            except (BmcError, Busy) as error:
                read = policy.PowerRead(off=None, error=str(error) or type(error).__name__)
            seen = replace(seen, power_read=read)
        fenced = policy.lists_evacuation(seen, self.settings)
        if fenced and self.evacuations is not None:
            seen = replace(seen, evacuation=await self.evacuations.left_on(fenced))
        return seen

    async def act(self, obj: Any, action: policy.Action, host: Any | None) -> Any | None:
        """Carry one action out through the writer; return our object if the action changed
        it (the next versioned write of this decision carries the new version)."""
        writer = self.writer
        match action:
            case policy.SetProgress(progress=progress):
                before = obj.get("status") or {}
                status = progress.to_wire(before)
                written = await writer.patch_status(self.resource, obj, status)
                metrics.entered(self.metrics_name, before, progress.phase)
                return written
            case policy.AddFinalizer() | policy.RemoveFinalizer():
                present = list(obj.metadata.finalizers or [])
                wanted = [f for f in present if f != names.REMEDIATION_FINALIZER]
                if isinstance(action, policy.AddFinalizer):
                    wanted.append(names.REMEDIATION_FINALIZER)
                return await writer.set_finalizers(self.resource, obj, wanted)
            case policy.BackupNode(backup=backup):
                return await writer.patch_metadata(
                    self.resource, obj, "annotations", backup.to_wire(), require_version=True
                )
            case policy.Event(type=kind, reason=reason, message=message):
                await writer.record_event(obj, kind, reason, message)
            case policy.MarkEscalation() | policy.ClearEscalation():
                if host is None:
                    raise LookupError(f"host of {object_key(obj)} vanished")  # decide() saw it
                mark = reboot_key(obj) if isinstance(action, policy.MarkEscalation) else None
                await writer.patch_metadata(
                    BareMetalHost, host, "annotations", {names.ESCALATING: mark},
                    require_version=mark is not None,
                )  # fmt: skip
            case policy.RequestPowerOff() | policy.ReleasePower():
                if host is None:
                    raise LookupError(f"host of {object_key(obj)} vanished")  # decide() saw it
                asked = HARD if isinstance(action, policy.RequestPowerOff) else None
                # Adding our key is conditional on the host as decided on: two remediations
                # that both saw a free host cannot both take it.
                await writer.patch_metadata(
                    BareMetalHost, host, "annotations", {reboot_key(obj): asked},
                    require_version=asked is not None,
                )  # fmt: skip
            case _:
                await self._act_on_node_or_machine(obj, action)
        return None

    async def _act_on_node_or_machine(self, obj: Any, action: policy.Action) -> None:
        writer = self.writer
        match action:
            case policy.DeleteNode(name=name, uid=uid):
                with metrics.fencing(self.metrics_name, policy.FenceMethod.DELETE_NODE):
                    deleted = await writer.delete_exact(Node, name, uid)
                if deleted:
                    log.info("node deleted", extra=fields(remediation=object_key(obj), node=name))
            case policy.DeletePods(node=node_name):
                await writer.delete_pods_on(node_name)
            case policy.TaintNode(name=name) | policy.UntaintNode(name=name):
                node = self.nodes.store.get(name)
                if node is not None:
                    taints = out_of_service_taints(node, isinstance(action, policy.TaintNode))
                    if isinstance(action, policy.TaintNode):
                        method = policy.FenceMethod.OUT_OF_SERVICE_TAINT
                        with metrics.fencing(self.metrics_name, method):
                            await writer.set_taints(node, taints)
                    else:
                        await writer.set_taints(node, taints)
            case policy.RestoreNode(name=name, labels=labels, annotations=annotations):
                found = self.nodes.store.get(name)
                if found is not None:
                    found = await writer.patch_metadata(Node, found, "labels", labels) or found
                    await writer.patch_metadata(Node, found, "annotations", annotations)
            case policy.DeleteMachine():
                machine = self.machine_of(obj)
                if machine is not None and machine.metadata.deletionTimestamp is None:
                    await writer.delete_exact(
                        machine_resource(machine), machine.metadata.name, machine.metadata.uid,
                        namespace=machine.metadata.namespace,
                    )  # fmt: skip


def out_of_service_taints(node: Any, present: bool) -> list[dict[str, str]]:
    """The Node's taints with ours (node.kubernetes.io/out-of-service) present or not,
    every other taint kept."""
    taints = [t.to_dict() for t in (node.spec.taints or []) if t.key != names.OUT_OF_SERVICE_TAINT]
    if present:
        taints.append(dict(OUT_OF_SERVICE))
    return taints


# ---- views, from API objects to policy values --------------------------------------------


def no_host_link(machine: Any) -> str:
    """Why a Machine has no host: no annotation, nor (CAPM3) one its Metal3Machine confirms."""
    problem = f"Machine has no {names.MACHINE_HOST} annotation (<namespace>/<host>)"
    if m3m := links.metal3machine_key(links.machine_identity(machine)):
        problem += (
            f", and its Metal3Machine {m3m} names no host of its namespace whose"
            " spec.consumerRef is that Metal3Machine"
        )
    return problem


def host_wire(host: Any) -> policy.HostWire:
    """A cached BareMetalHost, as written: what a remediation reads of it."""
    return policy.HostWire(
        key=object_key(host),
        spec=host.get("spec") or {},
        status=host.get("status") or {},
        annotations=dict(host.metadata.annotations or {}),
    )


def host_view(host: Any, key: str) -> policy.HostView:
    """The host as the rules read it for reboot key ``key`` (policy.remediation.host_view)."""
    return policy.host_view(host_wire(host), key)


def node_view(node: Any) -> policy.NodeView:
    ready = next(
        (c for c in (node.status.conditions if node.status else None) or [] if c.type == "Ready"),
        None,
    )
    taints = node.spec.taints if node.spec else None
    return policy.NodeView(
        name=node.metadata.name,
        uid=node.metadata.uid,
        ready=ready is not None and ready.status == "True",
        labels=dict(node.metadata.labels or {}),
        annotations=dict(node.metadata.annotations or {}),
        out_of_service=any(t.key == names.OUT_OF_SERVICE_TAINT for t in taints or []),
        ready_since=ready.lastTransitionTime if ready is not None else None,
    )


Mapper = Callable[[Any, Any], list[str]]


@dataclass(frozen=True)
class Wakes:
    """Which remediation objects (by key) a change of another kind wakes: the only part of
    the watch wiring that differs between metal3-remediation and fence-remediation."""

    machine: Mapper
    host: Mapper
    node: Mapper
    of_node: Callable[[str], list[str]]  # the remediations holding this Node's host


def wire(manager: Manager, controller: RemediationController, name: str, wakes: Wakes) -> None:
    """The controller's runner, its gauge of objects by phase, and its watches: its own
    objects, Machines, hosts, Nodes and, where it evacuates by the taint, VolumeAttachments
    (one going away wakes the remediation holding its Node's host off)."""
    attachments = manager.informer(VolumeAttachment) if controller.evacuations is not None else None
    runner = manager.add(Controller(name, controller.reconcile, workers=4))
    metrics.from_cache(
        controller.metrics_name,
        lambda: metrics.metal3_remediation_samples(
            controller.remediations.store.values(), controller.metrics_name
        ),
    )
    runner.watch(controller.remediations)
    runner.watch(controller.machines, wakes.machine)
    runner.watch(controller.hosts, wakes.host)
    runner.watch(controller.nodes, wakes.node)

    def every_remediation(old: Any, new: Any) -> list[str]:
        del old, new
        return sorted(object_key(r) for r in controller.remediations.store.values())

    guard = controller.node_name_guard
    runner.watch(guard.policies, every_remediation, predicate=guard.concerns)
    runner.watch(guard.bindings, every_remediation, predicate=guard.concerns)
    if attachments is not None:

        def by_attachment(old: Any, new: Any) -> list[str]:
            attachment = new if new is not None else old
            node = attachment.spec.nodeName if attachment.spec else None
            return wakes.of_node(node) if node else []

        runner.watch(attachments, by_attachment)


def setup(
    manager: Manager,
    settings: Settings,
    *,
    reader: PowerReader | None = None,
    evacuations: Evacuations | None = None,
) -> None:
    """``reader``/``evacuations``: the BMC reads and the pod listing of the taint strategy
    (tests give their own hardware; by default the host's BMC and the API server)."""
    controller = RemediationController(manager, settings, reader=reader, evacuations=evacuations)

    def by_machine(old: Any, new: Any) -> list[str]:
        machine = new if new is not None else old
        return [object_key(machine)]  # the remediation of a Machine has its name

    def by_host(old: Any, new: Any) -> list[str]:
        host = new if new is not None else old
        key = object_key(host)
        machines = controller.machines.store.by_index(indexes.MACHINES_BY_HOST.name, key)
        return sorted({object_key(m) for m in machines} | controller.node_targets_of_host(key))

    def of_node(name: str) -> list[str]:
        found = controller.remediations.store.by_index(indexes.REMEDIATIONS_BY_NODE.name, name)
        return sorted(object_key(r) for r in found)

    def by_node(old: Any, new: Any) -> list[str]:
        node = new if new is not None else old
        name = node.metadata.name
        machines = controller.machines.store.by_index(indexes.MACHINES_BY_NODE.name, name)
        return sorted({object_key(m) for m in machines} | set(of_node(name)))

    wire(manager, controller, "metal3-remediation", Wakes(by_machine, by_host, by_node, of_node))
