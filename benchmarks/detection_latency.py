"""Health-check detection latency: from the moment a Node condition's timeout expires to
the remediation object's creation, seen by a watcher. 100 machines go unhealthy at
staggered moments; `metalmend run --controllers machine-health-check` runs as a process,
as in production. p50/p99; target p99 under 1 s (upstream requeues an MHC no faster than
every 15 s). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.types import PatchType

from metalmend.api.resources import (
    Machine,
    MachineHealthCheck,
    Metal3Remediation,
    Metal3RemediationTemplate,
)
from metalmend.kube.crds import install_crds
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig, free_port

MACHINES = 100
TIMEOUT = 2  # seconds
NS = "bench"


async def prepare(client: AsyncClient) -> None:
    await client.create(Namespace(metadata=ObjectMeta(name=NS)))
    await client.create(
        Metal3RemediationTemplate(
            metadata=ObjectMeta(name="fence"), spec={"template": {"spec": {}}}
        ),
        namespace=NS,
    )
    for i in range(MACHINES):
        name = f"m{i:03d}"
        await client.create(
            Machine(
                metadata=ObjectMeta(name=name, labels={"role": "w"}), spec={"clusterName": "c"}
            ),
            namespace=NS,
        )
        await client.patch(Machine.Status, name, {"status": {"nodeRef": {"kind": "Node", "name": name}}},
                           namespace=NS, patch_type=PatchType.MERGE)  # fmt: skip
        await client.create(Node(metadata=ObjectMeta(name=name)))
    spec = {
        "clusterName": "c", "selector": {"matchLabels": {"role": "w"}},
        "unhealthyConditions": [{"type": "KernelDeadlock", "status": "True", "timeout": f"{TIMEOUT}s"}],
        "remediationTemplate": {"apiVersion": "remediation.metal3.io/v1alpha1", "kind": "Metal3RemediationTemplate", "name": "fence"},
    }  # fmt: skip
    await client.create(
        MachineHealthCheck(metadata=ObjectMeta(name="all"), spec=spec), namespace=NS
    )


async def measure(client: AsyncClient) -> list[float]:
    created: dict[str, float] = {}

    async def watch() -> None:
        async for kind, obj in client.watch(Metal3Remediation, namespace=NS):
            if kind == "ADDED":
                created.setdefault(obj.metadata.name, time.time())
            if len(created) == MACHINES:
                return

    watcher = asyncio.create_task(watch())
    expiries: dict[str, float] = {}
    for i in random.Random(1).sample(range(MACHINES), MACHINES):
        name = f"m{i:03d}"
        now = dt.datetime.now(dt.UTC).isoformat()
        condition = {"type": "KernelDeadlock", "status": "True", "reason": "Bench",
                     "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
        node: Any = await client.patch(Node.Status, name, {"status": {"conditions": [condition]}})
        since = next(
            c.lastTransitionTime for c in node.status.conditions if c.type == "KernelDeadlock"
        )
        expiries[name] = since.timestamp() + TIMEOUT  # as stored: whole seconds
        await asyncio.sleep(random.uniform(0.02, 0.15))
    await asyncio.wait_for(watcher, 60)
    return [(created[n] - expiries[n]) * 1000 for n in expiries]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as workdir:
        plane = ControlPlane(ControlPlaneConfig(workdir=Path(workdir)))
        plane.start()
        port = free_port()
        controller = None
        try:
            install_crds(Client(KubeConfig.from_file(plane.kubeconfig)))
            client = AsyncClient(KubeConfig.from_file(plane.kubeconfig))
            asyncio.run(prepare(client))
            controller = subprocess.Popen(
                [sys.executable, "-m", "metalmend", "run", "--kubeconfig", str(plane.kubeconfig),
                 "--controllers", "machine-health-check", "--health-bind", f"127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for _ in range(300):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            latencies = asyncio.run(measure(AsyncClient(KubeConfig.from_file(plane.kubeconfig))))
        finally:
            if controller is not None:
                controller.terminate()
                controller.wait()
            plane.stop()
    q = statistics.quantiles(latencies, n=100)
    print(
        f"health-check detection latency, {MACHINES} machines, timeout expiry -> remediation created (ms)"
    )
    print(
        f"  p50 {q[49]:7.1f}   p99 {q[98]:7.1f}   max {max(latencies):7.1f}   min {min(latencies):7.1f}"
    )


if __name__ == "__main__":
    main()
