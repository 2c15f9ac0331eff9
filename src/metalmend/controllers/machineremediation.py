"""The annotation-driven machine remediation controller ("machine-remediation", seed 001).

One reconcile per BareMetalHost: the Machine that names it (``metal3.io/BareMetalHost``),
the Machine's ``host.metal3.io/external-remediation`` annotation, its nodeRef, the host's
power and its ``reboot.metal3.io/machine-remediation`` annotation are the whole state; the
truth table in policy.machineremediation says what to do. Keying by host is what lets a
restarted controller "check for the reboot annotation on all hosts and continue", as the
seed asks, even when the Machine that asked is gone (its host is then released).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lightkube.resources.core_v1 import Node

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, Machine
from metalmend.controllers import REGISTRY, RunOptions
from metalmend.controllers.remediation import delete_pods_bound_to, host_of
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writes import delete_exact, patch_annotations
from metalmend.log import fields
from metalmend.policy.fencing import HostPower, other_remediation, reported_off
from metalmend.policy.hostpower import parse_stamp
from metalmend.policy.machineremediation import Action, Observed, decide

log = logging.getLogger(__name__)
BY_HOST = "host"
KEY = names.MACHINE_REMEDIATION_REBOOT
HARD = json.dumps({"mode": "hard"})


def host_is_on(host: Any) -> bool:
    """The "powered on?" column. While our reboot key is set, only a report of the host
    off *for the pending reboot* counts as off (policy.fencing): a Node is deleted on it."""
    status = host.get("status") or {}
    annotations = host.metadata.annotations or {}
    if KEY not in annotations:
        return status.get("poweredOn") is not False
    provisioning = status.get("provisioning") or {}
    power = HostPower(
        holds_key=True,
        powered_on=status.get("poweredOn"),
        pending_reboot_since=parse_stamp(provisioning.get("pendingRebootSince")),
        last_powered_on=parse_stamp(provisioning.get("lastPoweredOn")),
        power_on_in_flight=(status.get("lastPowerCommand") or {}).get("action") == "on",
    )
    return not reported_off(power)


class MachineRemediationController:
    def __init__(self, manager: Manager, options: RunOptions) -> None:
        self.client = manager.client
        self.events = manager.events
        ns = options.namespace
        self.machines = manager.informer(Machine, namespace=ns, indexes={BY_HOST: host_of})
        self.hosts = manager.informer(BareMetalHost, namespace=ns)
        self.nodes = manager.informer(Node)

    def machine_for(self, host_key: str) -> Any | None:
        machines = sorted(self.machines.store.by_index(BY_HOST, host_key), key=object_key)
        asking = [
            m for m in machines if names.EXTERNAL_REMEDIATION in (m.metadata.annotations or {})
        ]
        if len(machines) > 1:
            log.warning("several Machines name one host", extra=fields(host=host_key))
        return (asking or machines or [None])[0]

    async def reconcile(self, key: str) -> Result:
        host = self.hosts.store.get(key)
        if host is None:
            return DONE
        machine = self.machine_for(key)
        annotations = host.metadata.annotations or {}
        node_ref = _node_ref(machine)
        observed = Observed(
            node_ref=node_ref is not None,
            needs_remediation=machine is not None
            and names.EXTERNAL_REMEDIATION in (machine.metadata.annotations or {}),
            powered_on=host_is_on(host),
            reboot_annotation=KEY in annotations,
        )
        action = decide(observed)
        if action is Action.NOTHING:
            return DONE
        log.info("machine remediation", extra=fields(host=key, action=action.value))
        if action is Action.ADD_REBOOT_ANNOTATION:
            if busy := other_remediation(annotations, KEY):
                await self._tell(machine, f"host {key} is being remediated by {busy}; waiting")
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


def setup(manager: Manager, options: RunOptions) -> None:
    controller = MachineRemediationController(manager, options)

    def by_machine(old: Any, new: Any) -> list[str]:
        keys: set[str] = set()
        for machine in (old, new):
            if machine is not None:
                keys.update(host_of(machine))
        return sorted(keys)

    runner = manager.add(Controller("machine-remediation", controller.reconcile, workers=2))
    runner.watch(controller.hosts)
    runner.watch(controller.machines, by_machine)


REGISTRY["machine-remediation"] = setup
