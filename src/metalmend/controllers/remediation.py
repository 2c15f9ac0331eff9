"""The Metal3Remediation controller ("metal3-remediation"): fence first (metal3's
Metal3Remediation proposal).

Observe the remediation object, its Machine, host and Node from the caches; ask
policy.remediation what to do; carry the actions out in order. Every action is idempotent
and every phase re-asserts its own preconditions, so a kill between any two actions is
resumed by the next reconcile. Writes to our own object carry the resourceVersion the
decision was made on (a concurrent change is a 409: re-read, decide again).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lightkube import ALL_NS, ApiError
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from metalmend.api import indexes, links, names
from metalmend.api.resources import BareMetalHost, Machine, Metal3Remediation
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.controllers.tenancy import report
from metalmend.kube import errors
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writes import delete_exact, patch_annotations, patch_labels, patch_status
from metalmend.log import fields
from metalmend.policy import remediation as policy
from metalmend.policy.fencing import host_power, other_remediation
from metalmend.settings import Settings

log = logging.getLogger(__name__)

HARD = json.dumps({"mode": "hard"})
OUT_OF_SERVICE = {"key": names.OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}


def reboot_key(remediation: Any) -> str:
    return f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{remediation.metadata.uid}"


class RemediationController:
    def __init__(self, manager: Manager, settings: Settings) -> None:
        self.client = manager.client
        self.clock = manager.clock
        self.events = manager.events
        ns = settings.runtime.namespace
        self.remediations = manager.informer(
            Metal3Remediation, namespace=ns, indexes=indexes.of(indexes.REMEDIATIONS_BY_NODE)
        )
        self.machines = manager.informer(
            Machine,
            namespace=ns,
            indexes=indexes.of(indexes.MACHINES_BY_HOST, indexes.MACHINES_BY_NODE),
        )
        self.hosts = manager.informer(BareMetalHost, namespace=ns)
        self.nodes = manager.informer(Node)
        self.settings = settings.remediation

    # ---- observe ------------------------------------------------------------------------

    def machine_of(self, remediation: Any) -> Any | None:
        namespace = remediation.metadata.namespace
        for owner in remediation.metadata.ownerReferences or []:
            if owner.kind == "Machine":
                return self.machines.store.get(f"{namespace}/{owner.name}")
        return self.machines.store.get(object_key(remediation))  # the proposal: same name

    def host_object(self, remediation: Any) -> Any | None:
        """The Machine's host (of its own namespace only: api/links.py); without one, the
        host we recorded putting our key on (so that deleting the Machine first, or changing
        its annotation, never leaves its host held off)."""
        machine = self.machine_of(remediation)
        hosts = links.host_of(machine) if machine is not None else []
        recorded = (remediation.get("status") or {}).get("host")
        # status is writable by whoever may update the status subresource: a recorded host
        # outside this namespace is none of ours (and none of this remediation's business).
        if (
            not hosts
            and recorded
            and links.key_in_namespace(recorded, remediation.metadata.namespace)
        ):
            hosts = [recorded]
        return self.hosts.store.get(hosts[0]) if hosts else None

    def observe(self, remediation: Any, found: Any | None) -> policy.Observed:
        """``found``: the host object, as ``host_object`` returned it for this decision."""
        status = remediation.get("status") or {}
        progress = progress_from(status)
        machine = self.machine_of(remediation)
        host, problem, link_problem = None, "", ""
        link = links.host_link_of(machine) if machine is not None else links.HostLink(None)
        if machine is None:
            problem = "the Machine to remediate does not exist"
            if found is not None:  # still release what we hold on its host
                host = host_view(found, reboot_key(remediation))
        elif link.refused or not link.key:
            problem = link.refusal or (
                f"Machine has no {names.MACHINE_HOST} annotation (<namespace>/<host>)"
            )
            if found is not None:  # the host we recorded: release what we hold on it
                host, link_problem = host_view(found, reboot_key(remediation)), problem
        elif found is None:
            problem = f"host {link.key} not found"
        else:
            host = host_view(found, reboot_key(remediation))
        machine_node = next(iter(links.node_of(machine)), None) if machine is not None else None
        node_name = progress.node or machine_node
        node = self.nodes.store.get(node_name) if node_name else None
        if node is not None and found is not None and machine is not None:
            provider = links.node_provider_id(node)
            refusal = links.node_fence_refusal(
                node.metadata.name, provider, links.host_facts(found)
            )
            if refusal:  # never fenced, tainted, evicted or restored: not this host's Node
                node, link_problem = None, refusal
        return policy.Observed(
            spec=spec_from(remediation.get("spec") or {}),
            progress=progress,
            has_finalizer=names.REMEDIATION_FINALIZER in (remediation.metadata.finalizers or []),
            deleting_since=remediation.metadata.deletionTimestamp,
            machine_found=machine is not None,
            machine_node=machine_node,
            host=host,
            host_problem=problem,
            node=node_view(node) if node is not None else None,
            backup=backup_from(remediation.metadata.annotations or {}),
            link_problem=link_problem,
        )

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        remediation = self.remediations.store.get(key)
        if remediation is None:
            return DONE
        # The host as decided on: adding our key is conditional on this very version, so
        # that two remediations that both saw a free host cannot both take it.
        host = self.host_object(remediation)
        machine = self.machine_of(remediation)
        if machine is not None:  # the Machine's own word on its host link (api/links.py)
            link = links.host_link_of(machine)
            await report(self.client, self.events, self.clock, machine,
                         names.CONDITION_HOST_LINK, link.refusal, link.reason)  # fmt: skip
        decision = policy.decide(self.observe(remediation, host), self.clock.now(), self.settings)
        for action in decision.actions:
            remediation = await self.act(remediation, action, host) or remediation
        return Result.at(decision.requeue_at)

    async def act(self, obj: Any, action: policy.Action, host: Any | None) -> Any | None:
        """Carry one action out; return our object if the action changed it."""
        match action:
            case policy.SetProgress(progress=progress):
                status = progress_to(obj.get("status") or {}, progress)
                return await patch_status(self.client, Metal3Remediation, obj, status)
            case policy.AddFinalizer() | policy.RemoveFinalizer():
                return await self._finalizer(obj, add=isinstance(action, policy.AddFinalizer))
            case policy.BackupNode(labels=labels, annotations=annotations):
                backup = {
                    names.NODE_LABELS_BACKUP: json.dumps(dict(labels), sort_keys=True),
                    names.NODE_ANNOTATIONS_BACKUP: json.dumps(dict(annotations), sort_keys=True),
                }
                return await patch_annotations(
                    self.client, Metal3Remediation, obj, backup, require_version=True
                )
            case policy.Event(type=kind, reason=reason, message=message):
                await self.events.record(obj, kind, reason, message)
            case _:
                await self._act_elsewhere(obj, action, host)
        return None

    async def _act_elsewhere(self, obj: Any, action: policy.Action, host: Any | None) -> None:
        if isinstance(action, policy.RequestPowerOff | policy.ReleasePower) and host is None:
            raise LookupError(f"host of {object_key(obj)} vanished")  # decide() saw it
        match action:
            case policy.RequestPowerOff():
                changes = {reboot_key(obj): HARD}
                await patch_annotations(
                    self.client, BareMetalHost, host, changes, require_version=True
                )
            case policy.ReleasePower():
                await patch_annotations(self.client, BareMetalHost, host, {reboot_key(obj): None})
            case policy.DeleteNode(name=name, uid=uid):
                if await delete_exact(self.client, Node, name, uid):
                    log.info("node deleted", extra=fields(remediation=object_key(obj), node=name))
            case policy.DeletePods(node=node_name):
                await delete_pods_bound_to(self.client, node_name)
            case policy.TaintNode(name=name) | policy.UntaintNode(name=name):
                await self._taint(name, present=isinstance(action, policy.TaintNode))
            case policy.RestoreNode(name=name, labels=labels, annotations=annotations):
                found = self.nodes.store.get(name)
                if found is not None:
                    found = await patch_labels(self.client, Node, found, dict(labels)) or found
                    await patch_annotations(self.client, Node, found, dict(annotations))
            case policy.DeleteMachine():
                machine = self.machine_of(obj)
                if machine is not None and machine.metadata.deletionTimestamp is None:
                    await delete_if_present(self.client, Machine, machine)

    async def _finalizer(self, obj: Any, add: bool) -> Any:
        present = list(obj.metadata.finalizers or [])
        wanted = [f for f in present if f != names.REMEDIATION_FINALIZER]
        if add:
            wanted.append(names.REMEDIATION_FINALIZER)
        body = {"metadata": {"finalizers": wanted, "resourceVersion": obj.metadata.resourceVersion}}
        try:
            return await self.client.patch(
                Metal3Remediation,
                obj.metadata.name,
                body,
                namespace=obj.metadata.namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as error:
            if errors.is_not_found(error) and not add:
                return None  # the last finalizer removed: the object is gone
            raise

    async def _taint(self, name: str, present: bool) -> None:
        node = self.nodes.store.get(name)
        if node is None:
            return
        taints = [
            t.to_dict() for t in (node.spec.taints or []) if t.key != names.OUT_OF_SERVICE_TAINT
        ]
        if present:
            taints.append(dict(OUT_OF_SERVICE))
        body = {
            "metadata": {"resourceVersion": node.metadata.resourceVersion},
            "spec": {"taints": taints},
        }
        await self.client.patch(Node, name, body, patch_type=PatchType.MERGE)


async def delete_pods_bound_to(client: Any, node: str) -> None:
    """The host is reported off: nothing of these pods runs any more. Deleting them at
    once (what the pod garbage collector would do some time after the Node is gone)
    lets their controllers start them elsewhere now."""
    async for pod in client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": node}):
        await delete_if_present(client, Pod, pod, grace_period=0)


async def delete_if_present(client: Any, resource: Any, obj: Any, **kw: Any) -> None:
    try:
        await client.delete(resource, obj.metadata.name, namespace=obj.metadata.namespace, **kw)
    except ApiError as error:
        if not errors.is_not_found(error):
            raise


# ---- status and spec, between API objects and policy values -------------------------------


def spec_from(spec: dict[str, Any]) -> policy.Spec:
    return policy.Spec(
        strategy=str(spec.get("strategy") or "reboot"),
        delete_after_retries=int(spec.get("deleteAfterRetries", 3)),
        power_off_timeout=float(spec.get("powerOffTimeoutSeconds", 120)),
        power_on_timeout=float(spec.get("powerOnTimeoutSeconds", 600)),
    )


def progress_from(status: dict[str, Any]) -> policy.Progress:
    return policy.Progress(
        phase=str(status.get("phase") or ""),
        retry_count=int(status.get("retryCount") or 0),
        last_remediated=parse_stamp(status.get("lastRemediated")),
        phase_since=parse_stamp(status.get("phaseSince")),
        next_attempt_at=parse_stamp(status.get("nextAttemptAt")),
        node=status.get("node") or None,
        fenced_node_uid=status.get("fencedNodeUID") or None,
        message=str(status.get("message") or ""),
        host=status.get("host") or None,
    )


def progress_to(status: dict[str, Any], progress: policy.Progress) -> dict[str, Any]:
    status = dict(status)
    values: dict[str, Any] = {
        "phase": progress.phase or None,
        "retryCount": progress.retry_count,
        "lastRemediated": stamp(progress.last_remediated) if progress.last_remediated else None,
        "phaseSince": stamp(progress.phase_since) if progress.phase_since else None,
        "nextAttemptAt": stamp(progress.next_attempt_at) if progress.next_attempt_at else None,
        "node": progress.node,
        "fencedNodeUID": progress.fenced_node_uid,
        "message": progress.message or None,
        "host": progress.host,
    }
    for name, value in values.items():
        if value is None:
            status.pop(name, None)
        else:
            status[name] = value
    return status


def host_view(host: Any, key: str) -> policy.HostView:
    spec = host.get("spec") or {}
    status = host.get("status") or {}
    annotations = host.metadata.annotations or {}
    error = status.get("errorMessage") if status.get("operationalStatus") == "error" else ""
    return policy.HostView(
        key=object_key(host),
        online=bool(spec.get("online", False)),
        power=host_power(status, annotations, key),
        other_remediation=other_remediation(annotations, key),
        bmc_error=str(error or ""),
    )


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


def backup_from(annotations: dict[str, str]) -> policy.Backup | None:
    if names.NODE_LABELS_BACKUP not in annotations:
        return None
    try:
        labels = json.loads(annotations[names.NODE_LABELS_BACKUP])
        kept = json.loads(annotations.get(names.NODE_ANNOTATIONS_BACKUP) or "{}")
    except ValueError:
        log.warning("unreadable node backup annotations; ignoring them")
        return None
    return policy.Backup(labels=dict(labels), annotations=dict(kept))


def setup(manager: Manager, settings: Settings) -> None:
    controller = RemediationController(manager, settings)

    def by_machine(old: Any, new: Any) -> list[str]:
        machine = new if new is not None else old
        return [object_key(machine)]  # the remediation of a Machine has its name

    def by_host(old: Any, new: Any) -> list[str]:
        host = new if new is not None else old
        machines = controller.machines.store.by_index(
            indexes.MACHINES_BY_HOST.name, object_key(host)
        )
        return sorted(object_key(m) for m in machines)

    def by_node(old: Any, new: Any) -> list[str]:
        node = new if new is not None else old
        name = node.metadata.name
        machines = controller.machines.store.by_index(indexes.MACHINES_BY_NODE.name, name)
        remediations = controller.remediations.store.by_index(
            indexes.REMEDIATIONS_BY_NODE.name, name
        )
        keys = {object_key(m) for m in machines}
        keys.update(object_key(r) for r in remediations)
        return sorted(keys)

    runner = manager.add(Controller("metal3-remediation", controller.reconcile, workers=4))
    runner.watch(controller.remediations)
    runner.watch(controller.machines, by_machine)
    runner.watch(controller.hosts, by_host)
    runner.watch(controller.nodes, by_node)
