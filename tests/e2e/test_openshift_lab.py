"""OpenShift's own MachineHealthCheck driving metalmend's fence-first remediation in the lab
(`metalmend lab up --machine-api openshift`): the real machine-healthcheck and
nodelink-controller of github.com/openshift/machine-api-operator (``make openshift``) with
the module's CRDs; per host a ``machine.openshift.io/v1beta1`` Machine as OpenShift's metal3
provider makes it (``metal3.io/BareMetalHost``, providerID ``baremetalhost:///<ns>/<host>/<uid>``
on the Machine and the Node), owned by a MachineSet; real BMCs, kubelets, scheduler.

Both remediation paths of OpenShift's check: ``spec.remediationTemplate`` naming a
FenceRemediationTemplate (metalmend's fence-remediation, fencing by the out-of-service taint)
and the check annotation ``machine.openshift.io/remediation-strategy: external-baremetal``
(``host.metal3.io/external-remediation`` on the Machine: metalmend's machine-remediation,
which deletes the Node). Each: a host hung, `metalmend run` killed -9 at each step, the
server off (sampled from the lab hardware) before its Node is tainted or deleted, db-0
Running elsewhere, OpenShift's check counting every Machine healthy again. And with
``maxUnhealthy: 1`` and 2 of 3 hung: OpenShift's check short-circuits, and metalmend does
nothing (no power change on any host)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import (
    BareMetalHost,
    FenceRemediation,
    FenceRemediationTemplate,
    OpenShiftMachine,
)
from metalmend_lab import assets, lab, openshift
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import Metalmend
from tests.e2e.fencing import power_of, repair, wait
from tests.e2e.machineapi import Sampler, remediate, wait_unhealthy_for

GRACE = 6.0
CONTROLLERS = lab.default_controllers("openshift", "metalmend")  # all but node-link
TAINT_SETTINGS = {
    "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_CONFIRM_READS": "3",
    "METALMEND_REMEDIATION_EVACUATION_POLL": "1",
}
TEMPLATE_API = "remediation.metalmend.dev/v1alpha1"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    try:
        found = assets.openshift_assets()
    except assets.AssetsError as error:
        pytest.fail(str(error))
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("openshift-lab"),
        node_monitor_grace_period=GRACE,
        hosts=3,
        bmc="mixed",
        boot_delay=1.0,
        redfish_power_delay=1.0,
        controllers="",  # the tests run metalmend themselves, to kill it
        serve=False,
        machine_api="openshift",
        openshift=found,
    )
    with lab.started(options) as running:
        running.client().create(
            FenceRemediationTemplate(
                metadata=ObjectMeta(name="fence", namespace=NAMESPACE),
                spec={"template": {"spec": {"strategy": "reboot", "powerOffTimeoutSeconds": 60,
                                            "powerOnTimeoutSeconds": 120}}},
            )
        )  # fmt: skip
        yield running


@pytest.fixture
def metalmend(fleet: lab.RunningLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Metalmend]:
    for name, value in TAINT_SETTINGS.items():
        monkeypatch.setenv(name, value)
    process = Metalmend(fleet, CONTROLLERS, 3.0)
    yield process
    process.stop()


def unhealthy(fleet: lab.RunningLab) -> str:
    """What keeps the fleet from being as the lab started it: a host off or not Ready, a
    request or a reboot key left behind ("" when nothing does)."""
    client = fleet.client()
    found = [f"{h.name}: power {h.power}, Ready {h.ready}"
             for h in lab.status(fleet.plane.workdir.parent).hosts
             if h.power != "on" or h.ready != "True"]  # fmt: skip
    for machine in client.list(OpenShiftMachine, namespace=NAMESPACE):
        if names.EXTERNAL_REMEDIATION in (machine.metadata.annotations or {}):
            found.append(f"Machine {machine.metadata.name} asks for remediation")
    found += [f"FenceRemediation {r.metadata.name}"
              for r in client.list(FenceRemediation, namespace=NAMESPACE)]  # fmt: skip
    for bmh in client.list(BareMetalHost, namespace=NAMESPACE):
        keys = [k for k in bmh.metadata.annotations or {} if k.startswith("reboot.metal3.io/")]
        if keys:
            found.append(f"BareMetalHost {bmh.metadata.name}: keys {keys}")
    return "; ".join(found)


@pytest.fixture(autouse=True)
def one_check(fleet: lab.RunningLab) -> Iterator[None]:
    """Each test makes its own MachineHealthCheck 'workers'; after it, the check is deleted
    and a fleet left unhealthy by a failure is repaired for the next test."""
    client = fleet.client()

    def counted_healthy() -> bool:  # nodelink-controller linked every Machine
        return all(
            ((m.get("status") or {}).get("nodeRef") or {}).get("name") == m.metadata.name
            for m in client.list(OpenShiftMachine, namespace=NAMESPACE)
        )

    wait(counted_healthy, 120, "OpenShift's nodelink-controller to set every Machine's nodeRef",
         tolerate=(ApiError,))  # fmt: skip
    yield
    with contextlib.suppress(ApiError):
        client.delete(openshift.MachineHealthCheck, "workers", namespace=NAMESPACE)
    repair(fleet, CONTROLLERS, lambda: unhealthy(fleet))


def unhealthy_conditions(timeout: str) -> list[dict[str, str]]:
    return [{"type": "Ready", "status": "Unknown", "timeout": timeout},
            {"type": "Ready", "status": "False", "timeout": timeout}]  # fmt: skip


def health_check(
    fleet: lab.RunningLab, *, template: bool, max_unhealthy: str = "100%", timeout: str = "2s"
) -> None:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": unhealthy_conditions(timeout),
        "maxUnhealthy": max_unhealthy,
    }
    annotations = {}
    if template:
        spec["remediationTemplate"] = {"apiVersion": TEMPLATE_API,
                                       "kind": "FenceRemediationTemplate", "name": "fence"}  # fmt: skip
    else:
        annotations[openshift.REMEDIATION_STRATEGY] = openshift.EXTERNAL_BAREMETAL
    fleet.client().create(
        openshift.MachineHealthCheck(
            metadata=ObjectMeta(name="workers", namespace=NAMESPACE, annotations=annotations),
            spec=spec,
        )
    )
    wait(lambda: counts(fleet) == (3, 3), 120, "OpenShift's check to count 3 of 3 healthy",
         tolerate=(ApiError,), state=lambda: check_status(fleet))  # fmt: skip


def check_status(fleet: lab.RunningLab) -> dict[str, Any]:
    found = fleet.client().get(openshift.MachineHealthCheck, "workers", namespace=NAMESPACE)
    return dict(found.get("status") or {})


def counts(fleet: lab.RunningLab) -> tuple[Any, Any]:
    status = check_status(fleet)
    return status.get("expectedMachines"), status.get("currentHealthy")


def asks(fleet: lab.RunningLab, machine: str) -> bool:
    found = fleet.client().get(OpenShiftMachine, machine, namespace=NAMESPACE)
    return names.EXTERNAL_REMEDIATION in (found.metadata.annotations or {})


def fence_remediations(fleet: lab.RunningLab) -> list[str]:
    return [
        str(r.metadata.name) for r in fleet.client().list(FenceRemediation, namespace=NAMESPACE)
    ]


@pytest.mark.long
@pytest.mark.timeout(900)  # a loaded machine: the test's own deadlines speak first
def test_openshift_check_with_a_fence_remediation_template(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    metalmend.start()
    health_check(fleet, template=True)
    made: list[dict[str, Any]] = []

    def requested() -> bool:
        found = fleet.client().list(FenceRemediation, namespace=NAMESPACE)
        made.extend(r.to_dict() for r in found if not made)
        return bool(made)

    def healthy_again() -> bool:  # and OpenShift's check deleted the FenceRemediation
        return counts(fleet) == (3, 3) and not fence_remediations(fleet)

    at = remediate(fleet, metalmend, requested, healthy_again, lambda: check_status(fleet)).at
    meta = made[0]["metadata"]
    owners = [(o["kind"], o["name"]) for o in meta.get("ownerReferences") or []]
    assert owners == [("Machine", meta["name"])], f"made by OpenShift's check: {meta}"
    assert made[0]["spec"]["strategy"] == "reboot", "copied from the template"
    assert at["fenced"] <= at["on"], at
    node = fleet.client().get(Node, meta["name"])
    assert not any(t.key == names.OUT_OF_SERVICE_TAINT for t in node.spec.taints or [])


@pytest.mark.timeout(900)
def test_openshift_check_with_the_external_baremetal_annotation(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    metalmend.start()
    health_check(fleet, template=False)
    victim: list[str] = []

    def requested() -> bool:
        for machine in fleet.client().list(OpenShiftMachine, namespace=NAMESPACE):
            if names.EXTERNAL_REMEDIATION in (machine.metadata.annotations or {}):
                victim[:] = [str(machine.metadata.name)]
                return True
        return False

    def healthy_again() -> bool:
        return counts(fleet) == (3, 3) and not requested()

    # OpenShift's check asks again while the deleted Node is missing; metalmend takes it for
    # the same failure (policy.machineremediation, rule "same failure"): remediate() checks
    # that the server went off once
    sampler = remediate(fleet, metalmend, requested, healthy_again, lambda: check_status(fleet))
    machine = fleet.client().get(OpenShiftMachine, victim[0], namespace=NAMESPACE)
    assert names.REMEDIATION_ENDED_AT not in (machine.metadata.annotations or {}), sampler.at


@pytest.mark.timeout(600)
def test_openshift_check_short_circuits_with_two_of_three_hung(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    """Both Nodes must be unhealthy before the check's timeout runs out on either: with a 2 s
    timeout from the start, the first Node to go Unknown could time out while the other was
    still Ready (the node lifecycle controller marks them on its own passes), leaving 1
    unhealthy of 3, within maxUnhealthy, and the check would then ask, rightly (an idle CI
    run saw it). So the check starts with a timeout of an hour and is shortened to 2 s once
    both Nodes have been Unknown (or NotReady) for longer than that."""
    metalmend.start()
    health_check(fleet, template=True, max_unhealthy="1", timeout="1h")
    assert fleet.hardware is not None
    hung = [h.name for h in fleet.hardware.hosts[:2]]
    workdir = fleet.plane.workdir.parent
    checker_log = fleet.extras[openshift.COMPONENT].log_path
    sampler = Sampler(fleet, hung[0], lambda: False).start()
    try:
        for name in hung:
            lab.inject_fault(workdir, name, "hang")
        wait_unhealthy_for(fleet, hung, 3.0)
        logged_before = checker_log.stat().st_size
        fleet.client().patch(
            openshift.MachineHealthCheck, "workers",
            {"spec": {"unhealthyConditions": unhealthy_conditions("2s")}},
            namespace=NAMESPACE, patch_type=PatchType.MERGE,
        )  # fmt: skip

        def short_circuited() -> bool:
            status = check_status(fleet)
            found = {c.get("type"): c for c in status.get("conditions") or []}
            allowed = found.get("RemediationAllowed", {})
            return status.get("currentHealthy") == 1 and allowed.get("status") == "False"

        def short_circuit_logged() -> bool:  # (klog, once per evaluation: not rate-limited)
            with checker_log.open("rb") as log:
                log.seek(logged_before)
                return b"Short-circuiting remediation" in log.read()

        wait(lambda: short_circuit_logged() and short_circuited(), 120,
             "OpenShift's check, its timeouts shortened, to count 1 of 3 healthy and"
             " short-circuit (RemediationAllowed False, logged)", tolerate=(ApiError,),
             state=lambda: check_status(fleet))  # fmt: skip
        assert fence_remediations(fleet) == [], "OpenShift's check made no request"
        assert not any(asks(fleet, n) for n in hung)
        # The check ends before the hosts recover: one at a time, the first recovered would
        # leave 1 unhealthy, within maxUnhealthy, and the check would then ask (rightly)
        fleet.client().delete(openshift.MachineHealthCheck, "workers", namespace=NAMESPACE)
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
