"""Beside metal3 (docs/install.md): upstream baremetal-operator's BareMetalHost CRD, made by
tools/metal3/crds.sh from its published Go module, installed in a real control plane
instead of ours. What the API server keeps of metalmend's status there, and ``metalmend
run`` refusing the controllers whose fields it would prune, naming them."""

from __future__ import annotations

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
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from metalmend.api.resources import CRD_DIR, BareMetalHost
from metalmend.kube import served_schema
from metalmend.kube.crds import install_crds
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig, free_port

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


def run(plane: ControlPlane, controllers: str, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "metalmend", "run", "--kubeconfig", str(plane.kubeconfig),
         "--controllers", controllers, "--health-bind", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE, text=True,
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
    process = run(metal3_plane, controllers, free_port())
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
