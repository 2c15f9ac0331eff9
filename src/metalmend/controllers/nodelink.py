"""node-link: keeps ``Machine.status.nodeRef`` true where no Cluster API runs."""

from __future__ import annotations

from typing import Any

from lightkube.resources.core_v1 import Node

from metalmend.api import names
from metalmend.api.resources import Machine
from metalmend.controllers import REGISTRY, RunOptions
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writes import patch_annotations, patch_status
from metalmend.policy.hostpower import stamp
from metalmend.policy.nodelink import desired_node_ref

BY_PROVIDER_ID = "providerID"
BY_NAME = "name"


def node_provider_id(node: Any) -> list[str]:
    return [node.spec.providerID] if node.spec and node.spec.providerID else []


def machine_provider_id(machine: Any) -> list[str]:
    provider = (machine.get("spec") or {}).get("providerID")
    return [provider] if provider else []


def setup(manager: Manager, options: RunOptions) -> None:
    machines = manager.informer(
        Machine,
        namespace=options.namespace,
        indexes={BY_PROVIDER_ID: machine_provider_id, BY_NAME: lambda m: [m.metadata.name]},
    )
    nodes = manager.informer(Node, indexes={BY_PROVIDER_ID: node_provider_id})

    async def reconcile(key: str) -> Result:
        machine = machines.store.get(key)
        if machine is None:
            return DONE
        provider = (machine.get("spec") or {}).get("providerID")
        by_provider = {
            p: n for p in [provider] if p for n in nodes.store.by_index(BY_PROVIDER_ID, p)
        }
        named = nodes.store.get(machine.metadata.name)
        by_name = {machine.metadata.name: named} if named is not None else {}
        wanted = desired_node_ref(provider, machine.metadata.name, by_provider, by_name)
        status = dict(machine.get("status") or {})
        if wanted == status.get("nodeRef"):
            return DONE
        if wanted is None:
            status.pop("nodeRef", None)
            # When it was lost, for the health check's nodeStartupTimeout (seed 002).
            lost = {names.NODE_REF_LOST_AT: stamp(manager.clock.now())}
            machine = await patch_annotations(manager.client, Machine, machine, lost) or machine
        else:
            status["nodeRef"] = wanted
        await patch_status(manager.client, Machine, machine, status)
        return DONE

    def machines_of(old: Any, new: Any) -> list[str]:
        keys: set[str] = set()
        for node in (old, new):
            if node is None:
                continue
            for provider in node_provider_id(node):
                keys.update(
                    object_key(m) for m in machines.store.by_index(BY_PROVIDER_ID, provider)
                )
            keys.update(object_key(m) for m in machines.store.by_index(BY_NAME, node.metadata.name))
        return sorted(keys)

    controller = manager.add(Controller("node-link", reconcile, workers=2))
    controller.watch(machines)
    controller.watch(nodes, machines_of)


REGISTRY["node-link"] = setup
