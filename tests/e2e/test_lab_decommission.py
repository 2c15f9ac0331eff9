"""decommission end to end in a lab with a site etcd (3 members on worker-0..2) and a
fourth host without one, through ``metalmend serve`` as ``lab up`` starts it and the
``metalmend node`` / ``metalmend etcd`` commands: workloads under a disruption budget
moved, the etcd member removed without breaking quorum, the kubelet stopped; a removal
that would break the site's threshold refused with nothing changed; and the service
killed in the middle of a decommission, then asked again, finishing it."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from lightkube import Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from metalmend_lab import lab
from tests.support import Deadline

PROMENADE = "/promenade/api/v1.0"
TIMEOUTS = (
    "drain-node-timeout=120&drain-node-grace-period=5&clear-labels-timeout=30"
    "&remove-etcd-timeout=30&etcd-ready-timeout=30"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("lab"),
        node_monitor_grace_period=6.0,
        hosts=4,
        bmc="ipmi",
        boot_delay=1.0,
        controllers="",
    )
    with lab.started(options) as running:
        client = running.client()
        wait_for(lambda: len(list(client.list(Node))) == 4, "the four lab Nodes")
        client.create(Namespace(metadata=ObjectMeta(name="shop")))
        yield running


def wait_for(check: Callable[[], object], what: str, within: float = 90.0) -> None:
    deadline = Deadline(within)
    while not check():
        assert not deadline.expired(), f"timed out waiting for {what}"
        time.sleep(0.2)


def endpoints(running: lab.RunningLab) -> dict[str, str]:
    data: dict[str, str] = json.loads((running.plane.workdir.parent / "endpoints.json").read_text())
    return data


def decommission(running: lab.RunningLab, node: str) -> httpx.Response:
    data = endpoints(running)
    return httpx.post(
        f"{data['url']}{PROMENADE}/nodes/{node}/decommission?{TIMEOUTS}",
        json={"rel": "design", "href": data["design_ref"], "type": "application/x-yaml"},
        headers={"Authorization": f"Bearer {data['token']}"},
        verify=ssl.create_default_context(cafile=data["ca"]),
        timeout=300,
    )


def lines(document: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(m["message"], m["error"]) for m in document["details"]["messageList"]]


def cli(running: lab.RunningLab, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "METALMEND_LAB_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "metalmend", *args, "--dir", str(running.plane.workdir.parent)],
        capture_output=True, text=True, timeout=300, check=False, env=environ,
    )  # fmt: skip


def etcd_health(running: lab.RunningLab) -> str:
    answer = cli(running, "etcd", "health")
    assert answer.returncode == 0, answer.stderr + answer.stdout
    return answer.stdout.strip()


def kill_and_wait_for_restart(running: lab.RunningLab) -> None:
    serve = running.extras["metalmend-serve"]
    old = serve.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    data = endpoints(running)

    def answers() -> bool:
        running.check()  # what the lab supervisor's loop does
        try:
            return httpx.get(
                data["url"] + "/healthz",
                verify=ssl.create_default_context(cafile=data["ca"]),
                timeout=2,
            ).is_success
        except httpx.HTTPError:
            return False

    wait_for(answers, "metalmend serve restarted")
    assert serve.pid != old


def make(client: Client, document: dict[str, Any]) -> None:
    client.create(codecs.from_dict(document))


def budget(client: Client, name: str, selector: dict[str, str], min_available: int) -> None:
    make(client, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                  "metadata": {"name": name, "namespace": "shop"},
                  "spec": {"minAvailable": min_available,
                           "selector": {"matchLabels": selector}}})  # fmt: skip


def ready_replicas(client: Client, name: str) -> int:
    status = client.get(StatefulSet, name, namespace="shop").status
    return (status.readyReplicas if status else None) or 0


def pods_on(client: Client, node: str, app: str) -> list[Pod]:
    return [
        p for p in client.list(Pod, namespace="shop", labels={"app": app})
        if p.spec.nodeName == node and p.metadata.deletionTimestamp is None
    ]  # fmt: skip


def test_the_lab_design_reference_is_in_endpoints_json(site: lab.RunningLab) -> None:
    data = endpoints(site)
    assert set(data) == {"url", "ca", "token", "design_ref", "metrics"}
    assert data["metrics"].startswith("http://127.0.0.1:")
    assert data["design_ref"] == site.state.design_ref
    assert etcd_health(site) == ("kubernetes: Healthy (3 of 3 members healthy; the site needs 2)")


def test_a_decommission_killed_midway_is_finished_by_asking_again(site: lab.RunningLab) -> None:
    """worker-3 holds no etcd member; its one pod is held by a budget until the service
    is killed, then the budget is relaxed and the decommission asked again."""
    client = site.client()
    make(client, {"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "till", "namespace": "shop", "labels": {"app": "till"}},
                  "spec": {"nodeName": "worker-3", "terminationGracePeriodSeconds": 1,
                           "containers": [{"name": "c", "image": "busybox"}]}})  # fmt: skip
    wait_for(
        lambda: getattr(client.get(Pod, "till", namespace="shop").status, "phase", "") == "Running",
        "till",
    )
    budget(client, "till", {"app": "till"}, 1)
    wait_for(
        lambda: (
            getattr(
                client.get(PodDisruptionBudget, "till", namespace="shop").status, "expectedPods", 0
            )
            == 1
        ),
        "the budget's status",
    )
    first: dict[str, Any] = {}
    asking = threading.Thread(
        target=lambda: first.update(answer=_answer_or_error(site, "worker-3")), daemon=True
    )
    asking.start()
    wait_for(lambda: client.get(Node, "worker-3").spec.unschedulable, "the drain to begin")
    kill_and_wait_for_restart(site)
    asking.join(30)
    assert isinstance(first["answer"], httpx.HTTPError)  # the service died under the request

    client.delete(PodDisruptionBudget, "till", namespace="shop")
    answer = decommission(site, "worker-3")
    document = answer.json()
    assert (answer.status_code, document["message"]) == (200, "Node worker-3 decommissioned")
    said = lines(document)
    assert said[0] == ("drain: Node worker-3 drained (1 pod(s) evicted by this request)", False)
    assert said[1][0].startswith("clear-labels: Node worker-3 labels cleared")
    assert said[2] == (
        "remove-etcd: Node worker-3 holds no etcd member of the design's clusters",
        False,
    )
    assert said[3][0].startswith("etcd-ready: etcd stable")
    assert said[4][0].startswith("shutdown-kubelet: node/worker-3 kubelet stopped")
    assert not pods_on(client, "worker-3", "till")


def _answer_or_error(site: lab.RunningLab, node: str) -> httpx.Response | httpx.HTTPError:
    try:
        return decommission(site, node)
    except httpx.HTTPError as error:
        return error


def test_decommission_moves_a_statefulset_under_its_budget_and_removes_the_etcd_member(
    site: lab.RunningLab,
) -> None:
    client = site.client()
    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
              "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "db"}}}  # fmt: skip
    make(client, {"apiVersion": "apps/v1", "kind": "StatefulSet",
                  "metadata": {"name": "db", "namespace": "shop"},
                  "spec": {"replicas": 3, "serviceName": "db",
                           "selector": {"matchLabels": {"app": "db"}},
                           "template": {"metadata": {"labels": {"app": "db"}},
                                        "spec": {"topologySpreadConstraints": [spread],
                                                 "terminationGracePeriodSeconds": 1,
                                                 "containers": [{"name": "db", "image": "postgres"}]}}}})  # fmt: skip
    wait_for(
        lambda: ready_replicas(client, "db") == 3,
        "the StatefulSet ready",
    )
    budget(client, "db", {"app": "db"}, 2)
    on_worker_0 = len(pods_on(client, "worker-0", "db"))

    answer = decommission(site, "worker-0")
    document = answer.json()
    assert (answer.status_code, document["reason"]) == (200, "Success"), document
    said = lines(document)
    assert said[0] == (
        f"drain: Node worker-0 drained ({on_worker_0} pod(s) evicted by this request)",
        False,
    )
    assert said[2][0].startswith("remove-etcd: ")
    assert "removed" in said[2][0]
    assert said[3][0] == "etcd-ready: etcd stable: kubernetes"
    assert [error for _, error in said] == [False] * 5
    assert etcd_health(site) == "kubernetes: Healthy (2 of 2 members healthy; the site needs 2)"
    wait_for(
        lambda: ready_replicas(client, "db") == 3,
        "the StatefulSet ready again, elsewhere",
    )
    assert not pods_on(client, "worker-0", "db")
    hardware = json.loads((site.plane.workdir.parent / "hardware" / "status.json").read_text())
    assert hardware["worker-0"]["kubelet"] == "disabled"

    removed = cli(site, "node", "remove-from-cluster", "worker-0")
    assert removed.returncode == 0, removed.stdout
    assert "Node worker-0 removed from the cluster" in removed.stdout


def test_a_decommission_that_would_break_the_sites_etcd_threshold_fails_changing_no_member(
    site: lab.RunningLab,
) -> None:
    """After worker-0's removal the cluster has 2 members and needs 2: worker-1's member
    may not go. The drain and clear-labels ran; the kubelet was not touched."""
    result = cli(site, "node", "decommission", "worker-1", "--remove-etcd-timeout", "10",
                 "--drain-node-timeout", "60", "--drain-node-grace-period", "5")  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert "Error: Node worker-1 was not decommissioned: remove-etcd failed" in result.stdout
    assert "Reason: DisassociateStepFailure" in result.stdout
    assert "- Error: remove-etcd: RemoveEtcdError: " in result.stdout
    assert "- Info: shutdown-kubelet: not attempted (remove-etcd failed)" in result.stdout
    assert etcd_health(site) == "kubernetes: Healthy (2 of 2 members healthy; the site needs 2)"
    hardware = json.loads((site.plane.workdir.parent / "hardware" / "status.json").read_text())
    assert hardware["worker-1"]["kubelet"] == "running"
