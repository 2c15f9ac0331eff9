"""Fencing beside baremetal-operator in the lab (docs/install.md, "Beside metal3"): the lab
serves upstream's BareMetalHost CRD and its stand-in for BMO (lab.bmostandin) owns the
hosts' power, driving the real Redfish and IPMI BMCs with an account of its own;
`metalmend run` (node-link, machine-health-check, metal3-remediation: no host-power) finds
baremetal-operator from the served schema. Checked from outside:

- metalmend never sends a power command: every command each simulated BMC journals came
  from the stand-in's account;
- the power-off is asked for only by metalmend's keyed reboot annotation, the fence comes
  only after the stand-in reported the host off in a version carrying that key AND
  metalmend's own reads confirmed it (``offReads``), and the pod runs elsewhere only after
  the fence: ordered by resourceVersion (one etcd: every object's version is its revision);
- the host comes back on through the annotation's removal;
- with the stand-in frozen right after its power-off (the server off, its status still
  on), nothing is fenced until it reports the host off: our own reads are not enough;
- `metalmend run` killed -9 at every step of a remediation, every host ends on and Ready;
- a host with ``spec.disablePowerOff`` is refused, said so, and never asked to power off.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, Metal3Remediation
from metalmend_lab import bmostandin, lab
from metalmend_lab.hosts import NAMESPACE, fence_health_check
from tests.e2e.conftest import Metalmend
from tests.e2e.fencing import create_db, db_running, repair
from tests.e2e.fencing import wait as wait_for
from tests.support import Deadline

GRACE = 6.0
REFRESH = 10.0  # the stand-in's power refresh (upstream: 60 s)
CONFIRM = {
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_CONFIRM_READS": "3",
}
CONFIRM_READS = 3


def wait(check: Callable[[], object], within: float, what: str) -> None:
    """tests.e2e.fencing's wait (stretched by the load); the API server may be restarting;
    a failure reports the fleet's state as last seen."""
    wait_for(check, within, what, tolerate=(ApiError,), state=lambda: unhealthy(FLEET[0]))


FLEET: list[lab.RunningLab] = []  # the module's lab, for the failures' messages


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("bmo-lab"),
        node_monitor_grace_period=GRACE,
        hosts=3,
        bmc="mixed",
        boot_delay=1.0,
        controllers="",
        power_owner=bmostandin.COMPONENT,
        bmo_refresh=REFRESH,
        serve=False,
    )
    with lab.started(options) as running:
        fence_health_check(running.client(), 2, power_off=60, power_on=120)
        FLEET[:] = [running]
        yield running


@pytest.fixture
def metalmend(fleet: lab.RunningLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Metalmend]:
    for name, value in CONFIRM.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("METALMEND_REMEDIATION_POWER_OWNER", raising=False)  # auto: detected
    process = Metalmend(fleet, lab.BMO_CONTROLLERS, 3.0)
    process.start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def leaves_the_fleet_healthy(
    fleet: lab.RunningLab, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A test that failed half-way leaves a hang, a frozen stand-in or a remediation behind,
    and every later test of the module would fail waiting for a healthy fleet: after each
    test, a fleet that is not healthy is brought back (tests.e2e.fencing.repair)."""
    yield
    stand_in = fleet.extras[bmostandin.COMPONENT]
    if stand_in.pid is not None and stand_in.running():
        os.kill(stand_in.pid, signal.SIGCONT)
    for name, value in CONFIRM.items():
        monkeypatch.setenv(name, value)
    repair(fleet, lab.BMO_CONTROLLERS, lambda: unhealthy(fleet))


def lab_dir(fleet: lab.RunningLab) -> Path:
    return fleet.plane.workdir.parent


def reboot_keys(host: Any) -> list[str]:
    return [k for k in host.metadata.annotations or {} if k.startswith("reboot.metal3.io")]


def all_healthy(fleet: lab.RunningLab) -> bool:
    """Every host on (the server itself, and the stand-in's status) and Ready, no
    remediation object, no reboot annotation."""
    return not unhealthy(fleet)


def unhealthy(fleet: lab.RunningLab) -> str:
    """What keeps the fleet from being healthy (``all_healthy``), "" when nothing does."""
    client = fleet.client()
    report = lab.status(lab_dir(fleet)).hosts
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
        powered = (bmh.status or {}).get("poweredOn")
        if reboot_keys(bmh) or powered is not True:
            found.append(f"BareMetalHost {bmh.metadata.name}: keys {reboot_keys(bmh)},"
                         f" poweredOn {powered}")  # fmt: skip
    return "; ".join(found)


def commands(fleet: lab.RunningLab, host: str) -> list[tuple[float, str, str]]:
    """(time, BMC account, action) of every power command ``host``'s BMC accepted."""
    path = lab_dir(fleet) / "hardware" / f"{host}.clients"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        at, user, action = line.split(" ", 2)
        found.append((float(at), user, action))
    return found


def assert_only_the_stand_in_powered(fleet: lab.RunningLab) -> None:
    assert fleet.hardware is not None
    for spec in fleet.hardware.hosts:
        senders = {user for _, user, _ in commands(fleet, spec.name)}
        assert senders <= {bmostandin.account(spec.name)}, (
            f"{spec.name}'s BMC took power commands from {senders}: only the BMO stand-in"
            f" ({bmostandin.account(spec.name)}) may send any"
        )


@dataclass
class Seen:
    kind: str  # ADDED, MODIFIED, DELETED
    version: int
    obj: Any


class History:
    """Every version of the watched objects, in order, none missed (a watch)."""

    def __init__(self, client: Client, resource: Any, **selectors: Any) -> None:
        self.client, self.resource, self.selectors = client, resource, selectors
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        try:
            for kind, obj in self.client.watch(self.resource, **self.selectors):
                with self.lock:
                    self.seen.append(Seen(kind, int(obj.metadata.resourceVersion), obj))
        except Exception:  # the lab went away at the end of the module
            return

    def first(self, match: Callable[[Seen], bool], what: str, within: float = 60.0) -> Seen:
        deadline = Deadline(within)
        while not deadline.expired():
            with self.lock:
                found = next((s for s in self.seen if match(s)), None)
            if found is not None:
                return found
            time.sleep(0.1)
        with self.lock:
            versions = [(s.kind, s.version) for s in self.seen]
        raise AssertionError(f"never seen within {deadline}: {what}; saw {versions}")


def test_fenced_through_the_stand_in_only_by_annotation_and_after_both_say_off(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    client = fleet.client()
    wait(lambda: all_healthy(fleet), 120, "a healthy fleet")
    said = [line for line in metalmend.log_tail(400).splitlines() if "power owner" in line]
    assert said, "metalmend run did not say which power owner it found"
    assert "owner=baremetal-operator" in said[-1], said
    labels = create_db(client)

    def running() -> tuple[str, int] | None:
        return db_running(client, labels)

    wait(lambda: running() is not None, 60, "db-0 Running")
    first = running()
    assert first is not None
    hung = first[0]
    by_name = {"fields": {"metadata.name": hung}}
    host_versions = History(client, BareMetalHost, namespace=NAMESPACE, **by_name)
    node_versions = History(client, Node, **by_name)
    remediations = History(client, Metal3Remediation, namespace=NAMESPACE, **by_name)
    began = time.time()
    try:
        lab.inject_fault(lab_dir(fleet), hung, "hang")
        moved: list[tuple[str, int]] = []

        def moved_elsewhere() -> bool:
            found = running()
            if found is not None and found[0] != hung:
                moved.append(found)
                return True
            return False

        wait(moved_elsewhere, 180, "db-0 Running on another node")
        lab.inject_fault(lab_dir(fleet), hung, "recover")
        wait(lambda: all_healthy(fleet), 180, f"{hung} back on and Ready, nothing left")
    finally:
        client.delete(StatefulSet, "db", namespace=NAMESPACE)

    def ours(seen: Seen) -> list[str]:
        prefix = names.METAL3_REMEDIATION_REBOOT_PREFIX
        return [k for k in reboot_keys(seen.obj) if k.startswith(prefix)]

    asked = host_versions.first(lambda s: bool(ours(s)), "metalmend's keyed reboot annotation")
    (key,) = ours(asked)
    assert asked.obj.metadata.annotations[key] == '{"mode": "hard"}'
    reported_off = host_versions.first(
        lambda s: key in reboot_keys(s.obj) and (s.obj.status or {}).get("poweredOn") is False,
        "the stand-in's status.poweredOn false in a version carrying our key",
    )
    confirmed = remediations.first(
        lambda s: (s.obj.get("status") or {}).get("phase") == "fencing",
        "the remediation confirmed the host off (phase fencing)",
    )
    assert (confirmed.obj["status"].get("offReads") or 0) >= CONFIRM_READS
    fenced = node_versions.first(lambda s: s.kind == "DELETED", f"Node {hung} deleted")
    released = host_versions.first(
        lambda s: s.version > fenced.version and key not in reboot_keys(s.obj),
        "our key removed after the fence",
    )
    back_on = host_versions.first(
        lambda s: s.version > released.version and (s.obj.status or {}).get("poweredOn") is True,
        "the stand-in reporting the host on after the key's removal",
    )
    ordered = [
        ("key added", asked.version), ("reported off", reported_off.version),
        ("confirmed by our reads", confirmed.version), ("Node deleted", fenced.version),
        ("db-0 Running elsewhere", moved[-1][1]),
    ]  # fmt: skip
    assert [v for _, v in ordered] == sorted(v for _, v in ordered), ordered
    assert released.version < back_on.version
    # At the BMC: the stand-in alone powered the host, off and back on (after the hang).
    assert_only_the_stand_in_powered(fleet)
    sent = [(at, action) for at, _, action in commands(fleet, hung) if at >= began]
    assert [a for _, a in sent][:2] == ["hard off", "on"], sent


STEPS = ("detect", "power-off", "confirming-off", "fencing", "power-on", "waiting")


def phase_of(client: Client, host: str) -> str:
    """The remediation's phase for ``host`` ("detect" while there is none)."""
    try:
        found = client.get(Metal3Remediation, host, namespace=NAMESPACE)
    except ApiError:
        return "detect"
    return str((found.get("status") or {}).get("phase") or "detect")


@pytest.mark.long
def test_killed_at_every_step_every_host_ends_on_and_ready(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    """Two hangs; in each, `metalmend run` is killed -9 as soon as each step of the
    remediation is seen (no remediation yet, power-off, confirming-off, fencing, power-on,
    waiting), and started again."""
    client = fleet.client()
    assert fleet.hardware is not None
    hosts = [h.name for h in fleet.hardware.hosts]
    killed: list[tuple[str, str]] = []
    for victim in hosts[:2]:
        wait(lambda: all_healthy(fleet), 180, "a healthy fleet before the next hang")
        lab.inject_fault(lab_dir(fleet), victim, "hang")
        done: set[str] = set()
        deadline = Deadline(240)
        while not deadline.expired():
            phase = phase_of(client, victim)
            if phase in STEPS and phase not in done:
                done.add(phase)
                metalmend.kill()
                killed.append((victim, phase))
                metalmend.start()
            if phase == "waiting" or ("power-on" in done and all_healthy(fleet)):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(
                f"{victim}: remediation not done within {deadline}; killed at {killed};"
                f" last seen: {unhealthy(fleet)}"
            )
        lab.inject_fault(lab_dir(fleet), victim, "recover")
        wait(lambda: all_healthy(fleet), 180, f"{victim} on and Ready after kills at {killed}")
    steps = {phase for _, phase in killed}
    assert {"detect", "power-off", "power-on"} <= steps, killed
    assert_only_the_stand_in_powered(fleet)
    print("killed at:", killed)


def test_no_fence_while_the_stand_in_has_not_reported_the_host_off(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    """Our own reads alone are not enough: the stand-in is frozen (SIGSTOP) right after it
    sent the power-off, so the server is off (and metalmend's reads would say so) but
    status.poweredOn still says on: nothing is fenced until the stand-in, let go, reports
    it off."""
    client = fleet.client()
    assert fleet.hardware is not None
    victim = fleet.hardware.hosts[1].name
    stand_in = fleet.extras[bmostandin.COMPONENT]
    assert stand_in.pid is not None
    wait(lambda: all_healthy(fleet), 180, "a healthy fleet")
    node_uid = client.get(Node, victim).metadata.uid
    sent = len(commands(fleet, victim))
    lab.inject_fault(lab_dir(fleet), victim, "hang")
    frozen = False
    try:
        wait(lambda: len(commands(fleet, victim)) > sent, 120, "the stand-in's power-off")
        os.kill(stand_in.pid, signal.SIGSTOP)
        frozen = True
        assert commands(fleet, victim)[-1][2] == "hard off", commands(fleet, victim)
        power = lambda: {h.name: h.power for h in lab.status(lab_dir(fleet)).hosts}[victim]  # noqa: E731
        wait(lambda: power() == "off", 60, f"{victim}'s server off")
        time.sleep(3 * float(CONFIRM["METALMEND_REMEDIATION_CONFIRM_WINDOW"]) + 5)
        host = client.get(BareMetalHost, victim, namespace=NAMESPACE)
        assert (host.status or {}).get("poweredOn") is True, "the frozen stand-in wrote"
        assert client.get(Node, victim).metadata.uid == node_uid, "fenced on our reads alone"
        assert phase_of(client, victim) == "power-off"
    finally:
        if frozen:
            os.kill(stand_in.pid, signal.SIGCONT)

    def fenced() -> bool:
        try:
            return client.get(Node, victim).metadata.uid != node_uid
        except ApiError:
            return True

    wait(fenced, 120, f"Node {victim} deleted once the stand-in reported the host off")
    wait(lambda: all_healthy(fleet), 180, f"{victim} back on and Ready")
    assert_only_the_stand_in_powered(fleet)


def test_disable_power_off_host_is_refused_and_never_asked(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    client = fleet.client()
    assert fleet.hardware is not None
    victim = fleet.hardware.hosts[2].name
    wait(lambda: all_healthy(fleet), 180, "a healthy fleet")
    client.patch(BareMetalHost, victim, {"spec": {"disablePowerOff": True}},
                 namespace=NAMESPACE, patch_type=PatchType.MERGE)  # fmt: skip
    versions = History(client, BareMetalHost, namespace=NAMESPACE,
                       fields={"metadata.name": victim})  # fmt: skip
    before = len(commands(fleet, victim))
    try:
        lab.inject_fault(lab_dir(fleet), victim, "hang")

        def refused() -> bool:
            status = client.get(Metal3Remediation, victim, namespace=NAMESPACE).get("status")
            return (status or {}).get("phase") == "failed"

        wait(refused, 120, f"the remediation of {victim} refused")
        status = client.get(Metal3Remediation, victim, namespace=NAMESPACE)["status"]
        assert "spec.disablePowerOff" in status["message"], status
        assert "baremetal-operator would reboot it" in status["message"], status
        events = [
            e for e in client.list(Event, namespace=NAMESPACE)
            if e.involvedObject.kind == "Metal3Remediation" and e.involvedObject.name == victim
            and e.reason == names.REASON_CANNOT_REMEDIATE
        ]  # fmt: skip
        assert events, f"no {names.REASON_CANNOT_REMEDIATE} Event for {victim}"
        assert events[0].type == "Warning", events
        time.sleep(GRACE)  # and it stays so
        assert all(not reboot_keys(s.obj) for s in versions.seen), "a reboot annotation"
        assert len(commands(fleet, victim)) == before, "a power command to the refused host"
        power = {h.name: h.power for h in lab.status(lab_dir(fleet)).hosts}
        assert power[victim] == "on", power
    finally:
        lab.inject_fault(lab_dir(fleet), victim, "recover")
        client.patch(BareMetalHost, victim, {"spec": {"disablePowerOff": None}},
                     namespace=NAMESPACE, patch_type=PatchType.MERGE)  # fmt: skip
    wait(lambda: all_healthy(fleet), 180, f"{victim} Ready again, its remediation gone")
    assert_only_the_stand_in_powered(fleet)
