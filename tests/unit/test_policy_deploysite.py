"""What deploy_site and update_site accept from a design, what they wait for, and which
actions may run side by side (policy.deploysite, policy.actions.collision): tables,
no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from metalmend.siteactions.policy.actions import ActionName, Running, collision
from metalmend.siteactions.policy.deploysite import (
    HostBmcSeen,
    HostSeen,
    bmc_hosts,
    bmc_problems,
    host_named,
    progress,
    read_site,
    redeploy_problems,
)

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
                     "annotation 'reboot.metal3.io' would power", id="a reboot annotation"),
        pytest.param(host(metadata={"annotations": {"reboot.metal3.io/x": "{}"}}),
                     "annotation 'reboot.metal3.io/x' would power",
                     id="a keyed reboot annotation"),
        pytest.param(host(metadata={"annotations": {"metalmend.dev/teardown": "{}"}}),
                     "annotation 'metalmend.dev/teardown' is metalmend's own",
                     id="a teardown claim"),
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
        pytest.param(host(spec={"bmc": {"address": "x", "credentialsName": "c"},
                                "consumerRef": {"apiVersion": "cluster.x-k8s.io/v1beta1",
                                                "kind": "Machine", "namespace": "tenant-b",
                                                "name": "worker-1"}}),
                     "spec.consumerRef.namespace 'tenant-b' is not the BareMetalHost's"
                     " namespace 'site'", id="another namespace's Machine as consumer"),
        pytest.param(host(spec={"bmc": {"address": "x", "credentialsName": "c"},
                                "consumerRef": "worker-1"}),
                     "spec.consumerRef must be an object reference", id="a consumer by name"),
        pytest.param(obj({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                          "metadata": {"name": "m1", "namespace": "site"},
                          "spec": {"clusterName": "c", "infrastructureRef": {
                              "kind": "Metal3Machine", "namespace": "tenant-b", "name": "m"}}}),
                     "spec.infrastructureRef.namespace 'tenant-b' is not the Machine's",
                     id="a Machine's infrastructure elsewhere"),
        pytest.param(obj({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                          "metadata": {"name": "m1", "namespace": "site"},
                          "spec": {"clusterName": "c", "bootstrap": {"configRef": {
                              "kind": "KubeadmConfig", "namespace": "tenant-b", "name": "m"}}}}),
                     "spec.bootstrap.configRef.namespace 'tenant-b' is not the Machine's",
                     id="a Machine's bootstrap elsewhere"),
        pytest.param(obj(["not", "an", "object"]), "data must be a Kubernetes object",
                     id="a list"),
    ],
)  # fmt: skip
def test_what_a_design_cannot_hold(document: dict[str, Any], problem: str) -> None:
    found = read_site([document], NS)
    assert len(found.problems) == 1, found.problems
    assert problem in found.problems[0]
    assert found.objects == ()


def machine_with(**meta: Any) -> dict[str, Any]:
    return obj({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                "metadata": {"name": "m1", "namespace": "site"} | meta,
                "spec": {"clusterName": "c"}}, name="machine.site.m1")  # fmt: skip


def labelled(labels: dict[str, str]) -> dict[str, Any]:
    return obj({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "worker-1", "labels": labels}}, name="node.worker-1")  # fmt: skip


# What makes a controller act on a server, on any object of the design; and the
# Kubernetes label domains. Each refusal names the document and the key.
@pytest.mark.parametrize(
    ("document", "problem"),
    [
        pytest.param(machine_with(annotations={"host.metal3.io/external-remediation": ""}),
                     "document 'machine.site.m1': annotation"
                     " 'host.metal3.io/external-remediation' would power, fence",
                     id="the remediation request on a Machine"),
        pytest.param(machine_with(annotations={"cluster.x-k8s.io/remediate-machine": ""}),
                     "annotation 'cluster.x-k8s.io/remediate-machine' would power",
                     id="a manual remediation request"),
        pytest.param(machine_with(annotations={"remediation.metal3.io/node-labels-backup": "{}"}),
                     "annotation 'remediation.metal3.io/node-labels-backup' would power",
                     id="a remediation's backup"),
        pytest.param(machine_with(annotations={"reboot.metal3.io/machine-remediation": ""}),
                     "annotation 'reboot.metal3.io/machine-remediation' would power",
                     id="machine-remediation's reboot"),
        pytest.param(machine_with(annotations={"metalmend.dev/remediation-ended-at": "x"}),
                     "annotation 'metalmend.dev/remediation-ended-at' is metalmend's own",
                     id="metalmend's stamp"),
        pytest.param(machine_with(labels={"shipyard.metalmend.dev/x": "y"}),
                     "label 'shipyard.metalmend.dev/x' is metalmend's own",
                     id="a subdomain of metalmend's"),
        pytest.param(labelled({"promenade-decomission": "enabled"}),
                     "document 'node.worker-1': label 'promenade-decomission' would power,"
                     " fence, remediate or stop", id="the teardown label"),
        pytest.param(labelled({"promenade-decomission": ""}),
                     "label 'promenade-decomission' would", id="the teardown label, empty"),
        pytest.param(labelled({"metalmend.dev/lab-host": "x"}),
                     "label 'metalmend.dev/lab-host' is metalmend's own", id="metalmend's label"),
        pytest.param(labelled({"node-role.kubernetes.io/control-plane": ""}),
                     "label 'node-role.kubernetes.io/control-plane' is in a Kubernetes domain",
                     id="a node role, not allowed"),
        pytest.param(labelled({"kubernetes.io/hostname": "x"}),
                     "label 'kubernetes.io/hostname' is in a Kubernetes domain",
                     id="the kubelet's label"),
        pytest.param(labelled({"node-restriction.kubernetes.io/x": "y"}),
                     "label 'node-restriction.kubernetes.io/x' is in a Kubernetes domain",
                     id="node-restriction"),
        pytest.param(labelled({"topology.k8s.io/zone": "a"}),
                     "label 'topology.k8s.io/zone' is in a Kubernetes domain", id="k8s.io"),
        pytest.param(obj({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": "worker-9", "labels": {"a": "b"}}},
                         name="node.worker-9"),
                     "document 'node.worker-9': Node 'worker-9' is not a Node of the design's"
                     " hosts", id="another server's Node"),
    ],
)  # fmt: skip
def test_what_would_act_on_a_server_is_refused(document: dict[str, Any], problem: str) -> None:
    found = read_site([host(), document], NS)
    assert len(found.problems) == 1, found.problems
    assert problem in found.problems[0]
    assert found.node_labels == {}


@pytest.mark.parametrize(
    ("labels", "allowed", "refused"),
    [
        ({"node-role.kubernetes.io/worker": ""}, ("node-role.kubernetes.io/",), False),
        ({"node-role.kubernetes.io/worker": ""}, ("node-role.kubernetes.io/w",), False),
        ({"kubernetes.io/hostname": "x"}, ("node-role.kubernetes.io/",), True),
        ({"cluster.x-k8s.io/cluster-name": "c"}, (), False),  # x-k8s.io is not k8s.io
        ({"example.com/kubernetes.io": "x"}, (), False),
        ({"role": "worker", "rack": "r1"}, (), False),
    ],
)  # fmt: skip
def test_kubernetes_label_domains_only_under_the_allowed_prefixes(
    labels: dict[str, str], allowed: tuple[str, ...], refused: bool
) -> None:
    found = read_site([host(), labelled(labels)], NS, allowed)
    assert bool(found.problems) is refused, found.problems
    assert found.node_labels == ({} if refused else {"worker-1": labels})


def test_redeploy_reads_the_design_with_the_same_rules() -> None:
    image = {"image": {"url": "u", "checksum": "c"}}
    good = read_site([host(spec=image), node()], NS)
    assert redeploy_problems(good, ["worker-1"]) == []
    assert host_named(good, "worker-1") is not None
    bad = read_site([host(spec=image), labelled({"promenade-decomission": "enabled"})], NS)
    assert "label 'promenade-decomission'" in redeploy_problems(bad, ["worker-1"])[0]
    assert redeploy_problems(good, ["worker-2"]) == ["the design has no BareMetalHost 'worker-2'"]
    no_image = read_site([host()], NS)
    assert "has no spec.image" in redeploy_problems(no_image, ["worker-1"])[0]
    two = read_site([host(spec=image), host(namespace="other", spec=image)], ("site", "other"))
    assert "2 BareMetalHosts named 'worker-1'" in redeploy_problems(two, ["worker-1"])[0]
    assert host_named(two, "worker-1") is None
    outside = read_site([host(namespace="kube-system", spec=image)], NS)
    assert "namespace 'kube-system' is not one" in redeploy_problems(outside, ["worker-1"])[0]


def test_deploy_site_and_redeploy_check_the_bmcs_of_what_they_apply_by_one_rule() -> None:
    """deploy_site: every host of the design; redeploy_server: its targets' hosts; the
    same lines for both (issue 27, point 3)."""
    design = read_site([host("w1", spec={}), host("w2")], NS)
    assert [h.name for h in bmc_hosts(design)] == ["w1", "w2"]
    assert [h.name for h in bmc_hosts(design, ["w2"])] == ["w2"]
    w1, w2 = design.hosts
    assert bmc_problems([HostBmcSeen(w1), HostBmcSeen(w2)]) == []
    found = bmc_problems([HostBmcSeen(w1, address="'..' in the path"),
                          HostBmcSeen(w2, credentials="Secret site/w2-bmc is not bound")])  # fmt: skip
    assert found == [
        "BareMetalHost site/w1: spec.bmc.address: '..' in the path",
        "BareMetalHost site/w2: Secret site/w2-bmc is not bound",
    ]


def test_an_object_twice_and_an_empty_namespace_list_are_refused() -> None:
    twice = read_site([host(), host()], NS)
    assert "is in the design twice" in twice.problems[0]
    nowhere = read_site([host()], ())
    assert "serve.site_namespaces is empty" in nowhere.problems[0]
    # a Node's labels need no namespace; but a Node is labelled only for the design's hosts
    assert "not a Node of the design's hosts" in read_site([node()], ()).problems[0]


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


def test_continue_on_fail_waits_for_the_other_hosts_before_failing() -> None:
    """Shipyard's continue-on-fail=true: a failed host no longer stops the wait; its Node
    is not waited for; the wait fails once nothing else is awaited, naming the host."""
    broken = seen("BareMetalHost site/a", provisioning="provisioning error", error="no image")
    other = seen("BareMetalHost site/b", provisioning="provisioning")
    nodes = {"a": None, "b": None}
    stop = progress([broken, other], nodes)
    assert stop.fails() is True
    assert "Node a not registered" in stop.waiting
    going = progress([broken, other], nodes, continue_on_fail=True)
    assert going.failed == ("BareMetalHost site/a: provisioning error: no image",)
    assert going.waiting == ("BareMetalHost site/b provisioning", "Node b not registered")
    assert going.fails(continue_on_fail=True) is False
    ready = seen("BareMetalHost site/b")
    last = progress([broken, ready], {"a": None, "b": True}, continue_on_fail=True)
    assert (last.waiting, last.fails(continue_on_fail=True)) == ((), True)
    assert progress([ready], {"b": True}, continue_on_fail=True).done


SITE = ActionName.DEPLOY_SITE
REDEPLOY = ActionName.REDEPLOY_SERVER
RELABEL = ActionName.RELABEL_NODES


@pytest.mark.parametrize(
    ("name", "targets", "running", "refused"),
    [
        (SITE, (), [], None),
        (SITE, (), [Running("A", "redeploy_server", frozenset({"n1"}))], "is running"),
        (REDEPLOY, ("n1",), [Running("A", "update_site")], "is running"),
        (REDEPLOY, ("n1",), [Running("A", "redeploy_server", frozenset({"n2"}))], None),
        (REDEPLOY, ("n1", "n2"), [Running("A", "redeploy_server", frozenset({"n2"}))],
         "already redeploying n2"),
        (RELABEL, ("n2",), [Running("A", "redeploy_server", frozenset({"n2"}))],
         "already redeploying n2"),
        (REDEPLOY, ("n2",), [Running("A", "relabel_nodes", frozenset({"n2"}))],
         "already relabelling n2"),
        (RELABEL, ("n1",), [Running("A", "relabel_nodes", frozenset({"n2"}))], None),
        (RELABEL, ("n1",), [Running("A", "deploy_site")], "is running"),
    ],
)  # fmt: skip
def test_which_actions_run_side_by_side(
    name: ActionName, targets: tuple[str, ...], running: list[Running], refused: str | None
) -> None:
    found = collision(name, targets, running)
    assert (found is None) if refused is None else (found is not None and refused in found)


def test_relabel_nodes_takes_target_nodes_only_and_each_action_names_its_targets() -> None:
    from metalmend.siteactions.policy.actions import (
        BadParameters,
        action_targets,
        relabel_parameters,
    )

    assert relabel_parameters({"target_nodes": "n1,n2"}) == ("n1", "n2")
    assert relabel_parameters({"target_nodes": ["n1", "n1"]}) == ("n1",)
    for raw in ({}, {"target_nodes": []}, {"target_nodes": ["N_1"]}, {"x": 1}, ["n1"]):
        assert isinstance(relabel_parameters(raw), BadParameters), raw
    assert action_targets("relabel_nodes", {"target_nodes": ["n1"]}) == ("n1",)
    assert action_targets("redeploy_server", {"target_nodes": ["n2"]}) == ("n2",)
    assert action_targets("deploy_site", {}) == ()
    assert action_targets("relabel_nodes", {"bad": 1}) == ()


def test_references_of_the_objects_own_namespace_or_none_are_accepted() -> None:
    own = {"kind": "Machine", "namespace": "site", "name": "m1"}
    found = read_site([host(spec={"consumerRef": own}), host("w2", spec={"consumerRef": {
        "kind": "Machine", "name": "m2"}})], NS)  # fmt: skip
    assert found.problems == ()
