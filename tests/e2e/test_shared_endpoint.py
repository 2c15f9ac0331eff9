"""Several BareMetalHosts behind ONE Redfish endpoint (a chassis manager, an aggregator,
sushy-tools without per-host proxies), driven by `metalmend run --controllers host-power`:
each host powers only the system its address names (docs/design.md, invariant 9).

Before the fix, the BMC pool kept one driver per endpoint with the system of whichever
host came first: a host `online: false` addressed to one system powered another off.
Here the hosts are addressed to the lab's sushy-tools emulator directly (not through the
per-host fault lines), in a namespace of their own, with a controller watching only that
namespace (the lab's own hosts are not managed, so nothing fights over a system).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Secret
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.bmc import BmcPool, BmcTarget, Credentials, PowerState, parse
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL, SECRET_LABEL_VALUE
from metalmend.bmc.settings import BmcSettings
from metalmend_lab import lab
from metalmend_lab.controlplane import free_port
from metalmend_lab.inventory import HostSpec
from tests.support import answers, started, until

NAMESPACE = "shared-endpoint"
REDFISH_CHANGE = 15.0  # sushy-tools' fake driver lands changes in 1-11 s


@pytest.fixture(scope="module")
def chassis_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    """Two Redfish hosts: two systems in one sushy-tools emulator."""
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("chassis"),
        hosts=2,
        bmc="redfish",
        boot_delay=1.0,
        controllers="",
    )
    with lab.started(options) as running:
        yield running


def systems(running: lab.RunningLab) -> list[HostSpec]:
    assert running.hardware is not None
    return [h for h in running.hardware.hosts if h.bmc == "redfish"]


def endpoint(spec: HostSpec) -> str:
    """The emulator itself, shared by every system: no per-host proxy in between."""
    return f"redfish+https://127.0.0.1:{spec.internal_port}"


@pytest.fixture(scope="module")
def shared_hosts(chassis_lab: lab.RunningLab) -> dict[str, str]:
    """Four hosts on the one endpoint: one per real system, one naming a system the BMC
    does not serve, one naming none (the BMC serves two). Returns name -> address."""
    a, b = systems(chassis_lab)
    base = endpoint(a)
    addresses = {
        "host-a": f"{base}/redfish/v1/Systems/{a.system_id}",
        "host-b": f"{base}/redfish/v1/Systems/{b.system_id}",
        "host-ghost": f"{base}/redfish/v1/Systems/no-such-system",
        "host-unnamed": base,
    }
    kube = chassis_lab.client()
    kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    kube.create(
        Secret(
            metadata=ObjectMeta(
                name="chassis-bmc",
                labels={SECRET_LABEL: SECRET_LABEL_VALUE},
                # (by name: a '*' Secret goes only inside allowed BMC networks)
                annotations={HOSTS_ANNOTATION: ",".join(addresses)},
            ),
            stringData={"username": a.username, "password": a.password},
        ),
        namespace=NAMESPACE,
    )
    for name, address in addresses.items():
        kube.create(
            BareMetalHost(
                metadata=ObjectMeta(name=name),
                spec={
                    "online": True,
                    "externallyProvisioned": True,
                    "bmc": {"address": address, "credentialsName": "chassis-bmc"},
                },
            ),
            namespace=NAMESPACE,
        )
    return addresses


@pytest.fixture(scope="module")
def host_power(chassis_lab: lab.RunningLab, shared_hosts: dict[str, str]) -> Iterator[None]:
    """`metalmend run --controllers host-power --namespace shared-endpoint`."""
    port = free_port()
    argv = lab.controller_argv(
        chassis_lab.kubeconfig, chassis_lab.plane.ca.pair.cert, "host-power", port, 3.0
    )
    argv += ["--namespace", NAMESPACE]
    log = Path(chassis_lab.plane.workdir.parent) / "metalmend-shared-endpoint.log"
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    started(
        answers(f"http://127.0.0.1:{port}/readyz"),
        f"metalmend run --controllers host-power to answer 200 on"
        f" http://127.0.0.1:{port}/readyz (log: {log})",
        process,
    )
    yield
    process.terminate()
    process.wait(timeout=15)


@pytest.fixture
async def kube(chassis_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(chassis_lab.kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def bmcs(chassis_lab: lab.RunningLab) -> AsyncIterator[BmcPool]:
    pool = BmcPool(BmcSettings(timeout=10, ca_bundle=str(chassis_lab.plane.ca.pair.cert)))
    yield pool
    await pool.close()


def truth(spec: HostSpec) -> BmcTarget:
    """Each system read through its own per-host line: ground truth, not via our hosts."""
    return BmcTarget(parse(spec.address), Credentials(spec.username, spec.password))


async def status(kube: AsyncClient, name: str) -> dict[str, Any]:
    host = await kube.get(BareMetalHost, name, namespace=NAMESPACE)
    return dict(host.get("status") or {})


async def test_hosts_on_one_endpoint_each_power_only_their_own_system(
    chassis_lab: lab.RunningLab, host_power: None, kube: AsyncClient, bmcs: BmcPool
) -> None:
    a, b = systems(chassis_lab)

    async def both_on() -> bool:
        on = [(await status(kube, n)).get("poweredOn") for n in ("host-a", "host-b")]
        return on == [True, True]

    await until(both_on, within=REDFISH_CHANGE * 2)

    # Fence host-a as remediation does: a keyed hard power-off request.
    key = "reboot.metal3.io/fence-test"
    await kube.patch(
        BareMetalHost, "host-a", {"metadata": {"annotations": {key: '{"mode":"hard"}'}}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip

    async def a_reported_off() -> bool:
        return (await status(kube, "host-a")).get("poweredOn") is False

    await until(a_reported_off, within=REDFISH_CHANGE * 2)
    assert await bmcs.power_state(truth(a)) == PowerState.OFF
    # Its neighbour on the same endpoint never went off, and reports its own power.
    assert await bmcs.power_state(truth(b)) == PowerState.ON
    assert (await status(kube, "host-b")).get("poweredOn") is True

    await kube.patch(
        BareMetalHost, "host-a", {"metadata": {"annotations": {key: None}}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip

    async def a_on_again() -> bool:
        return (await status(kube, "host-a")).get("poweredOn") is True

    await until(a_on_again, within=REDFISH_CHANGE * 2)
    assert await bmcs.power_state(truth(a)) == PowerState.ON
    assert await bmcs.power_state(truth(b)) == PowerState.ON


@pytest.mark.parametrize(
    ("name", "says"),
    [
        pytest.param("host-ghost", "no-such-system", id="a system the BMC does not serve"),
        pytest.param("host-unnamed", "serves 2 systems", id="no system named, two served"),
    ],
)
async def test_a_host_naming_no_served_system_is_an_error_and_powers_nothing(
    chassis_lab: lab.RunningLab,
    host_power: None,
    kube: AsyncClient,
    bmcs: BmcPool,
    name: str,
    says: str,
) -> None:
    async def in_error() -> bool:
        return (await status(kube, name)).get("operationalStatus") == "error"

    await until(in_error, within=REDFISH_CHANGE)
    found = await status(kube, name)
    assert says in found["errorMessage"]
    assert found["errorType"] == "registration error"
    assert "poweredOn" not in found  # never another system's power reported as its own
    # Asking it to power off reaches no system at all.
    await kube.patch(
        BareMetalHost, name, {"spec": {"online": False}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await asyncio.sleep(2)  # a few reconciles of the erroring host
    for spec in systems(chassis_lab):
        assert await bmcs.power_state(truth(spec)) == PowerState.ON
