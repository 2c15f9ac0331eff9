"""The FenceRemediation controller ("fence-remediation"): the metal3-remediation flow
(controllers.remediation, policy.remediation: power off and hold, confirm, fence, power on)
for objects any health checker creates from a FenceRemediationTemplate, by the external
remediation contract (docs/remediation.md, "As a remediation template").

Thin: what differs is in policy.fenceremediation (the target, Machine or Node; the
timed-out annotation; the conditions), the rest is the RemediationController it extends.
"""

from __future__ import annotations

import logging
from typing import Any

from metalmend.api import indexes, links
from metalmend.api.resources import FenceRemediation
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers import metrics
from metalmend.controllers.powerreads import PowerReader
from metalmend.controllers.remediation import (
    Evacuations,
    Planned,
    RemediationController,
    Wakes,
    wire,
)
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.policy import fenceremediation as fence
from metalmend.policy import remediation as policy
from metalmend.settings import Settings

log = logging.getLogger(__name__)


def target_of(remediation: Any) -> fence.Target:
    owners = [
        fence.Owner(o.kind, o.apiVersion, o.name)
        for o in remediation.metadata.ownerReferences or []
    ]
    annotations = remediation.metadata.annotations or {}
    return fence.target(remediation.metadata.name, annotations, owners)


class FenceRemediationController(RemediationController):
    resource = FenceRemediation
    metrics_name = metrics.FENCE_REMEDIATION

    def machine_of(self, remediation: Any) -> Any | None:
        namespace = remediation.metadata.namespace
        found = target_of(remediation)
        if found.kind == "Machine":
            key = f"{namespace}/{found.name}"
            return machine_kinds.find(self.machines, key, found.api_version)
        machines = sorted(
            (
                m
                for m in self.machines.store.by_index(indexes.MACHINES_BY_NODE.name, found.name)
                if m.metadata.namespace == namespace
            ),
            key=object_key,
        )
        return machines[0] if machines else None

    def remediated_node(self, remediation: Any) -> str | None:
        """A Node target that no Machine of this namespace names is remediated as the
        NodeHealthCheck's Machine-less remediations are: through the host that
        confirms the Node (api/links.node_host), never by the object's word."""
        goal = target_of(remediation)
        return goal.name if goal.kind == "Node" else None

    async def after(self, remediation: Any, planned: Planned) -> None:
        """The conditions health checkers read, written only when they change; none on an
        object whose last finalizer we just removed (it is gone)."""
        removed = any(isinstance(a, policy.RemoveFinalizer) for a in planned.decision.actions)
        gone = not (remediation.metadata.finalizers or []) or removed
        if remediation.metadata.deletionTimestamp is not None and gone:
            return
        status = dict(remediation.get("status") or {})
        progress = policy.Progress.from_wire(status)
        spec = policy.Spec.from_wire(remediation.get("spec") or {})
        stopped = fence.timed_out(remediation.metadata.annotations or {})
        wanted = fence.wanted_conditions(
            progress.phase,
            spec.strategy,
            progress.message,
            stopped,
            remediation.metadata.deletionTimestamp is not None,
        )
        present = status.get("conditions") or []
        merged = fence.conditions(present, wanted, self.clock.now())
        if merged != present:
            await self.writer.patch_status(
                self.resource, remediation, {**status, "conditions": merged}
            )


def setup(
    manager: Manager,
    settings: Settings,
    *,
    reader: PowerReader | None = None,
    evacuations: Evacuations | None = None,
) -> None:
    controller = FenceRemediationController(
        manager, settings, reader=reader, evacuations=evacuations
    )

    def remediating(machines: set[str], nodes: set[str]) -> list[str]:
        """The FenceRemediations whose target is one of these Machines or Nodes (few: one
        per unhealthy target)."""
        keys = []
        for remediation in controller.remediations.store.values():
            goal = target_of(remediation)
            namespace = remediation.metadata.namespace
            fenced = (remediation.get("status") or {}).get("node")
            if (
                (goal.kind == "Machine" and f"{namespace}/{goal.name}" in machines)
                or (goal.kind == "Node" and goal.name in nodes)
                or fenced in nodes
            ):
                keys.append(object_key(remediation))
        return sorted(keys)

    def nodes_of(machine: Any) -> set[str]:
        return set(links.node_of(machine))

    def by_machine(old: Any, new: Any) -> list[str]:
        found = [m for m in (old, new) if m is not None]
        machines = {object_key(m) for m in found}
        return remediating(machines, set().union(*(nodes_of(m) for m in found)))

    def by_host(old: Any, new: Any) -> list[str]:
        host = new if new is not None else old
        key = object_key(host)
        found = controller.machines.store.by_index(indexes.MACHINES_BY_HOST.name, key)
        keys = set(remediating({object_key(m) for m in found}, set().union(*map(nodes_of, found))))
        return sorted(keys | controller.node_targets_of_host(key))

    def by_node(old: Any, new: Any) -> list[str]:
        node = new if new is not None else old
        name = node.metadata.name
        found = controller.machines.store.by_index(indexes.MACHINES_BY_NODE.name, name)
        return remediating({object_key(m) for m in found}, {name})

    def of_node(name: str) -> list[str]:
        return remediating(set(), {name})

    wire(manager, controller, "fence-remediation", Wakes(by_machine, by_host, by_node, of_node))
