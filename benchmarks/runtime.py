"""The controller runtime's baselines, on a real control plane:

1. syncing an informer over 5,000 BareMetalHosts: time and resident memory, side by side
   with a bare paginated list of the same objects (the floor any informer pays);
2. no-op reconcile throughput over 5,000 keys through the work queue and controller,
   side by side with calling the same coroutine 5,000 times in a loop (the queue's
   overhead), for 1, 2 and 4 workers.

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta

from metalmend.api.resources import BareMetalHost
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.crds import install_crds
from metalmend.kube.informer import Informer
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig

OBJECTS = 5000


async def create_hosts(client: AsyncClient, namespace: str) -> None:
    semaphore = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        spec = {
            "online": True,
            "bootMACAddress": f"52:54:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}",
            "bmc": {"address": f"ipmi://127.0.0.1:{10000 + i}", "credentialsName": f"bmc-{i}"},
        }
        async with semaphore:
            await client.create(
                BareMetalHost(metadata=ObjectMeta(name=f"host-{i:05d}"), spec=spec),
                namespace=namespace,
            )

    await asyncio.gather(*(one(i) for i in range(OBJECTS)))


async def informer_sync(client: AsyncClient) -> None:
    # Memory is what the objects still hold once loaded (tracemalloc), not RSS, which the
    # allocator's reuse makes meaningless at this size.
    tracemalloc.start()
    started = time.perf_counter()
    objects = [o async for o in client.list(BareMetalHost, namespace="*", chunk_size=500)]
    listed = time.perf_counter() - started
    list_mib = tracemalloc.get_traced_memory()[0] / 2**20
    count = len(objects)
    del objects
    gc.collect()
    tracemalloc.reset_peak()
    baseline = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    informer = Informer(client, BareMetalHost)
    task = asyncio.create_task(informer.run())
    await informer.synced.wait()
    synced = time.perf_counter() - started
    sync_mib = (tracemalloc.get_traced_memory()[0] - baseline) / 2**20
    tracemalloc.stop()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    print(f"\n1. sync {count} BareMetalHosts (under tracemalloc, which slows both alike)")
    print(f"   bare paginated list   {listed:6.2f} s   {list_mib:6.1f} MiB held")
    print(f"   informer sync         {synced:6.2f} s   {sync_mib:6.1f} MiB held")
    ratio = f"{synced / listed:6.2f}x time, {sync_mib / list_mib:4.2f}x memory"
    print(f"   ratio informer/list   {ratio}")


async def reconcile_throughput() -> None:
    calls = 0
    finished = asyncio.Event()

    async def noop(key: str) -> Result:
        nonlocal calls
        calls += 1
        if calls == OBJECTS:
            finished.set()
        return DONE

    keys = [f"ns/host-{i:05d}" for i in range(OBJECTS)]
    started = time.perf_counter()
    for key in keys:
        await noop(key)
    calls = 0
    loop_seconds = time.perf_counter() - started
    print(f"\n2. no-op reconcile of {OBJECTS} keys")
    print(f"   plain loop              {OBJECTS / loop_seconds:10.0f} keys/s")
    for workers in (1, 2, 4):
        calls = 0
        finished.clear()
        controller = Controller(f"bench-{workers}", noop, workers=workers)
        for key in keys:
            controller.queue.add(key)
        started = time.perf_counter()
        task = asyncio.create_task(controller.run())
        await finished.wait()
        seconds = time.perf_counter() - started
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        print(
            f"   controller, {workers} worker(s) {OBJECTS / seconds:10.0f} keys/s"
            f"   ({seconds / loop_seconds:5.1f}x the plain loop's time)"
        )


async def run(plane: ControlPlane) -> None:
    client = AsyncClient(KubeConfig.from_file(plane.kubeconfig))
    from lightkube.resources.core_v1 import Namespace

    await client.create(Namespace(metadata=ObjectMeta(name="bench")))
    started = time.perf_counter()
    await create_hosts(client, "bench")
    print(f"created {OBJECTS} BareMetalHosts in {time.perf_counter() - started:.1f}s (setup)")
    await informer_sync(client)
    await reconcile_throughput()
    await client.close()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as workdir:
        plane = ControlPlane(ControlPlaneConfig(workdir=Path(workdir)))
        plane.start()
        try:
            from lightkube import Client

            install_crds(Client(KubeConfig.from_file(plane.kubeconfig)))
            asyncio.run(run(plane))
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
