"""node-link: keeps ``Machine.status.nodeRef`` true where no Cluster API runs, linking a
Machine only to a Node of a host it legitimately has (policy.nodelink, api/links.py)."""

from __future__ import annotations

from typing import Any

from lightkube.resources.core_v1 import Node

from metalmend.api import indexes, links, names
from metalmend.api.resources import BareMetalHost, Machine
from metalmend.api.stamps import stamp
from metalmend.controllers.tenancy import report
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writes import patch_annotations, patch_status
from metalmend.policy.nodelink import NodeFacts, desired_node_ref
from metalmend.settings import Settings


def node_facts(node: Any) -> NodeFacts:
    provider = node.spec.providerID if node.spec else None
    return NodeFacts(name=node.metadata.name, uid=node.metadata.uid, provider_id=provider or None)


def setup(manager: Manager, settings: Settings) -> None:
    machines = manager.informer(
        Machine,
        namespace=settings.runtime.namespace,
        indexes=indexes.of(
            indexes.MACHINES_BY_PROVIDER_ID,
            indexes.MACHINES_BY_NAME,
            indexes.MACHINES_BY_CONFIRMING_HOST,
        ),
    )
    nodes = manager.informer(Node, indexes=indexes.of(indexes.NODES_BY_PROVIDER_ID))
    hosts = manager.informer(BareMetalHost, namespace=settings.runtime.namespace)

    async def reconcile(key: str) -> Result:
        machine = machines.store.get(key)
        if machine is None:
            return DONE
        provider = (machine.get("spec") or {}).get("providerID")
        identity = links.machine_identity(machine)
        link = links.host_link_of(machine)
        host_key = links.host_key_for_link(identity, link, provider)
        found_host = hosts.store.get(host_key) if host_key else None
        known = {host_key: links.host_facts(found_host)} if found_host is not None else {}
        by_provider = {
            p: node_facts(n)
            for p in [provider]
            if p
            for n in nodes.store.by_index(indexes.NODES_BY_PROVIDER_ID.name, p)
        }
        named = nodes.store.get(machine.metadata.name)
        verdict = desired_node_ref(
            identity,
            provider,
            link,
            known,
            by_provider,
            node_facts(named) if named is not None else None,
        )
        machine = await _report(machine, link, verdict.refusal, verdict.reason)
        wanted = verdict.node_ref
        status = dict(machine.get("status") or {})
        if wanted == status.get("nodeRef"):
            return DONE
        if wanted is None:
            status.pop("nodeRef", None)
            # When it was lost, for the health check's nodeStartupTimeout
            # (Cluster API's machine health checking proposal).
            lost = {names.NODE_REF_LOST_AT: stamp(manager.clock.now())}
            machine = await patch_annotations(manager.client, Machine, machine, lost) or machine
        else:
            status["nodeRef"] = wanted
        await patch_status(manager.client, Machine, machine, status)
        return DONE

    async def _report(machine: Any, link: links.HostLink, refusal: str, reason: str) -> Any:
        for type_, why, because in (
            (names.CONDITION_HOST_LINK, link.refusal, link.reason),
            (names.CONDITION_NODE_LINK, refusal, reason),
        ):
            args = (manager.client, manager.events, manager.clock, machine, type_, why, because)
            machine = await report(*args) or machine
        return machine

    def machines_of(old: Any, new: Any) -> list[str]:
        keys: set[str] = set()
        for node in (old, new):
            if node is None:
                continue
            found = [
                *(
                    m
                    for provider in indexes.node_provider_id(node)
                    for m in machines.store.by_index(indexes.MACHINES_BY_PROVIDER_ID.name, provider)
                ),
                *machines.store.by_index(indexes.MACHINES_BY_NAME.name, node.metadata.name),
            ]
            keys.update(object_key(m) for m in found)
        return sorted(keys)

    def machines_of_host(old: Any, new: Any) -> list[str]:
        host = new if new is not None else old
        found = machines.store.by_index(indexes.MACHINES_BY_CONFIRMING_HOST.name, object_key(host))
        return sorted(object_key(m) for m in found)

    controller = manager.add(Controller("node-link", reconcile, workers=2))
    controller.watch(machines)
    controller.watch(nodes, machines_of)
    controller.watch(hosts, machines_of_host)
