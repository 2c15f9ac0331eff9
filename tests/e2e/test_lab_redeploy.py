"""Site actions end to end in a lab (docs/site-actions.md): the lab's design put, committed
and deployed (tagged), then worker-1, a site etcd member, redeployed with
``preserve-local-storage=true`` through ``metalmend serve`` as ``lab up`` starts it, with
the service killed (SIGKILL, restarted by the lab) as each step starts. The action
finishes with nothing lost and nothing done twice that would hurt: one Drydock task, one
erase of the OS drive and none of the data drive, the member removed once and added back
once, the Node back Ready with the design's labels, the story in Events."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from lightkube.resources.core_v1 import Event, Node, Pod

from metalmend.teardown.etcd.client import EtcdClient
from metalmend_lab import drives, lab, siteetcd
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.test_lab_provision import hardware, lab_dir, wait_for
from tests.support import Deadline

SHIPYARD = "/shipyard/api/v1.0"
TARGET = "worker-1"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("lab"),
        node_monitor_grace_period=6.0,
        hosts=3,
        bmc="redfish",
        boot_delay=1.0,
        erase_seconds=2.0,
        controllers="host-power",
        provision_delay=2.0,
    )
    with lab.started(options) as running:
        wait_for(lambda: ready(running) == 3, "the three lab Nodes Ready", running=running)
        yield running


def ready(running: lab.RunningLab, name: str | None = None) -> int:
    count = 0
    for node in running.client().list(Node):
        if name is not None and node.metadata.name != name:
            continue
        conditions = (node.status.conditions if node.status else None) or []
        count += any(c.type == "Ready" and c.status == "True" for c in conditions)
    return count


def call(
    running: lab.RunningLab, method: str, path: str, headers: dict[str, str] | None = None,
    **kw: Any,
) -> httpx.Response:  # fmt: skip
    data = json.loads((lab_dir(running) / "endpoints.json").read_text())
    return httpx.request(
        method, data["url"] + path,
        headers={"Authorization": f"Bearer {data['token']}", **(headers or {})},
        verify=ssl.create_default_context(cafile=data["ca"]), timeout=60, **kw,
    )  # fmt: skip


def action(running: lab.RunningLab, action_id: str) -> dict[str, Any]:
    found: dict[str, Any] = call(running, "GET", f"{SHIPYARD}/actions/{action_id}").json()
    return found


def serving(running: lab.RunningLab) -> bool:
    running.check()
    try:
        return call(running, "GET", "/openapi.json").is_success
    except httpx.HTTPError:
        return False


def kill_serve(running: lab.RunningLab) -> None:
    serve = running.extras["metalmend-serve"]
    old = serve.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: serving(running) and serve.pid != old, "metalmend serve restarted")


def run_to_end(
    running: lab.RunningLab, action_id: str, kill_in: tuple[str, ...] = (), within: float = 600
) -> tuple[dict[str, Any], list[str]]:
    """Follow an action to its end, killing the service the first time each of
    ``kill_in`` is seen running; the action as it ended, and the steps killed in."""
    killed: list[str] = []
    deadline = Deadline(within)
    while True:
        assert not deadline.expired(), stuck(running, action_id, within)
        try:
            found = action(running, action_id)
        except httpx.HTTPError:
            running.check()
            time.sleep(0.2)
            continue
        if found["action_lifecycle"] in ("Complete", "Failed"):
            return found, killed
        running_steps = [s["id"] for s in found["steps"] if s["state"] == "running"]
        for step in running_steps:
            if step in kill_in and step not in killed:
                killed.append(step)
                kill_serve(running)
        time.sleep(0.1)


def stuck(running: lab.RunningLab, action_id: str, within: float) -> str:
    """What an action that did not end within its deadline was waiting for: its steps
    and last notes, the pods of the target Node, and the end of serve's log."""
    lines = [f"action {action_id} did not end within {within:g} s"]
    try:
        found = action(running, action_id)
        lines += [f"  step {s['id']}: {s['state']}" for s in found.get("steps", [])]
        notes = call(running, "GET", f"{SHIPYARD}/actions/{action_id}").json().get("notes", [])
        lines += [f"  note: {n}" for n in notes[-10:]]
    except (httpx.HTTPError, ValueError) as error:
        lines.append(f"  (the action could not be read: {error})")
    for pod in running.client().list(Pod, namespace="*", fields={"spec.nodeName": TARGET}):
        status = pod.status.phase if pod.status else "?"
        deleting = " (being deleted)" if pod.metadata.deletionTimestamp else ""
        lines.append(f"  pod on {TARGET}: {pod.metadata.namespace}/{pod.metadata.name}"
                     f" {status}{deleting}")  # fmt: skip
    log = lab_dir(running) / "metalmend-serve.log"
    if log.exists():
        tail = [x for x in log.read_text(errors="replace").splitlines() if "alembic" not in x]
        lines += ["  serve's log, last lines:", *(f"    {x[:300]}" for x in tail[-25:])]
    return "\n".join(lines)


def create(running: lab.RunningLab, name: str, **parameters: str) -> str:
    answer = call(
        running, "POST", f"{SHIPYARD}/actions", json={"name": name, "parameters": parameters}
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def erases(running: lab.RunningLab, host: str) -> list[str]:
    ledger = drives.drives_dir(lab_dir(running)) / "tasks"
    found = [json.loads(p.read_text()) for p in ledger.glob("erase-*.json")]
    return sorted(t["drive"] for t in found if t["host"] == host)


def data_files(running: lab.RunningLab, host: str) -> dict[str, list[str]]:
    root = drives.drives_dir(lab_dir(running)) / host
    return {
        d.name: sorted(p.name for p in d.rglob("*") if p.is_file())
        for d in sorted(root.iterdir())
        if d.is_dir() and d.name != "os"
    }


async def member_list(running: lab.RunningLab) -> list[Any]:
    plan = siteetcd.SitePlan.read(siteetcd.plan_path(lab_dir(running)))
    assert plan is not None
    async with EtcdClient() as client:
        return await client.member_list(plan.members[0].client_url)


@pytest.mark.long
@pytest.mark.timeout(900)  # a loaded machine: the test's own deadlines speak first
def test_deploy_the_design_then_redeploy_a_member_with_serve_killed_in_every_step(
    site: lab.RunningLab,
) -> None:
    design = lab.site_design(lab_dir(site))
    put = call(site, "POST", f"{SHIPYARD}/configdocs/site", content=design,
               headers={"Content-Type": "application/x-yaml"})  # fmt: skip
    assert put.status_code == 201, put.text
    assert call(site, "POST", f"{SHIPYARD}/commitconfigdocs").status_code == 200
    deployed, _ = run_to_end(site, create(site, "deploy_site"), within=180)
    assert deployed["action_lifecycle"] == "Complete", deployed

    kept = data_files(site, TARGET)
    assert any(kept.values()), "the lab seeds files on every data drive"
    steps = ("preflight", "design_lookup", "validation", "decommission", "destroy",
             "remove_from_cluster", "deploy_server")  # fmt: skip
    started = time.monotonic()
    redeploy = create(
        site, "redeploy_server", target_nodes=TARGET, **{"preserve-local-storage": "true"}
    )
    done, killed = run_to_end(site, redeploy, kill_in=steps)
    took = time.monotonic() - started
    print(f"redeploy of {TARGET}: {took:.1f} s, serve killed in {', '.join(killed)}")
    assert done["action_lifecycle"] == "Complete", json.dumps(done, indent=1)[-3000:]
    assert {"decommission", "destroy", "deploy_server"} <= set(killed)
    assert done["design_revision"] == 1  # the revision deploy_site tagged

    # nothing done twice that would hurt: one task, one erase of the OS drive only
    tasks = call(site, "GET", "/drydock/api/v1.0/tasks").json()
    assert len(tasks) == 1
    assert erases(site, TARGET) == ["os"]  # the OS drive's Redfish Id
    assert data_files(site, TARGET) == kept

    # the server back: Ready, labelled as the design says, its etcd member back
    wait_for(lambda: ready(site, TARGET) == 1, f"{TARGET} Ready", running=site)
    node = site.client().get(Node, TARGET)
    assert node.spec.unschedulable is not True
    listed = asyncio.run(member_list(site))
    assert sorted(m.name for m in listed) == ["worker-0", "worker-1", "worker-2"]
    wait_for(lambda: hardware(site, TARGET)["etcd"] == "running", f"{TARGET}'s member")

    reasons = {e.reason for e in site.client().list(Event, namespace=NAMESPACE)}
    assert {"ShipyardDecommission", "ShipyardDestroy", "ShipyardDeployServer"} <= reasons
