"""BMC credentials from a cache, on the lab's hosts and BMCs: once the hosts have settled,
host-power reads no Secret from the API server, however often it reconciles (counted by
the API server itself, ``apiserver_request_total``); and a corrected Secret is used at
once, not after the long wait that follows a refused login."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL
from metalmend.controllers.hostpower import setup
from metalmend.kube.manager import Manager
from metalmend.settings import BmcSettings, PowerSettings, RuntimeSettings, Settings
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import host
from tests.support import reconciles, until


def secret_requests(running: lab.RunningLab) -> dict[str, float]:
    """The API server's count of requests on Secrets, by verb (every client)."""
    counts: dict[str, float] = {}
    with running.plane.admin_http() as http:
        text = http.get("/metrics").raise_for_status().text
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="secrets"' in line:
            labels, _, value = line.rpartition(" ")
            verb = labels.split('verb="', 1)[1].split('"', 1)[0]
            counts[verb] = counts.get(verb, 0.0) + float(value)
    return counts


@pytest.fixture
async def host_power(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    """host-power in-process against the lab's hosts, polling their BMCs every second."""
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    manager = Manager(client)
    options = Settings(
        runtime=RuntimeSettings(namespace=NAMESPACE),
        bmc=BmcSettings(ca_bundle=str(hosts_lab.plane.ca.pair.cert), timeout=5.0),
        power=PowerSettings(poll_interval=1.0),
    )
    setup(manager, options)
    task = asyncio.create_task(manager.run())
    yield client
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await manager.controllers[0].reconcile.__self__.bmcs.close()  # type: ignore[attr-defined]
    await client.close()


async def test_settled_hosts_cost_no_secret_reads(
    hosts_lab: lab.RunningLab, host_power: AsyncClient
) -> None:
    assert hosts_lab.hardware is not None
    names = [h.name for h in hosts_lab.hardware.hosts]

    async def settled() -> bool:
        for name in names:
            host = await host_power.get(BareMetalHost, name, namespace=NAMESPACE)
            status = host.get("status") or {}
            if status.get("operationalStatus") != "OK" or not status.get("poweredOn"):
                return False
        return True

    await until(settled, within=60)
    # The API server counts every client's requests, and the lab's other processes (the
    # controller manager, the lab's own metalmend) may list Secrets once in a while, when a
    # watch of theirs ends. Reading the Secret on every reconcile shows in every window (at
    # least ten GETs each); a stray list of another client does not: of up to three windows
    # one must see no request at all.
    windows: list[tuple[dict[str, float], dict[str, float]]] = []
    for _ in range(3):
        before, counted = secret_requests(hosts_lab), reconciles("host-power")
        # Each host reads its BMC again every second: wait for five such rounds per host.
        target = counted + 5 * len(names)
        await until(lambda target=target: reconciles("host-power") >= target, within=60)
        after = secret_requests(hosts_lab)
        assert before.get("LIST", 0.0) > 0, "the cache's own list is counted: the count works"
        windows.append((before, after))
        if all(after.get(verb, 0.0) == before.get(verb, 0.0) for verb in ("GET", "LIST")):
            break
    else:
        raise AssertionError(f"Secret requests in every window (before, after): {windows}")


async def test_a_corrected_password_is_used_at_once(
    hosts_lab: lab.RunningLab, host_power: AsyncClient
) -> None:
    """A refused login waits minutes before the next try (BMCs lock accounts); fixing the
    Secret is the one event that may try again at once."""
    spec = host(hosts_lab, "ipmi")
    name = "worker-ipmi-again"  # a second host on the IPMI BMC, reading its power only
    await host_power.create(
        Secret(
            metadata=ObjectMeta(
                name=f"{name}-bmc",
                labels={SECRET_LABEL: "true"},
                annotations={HOSTS_ANNOTATION: name},
            ),
            stringData={"username": spec.username, "password": "wrong-password"},
        ),
        namespace=NAMESPACE,
    )
    await host_power.create(
        BareMetalHost(
            metadata=ObjectMeta(name=name),
            spec={
                "online": True,
                "bmc": {"address": spec.address, "credentialsName": f"{name}-bmc"},
            },
        ),
        namespace=NAMESPACE,
    )

    async def status() -> dict[str, object]:
        obj = await host_power.get(BareMetalHost, name, namespace=NAMESPACE)
        return dict(obj.get("status") or {})

    try:
        await until(lambda: _refused(status), within=60)
        await host_power.patch(
            Secret, f"{name}-bmc", {"stringData": {"password": spec.password}},
            namespace=NAMESPACE, patch_type=PatchType.MERGE,
        )  # fmt: skip
        # The next try after a refused login is minutes away: only the reset gets here.
        await until(lambda: _recovered(status), within=60)
    finally:
        await host_power.delete(BareMetalHost, name, namespace=NAMESPACE)
        await host_power.delete(Secret, f"{name}-bmc", namespace=NAMESPACE)


async def _refused(status: Callable[[], Awaitable[dict[str, object]]]) -> bool:
    return "refused the credentials" in str((await status()).get("errorMessage") or "")


async def _recovered(status: Callable[[], Awaitable[dict[str, object]]]) -> bool:
    current = await status()
    return current.get("operationalStatus") == "OK" and current.get("poweredOn") is True
