"""Draining a lab Node of 300 pods: ``metalmend serve``'s drain against ``kubectl drain``.

A 2-host lab (the lab's own `metalmend serve`, as `lab up` starts it). On worker-0, 300
pods of four ReplicaSets: `web` (50, under one PodDisruptionBudget, maxUnavailable 10),
`api` (100), `batch` (100) and `cache` (50, each with an emptyDir). worker-1 is
schedulable while a drain runs, so the evicted pods' replacements land there, become
Ready, and the budget lets the next `web` pods go, as on a real cluster.

Each run starts from the same state: all 300 pods Running and Ready on worker-0 (put there
by cordoning worker-1 while the ReplicaSets scale up from 0), the budget allowing 10
disruptions, nothing on worker-1. Then, timed from the request to the answer:

- metalmend: `POST /promenade/api/v1.0/nodes/worker-0/drain?timeout=600&grace-period=30`
  to the lab's service (the url, CA and token of .lab/endpoints.json);
- kubectl: `kubectl drain worker-0 --force --delete-emptydir-data --ignore-daemonsets
  --grace-period=30 --timeout=600s`, the lab's own kubectl build, the lab admin's
  kubeconfig, its default client settings.

The runs alternate (kubectl first), ROUNDS of each; prints every time, the medians and
their ratio (metalmend / kubectl; the target is at most 0.8). Every pod takes SLOW_STOP
seconds to stop once deleted (the lab kubelet's slow-stop annotation; all of a Node's pods
stop together, as on a real kubelet), so a drain also waits for workloads to shut down, as
a real one does. Asserts nothing beyond both drains succeeding.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from metalmend_lab import lab
from metalmend_lab.controlplane import ControlPlane
from metalmend_lab.kubeletsim import SLOW_STOP_ANNOTATION

NAMESPACE = "drain-bench"
NODE, SPARE = "worker-0", "worker-1"
# name -> (replicas, emptyDir); 300 pods in all.
REPLICA_SETS = {"web": (50, False), "api": (100, False), "batch": (100, False), "cache": (50, True)}
PODS = sum(n for n, _ in REPLICA_SETS.values())
BUDGET = 10  # the web budget's maxUnavailable
GRACE, TIMEOUT = 30, 600
SLOW_STOP = 2  # seconds each pod takes to exit after SIGTERM (within GRACE)
ROUNDS = 2


def replica_set(name: str, emptydir: bool) -> dict[str, Any]:
    labels = {"app": name}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": GRACE,
        "containers": [{"name": name, "image": f"registry.invalid/metalmend/{name}:1"}],
    }
    if emptydir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        spec["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {SLOW_STOP_ANNOTATION: str(SLOW_STOP)},
                },
                "spec": spec,
            },
        },
    }


def budget() -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {"maxUnavailable": BUDGET, "selector": {"matchLabels": {"app": "web"}}},
    }


class Cluster:
    """The few calls the benchmark makes, as plain JSON over the lab admin's client
    (cheap: the benchmark shares the machine with what it measures)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.http = plane.admin_http(timeout=30)

    def ok(self, answer: httpx.Response) -> dict[str, Any]:
        if answer.status_code >= 400:
            raise RuntimeError(f"{answer.request.method} {answer.request.url}: {answer.text}")
        result: dict[str, Any] = answer.json()
        return result

    def create(self, path: str, obj: dict[str, Any]) -> None:
        self.ok(self.http.post(path, json=obj))

    def patch(self, path: str, body: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        self.ok(self.http.patch(path, json=body, headers=headers))

    def cordon(self, node: str, cordoned: bool) -> None:
        self.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": cordoned or None}})

    def scale(self, replicas: int | None) -> None:
        for name, (wanted, _) in REPLICA_SETS.items():
            count = wanted if replicas is None else replicas
            path = f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets/{name}"
            self.patch(path, {"spec": {"replicas": count}})

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.ok(
            self.http.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
        )["items"]
        return items

    def allowed(self) -> int:
        path = f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/web"
        return int(self.ok(self.http.get(path)).get("status", {}).get("disruptionsAllowed", 0))

    def ready_nodes(self) -> set[str]:
        ready = set()
        for node in self.ok(self.http.get("/api/v1/nodes"))["items"]:
            conditions = node.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                ready.add(node["metadata"]["name"])
        return ready


def ready_on(pod: dict[str, Any], node: str) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return (
        pod["spec"].get("nodeName") == node
        and not pod["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    )


def until(check: Callable[[], bool], within: float, what: str) -> None:
    # Every second, not faster: each look lists 300 pods on the machine being measured.
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {within:.0f}s: {what}")
        time.sleep(1.0)


def fill(cluster: Cluster) -> None:
    """All 300 pods Running and Ready on NODE, none anywhere else, the budget at rest."""
    cluster.scale(0)
    until(lambda: not cluster.pods(), 180, "every pod gone")
    cluster.cordon(SPARE, True)
    cluster.cordon(NODE, False)
    cluster.scale(None)

    def full() -> bool:
        pods = cluster.pods()
        return len(pods) == PODS and all(ready_on(p, NODE) for p in pods)

    until(full, 300, f"{PODS} pods Ready on {NODE}")
    until(lambda: cluster.allowed() == BUDGET, 60, "the budget at rest")
    cluster.cordon(SPARE, False)  # where the replacements go


def drain_with_metalmend(running: lab.RunningLab) -> float:
    endpoints = running.endpoints
    assert endpoints is not None, "the lab runs metalmend serve"
    url = f"{endpoints.url}/promenade/api/v1.0/nodes/{NODE}/drain"
    began = time.perf_counter()
    answer = httpx.post(
        url,
        params={"timeout": TIMEOUT, "grace-period": GRACE},
        headers={"Authorization": f"Bearer {endpoints.token}"},
        verify=endpoints.ca,
        timeout=TIMEOUT + 30,
    )
    took = time.perf_counter() - began
    if answer.status_code != 200:
        raise RuntimeError(f"metalmend's drain failed: {answer.text[:2000]}")
    return took


def drain_with_kubectl(running: lab.RunningLab, log: Path) -> tuple[float, int]:
    """Seconds, and how many times client-go said it waited for its own rate limiter."""
    kubectl = running.plane.binaries.kubectl
    assert kubectl is not None, "the lab's control-plane build includes kubectl"
    argv = [
        str(kubectl), "--kubeconfig", str(running.kubeconfig), "drain", NODE, "--force",
        "--delete-emptydir-data", "--ignore-daemonsets", f"--grace-period={GRACE}",
        f"--timeout={TIMEOUT}s",
    ]  # fmt: skip
    with log.open("wb") as out:
        began = time.perf_counter()
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
        took = time.perf_counter() - began
    text = log.read_text(errors="replace")
    if code != 0:
        raise RuntimeError(f"kubectl drain failed ({code}):\n{text[-2000:]}")
    return took, text.count("client-side throttling")


def run(running: lab.RunningLab, workdir: Path) -> None:
    cluster = Cluster(running.plane)
    until(lambda: {NODE, SPARE} <= cluster.ready_nodes(), 120, "both lab Nodes Ready")
    cluster.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for name, (_, emptydir) in REPLICA_SETS.items():
        cluster.create(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets", replica_set(name, emptydir)
        )
    cluster.create(f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets", budget())
    times: dict[str, list[float]] = {"kubectl": [], "metalmend": []}
    throttled = []
    for round_ in range(ROUNDS):
        fill(cluster)
        took, waits = drain_with_kubectl(running, workdir / f"kubectl-{round_}.log")
        times["kubectl"].append(took)
        throttled.append(waits)
        fill(cluster)
        times["metalmend"].append(drain_with_metalmend(running))
    mine, theirs = statistics.median(times["metalmend"]), statistics.median(times["kubectl"])
    print(
        f"drain of a lab Node holding {PODS} pods (4 ReplicaSets, {REPLICA_SETS['cache'][0]}"
        f" with emptyDir, {REPLICA_SETS['web'][0]} under a budget of maxUnavailable {BUDGET};"
        f" each pod {SLOW_STOP} s to stop), request to answer, {ROUNDS} runs each, alternating"
    )
    for tool, values in times.items():
        print(
            f"  {tool:<10} "
            + "  ".join(f"{v:6.1f} s" for v in values)
            + f"   median {statistics.median(values):6.1f} s"
        )
    print(f"  ratio metalmend / kubectl: {mine / theirs:.2f}x (target <= 0.8x)")
    print(f"  kubectl reported waiting on its client-side rate limit {sum(throttled)} time(s)")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-drain-") as tmp:
        options = lab.LabOptions(
            lab_dir=Path(tmp), hosts=2, bmc="ipmi", boot_delay=0.5, controllers="", serve=True
        )
        with lab.started(options) as running:
            run(running, Path(tmp))


if __name__ == "__main__":
    main()
