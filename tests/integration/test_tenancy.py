"""Tenancy on the real API server: a tenant in one namespace tries every path to another
namespace's host and Node (api/links.py, docs/security.md). The controllers run
cluster-wide, as deployed; the victim is a healthy host with its Machine, Node and a pod."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from lightkube import AsyncClient, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Pod
from lightkube.types import PatchType

from metalmend.api import links, names
from metalmend.api.resources import BareMetalHost, Machine, Metal3Remediation
from metalmend.controllers import machineremediation, nodelink, remediation
from tests.integration.test_remediation import Controllers, World
from tests.support import until


@pytest.fixture
def tenant(kube: Client) -> Iterator[str]:
    """The attacker's namespace (the victim's is ``namespace``)."""
    name = f"tenant-{secrets.token_hex(3)}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


@pytest.fixture
async def cluster_wide(aclient: AsyncClient) -> AsyncIterator[Controllers]:
    running = Controllers(aclient, None)  # all namespaces, as deployed
    yield running
    await running.kill()


@pytest.fixture
async def victim(aclient: AsyncClient, namespace: str) -> AsyncIterator[World]:
    world = World(aclient, namespace)
    await world.machine("worker-2", host="worker-2")
    await world.pod_on("worker-2", "db-0")
    yield world
    await world.cleanup()


@pytest.fixture
async def attacker(aclient: AsyncClient, tenant: str) -> AsyncIterator[World]:
    world = World(aclient, tenant)
    yield world
    await world.cleanup()


async def tenant_machine(
    world: World,
    name: str,
    *,
    host: str | None = None,
    provider_id: str | None = None,
    node_ref: Any = None,
    **annotations: str,
) -> Any:
    """A Machine made by hand in the attacker's namespace; ``node_ref``: a Node whose
    reference the tenant writes into status (Machine status is writable by tenants)."""
    if host is not None:
        annotations[names.MACHINE_HOST] = host
    spec: dict[str, Any] = {"clusterName": "c"}
    if provider_id:
        spec["providerID"] = provider_id
    machine: Any = await world.client.create(
        Machine(metadata=ObjectMeta(name=name, annotations=annotations), spec=spec),
        namespace=world.ns,
    )
    if node_ref is not None:
        ref = {"kind": "Node", "name": node_ref.metadata.name, "uid": node_ref.metadata.uid}
        await world.client.patch(
            Machine.Status, name, {"status": {"nodeRef": ref}},
            namespace=world.ns, patch_type=PatchType.MERGE,
        )  # fmt: skip
    return machine


async def own_host(world: World, name: str) -> None:
    await world.client.create(
        BareMetalHost(metadata=ObjectMeta(name=name), spec={"online": True}), namespace=world.ns
    )
    await world.power(name, on=True)


def condition_is(
    world: World, machine: str, type_: str, reason: str
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        got = await world.get(Machine, machine)
        conditions = ((got.get("status") or {}) if got else {}).get("conditions") or []
        return any(
            c["type"] == type_ and c["status"] == "False" and c.get("reason") == reason
            for c in conditions
        )

    return check


async def warnings(world: World, reason: str) -> list[Any]:
    return [
        e
        async for e in world.client.list(Event, namespace=world.ns)
        if e.type == "Warning" and e.reason == reason
    ]


async def victim_untouched(victim: World) -> None:
    annotations = await victim.host_annotations("worker-2")
    assert not [k for k in annotations if k.startswith(names.REBOOT)], annotations
    node = await victim.node_obj("worker-2")
    assert node is not None, "the victim's Node was deleted"
    assert names.OUT_OF_SERVICE_TAINT not in [t.key for t in node.spec.taints or []]
    assert await victim.get(Pod, "db-0") is not None, "the victim's pod was deleted"


# ---- the annotation flow (machine-remediation) --------------------------------------------------


async def test_external_remediation_of_another_namespaces_host_is_refused(
    victim: World, attacker: World, cluster_wide: Controllers
) -> None:
    await cluster_wide.start(machineremediation.setup)
    await tenant_machine(
        attacker, "evil", host=f"{victim.ns}/worker-2", **{names.EXTERNAL_REMEDIATION: ""}
    )
    check = condition_is(attacker, "evil", names.CONDITION_HOST_LINK, links.REASON_OTHER_NAMESPACE)
    await until(check)
    await victim_untouched(victim)
    [event] = await warnings(attacker, links.REASON_OTHER_NAMESPACE)
    assert victim.ns in event.message
    assert "own namespace" in event.message
    # The host is reconciled again (its status changes): the refusal is not reported again.
    await victim.power("worker-2", on=True)
    await asyncio.sleep(0.5)
    [again] = await warnings(attacker, links.REASON_OTHER_NAMESPACE)
    assert (again.count or 1) == (event.count or 1)
    await victim_untouched(victim)


async def test_external_remediation_with_a_foreign_node_ref_is_refused(
    victim: World, attacker: World, cluster_wide: Controllers
) -> None:
    """Own host, but status.nodeRef written to the victim's Node: no power-cycle, no fence."""
    await own_host(attacker, "mine")
    victim_node = await victim.node_obj("worker-2")
    await tenant_machine(
        attacker,
        "evil",
        host=f"{attacker.ns}/mine",
        node_ref=victim_node,
        **{names.EXTERNAL_REMEDIATION: ""},
    )
    await cluster_wide.start(machineremediation.setup)
    check = condition_is(
        attacker, "evil", names.CONDITION_NODE_FENCING, links.REASON_NODE_OF_ANOTHER_HOST
    )
    await until(check)
    assert names.MACHINE_REMEDIATION_REBOOT not in await attacker.host_annotations("mine")
    await victim_untouched(victim)


async def test_the_victims_own_annotation_flow_still_works(
    victim: World, attacker: World, cluster_wide: Controllers
) -> None:
    """The same cluster-wide controller, a refused tenant next to it, serves the owner."""
    await tenant_machine(
        attacker, "evil", host=f"{victim.ns}/worker-2", **{names.EXTERNAL_REMEDIATION: ""}
    )
    await cluster_wide.start(machineremediation.setup)
    await victim.client.patch(
        Machine, "worker-2", {"metadata": {"annotations": {names.EXTERNAL_REMEDIATION: ""}}},
        namespace=victim.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    key = names.MACHINE_REMEDIATION_REBOOT
    await until(lambda: _has(victim.host_annotations("worker-2"), key))


async def test_a_bare_host_name_means_the_machines_namespace(
    attacker: World, cluster_wide: Controllers
) -> None:
    await own_host(attacker, "mine")
    await tenant_machine(attacker, "m", host="mine", **{names.EXTERNAL_REMEDIATION: ""})
    await cluster_wide.start(machineremediation.setup)
    key = names.MACHINE_REMEDIATION_REBOOT
    await until(lambda: _has(attacker.host_annotations("mine"), key))


# ---- node-link -------------------------------------------------------------------------------


async def test_node_link_gives_no_node_of_another_namespace(
    victim: World, attacker: World, cluster_wide: Controllers
) -> None:
    victim_node = await victim.node_obj("worker-2")
    stolen = victim.provider_id("worker-2")
    await tenant_machine(attacker, "by-provider", provider_id=stolen)
    await tenant_machine(attacker, "by-both", host=f"{victim.ns}/worker-2", provider_id=stolen)
    await tenant_machine(attacker, victim_node.metadata.name)  # the name fallback
    # The victim's Machine loses its nodeRef to prove node-link really runs and links it back.
    await victim.client.patch(
        Machine.Status, "worker-2", {"status": {"nodeRef": None}},
        namespace=victim.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await cluster_wide.start(nodelink.setup)
    await until(lambda: _node_ref_is(victim, "worker-2", victim_node.metadata.name))
    reason = links.REASON_NOT_CONFIRMED
    await until(condition_is(attacker, "by-provider", names.CONDITION_NODE_LINK, reason))
    await until(condition_is(attacker, "by-both", names.CONDITION_NODE_LINK, reason))
    await until(condition_is(attacker, "by-both", names.CONDITION_HOST_LINK,
                             links.REASON_OTHER_NAMESPACE))  # fmt: skip
    fallback = links.REASON_NODE_OF_ANOTHER_HOST
    await until(
        condition_is(attacker, victim_node.metadata.name, names.CONDITION_NODE_LINK, fallback)
    )
    for name in ("by-provider", "by-both", victim_node.metadata.name):
        assert await _node_ref_is(attacker, name, None), name


async def test_node_link_needs_the_host_to_confirm_its_consumer(
    victim: World, cluster_wide: Controllers
) -> None:
    """In one namespace too: a second Machine with the host's providerID is not its consumer."""
    victim_node = await victim.node_obj("worker-2")
    await tenant_machine(
        victim, "squatter", host="worker-2", provider_id=victim.provider_id("worker-2")
    )
    await cluster_wide.start(nodelink.setup)
    reason = links.REASON_NOT_CONFIRMED
    await until(condition_is(victim, "squatter", names.CONDITION_NODE_LINK, reason))
    assert await _node_ref_is(victim, "squatter", None)
    assert await _node_ref_is(victim, "worker-2", victim_node.metadata.name)


# ---- Metal3Remediation -----------------------------------------------------------------------


async def test_metal3_remediation_of_another_namespaces_host_is_refused(
    victim: World, attacker: World, cluster_wide: Controllers
) -> None:
    """Annotation to the victim's host and the victim's Node in status.nodeRef (what node-link
    used to give): the remediation fails to start; host, Node and pods untouched."""
    victim_node = await victim.node_obj("worker-2")
    machine = await tenant_machine(
        attacker, "evil", host=f"{victim.ns}/worker-2", node_ref=victim_node
    )
    await cluster_wide.start(remediation.setup)
    await attacker.remediation(machine)
    await until(lambda: _phase_is(attacker, "evil", "failed"))
    got = await attacker.get(Metal3Remediation, "evil")
    assert "another namespace" in got.status["message"]
    reason = links.REASON_OTHER_NAMESPACE
    await until(condition_is(attacker, "evil", names.CONDITION_HOST_LINK, reason))
    assert await warnings(attacker, names.REASON_CANNOT_REMEDIATE)
    await victim_untouched(victim)
    # Deleting it releases nothing of the victim's either (it never held anything).
    await attacker.client.delete(Metal3Remediation, "evil", namespace=attacker.ns)
    await until(lambda: _is_none(attacker.get(Metal3Remediation, "evil")))
    await victim_untouched(victim)


async def test_metal3_remediation_never_fences_a_node_of_another_host(
    victim: World, attacker: World, cluster_wide: Controllers
) -> None:
    """Own host, the victim's Node in status.nodeRef: own host not even powered off."""
    await own_host(attacker, "mine")
    victim_node = await victim.node_obj("worker-2")
    machine = await tenant_machine(
        attacker, "evil", host=f"{attacker.ns}/mine", node_ref=victim_node
    )
    await cluster_wide.start(remediation.setup)
    await attacker.remediation(machine)
    await until(lambda: _phase_is(attacker, "evil", "failed"))
    got = await attacker.get(Metal3Remediation, "evil")
    assert "is not a Node of host" in got.status["message"]
    own = await attacker.host_annotations("mine")
    assert not [k for k in own if k.startswith(names.REBOOT)], own
    await victim_untouched(victim)


async def test_a_forged_status_node_is_not_fenced(
    victim: World, attacker: World, cluster_wide: Controllers
) -> None:
    """status.node (the Node a remediation fences) pre-written before the controller sees it."""
    await own_host(attacker, "mine")
    machine = await tenant_machine(attacker, "evil", host=f"{attacker.ns}/mine")
    obj: Any = await attacker.remediation(machine)
    victim_node = await victim.node_obj("worker-2")
    await attacker.client.patch(
        Metal3Remediation.Status, obj.metadata.name,
        {"status": {"node": victim_node.metadata.name, "host": f"{victim.ns}/worker-2"}},
        namespace=attacker.ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await cluster_wide.start(remediation.setup)
    await until(lambda: _phase_is(attacker, "evil", "failed"))
    own = await attacker.host_annotations("mine")
    assert not [k for k in own if k.startswith(names.REBOOT)], own
    await victim_untouched(victim)


# ---- small async predicates -----------------------------------------------------------------


async def _node_ref_is(world: World, machine: str, node: str | None) -> bool:
    got = await world.get(Machine, machine)
    ref = ((got.get("status") or {}) if got else {}).get("nodeRef") or {}
    return ref.get("name") == node


async def _phase_is(world: World, name: str, phase: str) -> bool:
    return await world.phase(name) == phase


async def _has(found: Awaitable[dict[str, str]], key: str) -> bool:
    return key in await found


async def _is_none(found: Awaitable[Any]) -> bool:
    return await found is None
