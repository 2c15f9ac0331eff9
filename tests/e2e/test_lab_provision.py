"""A destroyed lab server brought back, as redeploy_server's deploy_server does it
(docs/site-actions.md), against the lab's provisioner (lab.provisioner), host-power
(``metalmend run``), the kubelet simulators and the site etcd:

- worker-0 (a site etcd member) decommissioned and destroyed through ``metalmend serve``
  (kubelet disabled, member removed, OS drive wiped), then its design documents from
  ``metalmend lab design`` applied as deploy_server applies them: provisioning ->
  provisioned, powered on, its Node Ready with a kubelet no longer disabled; its etcd
  member stays stopped (never a cluster of its own) until metalmend's MemberAdd, then
  rejoins;
- worker-2's OS drive wiped under it and the host made available: the provisioner is
  killed in the middle of provisioning it, restarted by the lab, and finishes.

Every host speaks Redfish (only a Redfish BMC erases drives)."""

from __future__ import annotations

import asyncio
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
import yaml
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost, Machine
from metalmend.siteactions.policy.redeploy import host_documents
from metalmend.teardown.etcd import members
from metalmend.teardown.etcd.client import EtcdClient
from metalmend.teardown.etcd.design import from_documents
from metalmend_lab import drives, lab, provisioner, siteetcd
from metalmend_lab.hosts import NAMESPACE
from metalmend_lab.osdrive import OsDrive
from tests.support import Deadline

PROMENADE = "/promenade/api/v1.0"
TIMEOUTS = (
    "drain-node-timeout=60&drain-node-grace-period=5&clear-labels-timeout=30"
    "&remove-etcd-timeout=30&etcd-ready-timeout=30"
)
PROVISION_DELAY = 4.0  # long enough to kill the provisioner in the middle


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
        provision_delay=PROVISION_DELAY,
    )
    with lab.started(options) as running:
        wait_for(lambda: ready_nodes(running) == 3, "the three lab Nodes Ready")
        yield running


def wait_for(
    check: Callable[[], object], what: str, within: float = 120.0, running: Any = None
) -> None:
    deadline = Deadline(within)
    while not check():
        assert not deadline.expired(), f"timed out waiting for {what}"
        if running is not None:
            running.check()  # the lab supervisor's loop: restarts what died
        time.sleep(0.2)


def lab_dir(running: lab.RunningLab) -> Path:
    return running.plane.workdir.parent


def ready_nodes(running: lab.RunningLab) -> int:
    count = 0
    for node in running.client().list(Node):
        conditions = (node.status.conditions if node.status else None) or []
        count += any(c.type == "Ready" and c.status == "True" for c in conditions)
    return count


def node_ready(running: lab.RunningLab, name: str) -> bool:
    found = [n for n in running.client().list(Node) if n.metadata and n.metadata.name == name]
    conditions = (found[0].status.conditions if found and found[0].status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def hardware(running: lab.RunningLab, name: str) -> dict[str, Any]:
    report: dict[str, dict[str, Any]] = json.loads(
        (lab_dir(running) / "hardware" / "status.json").read_text()
    )
    return report[name]


def bmh(running: lab.RunningLab, name: str) -> Any:
    return running.client().get(BareMetalHost, name, namespace=NAMESPACE)


def provisioning_state(running: lab.RunningLab, name: str) -> str:
    return str(((bmh(running, name).status or {}).get("provisioning") or {}).get("state"))


def serve(running: lab.RunningLab, method: str, path: str, **kw: Any) -> httpx.Response:
    data = json.loads((lab_dir(running) / "endpoints.json").read_text())
    return httpx.request(
        method, data["url"] + path, headers={"Authorization": f"Bearer {data['token']}"},
        verify=ssl.create_default_context(cafile=data["ca"]), timeout=300, **kw,
    )  # fmt: skip


def metalmend(running: lab.RunningLab, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "METALMEND_LAB_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "metalmend", *args, "--dir", str(lab_dir(running))],
        capture_output=True, text=True, timeout=300, check=False, env=environ,
    )  # fmt: skip


def site_design(running: lab.RunningLab) -> list[Any]:
    """What ``metalmend lab design`` prints: the documents a design store bucket takes."""
    done = metalmend(running, "lab", "design")
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


def apply_host(running: lab.RunningLab, documents: list[Any], name: str) -> None:
    """deploy_server's apply phase: the design's BareMetalHost and Machine, server-side
    applied with its field manager, forcing conflicts (destroy wrote online: false)."""
    wanted = host_documents(documents, name)
    client = running.client()
    for obj in wanted.objects:
        kind = BareMetalHost if obj["kind"] == "BareMetalHost" else Machine
        client.apply(kind.from_dict(dict(obj)), field_manager="metalmend-shipyard", force=True)


def states_seen(running: lab.RunningLab, name: str, until: str, within: float) -> list[str]:
    """The host's provisioning states, in order, until ``until`` (polled every 0.1 s)."""
    seen: list[str] = []
    deadline = Deadline(within)
    while not seen or seen[-1] != until:
        assert not deadline.expired(), f"{name} not {until} within {within:g}s: {seen}"
        state = provisioning_state(running, name)
        if not seen or seen[-1] != state:
            seen.append(state)
        time.sleep(0.1)
    return seen


async def member_list(running: lab.RunningLab) -> list[Any]:
    site = siteetcd.SitePlan.read(siteetcd.plan_path(lab_dir(running)))
    assert site is not None
    async with EtcdClient() as client:
        return await client.member_list(site.members[1].client_url)


@pytest.mark.long
async def test_a_destroyed_etcd_host_is_provisioned_boots_and_rejoins_etcd(
    site: lab.RunningLab,
) -> None:
    documents = site_design(site)
    etcd = from_documents(documents, "metalmend lab design")
    answer = serve(
        site, "POST", f"{PROMENADE}/nodes/worker-0/decommission?{TIMEOUTS}",
        json={"rel": "design", "href": lab.LabState.read(lab_dir(site)).design_ref,  # type: ignore[union-attr]
              "type": "application/x-yaml"},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert hardware(site, "worker-0")["kubelet"] == "disabled"
    assert OsDrive.of(lab_dir(site), "worker-0").kubelet_disabled
    assert sorted(m.name for m in await member_list(site)) == ["worker-1", "worker-2"]
    destroyed = metalmend(site, "node", "destroy", "worker-0", "--preserve-local-storage")
    assert destroyed.returncode == 0, destroyed.stderr + destroyed.stdout
    assert OsDrive.of(lab_dir(site), "worker-0").installed() is None
    removed = serve(site, "POST", f"{PROMENADE}/nodes/worker-0/remove-from-cluster")
    assert removed.status_code == 200, removed.text
    assert provisioning_state(site, "worker-0") == "available"

    started = time.monotonic()
    apply_host(site, documents, "worker-0")
    seen = states_seen(site, "worker-0", "provisioned", within=60)
    provisioned = time.monotonic() - started
    # "available" was read just before the apply; under load the provisioner may have
    # moved on before the first look after it
    assert seen in (["available", "provisioning", "provisioned"], ["provisioning", "provisioned"])
    host = bmh(site, "worker-0")
    assert host.status["provisioning"]["image"] == host.spec["image"]
    assert OsDrive.of(lab_dir(site), "worker-0").installed() == host.spec["image"]["url"]
    wait_for(lambda: bmh(site, "worker-0").status.get("poweredOn") is True, "worker-0 on")
    wait_for(lambda: node_ready(site, "worker-0"), "worker-0's Node Ready again")
    ready = time.monotonic() - started
    # no longer disabled; the hardware report is written every 0.2 s, so wait for it
    wait_for(lambda: hardware(site, "worker-0")["kubelet"] == "running", "worker-0 running", 30)

    # Back, but not in the cluster: its member waits for a MemberAdd, never founding a
    # cluster of its own from its empty data directory.
    await asyncio.sleep(2)
    assert hardware(site, "worker-0")["etcd"] == "waiting"
    assert sorted(m.name for m in await member_list(site)) == ["worker-1", "worker-2"]
    data = Path(next(m.data_dir for m in etcd_plan(site).members if m.host == "worker-0"))
    assert not siteetcd.has_data(data)

    requested: list[str] = []

    async def on_request(cluster: str) -> None:
        requested.append(cluster)

    async def quiet(line: str) -> None:
        del line

    [outcome] = await members.add_member(
        etcd, "worker-0", members.AddHooks(on_request, quiet), timeout=60, poll=0.5
    )
    rejoined = time.monotonic() - started
    assert outcome.ok, outcome.lines
    assert requested == [siteetcd.CLUSTER]
    listed = await member_list(site)
    assert sorted(m.name for m in listed) == ["worker-0", "worker-1", "worker-2"]
    wait_for(lambda: hardware(site, "worker-0")["etcd"] == "running", "worker-0's member")
    assert siteetcd.has_data(data)
    print(
        f"worker-0 back: provisioned {provisioned:.1f} s, Node Ready {ready:.1f} s,"
        f" etcd member rejoined {rejoined:.1f} s after its documents were applied"
    )


def etcd_plan(running: lab.RunningLab) -> siteetcd.SitePlan:
    site = siteetcd.SitePlan.read(siteetcd.plan_path(lab_dir(running)))
    assert site is not None
    return site


def test_the_provisioner_killed_mid_provisioning_finishes_once_restarted(
    site: lab.RunningLab,
) -> None:
    documents = site_design(site)
    written = lab_dir(site) / "site-design.yaml"
    done = metalmend(site, "lab", "design", "--output", str(written))
    assert done.returncode == 0, done.stderr
    assert list(yaml.safe_load_all(written.read_text())) == documents
    client = site.client()
    # What destroy leaves, done under the running host: its OS drive wiped, the host
    # released (available, no image). The host stays on: its kubelet has no OS to boot.
    drives._empty(drives.os_drive_dir(lab_dir(site), "worker-2"))
    client.patch(
        BareMetalHost, "worker-2", {"spec": {"image": None, "consumerRef": None}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip
    client.patch(
        BareMetalHost.Status, "worker-2", {"status": {"provisioning": {"state": "available"}}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip
    wait_for(lambda: hardware(site, "worker-2")["kubelet"] == "no-os", "worker-2 without an OS")
    time.sleep(1.5)  # the provisioner leaves a host without an image alone
    assert provisioning_state(site, "worker-2") == "available"

    apply_host(site, documents, "worker-2")
    wait_for(lambda: provisioning_state(site, "worker-2") == "provisioning", "provisioning")
    component = site.extras[provisioner.COMPONENT]
    old = component.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(
        lambda: provisioning_state(site, "worker-2") == "provisioned",
        "worker-2 provisioned by the restarted provisioner",
        within=60,
        running=site,
    )
    took = time.monotonic() - killed
    assert component.pid != old
    assert site.state.restarts[provisioner.COMPONENT] == 1
    assert took >= PROVISION_DELAY  # the restarted one wrote the OS, then waited its delay
    image = bmh(site, "worker-2").spec["image"]
    assert OsDrive.of(lab_dir(site), "worker-2").installed() == image["url"]
    wait_for(lambda: node_ready(site, "worker-2"), "worker-2's Node Ready")
    print(f"worker-2 provisioned {took:.1f} s after the provisioner was killed")
    # Its member's data went with the wipe while the cluster still lists it as started:
    # it must be removed and added again, so it stays stopped.
    wait_for(lambda: hardware(site, "worker-2")["etcd"] == "waiting", "worker-2's member")
