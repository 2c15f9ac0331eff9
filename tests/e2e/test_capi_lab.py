"""Cluster API's own MachineHealthCheck controller remediating through metalmend's
FenceRemediationTemplate, in the lab: the real Cluster API core manager (built from the Go
module sigs.k8s.io/cluster-api by tools/capi/build.sh, with the module's CRDs; lab.capi),
its Machine controller setting each Machine's nodeRef from the infrastructure object's
providerID, its MachineHealthCheck creating the FenceRemediation; metalmend (`metalmend run
--controllers host-power,fence-remediation`, fencing by the out-of-service taint) powering
the real lab BMC off, fencing, powering it on; killed -9 once the server is off.

Watched from outside: every version of the FenceRemediation as its watch delivers them,
and every 0.1 s the simulated server's own power (lab.status, not anything metalmend
reports) and the Node's taint."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node

from metalmend.api import names
from metalmend.api.resources import FenceRemediation, FenceRemediationTemplate
from metalmend_lab import assets, capi, lab
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import Metalmend

GRACE = 6.0
CONTROLLERS = "host-power,fence-remediation"
TAINT_SETTINGS = {
    "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_CONFIRM_READS": "3",
    "METALMEND_REMEDIATION_EVACUATION_POLL": "1",
}
TEMPLATE_API = "remediation.metalmend.dev/v1alpha1"


def wait(check: Callable[[], bool], within: float, what: str, show: Callable[[], Any]) -> None:
    """Until ``check()``; on failure the message says what was awaited and what ``show()``
    last saw."""
    began = time.monotonic()
    deadline = began + within
    print(f"awaiting (up to {within:.0f}s): {what}", flush=True)
    while time.monotonic() < deadline:
        try:
            if check():
                print(f"  done in {time.monotonic() - began:.1f}s: {what}", flush=True)
                return
        except ApiError:
            pass  # an API server or conversion webhook still starting: not yet
        time.sleep(0.2)
    raise AssertionError(f"not within {within:.0f}s: {what}; last seen: {show()}")


def condition(obj: Any, kind: str) -> dict[str, Any]:
    found = ((obj.get("status") if isinstance(obj, dict) else obj.status) or {}).get(
        "conditions"
    ) or []
    return next((c for c in found if c.get("type") == kind), {})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    try:
        manager = assets.capi_manager()
    except assets.AssetsError as error:
        pytest.fail(str(error))
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("capi-lab"),
        node_monitor_grace_period=GRACE,
        hosts=2,
        bmc="mixed",
        boot_delay=1.0,
        controllers="",
        serve=False,
        cluster_api=manager,
    )
    with lab.started(options) as running:
        client = running.client()
        template = {"strategy": "reboot", "powerOffTimeoutSeconds": 60,
                    "powerOnTimeoutSeconds": 120}  # fmt: skip
        client.create(
            FenceRemediationTemplate.from_dict({
                "apiVersion": TEMPLATE_API, "kind": "FenceRemediationTemplate",
                "metadata": {"name": "fence", "namespace": NAMESPACE},
                "spec": {"template": {"spec": template}},
            })
        )  # fmt: skip
        client.create(
            capi.MachineHealthCheckV1Beta2.from_dict({
                "apiVersion": capi.API, "kind": "MachineHealthCheck",
                "metadata": {"name": "workers", "namespace": NAMESPACE,
                             "labels": {capi.CLUSTER_NAME_LABEL: capi.CLUSTER}},
                "spec": {
                    "clusterName": capi.CLUSTER,
                    "selector": {"matchLabels": {"role": "worker"}},
                    "checks": {"unhealthyNodeConditions": [
                        {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
                        {"type": "Ready", "status": "False", "timeoutSeconds": 2},
                    ]},
                    "remediation": {"templateRef": {
                        "apiVersion": TEMPLATE_API, "kind": "FenceRemediationTemplate",
                        "name": "fence",
                    }},
                },
            })
        )  # fmt: skip
        yield running


@pytest.fixture
def metalmend(fleet: lab.RunningLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Metalmend]:
    for name, value in TAINT_SETTINGS.items():
        monkeypatch.setenv(name, value)
    process = Metalmend(fleet, CONTROLLERS, 3.0)
    process.start()
    yield process
    process.stop()


def tainted(node: Any) -> bool:
    return any(t.key == names.OUT_OF_SERVICE_TAINT for t in (node.spec.taints or []))


@dataclass
class Versions:
    """Every version of the FenceRemediation ``name`` as its watch delivers them."""

    fleet: lab.RunningLab
    name: str
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (event, object)

    def start(self) -> Versions:
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def _watch(self) -> None:
        client = self.fleet.client()
        try:
            for event, obj in client.watch(
                FenceRemediation, namespace=NAMESPACE, fields={"metadata.name": self.name}
            ):
                self.seen.append((event, obj.to_dict()))
        except Exception:  # the lab went away at the end of the test
            return

    def first(self, check: Callable[[str, dict[str, Any]], bool]) -> int | None:
        return next((i for i, (e, o) in enumerate(list(self.seen)) if check(e, o)), None)

    def summary(self) -> list[tuple[str, str, str]]:
        return [
            (e, str((o.get("status") or {}).get("phase")),
             str(condition(o, "Succeeded").get("status")))
            for e, o in list(self.seen)
        ]  # fmt: skip


@pytest.mark.timeout(900)  # a loaded machine: the test's own deadlines speak first
def test_capi_machine_health_check_remediates_through_fence_remediation(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    client = fleet.client()
    workdir = fleet.plane.workdir.parent
    assert fleet.hardware is not None
    hosts = [h.name for h in fleet.hardware.hosts]

    def machines() -> dict[str, Any]:
        return {m.metadata.name: m for m in client.list(capi.MachineV1Beta2, namespace=NAMESPACE)}

    def node_refs() -> dict[str, Any]:
        return {n: ((m.get("status") or {}).get("nodeRef") or {}).get("name")
                for n, m in machines().items()}  # fmt: skip

    wait(lambda: node_refs() == {h: h for h in hosts}, 180,
         "Cluster API's Machine controller to set every Machine's status.nodeRef", node_refs)  # fmt: skip

    def cluster_conditions() -> dict[str, str]:
        cluster = client.get(capi.Cluster, capi.CLUSTER, namespace=NAMESPACE)
        found = (cluster.get("status") or {}).get("conditions") or []
        return {c["type"]: c["status"] for c in found}

    # Else the MachineHealthCheck judges no Machine (lab.capi, "A Cluster").
    wanted = {"InfrastructureReady": "True", "ControlPlaneInitialized": "True"}
    wait(lambda: wanted.items() <= cluster_conditions().items(), 180,
         f"the Cluster's conditions {wanted}", cluster_conditions)  # fmt: skip

    def check_status() -> dict[str, Any]:
        return dict(client.get(
            capi.MachineHealthCheckV1Beta2, "workers", namespace=NAMESPACE
        ).get("status") or {})  # fmt: skip

    def all_healthy() -> bool:
        status = check_status()
        counts = (status.get("expectedMachines"), status.get("currentHealthy"))
        return counts == (len(hosts), len(hosts))

    wait(all_healthy, 180, "the MachineHealthCheck to count every Machine healthy", check_status)

    victim = fleet.hardware.hosts[1].name  # the first is the control-plane Machine
    victim_uid = machines()[victim].metadata.uid
    versions = Versions(fleet, victim).start()
    at: dict[str, float] = {}
    power_log: list[tuple[float, str, bool]] = []
    began = time.monotonic()
    lab.inject_fault(workdir, victim, "hang")
    print(f"hung {victim}; awaiting (up to 300s) the FenceRemediation, the fence, Cluster API"
          " deleting it", flush=True)  # fmt: skip
    killed = False

    def look() -> None:
        now = time.monotonic() - began
        try:
            node = client.get(Node, victim)
        except ApiError:
            node = None
        power = next(h.power for h in lab.status(workdir).hosts if h.name == victim)
        is_tainted = node is not None and tainted(node)
        power_log.append((round(now, 1), power, is_tainted))
        if versions.first(lambda e, o: e == "ADDED") is not None:
            at.setdefault("created", now)
        if power == "off":
            at.setdefault("off", now)
        if is_tainted:
            at.setdefault("tainted", now)
            assert "off" in at, (
                f"{victim} tainted before its server was seen off: {power_log[-20:]}"
            )
        if "off" in at and power == "on":
            at.setdefault("on_again", now)
        if "tainted" in at and not is_tainted:
            at.setdefault("untainted", now)
        if "created" in at and versions.first(lambda e, o: e == "DELETED") is not None:
            at.setdefault("gone", now)

    deadline = began + 300
    while time.monotonic() < deadline:
        look()
        if "off" in at and not killed:  # mid-remediation: the server is held off
            metalmend.kill()
            metalmend.start()
            killed = True
            print(f"  metalmend run killed -9 and restarted at {at['off']:.1f}s", flush=True)
        if {"gone", "untainted", "on_again"} <= at.keys():
            break
        time.sleep(0.1)
    else:
        raise AssertionError(
            f"not within 300s: the remediation done and deleted by Cluster API; at {at};"
            f" versions {versions.summary()}; power {power_log[-10:]}"
        )
    print("Cluster API timeline (s after the hang):", {k: round(v, 1) for k, v in at.items()})

    created = versions.seen[versions.first(lambda e, o: e == "ADDED") or 0][1]
    meta = created["metadata"]
    assert [(o["kind"], o["name"], o["uid"]) for o in meta.get("ownerReferences") or []] == [
        ("Machine", victim, victim_uid)
    ], f"created by Cluster API's MachineHealthCheck, owned by the Machine: {meta}"
    assert (meta.get("labels") or {}).get(capi.CLUSTER_NAME_LABEL) == capi.CLUSTER
    assert created["spec"]["strategy"] == "reboot", "copied from the template"
    assert at["created"] <= at["off"] <= at["tainted"] <= at["on_again"], at
    succeeded = versions.first(lambda e, o: condition(o, "Succeeded").get("status") == "True")
    deleted = versions.first(lambda e, o: e == "DELETED")
    assert succeeded is not None, f"Succeeded=True never reported: {versions.summary()}"
    assert deleted is not None, f"never deleted by Cluster API: {versions.summary()}"
    assert succeeded < deleted, versions.summary()

    def machine_healthy() -> bool:
        machine = machines()[victim]
        return condition(machine, "HealthCheckSucceeded").get("status") == "True"

    wait(machine_healthy, 180, f"Cluster API to find Machine {victim} healthy again",
         lambda: (machines()[victim].get("status") or {}).get("conditions"))  # fmt: skip
    wait(all_healthy, 180, "the MachineHealthCheck to count every Machine healthy again",
         check_status)  # fmt: skip
    assert node_refs()[victim] == victim, "the same Node: fenced by taint, not deleted"
