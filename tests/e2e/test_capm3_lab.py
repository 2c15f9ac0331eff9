"""Cluster API's own MachineHealthCheck driving metalmend's fence-first remediation of
Machines linked to their hosts as Cluster API Provider Metal3 (CAPM3) links them, in the lab
(`metalmend lab up --machine-api capi-metal3`): the real Cluster API core manager (``make
capi``); per host a Metal3Machine (upstream's CRD, cluster-api-provider-metal3 ``2f6d76b``)
carrying ``metal3.io/BareMetalHost``, the host's consumerRef naming it, the providerID
``metal3://<ns>/<host>/<metal3machine>`` on it, on the Machine (copied by Cluster API) and on
the Node; the Machine carries no host annotation. CAPM3's own controller does not run (the
Go module proxy refuses its module): the objects are made as it leaves them.

A host hung; Cluster API's check creates a FenceRemediation from metalmend's template;
`metalmend run` is killed -9 at each step; the server is off (sampled from the lab
hardware) before its Node is tainted; db-0 Running elsewhere; the check counting every
Machine healthy again and deleting the FenceRemediation. And 2 of 3 hung with
``triggerIf.unhealthyLessThanOrEqualTo: 1`` (v1beta2's maxUnhealthy): the check
short-circuits, metalmend changes no power.

The Metal3Machine CRD is read from the pinned upstream CRDs (``METALMEND_UPSTREAM_CRDS``,
by default the directory CI provides beside the checkout, as
tests/integration/test_capm3_links.py reads it): the tests fail naming it when missing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, FenceRemediation, FenceRemediationTemplate
from metalmend_lab import assets, capi, lab
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import Metalmend
from tests.e2e.fencing import power_of, repair, wait
from tests.e2e.machineapi import Sampler, remediate, wait_unhealthy_for

GRACE = 6.0
CONTROLLERS = lab.default_controllers("capi-metal3", "metalmend")
TAINT_SETTINGS = {
    "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_CONFIRM_READS": "3",
    "METALMEND_REMEDIATION_EVACUATION_POLL": "1",
}
TEMPLATE_API = "remediation.metalmend.dev/v1alpha1"
REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE = "worker-0"  # the Cluster's stand-alone control-plane Machine (lab.hosts)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[lab.RunningLab]:
    base = os.environ.get(lab.UPSTREAM_CRDS_ENV) or str(REPO.parent / "shared" / "upstream")
    if not (Path(base) / "metal3" / capi.METAL3MACHINE_CRD).is_file():
        pytest.fail(
            f"upstream CAPM3 Metal3Machine CRD not found under {base}/metal3: set"
            f" {lab.UPSTREAM_CRDS_ENV} to the directory of the pinned upstream CRDs"
        )
    monkeypatch_module.setenv(lab.UPSTREAM_CRDS_ENV, base)
    try:
        manager = assets.capi_manager()
    except assets.AssetsError as error:
        pytest.fail(str(error))
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("capm3-lab"),
        node_monitor_grace_period=GRACE,
        hosts=3,
        bmc="mixed",
        boot_delay=1.0,
        redfish_power_delay=1.0,
        controllers="",  # the tests run metalmend themselves, to kill it
        serve=False,
        cluster_api=manager,
        machine_api="capi-metal3",
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
        yield running


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture
def metalmend(fleet: lab.RunningLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Metalmend]:
    for name, value in TAINT_SETTINGS.items():
        monkeypatch.setenv(name, value)
    process = Metalmend(fleet, CONTROLLERS, 3.0)
    yield process
    process.stop()


def unhealthy(fleet: lab.RunningLab) -> str:
    client = fleet.client()
    found = [f"{h.name}: power {h.power}, Ready {h.ready}"
             for h in lab.status(fleet.plane.workdir.parent).hosts
             if h.power != "on" or h.ready != "True"]  # fmt: skip
    found += [f"FenceRemediation {r.metadata.name}"
              for r in client.list(FenceRemediation, namespace=NAMESPACE)]  # fmt: skip
    for node in client.list(Node):
        if any(t.key == names.OUT_OF_SERVICE_TAINT for t in node.spec.taints or []):
            found.append(f"Node {node.metadata.name} tainted out-of-service")
    for bmh in client.list(BareMetalHost, namespace=NAMESPACE):
        keys = [k for k in bmh.metadata.annotations or {} if k.startswith("reboot.metal3.io/")]
        if keys:
            found.append(f"BareMetalHost {bmh.metadata.name}: keys {keys}")
    return "; ".join(found)


def machines(fleet: lab.RunningLab) -> dict[str, Any]:
    found = fleet.client().list(capi.MachineV1Beta2, namespace=NAMESPACE)
    return {m.metadata.name: m for m in found}


@pytest.fixture(autouse=True)
def one_check(fleet: lab.RunningLab) -> Iterator[None]:
    """Each test makes its own MachineHealthCheck 'workers'; after it, the check is deleted
    and a fleet left unhealthy by a failure is repaired for the next test."""
    client = fleet.client()

    def linked() -> dict[str, Any]:
        return {n: ((m.get("status") or {}).get("nodeRef") or {}).get("name")
                for n, m in machines(fleet).items()}  # fmt: skip

    wait(lambda: all(k == v for k, v in linked().items()) and len(linked()) == 3, 180,
         "Cluster API's Machine controller to set every Machine's nodeRef (by the"
         " Metal3Machine's providerID)", tolerate=(ApiError,), state=linked)  # fmt: skip

    def cluster_ready() -> bool:
        cluster = client.get(capi.Cluster, capi.CLUSTER, namespace=NAMESPACE)
        found = {c["type"]: c["status"]
                 for c in (cluster.get("status") or {}).get("conditions") or []}  # fmt: skip
        return found.get("InfrastructureReady") == "True" and (
            found.get("ControlPlaneInitialized") == "True"
        )

    wait(cluster_ready, 180, "the Cluster's InfrastructureReady and ControlPlaneInitialized",
         tolerate=(ApiError,))  # fmt: skip
    yield
    with contextlib.suppress(ApiError):
        client.delete(capi.MachineHealthCheckV1Beta2, "workers", namespace=NAMESPACE)
    repair(fleet, CONTROLLERS, lambda: unhealthy(fleet))


def unhealthy_conditions(timeout: int) -> list[dict[str, Any]]:
    return [{"type": "Ready", "status": "Unknown", "timeoutSeconds": timeout},
            {"type": "Ready", "status": "False", "timeoutSeconds": timeout}]  # fmt: skip


def health_check(
    fleet: lab.RunningLab, trigger_if: dict[str, Any] | None = None, timeout: int = 2
) -> None:
    remediation: dict[str, Any] = {
        "templateRef": {"apiVersion": TEMPLATE_API, "kind": "FenceRemediationTemplate",
                        "name": "fence"},
    }  # fmt: skip
    if trigger_if is not None:
        remediation["triggerIf"] = trigger_if
    fleet.client().create(
        capi.MachineHealthCheckV1Beta2.from_dict({
            "apiVersion": capi.API, "kind": "MachineHealthCheck",
            "metadata": {"name": "workers", "namespace": NAMESPACE,
                         "labels": {capi.CLUSTER_NAME_LABEL: capi.CLUSTER}},
            "spec": {
                "clusterName": capi.CLUSTER,
                "selector": {"matchLabels": {"role": "worker"}},
                "checks": {"unhealthyNodeConditions": unhealthy_conditions(timeout)},
                "remediation": remediation,
            },
        })
    )  # fmt: skip
    wait(lambda: counts(fleet) == (3, 3), 180, "Cluster API's check to count 3 of 3 healthy",
         tolerate=(ApiError,), state=lambda: check_status(fleet))  # fmt: skip


def check_status(fleet: lab.RunningLab) -> dict[str, Any]:
    found = fleet.client().get(capi.MachineHealthCheckV1Beta2, "workers", namespace=NAMESPACE)
    return dict(found.get("status") or {})


def counts(fleet: lab.RunningLab) -> tuple[Any, Any]:
    status = check_status(fleet)
    return status.get("expectedMachines"), status.get("currentHealthy")


def fence_remediations(fleet: lab.RunningLab) -> list[str]:
    return [
        str(r.metadata.name) for r in fleet.client().list(FenceRemediation, namespace=NAMESPACE)
    ]


@pytest.fixture
def workers_only(fleet: lab.RunningLab) -> Iterator[None]:
    """db-0 is kept off the Cluster's one control-plane Machine (cordoned while the test
    runs): remediating the only control plane is not what this test is about."""
    client = fleet.client()
    client.patch(Node, CONTROL_PLANE, {"spec": {"unschedulable": True}})
    yield
    with contextlib.suppress(ApiError):
        client.patch(Node, CONTROL_PLANE, {"spec": {"unschedulable": None}})


@pytest.mark.long
@pytest.mark.timeout(900)  # a loaded machine: the test's own deadlines speak first
def test_capi_check_remediates_a_capm3_machine_through_fence_remediation(
    fleet: lab.RunningLab, metalmend: Metalmend, workers_only: None
) -> None:
    metalmend.start()
    health_check(fleet)
    made: list[dict[str, Any]] = []
    infra = {n: m["spec"]["infrastructureRef"] for n, m in machines(fleet).items()}
    assert all(ref["kind"] == "Metal3Machine" for ref in infra.values()), infra
    assert not any(
        "metal3.io/BareMetalHost" in (m.metadata.annotations or {})
        for m in machines(fleet).values()
    ), "the host is named on the Metal3Machine only, as CAPM3 does"

    def requested() -> bool:
        found = fleet.client().list(FenceRemediation, namespace=NAMESPACE)
        made.extend(r.to_dict() for r in found if not made)
        return bool(made)

    def healthy_again() -> bool:  # and Cluster API deleted the FenceRemediation
        return counts(fleet) == (3, 3) and not fence_remediations(fleet)

    at = remediate(fleet, metalmend, requested, healthy_again, lambda: check_status(fleet)).at
    meta = made[0]["metadata"]
    owners = [(o["kind"], o["name"]) for o in meta.get("ownerReferences") or []]
    assert owners == [("Machine", meta["name"])], f"made by Cluster API's check: {meta}"
    assert at["fenced"] <= at["on"], at
    node = fleet.client().get(Node, meta["name"])
    assert node.spec.providerID == f"metal3://{NAMESPACE}/{meta['name']}/{meta['name']}"
    assert not any(t.key == names.OUT_OF_SERVICE_TAINT for t in node.spec.taints or [])


@pytest.mark.timeout(600)
def test_capi_check_short_circuits_with_two_of_three_hung(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    """Both Nodes must be unhealthy before the check's timeout runs out on either (else the
    first to time out would be 1 unhealthy of 3, within the limit, and rightly remediated):
    the check starts with a timeout of an hour, shortened to 2 s once both Nodes have been
    Unknown (or NotReady) for longer than that; its status then says 2 unhealthy (Cluster
    API counts only the timed-out ones there) at the generation of that change."""
    metalmend.start()
    health_check(fleet, {"unhealthyLessThanOrEqualTo": 1}, timeout=3600)
    assert fleet.hardware is not None
    hung = [h.name for h in fleet.hardware.hosts[1:]]
    workdir = fleet.plane.workdir.parent
    sampler = Sampler(fleet, hung[0], lambda: False).start()
    try:
        for name in hung:
            lab.inject_fault(workdir, name, "hang")
        wait_unhealthy_for(fleet, hung, 3.0)
        changed = fleet.client().patch(
            capi.MachineHealthCheckV1Beta2, "workers",
            {"spec": {"checks": {"unhealthyNodeConditions": unhealthy_conditions(2)}}},
            namespace=NAMESPACE, patch_type=PatchType.MERGE,
        )  # fmt: skip

        def short_circuited() -> bool:
            status = check_status(fleet)
            found = {c.get("type"): c for c in status.get("conditions") or []}
            message = found.get("RemediationAllowed", {}).get("message", "")
            return (
                status.get("observedGeneration", 0) >= changed.metadata.generation
                and status.get("currentHealthy") == 1
                and status.get("remediationsAllowed") == 0
                and "unhealthy: 2," in message
            )

        wait(short_circuited, 180, "Cluster API's check, its timeouts shortened, to count 2"
             " unhealthy of 3 and allow no remediation", tolerate=(ApiError,),
             state=lambda: check_status(fleet))  # fmt: skip
        assert fence_remediations(fleet) == [], "Cluster API's check made no request"
        # The check ends before the hosts recover: one at a time, the first recovered would
        # leave 1 unhealthy, within maxUnhealthy, and the check would then ask (rightly)
        fleet.client().delete(capi.MachineHealthCheckV1Beta2, "workers", namespace=NAMESPACE)
        for name in hung:
            lab.inject_fault(workdir, name, "recover")
        wait(lambda: not unhealthy(fleet), 180, "the hung hosts back, on and Ready",
             tolerate=(ApiError,), state=lambda: unhealthy(fleet))  # fmt: skip
    finally:
        sampler.stop()
    offs = sorted(p for p in sampler.powers if not p.endswith(":on"))
    assert offs == [], f"metalmend changed power while the check short-circuited: {offs}"
    assert fence_remediations(fleet) == []
    assert all(power_of(workdir, h.name) == "on" for h in fleet.hardware.hosts)
