"""What deploy_site and update_site accept from a design, what they wait for, and which
actions may run side by side (policy.deploysite, policy.siteactions.collision): tables,
no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from metalmend.policy.deploysite import HostSeen, progress, read_site
from metalmend.policy.siteactions import ActionName, Running, collision

NS = ("site",)


def obj(data: dict[str, Any], name: str = "doc") -> dict[str, Any]:
    return {
        "schema": "metalmend/KubernetesObject/v1",
        "metadata": {"schema": "metadata/Document/v1", "name": name},
        "data": data,
    }


def host(name: str = "worker-1", namespace: str = "site", **extra: Any) -> dict[str, Any]:
    spec = {"bmc": {"address": "redfish://127.0.0.1:8000/redfish/v1/Systems/1",
                    "credentialsName": f"{name}-bmc"}, "online": True}  # fmt: skip
    spec |= extra.pop("spec", {})
    meta = {"name": name, "namespace": namespace} | extra.pop("metadata", {})
    return obj({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                "metadata": meta, "spec": spec, **extra})  # fmt: skip


def machine(name: str = "m1", namespace: str = "site") -> dict[str, Any]:
    return obj({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterName": "c"}})  # fmt: skip


def node(name: str = "worker-1", **meta: Any) -> dict[str, Any]:
    return obj({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"role": "worker"}} | meta})  # fmt: skip


def test_a_good_design_applies_hosts_before_machines_and_keeps_node_labels() -> None:
    found = read_site([machine(), host(), node(), {"schema": "promenade/EtcdClusters/v1"}], NS)
    assert found.problems == ()
    assert [o.kind for o in found.objects] == ["BareMetalHost", "Machine"]
    assert found.node_labels == {"worker-1": {"role": "worker"}}
    assert [h.key for h in found.hosts] == ["BareMetalHost site/worker-1"]


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        pytest.param(obj({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}),
                     "is not a kind site actions apply", id="a Secret"),
        pytest.param(obj({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                          "metadata": {"name": "x"}}),
                     "is not a kind site actions apply", id="RBAC"),
        pytest.param(obj({"apiVersion": "metal3.io/v1beta9", "kind": "BareMetalHost",
                          "metadata": {"name": "x"}}),
                     "is not a kind site actions apply", id="another version"),
        pytest.param(host(namespace="kube-system"), "namespace 'kube-system' is not one",
                     id="another tenant's namespace"),
        pytest.param(host(metadata={"annotations": {"reboot.metal3.io": ""}}),
                     "would power or claim a host", id="a reboot annotation"),
        pytest.param(host(metadata={"annotations": {"reboot.metal3.io/x": "{}"}}),
                     "would power or claim a host", id="a keyed reboot annotation"),
        pytest.param(host(metadata={"annotations": {"metalmend.dev/teardown": "{}"}}),
                     "would power or claim a host", id="a teardown claim"),
        pytest.param(host(metadata={"ownerReferences": []}),
                     "metadata.ownerReferences cannot be set", id="owner references"),
        pytest.param(host(status={"poweredOn": True}), "status is the controllers'",
                     id="a status"),
        pytest.param(host(spec={"bmc": {"address": "x"}}), "credentialsName must name",
                     id="no credentials"),
        pytest.param(host(spec={"bmc": None}), "has no spec.bmc", id="no BMC"),
        pytest.param(host(name="Bad_Name"), "is not a valid name", id="a bad name"),
        pytest.param(host(namespace=""), "has no metadata.namespace", id="no namespace"),
        pytest.param(node(annotations={"a": "b"}), "may carry only its labels",
                     id="a Node's annotations"),
        pytest.param(obj({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                          "spec": {"unschedulable": True}}),
                     "may carry only its labels, not spec", id="a Node's spec"),
        pytest.param(node(labels={"a": 1}), "labels must map strings", id="a number label"),
        pytest.param(obj(["not", "an", "object"]), "data must be a Kubernetes object",
                     id="a list"),
    ],
)  # fmt: skip
def test_what_a_design_cannot_hold(document: dict[str, Any], problem: str) -> None:
    found = read_site([document], NS)
    assert len(found.problems) == 1, found.problems
    assert problem in found.problems[0]
    assert found.objects == ()


def test_an_object_twice_and_an_empty_namespace_list_are_refused() -> None:
    twice = read_site([host(), host()], NS)
    assert "is in the design twice" in twice.problems[0]
    nowhere = read_site([host()], ())
    assert "serve.site_namespaces is empty" in nowhere.problems[0]
    assert read_site([node()], ()).problems == ()  # labels only: no namespace needed


def seen(key: str = "h", **changes: Any) -> HostSeen:
    values = {"key": key, "wants_on": True, "wants_image": True,
              "provisioning": "provisioned", "powered_on": True} | changes  # fmt: skip
    return HostSeen(**values)


@pytest.mark.parametrize(
    ("hosts", "nodes", "waiting", "failed"),
    [
        ([seen()], {"n": True}, (), ()),
        ([seen(provisioning="provisioning")], {}, ("h provisioning",), ()),
        ([seen(provisioning="")], {}, ("h not registered",), ()),
        ([seen(wants_image=False, provisioning="available")], {}, (), ()),
        ([seen(powered_on=False)], {}, ("h not on yet",), ()),
        ([seen(wants_on=False, powered_on=False)], {}, (), ()),
        ([seen(provisioning="provisioning error", error="no image")], {}, (),
         ("h: provisioning error: no image",)),
        ([], {"n": None, "m": False}, ("Node m not Ready", "Node n not registered"), ()),
    ],
)  # fmt: skip
def test_what_the_site_waits_for(
    hosts: list[HostSeen], nodes: dict[str, bool | None], waiting: tuple[str, ...],
    failed: tuple[str, ...],
) -> None:  # fmt: skip
    found = progress(hosts, nodes)
    assert (found.waiting, found.failed) == (waiting, failed)
    assert found.done is (not waiting and not failed)


SITE = ActionName.DEPLOY_SITE
REDEPLOY = ActionName.REDEPLOY_SERVER


@pytest.mark.parametrize(
    ("name", "targets", "running", "refused"),
    [
        (SITE, (), [], None),
        (SITE, (), [Running("A", "redeploy_server", frozenset({"n1"}))], "is running"),
        (REDEPLOY, ("n1",), [Running("A", "update_site")], "is running"),
        (REDEPLOY, ("n1",), [Running("A", "redeploy_server", frozenset({"n2"}))], None),
        (REDEPLOY, ("n1", "n2"), [Running("A", "redeploy_server", frozenset({"n2"}))],
         "already redeploying n2"),
    ],
)  # fmt: skip
def test_which_actions_run_side_by_side(
    name: ActionName, targets: tuple[str, ...], running: list[Running], refused: str | None
) -> None:
    found = collision(name, targets, running)
    assert (found is None) if refused is None else (found is not None and refused in found)
