"""Fencing by the out-of-service taint in the lab: real BMCs (Redfish and IPMI), the real
host power controller, the real kube-controller-manager (its taint-eviction controller and
pod garbage collector act on the taint), scheduler and StatefulSet controller, and
`metalmend run --fence out-of-service-taint` as a process killed -9 once the Node is
tainted. Watched from outside every 0.1 s: the taint is seen only while the host is off
(the simulated server's own power, not anything metalmend reports), or once the Node has
no pod left; the StatefulSet's pod runs elsewhere only after the taint (ordered by the
writes' resourceVersions, which one poll cannot order); the host comes
back, the taint goes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from lightkube import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod

from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE, fence_health_check
from tests.e2e.conftest import Metalmend
from tests.e2e.fencing import TaintHistory, create_db, db_running, tainted, wait
from tests.support import Deadline

GRACE = 6.0
TAINT_SETTINGS = {
    "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_CONFIRM_READS": "3",
    "METALMEND_REMEDIATION_EVACUATION_POLL": "1",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("taint-lab"),
        node_monitor_grace_period=GRACE,
        hosts=3,
        bmc="mixed",
        boot_delay=1.0,
        controllers="",
    )
    with lab.started(options) as running:
        fence_health_check(running.client(), 2, power_off=60, power_on=120)
        yield running


@pytest.fixture
def metalmend(fleet: lab.RunningLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Metalmend]:
    for name, value in TAINT_SETTINGS.items():
        monkeypatch.setenv(name, value)
    process = Metalmend(fleet, lab.DEFAULT_CONTROLLERS, 3.0)
    process.start()
    yield process
    process.stop()


@pytest.mark.long
def test_taint_only_on_a_server_that_is_off_and_the_pod_moves_after_it(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    client = fleet.client()
    workdir = fleet.plane.workdir.parent
    wait(lambda: all(h.ready == "True" for h in lab.status(workdir).hosts), 60, "Ready hosts")
    labels = create_db(client)

    def running() -> tuple[str, int] | None:
        return db_running(client, labels)

    def running_on() -> str | None:
        found = running()
        return None if found is None else found[0]

    wait(lambda: running_on() is not None, 60, "db-0 Running")
    hung = running_on()
    assert hung is not None
    taints = TaintHistory(fleet, hung)
    host = next(h for h in lab.status(workdir).hosts if h.name == hung)
    began = time.monotonic()
    lab.inject_fault(workdir, hung, "hang")
    at: dict[str, float] = {}
    killed = False
    deadline = Deadline(240)
    try:
        while not deadline.expired():
            now = time.monotonic() - began
            try:
                node = client.get(Node, hung)
            except ApiError:
                node = None
            power = next(h.power for h in lab.status(workdir).hosts if h.name == host.name)
            on_node = [
                p for p in client.list(Pod, namespace="*", fields={"spec.nodeName": hung})
            ]  # fmt: skip
            if node is not None and tainted(node):
                at.setdefault("tainted", now)
                # Read in this order (Node, power, pods), a server on with pods still
                # listed while the Node is tainted: the fence let it on too soon (a new pod
                # cannot land on the tainted Node meanwhile).
                assert power == "off" or not on_node, (
                    f"{hung} tainted while its server is {power} with pods {len(on_node)}"
                )
                if not killed:  # restart-safe: kill -9 once the Node is tainted
                    metalmend.kill()
                    metalmend.start()
                    killed = True
            elif "tainted" in at:
                at.setdefault("untainted", now)
            moved = running()
            if moved is not None and moved[0] != hung and "moved" not in at:
                at["moved"] = now
                taints.assert_tainted_before(moved[1], f"db-0 running on {moved[0]}")
            if "tainted" in at and not on_node:
                at.setdefault("pods_gone", now)
            if power == "on" and "tainted" in at:
                at.setdefault("powered_on", now)
            if "untainted" in at and "moved" in at and node is not None:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"not done within {deadline}: {at}")
    finally:
        client.delete(StatefulSet, "db", namespace=NAMESPACE)
    print("taint timeline (s after the hang):", {k: round(v, 1) for k, v in at.items()})
