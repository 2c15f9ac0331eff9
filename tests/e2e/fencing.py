"""What the lab's fencing tests share: a polling wait that names what it waited for, the
workload that must move (a one-replica StatefulSet, db), the out-of-service taint on a
Node, the simulated server's own power, and the Node's history of taints from its watch,
which orders a taint and a pod's move by resourceVersion."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client
from lightkube.models.apps_v1 import StatefulSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod

from metalmend.api import names
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from metalmend_lab.inventory import status_path
from tests import support
from tests.e2e.conftest import Metalmend


def wait(
    check: Callable[[], object],
    within: float,
    what: str,
    tolerate: tuple[type[Exception], ...] = (),
    state: Callable[[], object] | None = None,
) -> None:
    """Until ``check()``, within ``within`` seconds stretched by the load (tests.support:
    ``wait``); ``tolerate``: errors that mean "not yet" (an API server still starting, an
    object being replaced); ``state``: what the failure reports as last seen."""
    support.wait(check, within, what, tolerate=tolerate, state=state)


def create_db(client: Client) -> dict[str, str]:
    """The workload a fence must move: StatefulSet db, one replica (db-0), in the lab's
    namespace; its pod's labels."""
    labels = {"app": "db"}
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
    return labels


def db_running(client: Client, labels: dict[str, str]) -> tuple[str, int] | None:
    """The node db-0 runs on, and the version of the pod that says so."""
    for pod in client.list(Pod, namespace=NAMESPACE, labels=labels):
        if pod.status and pod.status.phase == "Running" and pod.spec and pod.spec.nodeName:
            assert pod.metadata
            assert pod.metadata.resourceVersion
            return str(pod.spec.nodeName), int(pod.metadata.resourceVersion)
    return None


def tainted(node: Any) -> bool:
    return any(t.key == names.OUT_OF_SERVICE_TAINT for t in (node.spec.taints or []))


def power_of(workdir: Path, host: str) -> str:
    """The simulated server's own power, from the hardware's status file (rewritten every
    0.2 s; `lab status` reads the same, and probes every BMC besides)."""
    return str(json.loads(status_path(workdir).read_text())[host]["power"])


def power_commands(workdir: Path, host: str, since: float) -> list[tuple[float, str]]:
    """The power commands ``host``'s BMC accepted at or after ``since`` (wall-clock), from
    its own journal (``<lab>/hardware/<host>.commands``, reads left out): what the server
    was told, which no sampling of its power can miss."""
    journal = workdir / "hardware" / f"{host}.commands"
    lines = journal.read_text().splitlines() if journal.exists() else []
    commands = [(float(t), what.partition(" pid=")[0])
                for t, _, what in (line.partition(" ") for line in lines)]  # fmt: skip
    return [(t, what) for t, what in commands if what != "status" and t >= since]


def power_cycles(commands: list[tuple[float, str]]) -> int:
    """How many power-offs ``commands`` hold, an off sent again before any "on" (a command
    re-sent, not obeyed yet) counting once."""
    cycles, last = 0, "on"
    for _, command in commands:
        if command.endswith("off") and last == "on":
            cycles += 1
        last = "off" if command.endswith("off") else "on" if command == "on" else last
    return cycles


class TaintHistory:
    """Every version of one Node, as its watch delivers them (in order, none missed), with
    whether it carried the out-of-service taint. Polling the Node and the pods one after
    the other cannot order a taint and a pod's move that happen between two polls (on a
    busy machine a poll round takes a second and both happen within one); this orders
    them by resourceVersion: the lab has one etcd, whose revision every object's version
    is, so the versions of a Node and a pod compare as the order of their writes.

    For each tainted version, as it arrives: the simulated server's power, then the Node's
    pods; a server on while pods are still listed on the tainted Node is a violation (the
    fence let it on too soon)."""

    def __init__(self, fleet: lab.RunningLab, node: str) -> None:
        self._client = fleet.client()
        self._reader = fleet.client()
        self.violations: list[str] = []
        self._workdir = fleet.plane.workdir.parent
        self._node = node
        self._seen: list[tuple[int, bool]] = []
        self.power_at_first_taint: str | None = None
        self._changed = threading.Condition()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        try:
            for _, obj in self._client.watch(Node, fields={"metadata.name": self._node}):
                assert obj.metadata
                assert obj.metadata.resourceVersion
                carries = tainted(obj)
                if carries:
                    power = power_of(self._workdir, self._node)
                    if self.power_at_first_taint is None:
                        self.power_at_first_taint = power
                    pods = list(
                        self._reader.list(Pod, namespace="*", fields={"spec.nodeName": self._node})
                    )
                    if power != "off" and pods:
                        self.violations.append(
                            f"version {obj.metadata.resourceVersion} tainted, server {power},"
                            f" {len(pods)} pods on it"
                        )
                with self._changed:
                    self._seen.append((int(obj.metadata.resourceVersion), carries))
                    self._changed.notify_all()
        except Exception:  # the lab went away at the end of the test
            return

    def assert_tainted_before(self, version: int, what: str, within: float = 60.0) -> None:
        """The Node carried the taint at a version before ``version`` (a write of ``what``):
        waits for the watch to deliver the Node's versions up to it."""
        deadline = support.Deadline(within)
        with self._changed:
            while True:
                if any(v < version and t for v, t in self._seen):
                    return
                after = [v for v, _ in self._seen if v > version]
                assert not after, (
                    f"{what} (version {version}) before any taint of {self._node}: "
                    f"the Node's versions {self._seen}"
                )
                left = deadline.left()
                assert left > 0, (
                    f"{what} (version {version}); {self._node}'s watch delivered no taint "
                    f"before it within {deadline}: {self._seen}"
                )
                self._changed.wait(min(left, 5.0))


def repair(fleet: lab.RunningLab, controllers: str, unhealthy: Callable[[], str]) -> None:
    """After a test that failed half-way (a hang, a remediation, a frozen stand-in left
    behind, so that every later test of the module would fail waiting for a healthy
    fleet): when ``unhealthy()`` says something, clear every host's hang and run
    ``metalmend run --controllers controllers`` until it says nothing."""
    try:
        if not unhealthy():
            return
    except ApiError:
        pass
    assert fleet.hardware is not None
    for spec in fleet.hardware.hosts:
        lab.inject_fault(fleet.plane.workdir.parent, spec.name, "recover")
    process = Metalmend(fleet, controllers, 3.0)
    process.start()
    try:
        wait(
            lambda: not unhealthy(), 180, "the fleet healthy again for the next test",
            tolerate=(ApiError,), state=unhealthy,
        )  # fmt: skip
    finally:
        process.stop()
