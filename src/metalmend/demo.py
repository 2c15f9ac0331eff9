"""``make demo``: start the lab from nothing and show, step by step, what it gives us.

Each step prints what it does and what the real cluster answered. The demo grows with the
project: hosts, faults and remediation join it as they land.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client, KubeConfig
from lightkube.codecs import load_all_yaml
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend.api.resources import CRD_DIR, MachineHealthCheck
from metalmend.kube.crds import crd_name, load_crds
from metalmend.lab import lab
from metalmend.lab.assets import find_binaries

NAMESPACE = "metalmend-demo"
EXAMPLES = CRD_DIR.parent / "examples"
GRACE = 8.0  # seconds of silence before the node-lifecycle controller marks a Node Unknown


def run_demo(lab_dir: Path, out: Console, keep: bool = False) -> None:
    out.rule("[bold]metalmend demo")
    out.print("Starting a real control plane on 127.0.0.1 (etcd, kube-apiserver,")
    out.print("kube-controller-manager built from upstream; built once on first use)...")
    options = lab.LabOptions(lab_dir=lab_dir, node_monitor_grace_period=GRACE)
    with lab.stop_requested() as stop, lab.started(options) as running:
        out.print(
            f"[green]ready[/green] in {running.state.started_in_seconds:.1f}s at"
            f" {running.state.server}; kubeconfig {running.kubeconfig}"
        )
        client = running.client()
        show_crds(client, out)
        apply_examples(client, running.kubeconfig, out)
        show_validation(client, out)
        show_rbac(running, out)
        show_node_lifecycle(client, out)
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


def show_crds(client: Client, out: Console) -> None:
    step(out, "1. Our API: CustomResourceDefinitions installed and established")
    table = Table("CRD", "kind", "columns")
    for crd in load_crds():
        version = crd.spec.versions[0]
        columns = ", ".join(c.name.upper() for c in version.additionalPrinterColumns or [])
        table.add_row(crd_name(crd), crd.spec.names.kind, columns)
    out.print(table)


def apply_examples(client: Client, kubeconfig: Path, out: Console) -> None:
    step(out, "2. A bare-metal pool: Secret, BareMetalHost, Machine, health check, template")
    client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    objects: list[Any] = load_all_yaml((EXAMPLES / "demo-cluster.yaml").read_text())
    for obj in objects:
        client.create(obj, namespace=NAMESPACE)
        out.print(f"created {obj.kind}/{obj.metadata.name}")
    kubectl = find_binaries(build_missing=False).kubectl or shutil.which("kubectl")
    if kubectl is None:
        return
    command = [str(kubectl), "--kubeconfig", str(kubeconfig), "-n", NAMESPACE, "get"]
    for kinds in ("baremetalhosts", "machines", "machinehealthchecks"):
        out.print(f"[dim]$ kubectl -n {NAMESPACE} get {kinds}[/dim]")
        result = subprocess.run([*command, kinds], capture_output=True, text=True, check=False)
        out.print(result.stdout or result.stderr, end="", highlight=False, markup=False)


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
        body = {"clusterName": "demo", "selector": {"matchLabels": {"role": "worker"}}, **spec}
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


def show_node_lifecycle(client: Client, out: Console) -> None:
    step(out, "5. A Node that stops its heartbeats is marked Unknown by kube-controller-manager")
    now = dt.datetime.now(dt.UTC)
    client.create(Node(metadata=ObjectMeta(name="worker-0", labels={"role": "worker"})))
    client.create(
        Lease(
            metadata=ObjectMeta(name="worker-0"),
            spec=LeaseSpec(holderIdentity="worker-0", leaseDurationSeconds=40, renewTime=now),
        ),
        namespace="kube-node-lease",
    )
    heartbeat = now.isoformat()
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": heartbeat,
    }
    client.patch(Node.Status, "worker-0", {"status": {"conditions": [ready]}})
    out.print(f"worker-0 registered Ready; its heartbeats stop now (grace period {GRACE:g}s)")
    began = time.monotonic()
    while time.monotonic() - began < GRACE + 30:
        status = client.get(Node, "worker-0").status
        conditions = (status.conditions if status else None) or []
        condition = next(c for c in conditions if c.type == "Ready")
        if condition.status == "Unknown":
            out.print(
                f"after {time.monotonic() - began:.1f}s: Ready=[yellow]Unknown[/yellow]"
                f" ({condition.reason}: {condition.message})"
            )
            out.print("This is the signal a MachineHealthCheck acts on (arrives with issue 6).")
            return
        time.sleep(0.5)
    out.print("[red]the Node was not marked Unknown in time[/red]")
