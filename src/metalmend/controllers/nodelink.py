"""node-link: keeps ``Machine.status.nodeRef`` true where no Cluster API runs, linking a
Machine only to a Node of a host it legitimately has (policy.nodelink, api/links.py), in
the decide/act shape of docs/decide-act.md. A nodeRef whose Node was deleted is kept, as
Cluster API keeps it: the health check then finds the Machine unhealthy at once."""

from __future__ import annotations

from typing import Any

from lightkube.resources.core_v1 import Node

from metalmend.api import indexes, links
from metalmend.api.resources import BareMetalHost, machine_resource
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers.tenancy import report
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writer import KubeWriter, Writer
from metalmend.policy import nodelink as policy
from metalmend.policy.nodelink import NodeFacts
from metalmend.settings import Settings


def node_facts(node: Any) -> NodeFacts:
    provider = node.spec.providerID if node.spec else None
    return NodeFacts(name=node.metadata.name, uid=node.metadata.uid, provider_id=provider or None)


def node_facts_changed(old: Any | None, new: Any | None) -> bool:
    """A Node event that can change a link: the Node appeared, went, or changed what
    ``node_facts`` reads of it (its uid, its providerID). A status update (a kubelet's
    heartbeat every few minutes on every Node, condition changes) wakes nothing: at 5,000
    Nodes that was 17 reconciles a second on the leader for no decision."""
    if old is None or new is None:
        return True
    return node_facts(old) != node_facts(new)


class NodeLinkController:
    def __init__(self, manager: Manager, settings: Settings, writer: Writer | None = None) -> None:
        self.writer = writer or KubeWriter(manager.client, manager.events)
        self.clock = manager.clock
        self.machines = machine_kinds.informer(
            manager,
            namespace=settings.runtime.namespace,
            indexes=indexes.of(
                indexes.MACHINES_BY_PROVIDER_ID,
                indexes.MACHINES_BY_NAME,
                indexes.MACHINES_BY_CONFIRMING_HOST,
            ),
        )
        self.nodes = manager.informer(Node, indexes=indexes.of(indexes.NODES_BY_PROVIDER_ID))
        self.hosts = manager.informer(BareMetalHost, namespace=settings.runtime.namespace)

    def observe(self, machine: Any) -> policy.View:
        """The Machine, the host its rules may ask, and the Nodes that could be its own."""
        provider = (machine.get("spec") or {}).get("providerID") or None
        identity = links.machine_identity(machine)
        link = links.host_link_of(machine)
        host_key = links.host_key_for_link(identity, link, provider)
        host = self.hosts.store.get(host_key) if host_key else None
        with_provider = (
            self.nodes.store.by_index(indexes.NODES_BY_PROVIDER_ID.name, provider)
            if provider
            else []
        )
        by_provider = (
            {provider: node_facts(with_provider[-1])} if provider and with_provider else {}
        )
        named = self.nodes.store.get(machine.metadata.name)
        node_ref = (machine.get("status") or {}).get("nodeRef")
        ref_name = str(node_ref.get("name") or "") if isinstance(node_ref, dict) else ""
        return policy.View(
            machine=identity,
            key=object_key(machine),
            provider_id=provider,
            link=link,
            hosts={host_key: links.host_facts(host)} if host is not None else {},
            nodes_by_provider=by_provider,
            node_named_like_machine=node_facts(named) if named is not None else None,
            node_ref=dict(node_ref) if isinstance(node_ref, dict) else None,
            node_ref_found=bool(ref_name) and self.nodes.store.get(ref_name) is not None,
        )

    async def reconcile(self, key: str) -> Result:
        machine = self.machines.store.get(key)
        if machine is None:
            return DONE
        decision = policy.decide(self.observe(machine))
        for action in decision.actions:
            machine = await self.act(machine, action) or machine
        return Result.at(decision.requeue_at)

    async def act(self, machine: Any, action: policy.Action) -> Any | None:
        """Carry one action out through the writer; return the Machine if it changed."""
        match action:
            case policy.SetLinkCondition(type=type_, refusal=refusal, reason=reason):
                return await report(self.writer, self.clock, machine, type_, refusal, reason)
            case policy.SetNodeRef():
                status = action.to_wire(machine.get("status") or {})
                return await self.writer.patch_status(machine_resource(machine), machine, status)
            case policy.Event(type=kind, reason=reason, message=message):
                await self.writer.record_event(machine, kind, reason, message)
        return None


def setup(manager: Manager, settings: Settings) -> None:
    controller = NodeLinkController(manager, settings)
    machines = controller.machines

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

    runner = manager.add(Controller("node-link", controller.reconcile, workers=2))
    runner.watch(machines)
    runner.watch(controller.nodes, machines_of, predicate=node_facts_changed)
    runner.watch(controller.hosts, machines_of_host)
