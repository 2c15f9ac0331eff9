"""``make demo``: start the lab from nothing and show, step by step, what it gives us.

Each step prints what it does and what the real cluster and the real BMCs answered. The
demo grows with the project: health checks and remediation join it as they land.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client, KubeConfig
from lightkube.models.apps_v1 import StatefulSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import ConfigMap, Pod
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend.api.resources import (
    MachineHealthCheck,
)
from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
from metalmend.bmc.settings import BmcSettings
from metalmend.kube.crds import crd_name, load_crds
from metalmend_lab import lab
from metalmend_lab.assets import find_binaries
from metalmend_lab.hosts import NAMESPACE, fence_health_check
from metalmend_lab.inventory import HostSpec
from metalmend_lab.timeline import MILESTONES, PATH, Recorder, Timeline, breakdown, svg, total
from metalmend_lab.timeline import Settings as TimelineSettings

GRACE = 8.0  # seconds of silence before the node-lifecycle controller marks a Node Unknown
MHC_TIMEOUT = 3.0  # seconds a Node must stay Unknown before it is remediated
POWER_OFF_TIMEOUT = 60
POWER_ON_TIMEOUT = 120
HOSTS = 3  # the lab's servers: one hangs, the others take its workload
NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def counted(n: int, noun: str) -> str:
    """``counted(3, "server")``: "three servers", as the demo's text says a number."""
    return f"{NUMBERS[n] if 0 <= n < len(NUMBERS) else n} {noun}{'' if n == 1 else 's'}"


def run_demo(lab_dir: Path, out: Console, keep: bool = False) -> None:
    out.rule("[bold]metalmend demo")
    out.print("Starting the lab on 127.0.0.1: etcd, kube-apiserver and kube-controller-manager")
    out.print("built from upstream (once, on first use), a Redfish BMC emulator (sushy-tools),")
    out.print(
        f"IPMI BMCs (pyghmi), {counted(HOSTS, 'server')} with kubelets, and `metalmend run`..."
    )
    options = lab.LabOptions(
        lab_dir=lab_dir,
        node_monitor_grace_period=GRACE,
        hosts=HOSTS,
        bmc="mixed",
        boot_delay=2.0,
    )
    with lab.stop_requested() as stop, lab.started(options) as running:
        out.print(
            f"[green]ready[/green]: control plane in {running.state.started_in_seconds:.1f}s"
            f" at {running.state.server}; kubeconfig {running.kubeconfig}"
        )
        client = running.client()
        show_crds(out)
        show_hosts(running, options.hosts, out)
        show_validation(client, out)
        show_rbac(running, out)
        asyncio.run(show_bmcs(running, out))
        timeline = asyncio.run(show_remediation(running, client, out))
        show_timeline(timeline, options, out)
        out.rule("[bold]done")
        if keep:
            out.print(f"The lab keeps running: kubectl --kubeconfig {running.kubeconfig} ...")
            out.print("Ctrl-C stops it.")
            while not stop.wait(0.5):
                running.check()
    out.print("lab stopped; nothing left running")


def step(out: Console, title: str) -> None:
    out.print()
    out.rule(f"[cyan]{title}", align="left")


def show_crds(out: Console) -> None:
    step(out, "1. Our API: CustomResourceDefinitions installed and established")
    table = Table("CRD", "kind", "columns")
    for crd in load_crds():
        version = crd.spec.versions[0]
        columns = ", ".join(c.name.upper() for c in version.additionalPrinterColumns or [])
        table.add_row(crd_name(crd), crd.spec.names.kind, columns)
    out.print(table)


def hosts_step(hosts: int) -> str:
    """Step 2's title, counting the hosts the lab was started with."""
    each = "BMC, kubelet, Node, BareMetalHost and Machine each"
    return f"2. {counted(hosts, 'bare-metal host').capitalize()}: {each}"


def show_hosts(running: lab.RunningLab, hosts: int, out: Console) -> None:
    step(out, hosts_step(hosts))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        report = lab.status(running.plane.workdir.parent).hosts
        if report and all(h.ready == "True" for h in report):
            break
        time.sleep(0.5)
    table = Table("host", "BMC", "power", "kubelet", "Node", "Ready", "BMC reachable")
    for h in report:
        table.add_row(h.name, h.bmc, h.power, h.kubelet, "yes" if h.node else "no", h.ready,
                      "yes" if h.bmc_reachable else "no")  # fmt: skip
    out.print(table)
    kubectl = find_binaries(build_missing=False).kubectl or shutil.which("kubectl")
    if kubectl is None:
        return
    command = [str(kubectl), "--kubeconfig", str(running.kubeconfig), "-n", NAMESPACE, "get"]
    for kinds in ("baremetalhosts", "machines"):
        out.print(f"[dim]$ kubectl -n {NAMESPACE} get {kinds}[/dim]")
        result = subprocess.run([*command, kinds], capture_output=True, text=True, check=False)
        out.print(result.stdout or result.stderr, end="", highlight=False, markup=False)
    out.print(
        "(Machine NODE is set by metalmend's node-link controller, running as `metalmend run`)"
    )


def show_validation(client: Client, out: Console) -> None:
    step(out, "3. Bad specs are refused by the API server, with a readable message")
    bad_specs: dict[str, dict[str, Any]] = {
        "unhealthyRange: '[5-'": {"unhealthyRange": "[5-"},
        "maxUnhealthy: abc": {"maxUnhealthy": "abc"},
        "timeout: -5m": {
            "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "-5m"}]
        },
    }
    for label, spec in bad_specs.items():
        body = {"clusterName": "lab", "selector": {"matchLabels": {"role": "worker"}}, **spec}
        try:
            check = MachineHealthCheck(metadata=ObjectMeta(name="bad"), spec=body)
            client.create(check, namespace=NAMESPACE)
            out.print(f"{label}: [red]accepted[/red]")
        except ApiError as error:
            reason = escape(str(error.status.message).split(": ", 1)[-1])
            out.print(f"{label}: [yellow]{error.status.code}[/yellow] {reason}", highlight=False)


def show_rbac(running: lab.RunningLab, out: Console) -> None:
    step(out, "4. RBAC is on: a user with no role binding is refused")
    alice = Client(KubeConfig.from_file(running.plane.user_kubeconfig("alice", ["team-a"])))
    try:
        alice.get(ConfigMap, "anything", namespace=NAMESPACE)
    except ApiError as error:
        message = escape(str(error.status.message))
        out.print(f"alice: [yellow]{error.status.code}[/yellow] {message}", highlight=False)


def bmc_of(spec: HostSpec) -> BmcTarget:
    return BmcTarget(parse(spec.address), Credentials(spec.username, spec.password))


async def show_bmcs(running: lab.RunningLab, out: Console) -> None:
    step(out, "5. metalmend talks to the BMCs directly: Redfish (httpx) and IPMI (pyghmi)")
    assert running.hardware is not None
    bmcs = BmcPool(BmcSettings(timeout=10, ca_bundle=str(running.plane.ca.pair.cert)))
    for spec in running.hardware.hosts:
        began = time.monotonic()
        state = await bmcs.power_state(bmc_of(spec))
        took = (time.monotonic() - began) * 1000
        out.print(f"{spec.name}: {spec.address} -> power {state} ({took:.0f} ms)")
    wrong = BmcTarget(parse(running.hardware.hosts[0].address), Credentials("admin", "wrong"))
    try:
        await bmcs.power_state(wrong)
    except Exception as error:
        out.print(f"wrong password: {type(error).__name__}: {escape(str(error))}", highlight=False)
    await bmcs.close()


async def show_remediation(running: lab.RunningLab, client: Client, out: Console) -> Timeline:
    step(out, "6. A server hangs: fenced, its workload moves, it is powered back on")
    lab_dir = running.plane.workdir.parent
    fence_health_check(client, MHC_TIMEOUT, power_off=POWER_OFF_TIMEOUT, power_on=POWER_ON_TIMEOUT)
    out.print(
        f"MachineHealthCheck 'workers': Ready=Unknown for {MHC_TIMEOUT:g}s -> a Metal3Remediation"
        f" (template 'fence': strategy reboot, powerOffTimeout {POWER_OFF_TIMEOUT}s,"
        f" powerOnTimeout {POWER_ON_TIMEOUT}s)"
    )
    node = await start_workload(client)
    host = next(h for h in (running.hardware.hosts if running.hardware else []) if h.name == node)
    out.print(f"StatefulSet 'db' (1 replica, at most one copy): pod db-0 Running on {node}")
    recorder = Recorder(running.kubeconfig, NAMESPACE, node, app="db").start()
    await asyncio.sleep(0.5)  # the watches have listed
    began = time.time()

    def live(milestone: str, when: float) -> None:
        out.print(f"  [bold]+{when - began:6.2f}s[/bold]  {MILESTONES[milestone]}", highlight=False)

    recorder.on_mark = live
    lab.inject_fault(lab_dir, node, "hang")
    recorder.timeline.mark("hang", began)
    out.print(f"{node} ({host.bmc} BMC {host.address}): kernel hung; heartbeats stop")
    try:
        await wait_for(lambda: recorder.timeline.complete(), 180)
        await wait_for(lambda: "pod_moved" in recorder.timeline.at, 30)
    finally:
        timeline = recorder.stop()
    return timeline


def show_timeline(timeline: Timeline, options: lab.LabOptions, out: Console) -> None:
    step(out, "7. The timeline, and who spent the time")
    settings = TimelineSettings(GRACE, MHC_TIMEOUT, options.boot_delay)
    table = Table("since hang", "what", "step", "who")
    previous = timeline.at["hang"]
    owners = {s.end: s.who for s in PATH}
    owners["pod_moved"] = "kubernetes"
    for milestone, when in sorted(timeline.at.items(), key=lambda item: item[1]):
        step_time = when - previous if milestone != "pod_moved" else when - timeline.at["fenced"]
        table.add_row(
            f"{when - timeline.at['hang']:7.2f}s", MILESTONES[milestone],
            f"{step_time:6.2f}s" if milestone != "hang" else "", owners.get(milestone, ""),
        )  # fmt: skip
        if milestone != "pod_moved":
            previous = when
    out.print(table)
    parts = breakdown(timeline, settings)
    whole = total(timeline)
    out.print(
        f"total {whole:.2f}s = configured waits {parts['configured']:.2f}s (grace {GRACE:g}s,"
        f" health check timeout {MHC_TIMEOUT:g}s, boot delay {settings.boot_delay:g}s)"
        f" + hardware {parts['hardware']:.2f}s (BMC power changes, kubelet)"
        f" + [bold green]metalmend {parts['metalmend']:.2f}s[/bold green]"
    )
    out.print(
        f"the pod started on {timeline.pod_node} {parts['kubernetes']:.2f}s after the fence"
        " (StatefulSet controller, scheduler, kubelet), never before it"
    )
    picture = Path(".lab") / "demo-timeline.svg"
    picture.parent.mkdir(exist_ok=True)
    picture.write_text(svg(timeline, settings, f"metalmend: remediation of {timeline.host}"))
    out.print(f"timeline picture: {picture}")


async def start_workload(client: Client) -> str:
    """A one-replica StatefulSet; returns the Node its pod runs on."""
    labels: dict[str, Any] = {"app": "db"}
    statefulset = StatefulSet(
        metadata=ObjectMeta(name="db", labels=labels),
        spec=StatefulSetSpec(
            serviceName="db",
            replicas=1,
            selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(
                metadata=ObjectMeta(labels=labels),
                spec=PodSpec(containers=[Container(name="db", image="example.org/db:1")]),
            ),
        ),
    )
    client.create(statefulset, namespace=NAMESPACE)
    found: dict[str, str] = {}

    def running() -> bool:
        for pod in client.list(Pod, namespace=NAMESPACE, labels=labels):
            if pod.status and pod.status.phase == "Running" and pod.spec and pod.spec.nodeName:
                found["node"] = pod.spec.nodeName
                return True
        return False

    await wait_for(running, 60)
    return found["node"]


async def wait_for(check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.2)
    raise lab.LabError(f"not done within {within:.0f}s")
