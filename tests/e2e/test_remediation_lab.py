"""Fence-first remediation in the lab: real BMCs, the real host power controller, the real
scheduler, StatefulSet and node-lifecycle controllers, and `metalmend run` as a process
that the tests kill -9 at random moments."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube.models.apps_v1 import StatefulSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod

from metalmend.api.resources import (
    BareMetalHost,
    Metal3Remediation,
)
from metalmend.lab import lab
from metalmend.lab.hosts import NAMESPACE, fence_health_check
from metalmend.lab.timeline import Recorder
from tests.e2e.conftest import Metalmend

GRACE = 6.0
MHC_TIMEOUT = 2
RACK = "topology.example.org/rack"


def wait(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {within:.0f}s: {what}")


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


def all_healthy(running: lab.RunningLab) -> bool:
    """Every host on and Ready, no remediation object, no remediation reboot key."""
    client = running.client()
    report = lab.status(running.plane.workdir.parent).hosts
    if not report or any(h.power != "on" or h.ready != "True" for h in report):
        return False
    if list(client.list(Metal3Remediation, namespace=NAMESPACE)):
        return False
    for bmh in client.list(BareMetalHost, namespace=NAMESPACE):
        if any(k.startswith("reboot.metal3.io/") for k in bmh.metadata.annotations or {}):
            return False
    return True


@dataclass
class Sighting:
    node: str
    created: float
    running_at: float | None = None


def test_statefulset_pod_moves_only_after_its_node_is_fenced(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    client = fleet.client()
    wait(lambda: all_healthy(fleet), 60, "a healthy fleet")
    labels: dict[str, Any] = {"app": "db"}
    client.create(
        StatefulSet(
            metadata=ObjectMeta(name="db"),
            spec=StatefulSetSpec(
                serviceName="db", replicas=1, selector=LabelSelector(matchLabels=labels),
                template=PodTemplateSpec(
                    metadata=ObjectMeta(labels=labels),
                    spec=PodSpec(containers=[Container(name="db", image="example.org/db:1")]),
                ),
            ),
        ),
        namespace=NAMESPACE,
    )  # fmt: skip
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
    wait(lambda: all_healthy(fleet), 90, "the hung host back, on and Ready")


def test_killed_at_20_random_moments_every_host_ends_on_and_ready(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    lab_dir: Path = fleet.plane.workdir.parent
    rng = random.Random(7)
    assert fleet.hardware is not None
    hosts = [h.name for h in fleet.hardware.hosts]
    client = fleet.client()
    wait(lambda: all_healthy(fleet), 120, "a healthy fleet")
    for name in hosts:  # an operator's label: the kubelet does not bring it back, we must
        client.patch(Node, name, {"metadata": {"labels": {RACK: f"r-{name}"}}})
    kills = 0
    rounds = 0
    while kills < 20:
        wait(lambda: all_healthy(fleet), 120, "a healthy fleet before the next hang")
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
            if kills >= 20:
                break
    wait(lambda: all_healthy(fleet), 180, "every host on and Ready after 20 kills")
    for name in hosts:
        node = client.get(Node, name)
        assert (node.metadata.labels or {}).get(RACK) == f"r-{name}", f"label restored on {name}"
    assert rounds >= 4
