"""``make demo-site``: site actions in a lab (docs/site-actions.md), live and with times.

The lab's design is put into the configdocs buffer, committed and deployed (``deploy_site``,
tagged ``site-action-success``). A StatefulSet pod behind a PodDisruptionBudget runs on
worker-1, which also holds a site etcd member; worker-1 is redeployed with
``preserve-local-storage=true`` and everything that happens to it is shown as it happens:
the action's notes and what the lab itself shows (the pod moved, the member gone with
quorum kept, the kubelet stopped, the host off, the OS drive wiped and the data drive
kept, the Node removed, the server provisioned, on and Ready again, its member back).
Then two commits pile up: ``deploy_site`` is refused, and accepted with
``allow-intermediate-commits=true``. Last, the timeline as a table and a picture.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import ApiError, Client
from lightkube.models.apps_v1 import StatefulSetSpec
from lightkube.models.core_v1 import (
    Affinity,
    Container,
    NodeAffinity,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodSpec,
    PodTemplateSpec,
    PreferredSchedulingTerm,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend.api.resources import BareMetalHost
from metalmend.teardown.etcd.client import EtcdClient
from metalmend_lab import drives, lab, siteetcd, sitetimeline
from metalmend_lab.hosts import NAMESPACE
from metalmend_lab.inventory import status_path

SHIPYARD = "/shipyard/api/v1.0"
TARGET = "worker-1"
WORKLOAD = "shop"
POLL = 0.25


# Seconds the lab's BMCs take to carry out a power change. Without it, sushy-tools' fake
# driver lands each change 1-11 s after the command, at random: the 3-11 s that showed
# between destroy's start and the host off (metalmend's part of it: under half a second).
REDFISH_POWER_DELAY = 3.0


def lab_options(lab_dir: Path) -> lab.LabOptions:
    return lab.LabOptions(
        lab_dir=lab_dir, node_monitor_grace_period=8.0, hosts=4, bmc="redfish",
        boot_delay=2.0, erase_seconds=3.0, provision_delay=2.0,
        redfish_power_delay=REDFISH_POWER_DELAY,
    )  # fmt: skip


def run_site_demo(lab_dir: Path, out: Console, keep: bool = False) -> None:
    out.rule("[bold]metalmend site demo")
    out.print("Starting the lab: control plane, four Redfish servers with kubelets, a 3-member")
    out.print("site etcd on worker-0..2, `metalmend run` and `metalmend serve`...")
    with lab.stop_requested() as stop, lab.started(lab_options(lab_dir)) as running:
        site = Site(running)
        site.wait(lambda: site.ready_nodes() == 4, 120)
        out.print(f"[green]ready[/green] in {running.state.started_in_seconds:.1f}s")
        deploy_design(site, out)
        start_workload(site, out)
        result = redeploy(site, out)
        intermediate_commits(site, out)
        show_timeline(result, out, lab_dir)
        out.rule("[bold]done")
        if keep:
            out.print(f"The lab keeps running: kubectl --kubeconfig {running.kubeconfig} ...")
            while not stop.wait(0.5):
                running.check()
    out.print("lab stopped; nothing left running")


@dataclass
class Site:
    running: lab.RunningLab
    client: Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = self.running.client()

    @property
    def lab_dir(self) -> Path:
        return self.running.plane.workdir.parent

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        data = json.loads((self.lab_dir / "endpoints.json").read_text())
        headers = {"Authorization": f"Bearer {data['token']}", **kw.pop("headers", {})}
        trust = ssl.create_default_context(cafile=data["ca"])
        return httpx.request(
            method, data["url"] + SHIPYARD + path, headers=headers, verify=trust, timeout=60, **kw
        )

    def action(self, action_id: str) -> dict[str, Any]:
        while True:
            try:
                found: dict[str, Any] = self.call("GET", f"/actions/{action_id}").json()
                return found
            except httpx.HTTPError:  # the service restarting: ask again
                self.running.check()
                time.sleep(POLL)

    def wait(self, check: Any, within: float) -> None:
        deadline = time.monotonic() + within
        while not check():
            if time.monotonic() > deadline:
                raise lab.LabError(f"not done within {within:.0f}s")
            self.running.check()
            time.sleep(POLL)

    def ready_nodes(self) -> int:
        return sum(_ready(n) for n in self.client.list(Node))

    def hardware(self) -> dict[str, Any]:
        try:
            found: dict[str, Any] = json.loads(status_path(self.lab_dir).read_text())
            return found
        except (OSError, ValueError):
            return {}


def _ready(node: Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def step(out: Console, title: str) -> None:
    out.print()
    out.rule(f"[bold]{title}", align="left")


def show_status(out: Console, answer: httpx.Response) -> None:
    document = answer.json()
    colour = "green" if answer.status_code < 400 else "red"
    out.print(
        f"[{colour}]HTTP {answer.status_code}[/{colour}] {escape(str(document.get('message')))}"
    )
    if answer.status_code >= 400:
        out.print(f"Reason: {escape(str(document.get('reason')))}")


def follow(site: Site, out: Console, action_id: str, extra: Any = None) -> dict[str, Any]:
    """Print each note as it is stored (and ``extra``'s lines), until the action ends."""
    printed: set[tuple[str, str]] = set()
    while True:
        found = site.action(action_id)
        for entry in found["steps"]:
            for note in entry["notes"]:
                key = (note["note_timestamp"], note["note_val"])
                if key not in printed:
                    printed.add(key)
                    stamp = key[0][11:23]
                    out.print(
                        f"{stamp}  [cyan]{escape(entry['id']):20}[/cyan] {escape(key[1])}",
                        highlight=False,
                    )
        if extra is not None:
            extra()
        if found["action_lifecycle"] in ("Complete", "Failed"):
            out.print(f"action {action_id}: [bold]{found['action_lifecycle']}[/bold]")
            return found
        time.sleep(POLL)


def deploy_design(site: Site, out: Console) -> None:
    step(out, "1. The design: put into the buffer, committed, deployed, tagged")
    design = lab.site_design(site.lab_dir)
    answer = site.call("POST", "/configdocs/site", content=design,
                       headers={"Content-Type": "application/x-yaml"})  # fmt: skip
    show_status(out, answer)
    show_status(out, site.call("POST", "/commitconfigdocs"))
    answer = site.call("POST", "/actions", json={"name": "deploy_site"})
    out.print(f"deploy_site: action {answer.json()['id']}")
    follow(site, out, answer.json()["id"])


def start_workload(site: Site, out: Console) -> None:
    step(out, f"2. A StatefulSet behind a PodDisruptionBudget, on {TARGET} (an etcd member)")
    labels = {"app": "db"}
    prefer = PreferredSchedulingTerm(
        weight=100,
        preference=NodeSelectorTerm(
            matchExpressions=[
                NodeSelectorRequirement(
                    key="kubernetes.io/hostname", operator="In", values=[TARGET]
                )
            ]
        ),
    )
    site.client.create(
        StatefulSet(
            metadata=ObjectMeta(name="db", namespace=NAMESPACE),
            spec=StatefulSetSpec(
                serviceName="db", replicas=1, selector=LabelSelector(matchLabels=labels),
                template=PodTemplateSpec(
                    metadata=ObjectMeta(labels=labels),
                    spec=PodSpec(
                        containers=[Container(name="db", image="example.org/db:1")],
                        affinity=Affinity(nodeAffinity=NodeAffinity(
                            preferredDuringSchedulingIgnoredDuringExecution=[prefer])),
                    ),
                ),
            ),
        )
    )  # fmt: skip
    site.client.create(
        PodDisruptionBudget(
            metadata=ObjectMeta(name="db", namespace=NAMESPACE),
            spec=PodDisruptionBudgetSpec(
                maxUnavailable=1, selector=LabelSelector(matchLabels=labels)
            ),
        )
    )
    site.wait(lambda: pod_node(site) == TARGET, 60)
    out.print(f"db-0 Running on {TARGET}; PodDisruptionBudget db: maxUnavailable 1")


def pod_node(site: Site) -> str | None:
    try:
        pod = site.client.get(Pod, "db-0", namespace=NAMESPACE)
    except ApiError:
        return None
    running = pod.status is not None and pod.status.phase == "Running"
    leaving = pod.metadata is not None and pod.metadata.deletionTimestamp is not None
    return pod.spec.nodeName if running and pod.spec and not leaving else None


@dataclass
class Redeploy:
    created: dt.datetime
    action: dict[str, Any]
    steps: list[sitetimeline.StepSpan]
    marks: dict[str, float]


def redeploy(site: Site, out: Console, target: str = TARGET) -> Redeploy:
    step(out, f"3. redeploy_server {target} with preserve-local-storage=true, live")
    plan = siteetcd.SitePlan.read(siteetcd.plan_path(site.lab_dir))
    assert plan is not None
    witness = next(m.client_url for m in plan.members if m.host != target)
    data_before = data_files(site, target)
    since = time.time()
    body = {"name": "redeploy_server",
            "parameters": {"target_nodes": target, "preserve-local-storage": "true"}}  # fmt: skip
    created_mono = time.monotonic()
    answer = site.call("POST", "/actions", json=body)
    action_id = answer.json()["id"]
    created = dt.datetime.fromisoformat(answer.json()["datetime"].replace("Z", "+00:00"))
    out.print(f"redeploy_server: action {action_id}")
    marks: dict[str, float] = {}
    labels = {m.name: m.label for m in sitetimeline.MILESTONES}

    def observe() -> None:
        facts = milestone_facts(site, target, witness, data_before, since)
        now = time.monotonic() - created_mono
        for name, at in sitetimeline.due(marks, facts, now).items():
            if name == "power_off_sent" and (sent := power_off_at(site.lab_dir, target, since)):
                at = min(at, sent - since)  # the journal's own time, not this round's
            marks[name] = at
            out.print(f"{'':12}  [bold magenta]+{at:6.2f}s  {escape(labels[name])}[/bold magenta]")

    found = follow(site, out, action_id, observe)

    def back() -> bool:
        observe()
        return "member_back" in marks

    site.wait(back, 60)
    details = [
        site.call("GET", f"/actions/{action_id}/steps/{s['id']}").json() for s in found["steps"]
    ]
    return Redeploy(created, found, sitetimeline.spans(created, details), marks)


def data_files(site: Site, target: str) -> int:
    root = drives.drives_dir(site.lab_dir) / target
    return sum(
        1
        for d in root.iterdir()
        if d.is_dir() and d.name != "os"
        for p in d.rglob("*")
        if p.is_file()
    )


def os_files(site: Site, target: str) -> int:
    root = drives.drives_dir(site.lab_dir) / target / "os"
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def power_commands(lab_dir: Path, host: str) -> list[tuple[float, str]]:
    """The power commands the host's BMC accepted, with their arrival times (the lab
    emulator's journal, ``<lab>/hardware/<host>.commands``)."""
    try:
        lines = (lab_dir / "hardware" / f"{host}.commands").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        at, _, action = line.partition(" ")
        try:
            found.append((float(at), action))
        except ValueError:
            continue
    return found


def power_off_at(lab_dir: Path, host: str, since: float) -> float | None:
    """When the host's BMC first accepted a power-off since ``since`` (None: not yet)."""
    offs = [at for at, action in power_commands(lab_dir, host) if at >= since and "off" in action]
    return min(offs, default=None)


def milestone_facts(
    site: Site, target: str, witness: str, data_before: int, since: float = 0.0
) -> dict[str, bool]:
    hardware = site.hardware().get(target, {})
    status: dict[str, Any] = {}
    try:
        host = site.client.get(BareMetalHost, target, namespace=NAMESPACE)
        status = host.status if isinstance(host.status, dict) else {}
    except ApiError:
        pass
    nodes = {n.metadata.name: n for n in site.client.list(Node) if n.metadata}
    members = asyncio.run(member_names(witness))
    provisioning = (status.get("provisioning") or {}).get("state")
    os_now = os_files(site, target)
    return {
        "pod_moved": pod_node(site) not in (None, target),
        "member_left": members is not None and target not in members,
        "kubelet_stopped": hardware.get("kubelet") in ("disabled", "off"),
        "power_off_sent": power_off_at(site.lab_dir, target, since) is not None,
        "host_off": status.get("poweredOn") is False,
        "os_wiped": os_now == 0 and data_files(site, target) == data_before,
        "node_removed": target not in nodes,
        # The host was "provisioned" before the destroy too, and stays so through the wipe:
        # what says the OS was written again is the OS drive holding files after its wipe.
        "provisioned": provisioning == "provisioned" and os_now > 0,
        "host_on": status.get("poweredOn") is True,
        "node_ready": target in nodes and _ready(nodes[target]),
        "member_back": members is not None
        and target in members
        and hardware.get("etcd") == "running",
    }


async def member_names(url: str) -> set[str] | None:
    try:
        async with EtcdClient() as client:
            return {m.name for m in await client.member_list(url)}
    except Exception:  # the witness busy or a member restarting: no fact this time
        return None


def intermediate_commits(site: Site, out: Console) -> None:
    step(out, "4. Two commits pile up: deploy_site refused, then allowed")
    documents = list(yaml.safe_load_all(lab.site_design(site.lab_dir)))
    node = next(d for d in documents if d and (d.get("data") or {}).get("kind") == "Node")
    for n in (1, 2):
        node["data"]["metadata"].setdefault("labels", {})["rack"] = f"r{n}"  # a change to commit
        changed = yaml.safe_dump_all(documents)
        site.call(
            "POST",
            "/configdocs/site",
            content=changed,
            headers={"Content-Type": "application/x-yaml"},
        )
        show_status(out, site.call("POST", "/commitconfigdocs"))
    refused = site.call("POST", "/actions", json={"name": "deploy_site"})
    show_status(out, refused)
    allowed = site.call("POST", "/actions", json={"name": "deploy_site"},
                        params={"allow-intermediate-commits": "true"})  # fmt: skip
    answered = allowed.json()["id"]
    out.print(
        f"with allow-intermediate-commits=true: HTTP {allowed.status_code}, action {answered}"
    )
    follow(site, out, allowed.json()["id"])


def show_timeline(result: Redeploy, out: Console, lab_dir: Path) -> None:
    step(out, "5. The redeploy's timeline, and who spent the time")
    table = Table("since start", "step", "took", "who")
    for span in result.steps:
        table.add_row(
            f"{span.start:7.2f}s",
            span.name,
            f"{span.end - span.start:6.2f}s",
            sitetimeline.owner(span.name),
        )
    out.print(table)
    marks = Table("since start", "what the lab shows")
    labels = {m.name: m.label for m in sitetimeline.MILESTONES}
    for name, at in sorted(result.marks.items(), key=lambda item: item[1]):
        marks.add_row(f"{at:7.2f}s", labels[name])
    out.print(marks)
    configured = configured_waits(lab_options(lab_dir))
    parts = sitetimeline.split(result.steps, configured)
    own = f"[bold green]metalmend {parts['metalmend']:.2f}s[/bold green]"
    out.print(
        f"total {result.steps[-1].end:.2f}s: {own}"
        f" + configured waits {parts['configured']:.2f}s"
        f" + hardware and Kubernetes {parts['hardware and Kubernetes']:.2f}s"
    )
    picture = Path(".lab") / "demo-redeploy.svg"
    picture.parent.mkdir(exist_ok=True)
    picture.write_text(
        sitetimeline.svg(
            result.steps, result.marks, f"metalmend: redeploy_server {TARGET}", configured
        )
    )
    out.print(f"timeline picture: {picture}")


def configured_waits(options: lab.LabOptions) -> dict[str, float]:
    """The lab's configured waits inside each step: the kubelet-stopped window
    (decommission), the BMC's power-off and the erase time (destroy), the provisioning
    delay or the BMC's power-on, whichever is longer (the image is written while the
    host powers on: both start from the applied host), then the boot delay
    (deploy_server). A power change of sushy-tools' own random delay (no
    ``redfish_power_delay``) is not counted."""
    from metalmend_lab.servedeploy import LAB_TEARDOWN

    power = options.redfish_power_delay or 0.0
    return {
        "decommission": float(LAB_TEARDOWN["kubelet_stopped_after"]),
        "destroy": power + options.erase_seconds,
        "deploy_server": max(options.provision_delay, power) + options.boot_delay,
    }
