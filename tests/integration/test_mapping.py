"""Handlers map a change of one kind to reconcile keys of another: a Node turning NotReady
wakes the MachineHealthCheck that selects its Machine, found through store indexes."""

from __future__ import annotations

import asyncio
from typing import Any

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api.resources import Machine, MachineHealthCheck
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from tests.support import until


def node_of(machine: Any) -> list[str]:
    ref = (machine.get("status") or {}).get("nodeRef") or {}
    return [ref["name"]] if ref.get("name") else []


async def test_a_node_change_wakes_the_health_check_selecting_its_machine(
    aclient: AsyncClient, namespace: str
) -> None:
    woken: list[str] = []

    async def reconcile(key: str) -> Result:
        woken.append(key)
        return DONE

    manager = Manager(aclient)
    checks = manager.informer(MachineHealthCheck, namespace=namespace)
    machines = manager.informer(Machine, namespace=namespace, indexes={"node": node_of})
    controller = manager.add(Controller("mhc", reconcile))
    controller.watch(checks)

    def checks_selecting(old: Any, new: Any) -> list[str]:
        node = new if new is not None else old
        keys = []
        for machine in machines.store.by_index("node", node.metadata.name):
            labels = machine.metadata.labels or {}
            for check in checks.store.values():
                wanted = check["spec"]["selector"].get("matchLabels", {})
                if all(labels.get(k) == v for k, v in wanted.items()):
                    keys.append(object_key(check))
        return keys

    controller.watch(manager.informer(Node), checks_selecting)
    run = asyncio.create_task(manager.run())
    node_name = f"{namespace}-worker"
    try:
        for name, role in (("workers", "worker"), ("masters", "master")):
            await aclient.create(
                MachineHealthCheck(
                    metadata=ObjectMeta(name=name),
                    spec={"clusterName": "c", "selector": {"matchLabels": {"role": role}}},
                ),
                namespace=namespace,
            )
        await aclient.create(
            Machine(
                metadata=ObjectMeta(name="m", labels={"role": "worker"}),
                spec={"clusterName": "c"},
            ),
            namespace=namespace,
        )
        await aclient.patch(
            Machine.Status,
            "m",
            {"status": {"nodeRef": {"kind": "Node", "name": node_name}}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
        await until(lambda: len(machines.store.by_index("node", node_name)) == 1)
        await until(lambda: {f"{namespace}/workers", f"{namespace}/masters"} <= set(woken))
        woken.clear()
        await aclient.create(Node(metadata=ObjectMeta(name=node_name)))
        await until(lambda: f"{namespace}/workers" in woken)
        await asyncio.sleep(0.3)
        assert f"{namespace}/masters" not in woken
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await aclient.delete(Node, node_name)
