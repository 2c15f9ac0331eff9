"""Time from a server lost to its StatefulSet pod Running on another server, per fencing
mode, in the lab (real BMCs, kube-controller-manager's own taint-eviction controller and
pod garbage collector, `metalmend run` as a process). Modes: the Node deleted once the
host is reported off (``delete-node``), and the out-of-service taint after metalmend's own
BMC reads confirmed it off (``out-of-service-taint``, confirm window 2 s, 3 reads), and
beside baremetal-operator (``beside-bmo-stand-in``): the lab's stand-in for BMO
(lab.bmostandin, upstream's timings: power refresh 60 s, 10 s between its looks while a
power change it asked for is under way) owns power, metalmend asks by its keyed reboot
annotation and deletes the Node once BMO's status and its own reads (2 s, 3 reads) agree.

Beside them, from upstream's documents and code rather than measured here (no
baremetal-operator or CSI driver runs in the lab):
- CAPM3's evidence: CAPM3 asks baremetal-operator for the power-off (its reboot
  annotation) and waits for ``poweredOn: false``. A power-off BMO made itself shows there
  within its 10 s power requeue (``powerRequeueDelay``), as in the stand-in mode (the 60 s
  refresh, from Ironic's cache synced every 60 s, bounds only how old the value may be for
  a change BMO did not make: up to about 120 s). So CAPM3's path is about as fast as the
  stand-in's; what it lacks is an independent confirmation, not speed;
- the taint alone, without fencing (Kubernetes' default after a node is lost): the
  StatefulSet pod stays Terminating until someone acts, and the attach-detach controller
  force-detaches its volume after 6 minutes (``maxWaitForUnmountDuration``).
The lab has no volumes, so "volumes attached elsewhere" is not measured: with the taint,
Kubernetes detaches at once when the pod is force-deleted (non-graceful node shutdown).

And the deployments whose own health checker asks metalmend (``lab up --machine-api``;
MACHINE_API_MODES): OpenShift's machine-healthcheck with ``spec.remediationTemplate``
naming a FenceRemediationTemplate (``openshift-template``: fence-remediation, the
out-of-service taint) and with ``external-baremetal`` (``openshift-annotation``:
machine-remediation, the Node deleted), and Cluster API's MachineHealthCheck with
Metal3Machines as CAPM3 makes them (``capi-metal3``: needs ``METALMEND_UPSTREAM_CRDS``, the
directory of the pinned upstream CRDs). For these, each step is timed from the hang, sampled
every 0.1 s: the request (the FenceRemediation made, or the Machine annotated), the server
off (when the first power-off its BMC accepted landed, from the BMC's journal
``<lab>/hardware/<host>.commands``; Redfish power changes land 1 s after the command here,
IPMI ones at once: not status.json's power, the kubelet's view, read once a second), fenced
(the Node tainted or deleted), db-0 Running elsewhere, and the checker counting every
Machine healthy with its request gone.
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube import ApiError
from lightkube.models.apps_v1 import StatefulSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod

from benchmarks.shared import wait
from metalmend.api import names
from metalmend.api.resources import FenceRemediation, FenceRemediationTemplate, OpenShiftMachine
from metalmend_lab import bmostandin, capi, lab, openshift
from metalmend_lab.hosts import NAMESPACE, fence_health_check

RUNS = int(os.environ.get("METALMEND_BENCH_FENCING_RUNS", "3"))
GRACE = 6.0
MHC_TIMEOUT = 2.0
MODES: dict[str, dict[str, str]] = {
    "delete-node": {"METALMEND_REMEDIATION_FENCE": "delete-node"},
    "out-of-service-taint": {
        "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
        "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
        "METALMEND_REMEDIATION_CONFIRM_READS": "3",
        "METALMEND_REMEDIATION_EVACUATION_POLL": "1",
    },
}
# Lab options per mode (the default: metalmend's host-power owns power).
LAB_OPTIONS: dict[str, dict[str, Any]] = {
    "beside-bmo-stand-in": {
        "power_owner": bmostandin.COMPONENT,
        "bmo_refresh": bmostandin.DEFAULT_REFRESH,
        "controllers": lab.BMO_CONTROLLERS,
    },
}
MODES["beside-bmo-stand-in"] = {
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_CONFIRM_READS": "3",
}
# BMO's look after a power change it made (powerRequeueDelay), and the age its refresh
# allows for a change it did not make (Ironic's 60 s sync, then BMO's 60 s refresh).
CAPM3_EVIDENCE_EXPECTED, CAPM3_STALE_WORST = 10.0, 120.0
DETACH_WITHOUT_FENCING = 360.0
LABELS: dict[str, Any] = {"app": "db"}


def running_on(client: Any) -> str | None:
    for pod in client.list(Pod, namespace=NAMESPACE, labels=LABELS):
        if pod.status and pod.status.phase == "Running" and pod.spec and pod.spec.nodeName:
            return str(pod.spec.nodeName)
    return None


def measure(mode: str) -> list[float]:
    saved = {k: os.environ.get(k) for k in MODES[mode]}
    os.environ.update(MODES[mode])
    moves: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as tmp:
            options = lab.LabOptions(
                lab_dir=Path(tmp) / "lab", node_monitor_grace_period=GRACE, hosts=3,
                bmc="mixed", boot_delay=1.0, **LAB_OPTIONS.get(mode, {}),
            )  # fmt: skip
            with lab.started(options) as running:
                client = running.client()
                fence_health_check(client, MHC_TIMEOUT, power_off=60, power_on=120)
                for i in range(RUNS):
                    wait(
                        lambda: all(h.ready == "True" for h in lab.status(options.lab_dir).hosts),
                        180,
                    )
                    client.create(
                        StatefulSet(
                            metadata=ObjectMeta(name="db"),
                            spec=StatefulSetSpec(
                                serviceName="db", replicas=1,
                                selector=LabelSelector(matchLabels=LABELS),
                                template=PodTemplateSpec(
                                    metadata=ObjectMeta(labels=LABELS),
                                    spec=PodSpec(containers=[Container(name="db", image="db:1")]),
                                ),
                            ),
                        ),
                        namespace=NAMESPACE,
                    )  # fmt: skip
                    wait(lambda: running_on(client) is not None, 60)
                    hung = running_on(client)
                    began = time.monotonic()
                    lab.inject_fault(options.lab_dir, str(hung), "hang")
                    wait(lambda h=hung: running_on(client) not in (None, h), 240)
                    moves.append(time.monotonic() - began)
                    print(f"  {mode} {i + 1}: db-0 Running elsewhere {moves[-1]:.1f}s after the hang",
                          flush=True)  # fmt: skip
                    client.delete(StatefulSet, "db", namespace=NAMESPACE)
                    wait(
                        lambda: not list(client.list(Pod, namespace=NAMESPACE, labels=LABELS)), 120
                    )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return moves


TAINT = MODES["out-of-service-taint"]
TEMPLATE_API = "remediation.metalmend.dev/v1alpha1"
# mode -> the lab's --machine-api; metalmend run is the lab's, with its default controllers
MACHINE_API_MODES = {
    "openshift-template": "openshift",
    "openshift-annotation": "openshift",
    "capi-metal3": "capi-metal3",
}
STEPS = ("request", "off", "fenced", "moved", "healthy")
CONTROL_PLANE = "worker-0"  # under Cluster API, the Cluster's one control-plane Machine
REDFISH_POWER_DELAY = 1.0  # seconds a Redfish power change takes in these modes


def db(client: Any) -> None:
    client.create(
        StatefulSet(
            metadata=ObjectMeta(name="db"),
            spec=StatefulSetSpec(
                serviceName="db", replicas=1, selector=LabelSelector(matchLabels=LABELS),
                template=PodTemplateSpec(
                    metadata=ObjectMeta(labels=LABELS),
                    spec=PodSpec(containers=[Container(name="db", image="db:1")]),
                ),
            ),
        ),
        namespace=NAMESPACE,
    )  # fmt: skip


def checker(client: Any, mode: str) -> tuple[Any, Any]:
    """The mode's MachineHealthCheck 'workers' (Ready Unknown or False for 2 s), created;
    returns the resource to read its status with and a function: whether a request exists."""
    client.create(
        FenceRemediationTemplate(
            metadata=ObjectMeta(name="fence", namespace=NAMESPACE),
            spec={"template": {"spec": {"strategy": "reboot", "powerOffTimeoutSeconds": 60,
                                        "powerOnTimeoutSeconds": 120}}},
        )
    )  # fmt: skip
    template = {"apiVersion": TEMPLATE_API, "kind": "FenceRemediationTemplate", "name": "fence"}
    if mode == "capi-metal3":
        client.create(
            capi.MachineHealthCheckV1Beta2.from_dict({
                "apiVersion": capi.API, "kind": "MachineHealthCheck",
                "metadata": {"name": "workers", "namespace": NAMESPACE},
                "spec": {
                    "clusterName": capi.CLUSTER, "selector": {"matchLabels": {"role": "worker"}},
                    "checks": {"unhealthyNodeConditions": [
                        {"type": "Ready", "status": "Unknown", "timeoutSeconds": 2},
                        {"type": "Ready", "status": "False", "timeoutSeconds": 2}]},
                    "remediation": {"templateRef": template},
                },
            })
        )  # fmt: skip
        return capi.MachineHealthCheckV1Beta2, lambda: bool(
            list(client.list(FenceRemediation, namespace=NAMESPACE))
        )
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "2s"},
                                {"type": "Ready", "status": "False", "timeout": "2s"}],
    }  # fmt: skip
    annotations = {}
    if mode == "openshift-template":
        spec["remediationTemplate"] = template
    else:
        annotations[openshift.REMEDIATION_STRATEGY] = openshift.EXTERNAL_BAREMETAL
    client.create(
        openshift.MachineHealthCheck(
            metadata=ObjectMeta(name="workers", namespace=NAMESPACE, annotations=annotations),
            spec=spec,
        )
    )

    def requested() -> bool:
        if mode == "openshift-template":
            return bool(list(client.list(FenceRemediation, namespace=NAMESPACE)))
        return any(
            names.EXTERNAL_REMEDIATION in (m.metadata.annotations or {})
            for m in client.list(OpenShiftMachine, namespace=NAMESPACE)
        )

    return openshift.MachineHealthCheck, requested


def measure_steps(mode: str) -> list[dict[str, float]]:
    """RUNS remediations under the mode's own health checker: seconds from the hang to each
    of STEPS."""
    saved = {k: os.environ.get(k) for k in TAINT}
    os.environ.update(TAINT)
    runs: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as tmp:
            options = lab.LabOptions(
                lab_dir=Path(tmp) / "lab", node_monitor_grace_period=GRACE, hosts=3,
                bmc="mixed", boot_delay=1.0, serve=False, machine_api=MACHINE_API_MODES[mode],
                redfish_power_delay=REDFISH_POWER_DELAY,
            )  # fmt: skip
            with lab.started(options) as running:
                client = running.client()
                check, requested = checker(client, mode)
                if mode == "capi-metal3":  # db-0 kept off the one control-plane Machine
                    client.patch(Node, CONTROL_PLANE, {"spec": {"unschedulable": True}})

                def counted(wanted: int) -> bool:
                    try:
                        status = client.get(check, "workers", namespace=NAMESPACE).get("status")
                    except ApiError:
                        return False
                    status = status or {}
                    return (status.get("expectedMachines"), status.get("currentHealthy")) == (
                        wanted, wanted)  # fmt: skip

                for i in range(RUNS):
                    wait(lambda: counted(3) and not requested(), 300)
                    db(client)
                    wait(lambda: running_on(client) is not None, 120)
                    hung = str(running_on(client))
                    runs.append(follow(running, client, hung, requested, lambda: counted(3)))
                    print(f"  {mode} {i + 1}: {hung}: {runs[-1]}", flush=True)
                    client.delete(StatefulSet, "db", namespace=NAMESPACE)
                    wait(
                        lambda: not list(client.list(Pod, namespace=NAMESPACE, labels=LABELS)), 120
                    )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return runs


def follow(
    running: lab.RunningLab, client: Any, hung: str, requested: Any, healthy: Any
) -> dict[str, float]:
    """Hang ``hung`` and sample every 0.1 s until the checker counts every Machine healthy
    again with no request left."""
    at: dict[str, float] = {}
    lab.inject_fault(running.plane.workdir.parent, hung, "hang")
    began, wall = time.monotonic(), time.time()
    while time.monotonic() - began < 600:
        now = round(time.monotonic() - began, 1)
        try:
            if (off := off_landed(running, hung, wall)) is not None:
                at.setdefault("off", round(off - wall, 1))
            try:
                node = client.get(Node, hung)
                fenced = any(t.key == names.OUT_OF_SERVICE_TAINT for t in node.spec.taints or [])
            except ApiError as error:
                fenced = error.status.code == 404
            asked = requested()
            if asked:
                at.setdefault("request", now)
            if fenced:
                at.setdefault("fenced", now)
            if "fenced" in at and running_on(client) not in (None, hung):
                at.setdefault("moved", now)
            if "moved" in at and not asked and healthy():
                at["healthy"] = now
                return at
        except (ApiError, OSError, ValueError, KeyError):
            pass  # the API server or the status file mid-write: the next sample
        time.sleep(0.1)
    raise TimeoutError(f"{hung} not remediated within 600s: {at}")


def off_landed(running: lab.RunningLab, host: str, since: float) -> float | None:
    """When the first power-off ``host``'s BMC accepted after ``since`` landed (wall clock)."""
    journal = running.plane.workdir.parent / "hardware" / f"{host}.commands"
    assert running.hardware is not None
    spec = next(h for h in running.hardware.hosts if h.name == host)
    delay = REDFISH_POWER_DELAY if spec.bmc == "redfish" else spec.power_delay
    for line in journal.read_text().splitlines() if journal.exists() else []:
        stamp, _, action = line.partition(" ")
        if action in ("hard off", "soft off") and float(stamp) >= since:
            return float(stamp) + delay
    return None


def main() -> None:
    chosen = os.environ.get(
        "METALMEND_BENCH_FENCING_MODES", ",".join([*MODES, *MACHINE_API_MODES])
    ).split(",")
    results = {mode: measure(mode) for mode in MODES if mode in chosen}
    steps = {mode: measure_steps(mode) for mode in MACHINE_API_MODES if mode in chosen}
    waits = GRACE + MHC_TIMEOUT
    print(f"fencing modes, {RUNS} runs each (node-monitor grace {GRACE:g}s + check timeout"
          f" {MHC_TIMEOUT:g}s = {waits:g}s of configured waits in each):")  # fmt: skip
    for mode, moves in results.items():
        print(f"  {mode:22} hang -> db-0 Running elsewhere: median {statistics.median(moves):5.1f}s"
              f"  min {min(moves):5.1f}s  max {max(moves):5.1f}s")  # fmt: skip
    if "beside-bmo-stand-in" in results:
        print(f"  (beside-bmo-stand-in: the stand-in's power refresh {bmostandin.DEFAULT_REFRESH:g}s,"
              f" its looks every {bmostandin.DEFAULT_POWER_REQUEUE:g}s while its power-off"
              " is under way)")  # fmt: skip
    if taints := results.get("out-of-service-taint"):
        taint = statistics.median(taints)
        print(f"  with CAPM3's evidence on the same path: BMO's own power-off in poweredOn"
              f" within +{CAPM3_EVIDENCE_EXPECTED:g}s -> ~{taint + CAPM3_EVIDENCE_EXPECTED:.0f}s"
              f" (a change BMO did not make: up to {CAPM3_STALE_WORST:g}s old)")  # fmt: skip
    print(f"  no fencing (taint never added): the pod stays Terminating until someone acts;"
          f" its volume force-detached after {DETACH_WITHOUT_FENCING:g}s")  # fmt: skip
    if steps:
        print(f"under the deployment's own health checker, {RUNS} runs each, seconds after the"
              " hang, median (min-max):")  # fmt: skip
        print(f"  {'mode':22} " + " ".join(f"{s:>17}" for s in STEPS))
    for mode, runs in steps.items():
        cells = []
        for step in STEPS:
            values = [r[step] for r in runs if step in r]
            cells.append(f"{statistics.median(values):5.1f} ({min(values):.1f}-{max(values):.1f})"
                         if values else "-")  # fmt: skip
        print(f"  {mode:22} " + " ".join(f"{c:>17}" for c in cells))


if __name__ == "__main__":
    main()
