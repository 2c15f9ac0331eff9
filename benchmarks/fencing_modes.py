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
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube.models.apps_v1 import StatefulSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Pod

from benchmarks.shared import wait
from metalmend_lab import bmostandin, lab
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


def main() -> None:
    chosen = os.environ.get("METALMEND_BENCH_FENCING_MODES", ",".join(MODES)).split(",")
    results = {mode: measure(mode) for mode in MODES if mode in chosen}
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
    taint = statistics.median(results.get("out-of-service-taint") or [0.0])
    print(f"  with CAPM3's evidence on the same path: BMO's own power-off in poweredOn"
          f" within +{CAPM3_EVIDENCE_EXPECTED:g}s -> ~{taint + CAPM3_EVIDENCE_EXPECTED:.0f}s"
          f" (a change BMO did not make: up to {CAPM3_STALE_WORST:g}s old)")  # fmt: skip
    print(f"  no fencing (taint never added): the pod stays Terminating until someone acts;"
          f" its volume force-detached after {DETACH_WITHOUT_FENCING:g}s")  # fmt: skip


if __name__ == "__main__":
    main()
