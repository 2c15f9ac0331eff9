"""Fence-first remediation in the lab: real BMCs, the real host power controller, the real
scheduler, StatefulSet and node-lifecycle controllers, and `metalmend run` as a process
that the tests kill -9 at random moments."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import (
    BareMetalHost,
    Machine,
    MachineHealthCheck,
    Metal3Remediation,
)
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE, fence_health_check
from metalmend_lab.timeline import Recorder
from tests.e2e.conftest import Metalmend
from tests.e2e.fencing import create_db, repair, wait
from tests.support import thorough

GRACE = 6.0
MHC_TIMEOUT = 2
RACK = "topology.example.org/rack"
# metalmend killed -9 this many times at random moments of remediations (tests/support.py)
KILLS = thorough(10, 20)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("remediation-lab"),
        node_monitor_grace_period=GRACE,
        hosts=3,
        bmc="mixed",
        boot_delay=1.0,
        controllers="",
    )
    with lab.started(options) as running:
        fence_health_check(running.client(), MHC_TIMEOUT, power_off=60, power_on=90)
        yield running


@pytest.fixture
def metalmend(fleet: lab.RunningLab) -> Iterator[Metalmend]:
    process = Metalmend(fleet, lab.DEFAULT_CONTROLLERS, 3.0)
    process.start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def leaves_the_fleet_healthy(fleet: lab.RunningLab) -> Iterator[None]:
    """A test that failed half-way leaves a hang or a remediation behind, and every later
    test of the module would fail waiting for a healthy fleet: after each test, a fleet
    that is not healthy has its hangs cleared and metalmend run until it is."""
    yield
    repair(fleet, lab.DEFAULT_CONTROLLERS, lambda: unhealthy(fleet))


def all_healthy(running: lab.RunningLab) -> bool:
    """Every host on and Ready, no remediation object, no remediation reboot key (an API
    server still starting, 429 "storage is (re)initializing", is not yet)."""
    return not unhealthy(running)


def unhealthy(running: lab.RunningLab) -> str:
    """What keeps the fleet from being healthy (``all_healthy``), "" when nothing does."""
    try:
        return _unhealthy(running)
    except ApiError as error:
        return f"the API server: {error.status.code} {error.status.message}"


def _unhealthy(running: lab.RunningLab) -> str:
    client = running.client()
    report = lab.status(running.plane.workdir.parent).hosts
    found = [f"{h.name}: power {h.power}, Ready {h.ready}" for h in report
             if h.power != "on" or h.ready != "True"]  # fmt: skip
    if not report:
        found.append("no hosts in the lab's status")
    for remediation in client.list(Metal3Remediation, namespace=NAMESPACE):
        status = remediation.get("status") or {}
        found.append(
            f"Metal3Remediation {remediation['metadata']['name']} ({status.get('phase')}:"
            f" {status.get('message', '')})"
        )
    for bmh in client.list(BareMetalHost, namespace=NAMESPACE):
        keys = [k for k in bmh.metadata.annotations or {} if k.startswith("reboot.metal3.io/")]
        if keys:
            found.append(f"BareMetalHost {bmh.metadata.name}: keys {keys}")
    return "; ".join(found)


def healthy(running: lab.RunningLab, within: float, what: str) -> None:
    """Wait for ``all_healthy``; a failure says what was still unhealthy."""
    wait(lambda: all_healthy(running), within, what, state=lambda: unhealthy(running))


@dataclass
class Sighting:
    node: str
    created: float
    running_at: float | None = None


def test_statefulset_pod_moves_only_after_its_node_is_fenced(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    client = fleet.client()
    healthy(fleet, 60, "a healthy fleet")
    labels = create_db(client)
    seen: dict[str, Sighting] = {}

    def look() -> None:
        for pod in client.list(Pod, namespace=NAMESPACE, labels=labels):
            uid = str(pod.metadata.uid)
            if uid not in seen and pod.spec and pod.spec.nodeName:
                created = pod.metadata.creationTimestamp
                seen[uid] = Sighting(
                    pod.spec.nodeName, created.timestamp() if created else time.time()
                )
            if uid in seen and pod.status and pod.status.phase == "Running":
                seen[uid].running_at = seen[uid].running_at or time.time()

    def first_running() -> bool:
        look()
        return any(s.running_at for s in seen.values())

    wait(first_running, 60, "db-0 Running")
    hung = next(s.node for s in seen.values() if s.running_at)
    recorder = Recorder(fleet.kubeconfig, NAMESPACE, hung, app="db").start()
    time.sleep(0.5)
    lab.inject_fault(fleet.plane.workdir.parent, hung, "hang")
    recorder.timeline.mark("hang")

    def moved() -> bool:
        look()
        return any(s.node != hung and s.running_at for s in seen.values())

    try:
        wait(moved, 120, "db-0 Running on another node")
        wait(recorder.timeline.complete, 120, "remediation complete")
    finally:
        timeline = recorder.stop()
        client.delete(StatefulSet, "db", namespace=NAMESPACE)
    fenced = timeline.at["fenced"]
    assert timeline.at["reported_off"] <= fenced, "fenced only after the host was reported off"
    for sighting in seen.values():
        if sighting.node != hung:  # whole-second creationTimestamp: allow its rounding down
            assert sighting.created >= int(fenced), f"a replacement before the fence: {sighting}"
            assert sighting.running_at is None or sighting.running_at > fenced
    healthy(fleet, 90, "the hung host back, on and Ready")


@pytest.mark.long
def test_killed_at_random_moments_every_host_ends_on_and_ready(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    lab_dir: Path = fleet.plane.workdir.parent
    rng = random.Random(7)
    assert fleet.hardware is not None
    hosts = [h.name for h in fleet.hardware.hosts]
    client = fleet.client()
    healthy(fleet, 120, "a healthy fleet")
    for name in hosts:  # an operator's label: the kubelet does not bring it back, we must
        client.patch(Node, name, {"metadata": {"labels": {RACK: f"r-{name}"}}})
    kills = 0
    rounds = 0
    while kills < KILLS:
        healthy(fleet, 120, "a healthy fleet before the next hang")
        victim = hosts[rounds % len(hosts)]
        rounds += 1
        lab.inject_fault(lab_dir, victim, "hang")
        began = time.monotonic()
        # Kill at random moments across the remediation: detection, power-off, fencing,
        # power-on, waiting (a remediation here takes ~12-25 s).
        for _ in range(rng.randint(2, 5)):
            time.sleep(rng.uniform(0.0, 4.0) if time.monotonic() - began > 6 else rng.uniform(4, 9))
            metalmend.kill()
            kills += 1
            time.sleep(rng.uniform(0.0, 1.0))
            metalmend.start()
            if kills >= KILLS:
                break
    healthy(fleet, 180, f"every host on and Ready after {KILLS} kills")
    for name in hosts:
        node = client.get(Node, name)
        assert (node.metadata.labels or {}).get(RACK) == f"r-{name}", f"label restored on {name}"
    assert rounds >= KILLS // 5


WITHOUT_NODE_LINK = "host-power,machine-health-check,machine-remediation"


class KeyAdditions:
    """Counts how often a host's reboot key appears (absent -> present), read every 0.1 s
    in a thread: a power-off the key asks for lasts seconds, none is missed."""

    def __init__(self, fleet: lab.RunningLab, host: str, key: str) -> None:
        self.client, self.host, self.key = fleet.client(), host, key
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        held = False
        while not self.stop.wait(0.1):
            try:
                bmh = self.client.get(BareMetalHost, self.host, namespace=NAMESPACE)
            except ApiError:
                continue
            now_held = self.key in (bmh.metadata.annotations or {})
            self.count += int(now_held and not held)
            held = now_held

    def start(self) -> KeyAdditions:
        self.thread.start()
        return self

    def finish(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.count


def test_annotation_flow_without_node_link_power_cycles_once_and_lets_go(
    fleet: lab.RunningLab,
) -> None:
    """Where Cluster API owns status.nodeRef (node-link left out; the test sets nodeRef once,
    as Cluster API does, and never clears or updates it), the health check requests
    remediation by annotation: the hung host is powered off, its Node deleted, the request
    removed and the host powered back on; it ends on, its new Node Ready, nothing left on
    the Machine or the host (before the fix the host stayed off and the Machine annotated).
    One power cycle: the check waits for the rebooted server's Node instead of asking again
    while it is missing (docs/healthcheck.md, "After a remediation by annotation")."""
    client = fleet.client()
    lab_dir: Path = fleet.plane.workdir.parent
    healthy(fleet, 120, "a healthy fleet")
    for machine in client.list(Machine, namespace=NAMESPACE):
        node = client.get(Node, machine.metadata.name)
        ref = {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name,
               "uid": node.metadata.uid}  # fmt: skip
        client.patch(Machine.Status, machine.metadata.name, {"status": {"nodeRef": ref}},
                     namespace=NAMESPACE, patch_type=PatchType.MERGE)  # fmt: skip
    by_annotation = {
        "metadata": {"annotations": {names.REQUEST_REMEDIATION_BY: "annotation"}},
        "spec": {"remediationTemplate": None},
    }
    check = client.get(MachineHealthCheck, "workers", namespace=NAMESPACE)
    template = (check.get("spec") or {}).get("remediationTemplate")
    client.patch(MachineHealthCheck, "workers", by_annotation, namespace=NAMESPACE,
                 patch_type=PatchType.MERGE)  # fmt: skip
    process = Metalmend(fleet, WITHOUT_NODE_LINK, 3.0)
    process.start()
    assert fleet.hardware is not None
    victim = fleet.hardware.hosts[0].name
    before = client.get(Node, victim).metadata.uid
    power_offs = KeyAdditions(fleet, victim, names.MACHINE_REMEDIATION_REBOOT).start()
    try:
        lab.inject_fault(lab_dir, victim, "hang")

        def asked() -> bool:
            machine = client.get(Machine, victim, namespace=NAMESPACE)
            return names.EXTERNAL_REMEDIATION in (machine.metadata.annotations or {})

        wait(asked, 60, "the health check requests remediation by annotation")

        def replaced() -> bool:
            try:
                return client.get(Node, victim).metadata.uid != before
            except ApiError:
                return False

        wait(replaced, 120, "the Node deleted and registered again")

        def settled() -> bool:
            machine = client.get(Machine, victim, namespace=NAMESPACE)
            return all_healthy(fleet) and not asked() and bool(machine.status["nodeRef"])

        wait(settled, 120, "host on, Node Ready, request and reboot key gone")
        time.sleep(GRACE)  # and it stays so: no second power cycle
        assert settled(), "remediated again after it settled"
        machine = client.get(Machine, victim, namespace=NAMESPACE)
        assert names.REMEDIATION_ENDED_AT not in (machine.metadata.annotations or {})
        assert power_offs.finish() == 1, "powered off again before its Node registered"
    finally:
        power_offs.finish()
        process.stop()
        restore = {
            "metadata": {"annotations": {names.REQUEST_REMEDIATION_BY: None}},
            "spec": {"remediationTemplate": template},
        }
        client.patch(MachineHealthCheck, "workers", restore, namespace=NAMESPACE,
                     patch_type=PatchType.MERGE)  # fmt: skip
