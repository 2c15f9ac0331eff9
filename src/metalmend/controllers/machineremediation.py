"""The annotation-driven machine remediation controller ("machine-remediation", metal3's
"Annotation for Power Cycling and Deleting Failed Nodes" design), in the decide/act shape
of docs/decide-act.md.

One reconcile per BareMetalHost: the Machine that names it (``metal3.io/BareMetalHost``),
the Machine's ``host.metal3.io/external-remediation`` annotation, the Node its nodeRef
names, the host's power and its ``reboot.metal3.io/machine-remediation`` annotation are the
whole state; ``observe`` freezes them, policy.machineremediation.decide says what to do,
``act`` carries each action out through a Writer. Keying by host is what lets a restarted
controller "check for the reboot annotation on all hosts and continue", as the design asks,
even when the Machine that asked is gone (its host is then released).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lightkube.resources.core_v1 import Node

from metalmend.api import indexes, links, names
from metalmend.api.resources import BareMetalHost, OpenShiftMachine, machine_resource
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers import metrics
from metalmend.controllers.tenancy import report
from metalmend.kube.controller import Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writer import KubeWriter, Writer
from metalmend.log import fields
from metalmend.policy import machineremediation as policy
from metalmend.policy.fencing import host_power, other_remediation
from metalmend.policy.interlock import teardown_claim
from metalmend.settings import Settings

log = logging.getLogger(__name__)
KEY = policy.KEY
HARD = json.dumps({"mode": "hard"})


def host_is_on(host: Any) -> bool:
    """The "powered on?" column for this host (policy.machineremediation.powered_on)."""
    status = host.get("status") or {}
    return policy.powered_on(host_power(status, host.metadata.annotations or {}, KEY))


def node_ref_of(machine: Any | None) -> str | None:
    """The Node name in the Machine's ``status.nodeRef``, as written (not yet checked)."""
    return next(iter(links.node_of(machine)), None) if machine is not None else None


class MachineRemediationController:
    def __init__(self, manager: Manager, settings: Settings, writer: Writer | None = None) -> None:
        self.writer = writer or KubeWriter(manager.client, manager.events)
        self.clock = manager.clock
        ns = settings.runtime.namespace
        self.machines = machine_kinds.informer(
            manager,
            namespace=ns,
            indexes=indexes.of(
                indexes.MACHINES_BY_HOST, indexes.MACHINES_BY_CLAIMED_HOST, indexes.MACHINES_BY_NODE
            ),
        )
        self.hosts = manager.informer(BareMetalHost, namespace=ns)
        self.nodes = manager.informer(Node)

    # ---- observe ------------------------------------------------------------------------

    def machine_for(self, host_key: str) -> Any | None:
        """The Machine that names the host; of several, the first one asking for
        remediation (by key order), else the first one."""
        found = self.machines.store.by_index(indexes.MACHINES_BY_HOST.name, host_key)
        machines = sorted(found, key=object_key)
        asking = [
            m for m in machines if names.EXTERNAL_REMEDIATION in (m.metadata.annotations or {})
        ]
        if len(machines) > 1:
            log.warning("several Machines name one host", extra=fields(host=host_key))
        return (asking or machines or [None])[0]

    def observe(self, host_key: str, host: Any | None) -> policy.View:
        """Everything the truth table and its safety rules read, from the caches. ``host``:
        the host object the decision is made on (None: gone); adding the reboot key is
        conditional on its very version."""
        machine = self.machine_for(host_key) if host is not None else None
        asked = (machine.metadata.annotations or {}) if machine is not None else {}
        annotations = (host.metadata.annotations or {}) if host is not None else {}
        status = (host.get("status") or {}) if host is not None else {}
        node_ref = node_ref_of(machine)
        node = self.nodes.store.get(node_ref) if node_ref else None
        refusal = ""
        if node is not None and host is not None:
            # status.nodeRef is writable by whoever may update Machine status: its Node is
            # fenced only if it is this host's (api/links.py, rule 4)
            provider = links.node_provider_id(node)
            refusal = links.node_fence_refusal(node_ref or "", provider, links.host_facts(host))
        return policy.View(
            host=host_key,
            host_found=host is not None,
            machine=object_key(machine) if machine is not None else None,
            needs_remediation=names.EXTERNAL_REMEDIATION in asked,
            node_ref=node_ref,
            node=policy.NodeView(node.metadata.name, node.metadata.uid) if node else None,
            fence_refusal=refusal,
            power=host_power(status, annotations, KEY),
            other_remediation=other_remediation(annotations, KEY),
            refused_claims=self._refused_claims(host_key),
            remediation_ended=names.REMEDIATION_ENDED_AT in asked,
            teardown=teardown_claim(annotations),
            remediation_ended_at=parse_stamp(asked.get(names.REMEDIATION_ENDED_AT)),
            # only metalmend's own check reads the end stamp, and it judges Cluster API's
            # Machines only; OpenShift's check does not read it
            checker_reads_end=machine is None or machine_resource(machine) is not OpenShiftMachine,
        )

    def _refused_claims(self, host_key: str) -> tuple[policy.RefusedClaim, ...]:
        """Machines that name this host but may not use it (another namespace) and ask for
        remediation: they are told why nothing happens (the host is never read for them)."""
        claims = []
        for machine in sorted(
            self.machines.store.by_index(indexes.MACHINES_BY_CLAIMED_HOST.name, host_key),
            key=object_key,
        ):
            link = links.host_link_of(machine)
            if link.refused and names.EXTERNAL_REMEDIATION in (machine.metadata.annotations or {}):
                claims.append(policy.RefusedClaim(object_key(machine), link.refusal, link.reason))
        return tuple(claims)

    # ---- reconcile and act ----------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        host = self.hosts.store.get(key)
        view = self.observe(key, host)
        decision = policy.decide(view, self.clock.now())
        machine = self.machines.store.get(view.machine) if view.machine else None
        for action in decision.actions:
            if not isinstance(action, policy.SetLinkCondition | policy.Event):
                log.info("machine remediation", extra=fields(host=key, action=repr(action)))
            machine = await self.act(host, machine, action) or machine
        return Result.at(decision.requeue_at)

    async def act(self, host: Any | None, machine: Any | None, action: policy.Action) -> Any:
        """Carry one action out through the writer; return the Machine if it changed.
        ``host`` and ``machine``: the objects the decision was made on."""
        writer = self.writer
        match action:
            case policy.SetLinkCondition(machine=key, type=type_, refusal=refusal, reason=reason):
                own = machine is not None and object_key(machine) == key
                target = machine if own else self.machines.store.get(key)
                if target is not None:
                    updated = await report(writer, self.clock, target, type_, refusal, reason)
                    return updated if own else None
            case policy.RequestPowerOff(key=reboot_key):
                await writer.patch_metadata(
                    BareMetalHost, host, "annotations", {reboot_key: HARD}, require_version=True
                )
                cycling = (metrics.MACHINE_REMEDIATION, metrics.POWER_CYCLING)
                metrics.PHASE_ENTERED.labels(*cycling).inc()
            case policy.ReleasePower(key=reboot_key):
                await writer.patch_metadata(BareMetalHost, host, "annotations", {reboot_key: None})
            case policy.DeleteNode(name=name, uid=uid):
                with metrics.fencing(metrics.MACHINE_REMEDIATION, "delete-node"):
                    await writer.delete_exact(Node, name, uid)
            case policy.DeletePods(node=node):
                await writer.delete_pods_on(node)
            case policy.RemoveRemediationRequest(ended_at=ended_at):
                # one write: the request never reads as gone without the end that explains it
                ended: dict[str, str | None] = {names.EXTERNAL_REMEDIATION: None}
                ended[names.REMEDIATION_ENDED_AT] = stamp(ended_at)
                written = await writer.patch_metadata(
                    machine_resource(machine), machine, "annotations", ended
                )
                metrics.OUTCOMES.labels(metrics.MACHINE_REMEDIATION, "power_cycled").inc()
                return written
            case policy.WithdrawRequest():
                withdrawn = {names.EXTERNAL_REMEDIATION: None, names.REMEDIATION_ENDED_AT: None}
                return await writer.patch_metadata(
                    machine_resource(machine), machine, "annotations", withdrawn
                )
            case policy.ForgetRemediationEnd():
                forget = {names.REMEDIATION_ENDED_AT: None}
                return await writer.patch_metadata(
                    machine_resource(machine), machine, "annotations", forget
                )
            case policy.Event(type=kind, reason=reason, message=message):
                await writer.record_event(machine if machine is not None else host, kind,
                                          reason, message)  # fmt: skip
        return None


def setup(manager: Manager, settings: Settings) -> None:
    controller = MachineRemediationController(manager, settings)

    def by_machine(old: Any, new: Any) -> list[str]:
        keys: set[str] = set()
        for machine in (old, new):
            if machine is not None:
                keys.update(links.host_of(machine))
                keys.update(links.claimed_host_of(machine))
        return sorted(keys)

    def by_node(old: Any, new: Any) -> list[str]:
        # The "node ref" column is whether the Node is found: its deletion (by us, or by
        # anyone) changes the row, and the Machine itself may not change (Cluster API never
        # clears nodeRef).
        keys: set[str] = set()
        for node in (old, new):
            if node is None:
                continue
            for machine in controller.machines.store.by_index(
                indexes.MACHINES_BY_NODE.name, node.metadata.name
            ):
                keys.update(links.host_of(machine))
        return sorted(keys)

    runner = manager.add(Controller("machine-remediation", controller.reconcile, workers=2))
    metrics.from_cache(
        metrics.MACHINE_REMEDIATION,
        lambda: metrics.machine_remediation_samples(
            controller.machines.store.values(), controller.hosts.store.values()
        ),
    )
    runner.watch(controller.hosts)
    runner.watch(controller.machines, by_machine)
    runner.watch(controller.nodes, by_node, predicate=node_found_or_moved)


def node_found_or_moved(old: Any | None, new: Any | None) -> bool:
    """A Node event that can change a decision: it appeared, went, or changed providerID
    (the fence check). Status updates (heartbeats) wake nothing."""
    if old is None or new is None:
        return True
    return bool(links.node_provider_id(old) != links.node_provider_id(new))
