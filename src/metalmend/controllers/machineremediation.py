"""The annotation-driven machine remediation controller ("machine-remediation",
metal3's annotation-based remediation design).

One reconcile per BareMetalHost: the Machine that names it (``metal3.io/BareMetalHost``),
the Machine's ``host.metal3.io/external-remediation`` annotation, its nodeRef, the host's
power and its ``reboot.metal3.io/machine-remediation`` annotation are the whole state; the
truth table in policy.machineremediation says what to do. Keying by host is what lets a
restarted controller "check for the reboot annotation on all hosts and continue", as the
design asks, even when the Machine that asked is gone (its host is then released).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lightkube.resources.core_v1 import Node

from metalmend.api import indexes, links, names
from metalmend.api.resources import BareMetalHost, Machine
from metalmend.controllers.remediation import delete_pods_bound_to
from metalmend.controllers.tenancy import report
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writes import delete_exact, patch_annotations
from metalmend.log import fields
from metalmend.policy.fencing import host_power, other_remediation, reported_off, withdrawal_unseen
from metalmend.policy.machineremediation import Action, Observed, decide
from metalmend.settings import Settings

log = logging.getLogger(__name__)
KEY = names.MACHINE_REMEDIATION_REBOOT
HARD = json.dumps({"mode": "hard"})


def host_is_on(host: Any) -> bool:
    """The "powered on?" column. While our reboot key is set, only a report of the host
    off *for this key* counts as off (policy.fencing): a Node is deleted on it."""
    status = host.get("status") or {}
    annotations = host.metadata.annotations or {}
    if KEY not in annotations:
        return status.get("poweredOn") is not False
    return not reported_off(host_power(status, annotations, KEY))


def withdrawal_pending(host: Any) -> bool:
    """Our key is still listed as powered off for although it is gone: it is added again
    only once host-power has seen it removed (policy.fencing.withdrawal_unseen)."""
    status = host.get("status") or {}
    return withdrawal_unseen(host_power(status, host.metadata.annotations or {}, KEY))


class MachineRemediationController:
    def __init__(self, manager: Manager, settings: Settings) -> None:
        self.client = manager.client
        self.events = manager.events
        self.clock = manager.clock
        ns = settings.runtime.namespace
        self.machines = manager.informer(
            Machine,
            namespace=ns,
            indexes=indexes.of(indexes.MACHINES_BY_HOST, indexes.MACHINES_BY_CLAIMED_HOST),
        )
        self.hosts = manager.informer(BareMetalHost, namespace=ns)
        self.nodes = manager.informer(Node)

    def machine_for(self, host_key: str) -> Any | None:
        found = self.machines.store.by_index(indexes.MACHINES_BY_HOST.name, host_key)
        machines = sorted(found, key=object_key)
        asking = [
            m for m in machines if names.EXTERNAL_REMEDIATION in (m.metadata.annotations or {})
        ]
        if len(machines) > 1:
            log.warning("several Machines name one host", extra=fields(host=host_key))
        return (asking or machines or [None])[0]

    async def reconcile(self, key: str) -> Result:
        await self._tell_refused(key)
        host = self.hosts.store.get(key)
        if host is None:
            return DONE
        machine = self.machine_for(key)
        annotations = host.metadata.annotations or {}
        node_ref = _node_ref(machine)
        asking = machine is not None and names.EXTERNAL_REMEDIATION in (
            machine.metadata.annotations or {}
        )
        fence_refusal = self._fence_refusal(node_ref, host)
        if machine is not None:  # clears what an earlier refusal said, reports a new one
            machine = await self._condition(machine, names.CONDITION_HOST_LINK, "", "")
            because = links.REASON_NODE_OF_ANOTHER_HOST
            why = fence_refusal if asking else ""
            machine = await self._condition(machine, names.CONDITION_NODE_FENCING, why, because)
        observed = Observed(
            node_ref=node_ref is not None,
            needs_remediation=asking,
            powered_on=host_is_on(host),
            reboot_annotation=KEY in annotations,
        )
        action = decide(observed)
        if action is Action.NOTHING:
            return DONE
        if fence_refusal and action in (Action.ADD_REBOOT_ANNOTATION, Action.DELETE_NODE):
            # The Machine's nodeRef names a Node of another host: no power-cycle for it, and
            # a host already held off for it is released, never left off (the condition says).
            if KEY in annotations:
                await patch_annotations(self.client, BareMetalHost, host, {KEY: None})
            return DONE
        log.info("machine remediation", extra=fields(host=key, action=action.value))
        if action is Action.ADD_REBOOT_ANNOTATION:
            if busy := other_remediation(annotations, KEY):
                await self._tell(machine, f"host {key} is being remediated by {busy}; waiting")
                return DONE
            if withdrawal_pending(host):  # host-power's status write wakes us
                await self._tell(machine, f"waiting for host-power to see {KEY} withdrawn")
                return DONE
            await patch_annotations(
                self.client, BareMetalHost, host, {KEY: HARD}, require_version=True
            )
            await self._tell(machine, f"powering off host {key} (hard)")
        elif action is Action.DELETE_NODE:
            await self._fence(machine, node_ref or {}, key)
        elif action is Action.REMOVE_NEEDS_REMEDIATION:
            changes = {names.EXTERNAL_REMEDIATION: None}
            await patch_annotations(self.client, Machine, machine, changes)
            await self._tell(machine, "Node gone: remediation request removed")
        elif action is Action.REMOVE_REBOOT_ANNOTATION:
            await patch_annotations(self.client, BareMetalHost, host, {KEY: None})
            await self._tell(machine, f"powering host {key} back on")
        return DONE

    async def _tell_refused(self, host_key: str) -> None:
        """Machines that name this host but may not use it (another namespace): they asked
        for remediation, so they are told why nothing happens (the host is never read)."""
        for machine in self.machines.store.by_index(
            indexes.MACHINES_BY_CLAIMED_HOST.name, host_key
        ):
            link = links.host_link_of(machine)
            if link.refused and names.EXTERNAL_REMEDIATION in (machine.metadata.annotations or {}):
                await self._condition(machine, names.CONDITION_HOST_LINK, link.refusal, link.reason)

    async def _condition(self, machine: Any, type_: str, refusal: str, reason: str) -> Any:
        args = (self.client, self.events, self.clock, machine, type_, refusal, reason)
        return await report(*args) or machine

    def _fence_refusal(self, node_ref: dict[str, Any] | None, host: Any) -> str:
        """Why the Node of the Machine's nodeRef may not be fenced for this host ("" if it
        may): status.nodeRef is writable by whoever may update Machine status."""
        node = self.nodes.store.get(node_ref.get("name", "")) if node_ref else None
        if node is None:
            return ""
        provider = links.node_provider_id(node)
        return links.node_fence_refusal(node.metadata.name, provider, links.host_facts(host))

    async def _fence(self, machine: Any, node_ref: dict[str, Any], host_key: str) -> None:
        name = node_ref.get("name", "")
        node = self.nodes.store.get(name)
        uid = node_ref.get("uid") or (node.metadata.uid if node is not None else None)
        if uid and await delete_exact(self.client, Node, name, uid):
            await self._tell(machine, f"host {host_key} reported off: Node {name} deleted")
        await delete_pods_bound_to(self.client, name)  # the host is off: they are not running

    async def _tell(self, machine: Any | None, message: str) -> None:
        if machine is not None:
            await self.events.normal(machine, names.REASON_MACHINE_REMEDIATION, message)


def _node_ref(machine: Any | None) -> dict[str, Any] | None:
    if machine is None:
        return None
    ref = (machine.get("status") or {}).get("nodeRef") or {}
    return dict(ref) if ref.get("name") else None


def setup(manager: Manager, settings: Settings) -> None:
    controller = MachineRemediationController(manager, settings)

    def by_machine(old: Any, new: Any) -> list[str]:
        keys: set[str] = set()
        for machine in (old, new):
            if machine is not None:
                keys.update(links.host_of(machine))
                keys.update(links.claimed_host_of(machine))
        return sorted(keys)

    runner = manager.add(Controller("machine-remediation", controller.reconcile, workers=2))
    runner.watch(controller.hosts)
    runner.watch(controller.machines, by_machine)
