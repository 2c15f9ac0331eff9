"""The lab's site design (lab.sitedesign) without a lab: documents the design store takes,
in which redeploy_server finds each host's BareMetalHost, Machine and Node labels, and
the site's EtcdClusters; nothing the API server sets, no secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metalmend.designs.documents import dump_all, parse
from metalmend.siteactions.policy.deploysite import read_site, redeploy_problems
from metalmend.siteactions.policy.redeploy import KUBERNETES_OBJECT, host_documents
from metalmend.teardown.etcd.design import from_documents
from metalmend_lab import drives, sitedesign, siteetcd
from metalmend_lab.inventory import HostSpec


def hosts(count: int = 3) -> list[HostSpec]:
    return [
        HostSpec(
            name=f"worker-{i}", namespace="metalmend-lab", bmc="redfish", bmc_port=9000 + i,
            internal_port=8000, username=f"admin-worker-{i}", password=f"secret-{i}",
            provider_id=f"metal3://metalmend-lab/worker-{i}", kubeconfig="/nowhere",
            system_id=f"sys-{i}",
            labels={sitedesign.HOST_LABEL: f"worker-{i}", "kubernetes.io/hostname": f"worker-{i}"},
            drives=drives.plan(f"worker-{i}", i),
        )
        for i in range(count)
    ]  # fmt: skip


def site_documents(tmp_path: Path) -> list[dict[str, Any]]:
    found = hosts()
    site = siteetcd.plan(tmp_path, found, Path("/bin/etcd"))
    assert site is not None
    return sitedesign.site_documents(found, siteetcd.design_document(site))


def test_the_design_store_takes_the_documents(tmp_path: Path) -> None:
    documents = site_documents(tmp_path)
    stored = parse(dump_all(documents))
    assert [(d.schema, d.name) for d in stored][:3] == [
        (KUBERNETES_OBJECT, "baremetalhost.metalmend-lab.worker-0"),
        (KUBERNETES_OBJECT, "machine.metalmend-lab.worker-0"),
        (KUBERNETES_OBJECT, "node.worker-0"),
    ]
    assert len(stored) == 3 * 3 + 1
    assert stored[-1].schema == "promenade/EtcdClusters/v1"
    for document in stored:
        assert document.metadata["layeringDefinition"] == {"abstract": False, "layer": "site"}
        assert document.metadata["storagePolicy"] == "cleartext"


def test_redeploy_finds_each_hosts_objects_and_labels(tmp_path: Path) -> None:
    documents = site_documents(tmp_path)
    found = host_documents(documents, "worker-1")
    assert found.host_key == ("metalmend-lab", "worker-1")
    assert found.host is not None
    assert found.machine is not None
    spec = found.host["spec"]
    assert spec["online"] is True
    assert spec["image"] == sitedesign.LAB_IMAGE
    assert spec["consumerRef"] == {
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "worker-1",
        "namespace": "metalmend-lab",
    }  # fmt: skip
    assert spec["rootDeviceHints"] == {"deviceName": "/dev/sda"}
    assert spec["bmc"]["credentialsName"] == "worker-1-bmc"
    assert found.machine["spec"] == {
        "clusterName": "lab", "providerID": "metal3://metalmend-lab/worker-1"
    }  # fmt: skip
    # the kubelet's own labels (kubernetes.io) are the kubelet's to set, not the design's
    assert found.labels == {"metalmend-lab/host": "worker-1"}


def test_the_design_passes_what_site_actions_check(tmp_path: Path) -> None:
    found = read_site(site_documents(tmp_path), ["metalmend-lab"])
    assert found.problems == ()
    assert redeploy_problems(found, ["worker-0", "worker-1", "worker-2"]) == []


def test_the_objects_carry_nothing_the_api_server_sets_and_no_secret(tmp_path: Path) -> None:
    documents = site_documents(tmp_path)
    text = dump_all(documents)
    for secret in ("secret-0", "admin-worker-0"):
        assert secret not in text
    for document in documents[:-1]:
        obj = document["data"]
        assert "status" not in obj
        assert set(obj["metadata"]) <= {"name", "namespace", "labels", "annotations"}
        assert "uid" not in str(obj)
    node = documents[2]["data"]
    assert node == {"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"]}
    assert set(node["metadata"]) == {"name", "labels"}


def test_the_etcd_clusters_document_is_the_one_the_lab_serves(tmp_path: Path) -> None:
    documents = site_documents(tmp_path)
    design = from_documents(documents, "lab design")
    [cluster] = design.clusters
    assert cluster.name == siteetcd.CLUSTER
    assert [m.node for m in cluster.members] == ["worker-0", "worker-1", "worker-2"]
    served = siteetcd.design_documents(siteetcd.SitePlan.read(siteetcd.plan_path(tmp_path)))  # type: ignore[arg-type]
    assert parse(served)[0].data == documents[-1]["data"]


def test_without_a_site_etcd_only_the_hosts() -> None:
    documents = sitedesign.site_documents(hosts(2), None)
    assert len(documents) == 6
    assert all(d["schema"] == KUBERNETES_OBJECT for d in documents)


def test_lab_design_without_a_running_lab_says_so(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from metalmend.cli.main import app

    result = CliRunner().invoke(app, ["lab", "design", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no lab is running in" in result.output
