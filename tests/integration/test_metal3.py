"""Beside metal3 (docs/install.md): upstream baremetal-operator's BareMetalHost CRD, made by
tools/metal3/crds.sh from its published Go module, installed in a real control plane
instead of ours. What the API server keeps of metalmend's status there, and ``metalmend
run`` refusing the controllers whose fields it would prune, naming them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.names import REBOOT_PREFIX
from metalmend.api.resources import CRD_DIR, BareMetalHost, Machine, Metal3Remediation
from metalmend.controllers import remediation
from metalmend.kube import served_schema
from metalmend.kube.crds import install_crds
from metalmend.kube.manager import Manager
from metalmend.lab.controlplane import ControlPlane, ControlPlaneConfig, free_port
from metalmend.policy.remediation import PowerOwner
from metalmend.settings import RemediationSettings, RuntimeSettings, Settings
from tests.support import until

REPO = Path(__file__).resolve().parents[2]
BMH_CRD = "metal3.io_baremetalhosts.yaml"
PRUNED_UPSTREAM = [
    "status.lastPowerCommand",
    "status.poweredOffFor",
    "status.provisioning.lastPoweredOn",
    "status.provisioning.pendingRebootSince",
]


@pytest.fixture(scope="module")
def upstream_crds() -> Path:
    made = subprocess.run(
        ["bash", str(REPO / "tools" / "metal3" / "crds.sh")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert made.returncode == 0, f"tools/metal3/crds.sh failed:\n{made.stderr}"
    return Path(made.stdout.strip().splitlines()[-1])


def crd_schema(path: Path) -> dict[str, Any]:
    (version,) = yaml.safe_load(path.read_text())["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_our_crd_keeps_every_field_and_upstreams_prunes_four(upstream_crds: Path) -> None:
    everything = sorted({f for fs in served_schema.NEEDED_BY.values() for f in fs})
    assert served_schema.pruned(crd_schema(CRD_DIR / BMH_CRD), everything) == []
    assert served_schema.pruned(crd_schema(upstream_crds / BMH_CRD), everything) == PRUNED_UPSTREAM


@pytest.fixture(scope="module")
def metal3_plane(
    tmp_path_factory: pytest.TempPathFactory, upstream_crds: Path
) -> Iterator[ControlPlane]:
    """Upstream's BareMetalHost CRD; ours for the other kinds (Machines, health checks,
    remediations), which upstream's BareMetalHost does not replace."""
    crds = tmp_path_factory.mktemp("crds")
    for path in CRD_DIR.glob("*.yaml"):
        if path.name != BMH_CRD:
            shutil.copy(path, crds)
    shutil.copy(upstream_crds / BMH_CRD, crds)
    plane = ControlPlane(ControlPlaneConfig(workdir=tmp_path_factory.mktemp("metal3-plane")))
    plane.start()
    try:
        install_crds(Client(KubeConfig.from_file(plane.kubeconfig)), crds)
        yield plane
    finally:
        plane.stop()


def test_upstream_schema_drops_what_host_power_writes(metal3_plane: ControlPlane) -> None:
    kube = Client(KubeConfig.from_file(metal3_plane.kubeconfig), field_manager="metalmend-tests")
    kube.create(Namespace(metadata=ObjectMeta(name="hosts")))
    host = {
        "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
        "metadata": {"name": "node-0", "namespace": "hosts"},
        "spec": {"online": True, "bootMACAddress": "52:54:00:00:00:01",
                 "bmc": {"address": "ipmi://192.0.2.1", "credentialsName": "node-0-bmc"}},
    }  # fmt: skip
    kube.create(BareMetalHost.from_dict(host))
    stamp = "2026-11-23T20:00:00Z"
    status = {
        "poweredOn": False,
        "lastPowerCommand": {"action": "hard off", "at": stamp},
        "poweredOffFor": ["reboot.metal3.io/remediation"],
        "provisioning": {"state": "provisioned", "ID": "", "lastPoweredOn": stamp,
                         "pendingRebootSince": stamp},
        # what upstream's status requires (baremetal-operator writes it at registration)
        "operationalStatus": "OK", "errorMessage": "", "errorCount": 0,
    }  # fmt: skip
    kube.patch(
        BareMetalHost.Status, "node-0", {"status": status}, namespace="hosts",
        patch_type=PatchType.MERGE,
    )  # fmt: skip
    kept = kube.get(BareMetalHost, "node-0", namespace="hosts")["status"]
    assert kept["poweredOn"] is False
    assert kept["provisioning"] == {"state": "provisioned", "ID": ""}
    assert "lastPowerCommand" not in kept
    assert "poweredOffFor" not in kept


async def test_served_schema_check_reads_what_the_api_server_serves(
    metal3_plane: ControlPlane, control_plane: ControlPlane
) -> None:
    """Through the OpenAPI v3 document, with any identity (no RBAC of its own)."""
    nobody = AsyncClient(KubeConfig.from_file(metal3_plane.user_kubeconfig("nobody")))
    ours = AsyncClient(KubeConfig.from_file(control_plane.user_kubeconfig("nobody")))
    try:
        upstream = await served_schema.served_bare_metal_host_schema(nobody)
        assert upstream is not None
        assert served_schema.pruned(upstream, served_schema.HOST_POWER_FIELDS) == PRUNED_UPSTREAM
        assert await served_schema.check(nobody, ["node-link", "machine-health-check"]) is None
        assert await served_schema.check(ours, ["host-power", "metal3-remediation"]) is None
    finally:
        await nobody.close()
        await ours.close()


def run(
    plane: ControlPlane, controllers: str, port: int, owner: str | None = None
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if owner is not None:
        env["METALMEND_REMEDIATION_POWER_OWNER"] = owner
    return subprocess.Popen(
        [sys.executable, "-m", "metalmend", "run", "--kubeconfig", str(plane.kubeconfig),
         "--controllers", controllers, "--health-bind", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("controllers", "fields"),
    [
        ("host-power", PRUNED_UPSTREAM),
        ("node-link,metal3-remediation", ["status.lastPowerCommand", "status.poweredOffFor"]),
        ("all", PRUNED_UPSTREAM),
    ],
)
def test_run_refuses_controllers_whose_fields_upstream_prunes(
    metal3_plane: ControlPlane, controllers: str, fields: list[str]
) -> None:
    """With metalmend set as the power owner on upstream's schema."""
    process = run(metal3_plane, controllers, free_port(), owner="metalmend")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]  # after the log line saying who we connected as
    assert line.startswith(
        f"metalmend: the served BareMetalHost schema (metal3.io/v1alpha1) has no {', '.join(fields)}:"
    )
    assert "docs/install.md, 'Beside metal3'" in line


def test_health_checks_run_beside_upstream_schema(metal3_plane: ControlPlane) -> None:
    port = free_port()
    process = run(metal3_plane, "node-link,machine-health-check", port)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "node-link and machine-health-check never got ready"
            time.sleep(0.2)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("controllers", "clash"),
    [("host-power", "host-power"), ("all", "host-power, machine-remediation")],
)
def test_run_beside_baremetal_operator_refuses_what_would_send_power(
    metal3_plane: ControlPlane, controllers: str, clash: str
) -> None:
    """Found upstream's schema (power owner auto): baremetal-operator owns power."""
    process = run(metal3_plane, controllers, free_port())
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"metalmend: baremetal-operator owns power here; {clash} would")
    assert "docs/install.md, 'Beside metal3'" in line


def test_run_picks_baremetal_operator_and_says_so(metal3_plane: ControlPlane) -> None:
    port = free_port()
    process = run(metal3_plane, "node-link,metal3-remediation", port)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "metal3-remediation beside BMO never got ready"
            time.sleep(0.2)
        exported = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'metalmend_power_owner{owner="baremetal-operator"} 1.0' in exported
        assert 'metalmend_power_owner{owner="metalmend"} 0.0' in exported
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert "Traceback" not in stderr
    said = [line for line in stderr.splitlines() if "power owner" in line]
    assert said, stderr
    assert "baremetal-operator" in said[0]


class ReadOnlyBmc:
    """The hosts' BMCs as metal3-remediation reads them (it never sends a command here)."""

    def __init__(self) -> None:
        self.off = False

    async def is_off(self, host: Any) -> bool:
        return self.off


async def test_fencing_beside_baremetal_operator(metal3_plane: ControlPlane) -> None:
    """Upstream's schema, metal3-remediation in baremetal-operator mode; the test plays
    baremetal-operator (it writes status.poweredOn as BMO does) and the BMC."""
    client = AsyncClient(
        KubeConfig.from_file(metal3_plane.kubeconfig), field_manager="metalmend-tests"
    )
    ns = "bmo-fence"
    await client.create(Namespace(metadata=ObjectMeta(name=ns)))
    bmc = ReadOnlyBmc()
    settings = Settings(
        runtime=RuntimeSettings(namespace=ns),
        remediation=RemediationSettings(
            power_owner=PowerOwner.BAREMETAL_OPERATOR, confirm_window=1.0, confirm_reads=2
        ),
    )
    manager = Manager(client)
    remediation.setup(manager, settings, reader=bmc)
    task = asyncio.create_task(manager.run())
    try:
        await manager.wait_synced()
        for name, disable in (("h1", False), ("h2", True)):
            await bmo_host(client, ns, name, disable_power_off=disable)
            await machine_and_node(client, ns, name)
        made = {}
        for name in ("h1", "h2"):
            made[name] = await client.create(
                Metal3Remediation(
                    metadata=ObjectMeta(
                        name=f"m-{name}",
                        ownerReferences=[
                            OwnerReference(
                                apiVersion="cluster.x-k8s.io/v1beta1",
                                kind="Machine",
                                name=f"m-{name}",
                                uid=(
                                    await client.get(Machine, f"m-{name}", namespace=ns)
                                ).metadata.uid,
                            )
                        ],
                    ),
                    spec={"powerOffTimeoutSeconds": 30, "powerOnTimeoutSeconds": 60},
                ),
                namespace=ns,
            )
        key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{made['h1'].metadata.uid}"

        async def annotations(host: str) -> dict[str, str]:
            found = await client.get(BareMetalHost, host, namespace=ns)
            return dict(found.metadata.annotations or {})

        async def status(name: str) -> dict[str, Any]:
            found = await client.get(Metal3Remediation, name, namespace=ns)
            return dict(found.get("status") or {})

        async def node_gone() -> bool:
            try:
                await client.get(Node, f"{ns}-m-h1")
            except ApiError:
                return True
            return False

        # the request: our keyed annotation only
        await until(lambda: _has_key(annotations("h1"), key))
        assert json.loads((await annotations("h1"))[key]) == {"mode": "hard"}
        # BMO reports off, but our own read says on: no fence
        await bmo_power(client, ns, "h1", on=False)
        await until(lambda: _says(status("m-h1"), "read on from its BMC"))
        assert not await node_gone()
        # both agree: confirmed over the window, then the Node goes and the key with it
        bmc.off = True
        await bmo_power(client, ns, "h1", on=True)
        await bmo_power(client, ns, "h1", on=False)
        await until(node_gone)
        await until(lambda: _lacks_key(annotations("h1"), key))
        assert (await status("m-h1"))["offReads"] >= 2

        # disablePowerOff: refused, said, and never asked for
        await until(lambda: _says(status("m-h2"), "spec.disablePowerOff"))
        assert (await status("m-h2"))["phase"] == "failed"
        assert not [k for k in await annotations("h2") if k.startswith(REBOOT_PREFIX)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for name in ("h1", "h2"):
            with contextlib.suppress(ApiError):
                await client.delete(Node, f"{ns}-m-{name}")
        await client.delete(Namespace, ns)
        await client.close()


async def bmo_host(client: AsyncClient, ns: str, name: str, disable_power_off: bool) -> None:
    host = {
        "apiVersion": "metal3.io/v1alpha1",
        "kind": "BareMetalHost",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "online": True,
            "bootMACAddress": "52:54:00:00:00:02",
            "disablePowerOff": disable_power_off,
            "bmc": {
                "address": "redfish://192.0.2.1/redfish/v1/Systems/1",
                "credentialsName": f"{name}-bmc",
            },
        },
    }
    await client.create(BareMetalHost.from_dict(host))
    await bmo_power(client, ns, name, on=True)


async def bmo_power(client: AsyncClient, ns: str, name: str, on: bool) -> None:
    """status.poweredOn as baremetal-operator writes it (no per-request field, no time)."""
    status = {
        "poweredOn": on,
        "operationalStatus": "OK",
        "errorMessage": "",
        "errorCount": 0,
        "provisioning": {"state": "provisioned", "ID": ""},
    }
    await client.patch(
        BareMetalHost.Status, name, {"status": status}, namespace=ns, patch_type=PatchType.MERGE
    )


async def machine_and_node(client: AsyncClient, ns: str, host: str) -> None:
    machine = f"m-{host}"
    provider = f"metal3://{ns}/{host}/{machine}"
    made = await client.create(
        Machine(
            metadata=ObjectMeta(name=machine, annotations={names.MACHINE_HOST: f"{ns}/{host}"}),
            spec={"clusterName": "c", "providerID": provider},
        ),
        namespace=ns,
    )
    node = await client.create(
        Node(metadata=ObjectMeta(name=f"{ns}-{machine}"), spec=NodeSpec(providerID=provider))
    )
    await client.patch(
        Machine.Status,
        machine,
        {
            "status": {
                "nodeRef": {"kind": "Node", "name": node.metadata.name, "uid": node.metadata.uid}
            }
        },
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    assert made.metadata is not None


async def _has_key(found: Any, key: str) -> bool:
    return key in await found


async def _lacks_key(found: Any, key: str) -> bool:
    return key not in await found


async def _says(found: Any, text: str) -> bool:
    return text in str((await found).get("message") or "")
