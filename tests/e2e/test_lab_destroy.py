"""Drydock's destroy_nodes end to end in the lab (docs/destroy.md): ``metalmend serve`` as
``lab up`` starts it, host-power of ``metalmend run`` doing the power, the lab's Redfish
emulator erasing drives (their content is files under the lab directory):

- a Redfish host wiped completely, with the service killed in the middle of its erases
  and the task finished by the restarted service, each erase started once;
- a Redfish host with ``--preserve-local-storage``: its OS drive erased, its data drive's
  content intact;
- an IPMI host reported as not wiped (its BMC cannot erase), its drives untouched.

worker-0 and worker-2 have Redfish BMCs, worker-1 IPMI (the lab's "mixed")."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube.resources.core_v1 import Event, Node

from metalmend.api.resources import BareMetalHost
from metalmend_lab import drives, lab
from metalmend_lab.hosts import NAMESPACE
from tests.support import Deadline

TASKS = "/drydock/api/v1.0/tasks"
ERASE_SECONDS = 4.0


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("lab"),
        node_monitor_grace_period=6.0,
        hosts=3,
        bmc="mixed",
        boot_delay=1.0,
        erase_seconds=ERASE_SECONDS,
        controllers="host-power",
    )
    with lab.started(options) as running:
        wait_for(lambda: len(list(running.client().list(Node))) == 3, "the three lab Nodes")
        yield running


def wait_for(check: Callable[[], object], what: str, within: float = 120.0) -> None:
    deadline = Deadline(within)
    while not check():
        assert not deadline.expired(), f"timed out waiting for {what}"
        time.sleep(0.2)


def lab_dir(running: lab.RunningLab) -> Path:
    return running.plane.workdir.parent


def endpoints(running: lab.RunningLab) -> dict[str, str]:
    data: dict[str, str] = json.loads((lab_dir(running) / "endpoints.json").read_text())
    return data


def call(running: lab.RunningLab, method: str, path: str, **kw: Any) -> httpx.Response:
    data = endpoints(running)
    return httpx.request(
        method, data["url"] + path, headers={"Authorization": f"Bearer {data['token']}"},
        verify=ssl.create_default_context(cafile=data["ca"]), timeout=30, **kw,
    )  # fmt: skip


def cli(running: lab.RunningLab, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "METALMEND_LAB_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "metalmend", "node", *args, "--dir", str(lab_dir(running))],
        capture_output=True, text=True, timeout=300, check=False, env=environ,
    )  # fmt: skip


def host(running: lab.RunningLab, name: str) -> Any:
    return running.client().get(BareMetalHost, name, namespace=NAMESPACE)


def drive_ids(running: lab.RunningLab, name: str) -> list[str]:
    assert running.hardware is not None
    spec = next(h for h in running.hardware.hosts if h.name == name)
    return [d.id for d in spec.drives]


def erases_started(running: lab.RunningLab, name: str) -> list[str]:
    """The drives of host ``name`` the emulator was asked to erase, once per erase."""
    ledger = drives.drives_dir(lab_dir(running)) / "tasks"
    found = [json.loads(p.read_text()) for p in ledger.glob("erase-*.json")]
    return sorted(t["drive"] for t in found if t["host"] == name)


def kill_and_wait_for_restart(running: lab.RunningLab) -> None:
    serve = running.extras["metalmend-serve"]
    old = serve.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)

    def answers() -> bool:
        running.check()  # what the lab supervisor's loop does: restart it
        try:
            return call(running, "GET", "/openapi.json").is_success
        except httpx.HTTPError:
            return False

    wait_for(answers, "metalmend serve restarted")
    assert serve.pid != old


def split(task: dict[str, Any], node: str) -> str:
    """Where a destroy's time went, from its messages' times: claim to powered off (the
    power-off wait: host-power's), to wiped (the erases), to released (host-power removing
    the reboot annotations, the provisioning state written)."""
    times = {}
    for entry in task["result"]["details"]["messageList"]:
        if entry["context"] == node:
            step = entry["message"].split(":", 1)[0]
            times[step] = dt.datetime.fromisoformat(entry["ts"].replace("Z", "+00:00"))
    first = min(times.values())
    marks = [(s, (times[s] - first).total_seconds()) for s in ("power-off", "wipe", "release")]
    return ", ".join(f"{s} done at {t:.1f} s" for s, t in marks if s in times)


def destroy_body(running: lab.RunningLab, node: str) -> dict[str, Any]:
    return {
        "action": "destroy_nodes",
        "design_ref": endpoints(running)["design_ref"],
        "node_filter": {"filter_set": [{"node_names": [node]}]},
    }


def test_a_redfish_host_is_wiped_completely_even_with_serve_killed_mid_erase(
    site: lab.RunningLab,
) -> None:
    started = time.monotonic()
    answer = call(site, "POST", TASKS, json=destroy_body(site, "worker-0"))
    assert answer.status_code == 201, answer.text
    task_id = answer.json()["task_id"]

    def erasing() -> bool:
        task = call(site, "GET", f"{TASKS}/{task_id}").json()
        return any(d["erase"] == "running" for d in task["nodes"]["worker-0"]["drives"])

    wait_for(erasing, "worker-0's erases running")
    at_kill = time.monotonic() - started
    kill_and_wait_for_restart(site)

    def complete() -> Any:
        task = call(site, "GET", f"{TASKS}/{task_id}").json()
        return task if task["status"] == "complete" else None

    wait_for(complete, "the task complete after the restart", within=180)
    task = complete()
    took = time.monotonic() - started
    print(
        f"destroy of worker-0: {took:.1f} s (serve killed at {at_kill:.1f} s);",
        split(task, "worker-0"),
    )
    assert task["result"]["status"] == "success", task["result"]
    for drive in drive_ids(site, "worker-0"):
        assert drives.content(lab_dir(site), "worker-0", drive) == [], drive
    assert erases_started(site, "worker-0") == sorted(drive_ids(site, "worker-0"))  # once each
    bmh = host(site, "worker-0")
    assert bmh["spec"]["online"] is False
    assert bmh["status"]["poweredOn"] is False
    assert bmh["status"]["provisioning"]["state"] == "available"
    assert "consumerRef" not in bmh["spec"]
    assert not [k for k in bmh.metadata.annotations or {} if k.startswith("reboot.metal3.io")]
    story = {
        e.reason
        for e in site.client().list(Event, namespace=NAMESPACE)
        if e.involvedObject.name == "worker-0"
    }
    expected = {"DestroyStarted", "DestroyPowerOff", "DestroyPoweredOff", "DestroyWipePlanned",
                "DriveEraseStarted", "DriveErased", "DestroyReleasing", "DestroyReleased"}  # fmt: skip
    assert expected <= story, story


def test_preserve_local_storage_erases_the_os_drive_and_keeps_the_data_drive(
    site: lab.RunningLab,
) -> None:
    before = {d: drives.content(lab_dir(site), "worker-2", d) for d in drive_ids(site, "worker-2")}
    started = time.monotonic()
    done = cli(site, "destroy", "worker-2", "--preserve-local-storage")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr + done.stdout
    task = call(site, "GET", TASKS).json()[0]  # the newest
    print(f"destroy of worker-2 (preserve): {took:.1f} s;", split(task, "worker-2"))
    assert "success" in done.stdout
    assert "worker-2: wipe: erasing /dev/sda" in done.stderr  # progress as it ran
    assert drives.content(lab_dir(site), "worker-2", drives.OS_DRIVE) == []
    for drive, files in before.items():
        if drive != drives.OS_DRIVE:
            assert files
            assert drives.content(lab_dir(site), "worker-2", drive) == files, drive
    assert erases_started(site, "worker-2") == [drives.OS_DRIVE]


def test_an_ipmi_host_is_reported_not_wiped(site: lab.RunningLab) -> None:
    before = {d: drives.content(lab_dir(site), "worker-1", d) for d in drive_ids(site, "worker-1")}
    done = cli(site, "destroy", "worker-1")
    assert done.returncode == 1, done.stderr + done.stdout
    assert "failure" in done.stdout
    assert "drives NOT wiped" in done.stdout
    for drive, files in before.items():
        assert drives.content(lab_dir(site), "worker-1", drive) == files
    bmh = host(site, "worker-1")
    assert bmh["status"]["provisioning"]["state"] == "provisioned"  # not released
    assert bmh["status"]["poweredOn"] is False  # but powered off


def test_the_cli_prints_a_refusal_as_a_status(site: lab.RunningLab) -> None:
    done = cli(site, "destroy", "no-such-node")
    assert done.returncode == 1, done.stderr + done.stdout
    assert "Error: Node no-such-node is not discoverable: no such Node" in done.stdout
    assert "Reason: NotFound" in done.stdout
