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
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node
from lightkube.types import PatchType
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend.api.resources import (
    BareMetalHost,
    MachineHealthCheck,
    Metal3Remediation,
    Metal3RemediationTemplate,
)
from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
from metalmend.kube.crds import crd_name, load_crds
from metalmend.lab import lab
from metalmend.lab.assets import find_binaries
from metalmend.lab.hardware import HostSpec
from metalmend.lab.hosts import NAMESPACE

GRACE = 8.0  # seconds of silence before the node-lifecycle controller marks a Node Unknown


def run_demo(lab_dir: Path, out: Console, keep: bool = False) -> None:
    out.rule("[bold]metalmend demo")
    out.print("Starting the lab on 127.0.0.1: etcd, kube-apiserver and kube-controller-manager")
    out.print("built from upstream (once, on first use), a Redfish BMC emulator (sushy-tools),")
    out.print("an IPMI BMC (pyghmi), two servers with kubelets, and `metalmend run`...")
    options = lab.LabOptions(
        lab_dir=lab_dir,
        node_monitor_grace_period=GRACE,
        hosts=2,
        bmc="mixed",
        boot_delay=2.0,
        controllers="node-link,host-power,machine-health-check",
    )
    with lab.stop_requested() as stop, lab.started(options) as running:
        out.print(
            f"[green]ready[/green]: control plane in {running.state.started_in_seconds:.1f}s"
            f" at {running.state.server}; kubeconfig {running.kubeconfig}"
        )
        client = running.client()
        show_crds(out)
        show_hosts(running, out)
        show_validation(client, out)
        show_rbac(running, out)
        asyncio.run(show_bmcs(running, out))
        asyncio.run(show_hang_and_power_cycle(running, client, out))
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


def show_hosts(running: lab.RunningLab, out: Console) -> None:
    step(out, "2. Two bare-metal hosts: BMC, kubelet, Node, BareMetalHost and Machine each")
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
    step(out, "5. metalmend talks to the BMCs directly: Redfish (sushy) and IPMI (pyghmi)")
    assert running.hardware is not None
    bmcs = BmcPool(timeout=10, ca_bundle=str(running.plane.ca.pair.cert))
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
    bmcs.close()


async def show_hang_and_power_cycle(running: lab.RunningLab, client: Client, out: Console) -> None:
    step(out, "6. A hung server: its Node goes Unknown; a fence through the reboot API heals it")
    assert running.hardware is not None
    spec = next(h for h in running.hardware.hosts if h.bmc == "ipmi")
    lab_dir = running.plane.workdir.parent
    create_health_check(client)
    out.print("MachineHealthCheck 'workers': Ready=Unknown for 3s -> a Metal3Remediation")
    lab.inject_fault(lab_dir, spec.name, "hang")
    out.print(f"{spec.name}: kernel hung (lab fault); heartbeats stop, grace period {GRACE:g}s")
    began = time.monotonic()
    await wait_ready(client, spec.name, "Unknown", GRACE + 30)
    took = time.monotonic() - began
    out.print(
        f"after {took:.1f}s: Ready=[yellow]Unknown[/yellow] (the real node-lifecycle controller)"
    )
    await wait_for(lambda: _remediation(client, spec.name) is not None, 30)
    out.print(
        f"after {time.monotonic() - began:.1f}s: the health check created"
        f" [bold]Metal3Remediation/{spec.name}[/bold] (owner: Machine {spec.name})"
    )
    out.print("The remediation controller (next issue) will act on it; here we fence by hand")
    out.print("with the declarative reboot API, which metalmend's host-power controller serves:")
    key = "reboot.metal3.io/demo-fence"
    out.print(f'[dim]$ kubectl annotate bmh {spec.name} {key}=\'{{"mode":"hard"}}\'[/dim]')
    annotate(client, spec.name, {key: '{"mode":"hard"}'})
    await wait_host(client, spec.name, lambda h: h["status"].get("poweredOn") is False, 30)
    out.print(f"{spec.name}: powered off through IPMI and held off while {key} is present")
    client.delete(Node, spec.name)
    out.print(f"{spec.name}: Node deleted, so at-most-one workloads may start elsewhere")
    annotate(client, spec.name, {key: None})
    out.print(f"[dim]$ kubectl annotate bmh {spec.name} {key}-[/dim]")
    began = time.monotonic()
    await wait_ready(client, spec.name, "True", 60)
    host: Any = client.get(BareMetalHost, spec.name, namespace=NAMESPACE)
    provisioning = host["status"]["provisioning"]
    out.print(
        f"{spec.name}: powered on; after {time.monotonic() - began:.1f}s its kubelet registered"
        " again and the Node is [green]Ready[/green]"
    )
    out.print(
        f"the record a client checks: pendingRebootSince {provisioning['pendingRebootSince']}"
        f" < lastPoweredOn {provisioning['lastPoweredOn']}"
    )
    await wait_for(lambda: _remediation(client, spec.name) is None, 30)
    out.print(f"the health check removed Metal3Remediation/{spec.name}: its Node is healthy again")
    out.print(f"[dim]$ kubectl get events --field-selector involvedObject.name={spec.name}[/dim]")
    events = [
        e for e in client.list(Event, namespace=NAMESPACE) if e.involvedObject.name == spec.name
    ]
    for event in sorted(events, key=lambda e: int(e.metadata.resourceVersion or 0))[-6:]:
        out.print(f"  {event.reason:16} {escape(str(event.message))}", highlight=False)


def create_health_check(client: Client) -> None:
    client.create(
        Metal3RemediationTemplate(
            metadata=ObjectMeta(name="fence"), spec={"template": {"spec": {"strategy": "reboot"}}}
        ),
        namespace=NAMESPACE,
    )
    spec = {
        "clusterName": "lab",
        "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "3s"}],
        "maxUnhealthy": "50%",
        "remediationTemplate": {
            "apiVersion": "remediation.metal3.io/v1alpha1",
            "kind": "Metal3RemediationTemplate",
            "name": "fence",
        },
    }
    client.create(
        MachineHealthCheck(metadata=ObjectMeta(name="workers"), spec=spec), namespace=NAMESPACE
    )


def _remediation(client: Client, name: str) -> Any | None:
    try:
        return client.get(Metal3Remediation, name, namespace=NAMESPACE)
    except ApiError:
        return None


async def wait_for(check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.2)
    raise lab.LabError(f"not done within {within:.0f}s")


def annotate(client: Client, name: str, changes: dict[str, str | None]) -> None:
    client.patch(
        BareMetalHost, name, {"metadata": {"annotations": changes}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip


async def wait_host(client: Client, name: str, check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        host: Any = await asyncio.to_thread(client.get, BareMetalHost, name, namespace=NAMESPACE)
        if check(host):
            return
        await asyncio.sleep(0.2)
    raise lab.LabError(f"{name} did not reach the expected state within {within:.0f}s")


async def wait_ready(client: Client, name: str, status: str, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            node: Any = await asyncio.to_thread(client.get, Node, name)
            conditions = (node.status.conditions if node.status else None) or []
            if any(c.type == "Ready" and c.status == status for c in conditions):
                return
        except ApiError:
            pass
        await asyncio.sleep(0.5)
    raise lab.LabError(f"{name} did not become Ready={status} within {within:.0f}s")
