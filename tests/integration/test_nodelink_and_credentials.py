"""node-link on the real API server (BMC credentials: tests/integration/test_credentials.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend.api.resources import BareMetalHost, Machine
from metalmend.controllers.nodelink import setup
from metalmend.kube.manager import Manager
from metalmend.settings import RuntimeSettings, Settings
from tests.support import until


async def node_ref(client: AsyncClient, namespace: str, name: str) -> str | None:
    machine: Any = await client.get(Machine, name, namespace=namespace)
    return ((machine.get("status") or {}).get("nodeRef") or {}).get("name")


async def test_node_link_keeps_a_deleted_nodes_ref_and_follows_its_new_registration(
    aclient: AsyncClient, namespace: str
) -> None:
    """nodeRef is set to the Node found, is not removed when the Node is deleted (as Cluster
    API: the health check finds the Machine unhealthy at once), and names the new Node (new
    uid) once the host's Node registers again."""
    manager = Manager(aclient)
    setup(manager, Settings(runtime=RuntimeSettings(namespace=namespace)))
    run = asyncio.create_task(manager.run())
    provider = f"metal3://{namespace}/h1"
    node_name = f"{namespace}-n1"
    try:
        machine: Any = await aclient.create(
            Machine(
                metadata=ObjectMeta(name="m1"), spec={"clusterName": "c", "providerID": provider}
            ),
            namespace=namespace,
        )
        # The host the providerID names confirms the Machine as its consumer (api/links.py).
        consumer = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "m1",
                    "uid": machine.metadata.uid}  # fmt: skip
        await aclient.create(
            BareMetalHost(metadata=ObjectMeta(name="h1"), spec={"consumerRef": consumer}),
            namespace=namespace,
        )
        await aclient.create(
            Machine(metadata=ObjectMeta(name=f"{namespace}-n2"), spec={"clusterName": "c"}),
            namespace=namespace,
        )
        await aclient.create(
            Node(metadata=ObjectMeta(name=node_name), spec=NodeSpec(providerID=provider))
        )
        await aclient.create(Node(metadata=ObjectMeta(name=f"{namespace}-n2")))
        await until(lambda: _has(aclient, namespace, "m1", node_name))
        await until(lambda: _has(aclient, namespace, f"{namespace}-n2", f"{namespace}-n2"))
        first: Any = await aclient.get(Machine, "m1", namespace=namespace)
        await aclient.delete(Node, node_name)
        await asyncio.sleep(1.0)  # node-link saw the deletion (a watch event, milliseconds)
        kept: Any = await aclient.get(Machine, "m1", namespace=namespace)
        assert kept.status["nodeRef"] == first.status["nodeRef"]
        assert "metalmend.dev/node-ref-lost-at" not in (kept.metadata.annotations or {})
        again: Any = await aclient.create(
            Node(metadata=ObjectMeta(name=node_name), spec=NodeSpec(providerID=provider))
        )
        await until(lambda: _uid_is(aclient, namespace, "m1", again.metadata.uid))
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for name in (node_name, f"{namespace}-n2"):
            with contextlib.suppress(ApiError):
                await aclient.delete(Node, name)


async def _has(client: AsyncClient, namespace: str, machine: str, node: str | None) -> bool:
    return await node_ref(client, namespace, machine) == node


async def _uid_is(client: AsyncClient, namespace: str, machine: str, uid: str | None) -> bool:
    found: Any = await client.get(Machine, machine, namespace=namespace)
    return ((found.get("status") or {}).get("nodeRef") or {}).get("uid") == uid
