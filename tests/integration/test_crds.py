"""The CRDs as the real apiserver serves them: established, columns, status, validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType

from metalmend.api.resources import (
    BareMetalHost,
    Machine,
    MachineHealthCheck,
    Metal3Remediation,
    Metal3RemediationTemplate,
)
from metalmend.kube.crds import established, load_crds

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"

COLUMNS = {
    "baremetalhosts.metal3.io": {"State", "Online", "Powered", "Age"},
    "machinehealthchecks.cluster.x-k8s.io": {"Expected", "Healthy", "Allowed", "Age"},
    "metal3remediations.remediation.metal3.io": {"Phase", "Retries", "Age"},
}


def test_every_crd_is_established_with_a_status_subresource(kube: Client) -> None:
    for crd in load_crds():
        served = kube.get(CustomResourceDefinition, crd.metadata.name)
        assert established(served), crd.metadata.name
        assert all(
            v.subresources and v.subresources.status is not None for v in served.spec.versions
        )


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_printer_columns(kube: Client, name: str) -> None:
    served = kube.get(CustomResourceDefinition, name)
    columns = {c.name for c in served.spec.versions[0].additionalPrinterColumns}
    assert COLUMNS[name] <= columns


def test_seed_004_example_applies_unchanged(kube: Client, namespace: str) -> None:
    manifest = yaml.safe_load((EXAMPLES / "seed-004-baremetalhost.yaml").read_text())
    kube.create(BareMetalHost(manifest), namespace=namespace)
    host = kube.get(BareMetalHost, "example", namespace=namespace)
    assert host.metadata.annotations == manifest["metadata"]["annotations"]
    assert host["spec"] == manifest["spec"]


def test_upstream_fields_we_do_not_model_are_preserved(kube: Client, namespace: str) -> None:
    manifest = yaml.safe_load((EXAMPLES / "seed-004-baremetalhost.yaml").read_text())
    manifest["spec"]["rootDeviceHints"] = {"deviceName": "/dev/sda"}
    manifest["spec"]["image"] = {"url": "http://127.0.0.1/image.qcow2", "checksum": "abc"}
    kube.create(BareMetalHost(manifest), namespace=namespace)
    host = kube.get(BareMetalHost, "example", namespace=namespace)
    assert host["spec"]["rootDeviceHints"] == {"deviceName": "/dev/sda"}
    assert host["spec"]["image"]["checksum"] == "abc"


def test_status_is_written_only_through_the_status_subresource(
    kube: Client, namespace: str
) -> None:
    manifest = yaml.safe_load((EXAMPLES / "seed-004-baremetalhost.yaml").read_text())
    manifest["status"] = {"poweredOn": True}
    kube.create(BareMetalHost(manifest), namespace=namespace)
    assert kube.get(BareMetalHost, "example", namespace=namespace).get("status") in (None, {})
    kube.patch(
        BareMetalHost.Status,
        "example",
        {"status": {"poweredOn": True, "provisioning": {"lastPoweredOn": "2026-01-02T03:04:05Z"}}},
        namespace=namespace,
        patch_type=PatchType.MERGE,  # custom resources take no strategic merge patches
    )
    status = kube.get(BareMetalHost, "example", namespace=namespace)["status"]
    assert status["poweredOn"] is True
    assert status["provisioning"]["lastPoweredOn"] == "2026-01-02T03:04:05Z"


def mhc(**spec: Any) -> MachineHealthCheck:
    body = {"clusterName": "c", "selector": {"matchLabels": {"role": "worker"}}, **spec}
    return MachineHealthCheck(metadata={"name": "check"}, spec=body)


def rejected(kube: Client, namespace: str, obj: Any) -> str:
    with pytest.raises(ApiError) as caught:
        kube.create(obj, namespace=namespace)
    assert caught.value.status.code == 422
    return str(caught.value.status.message)


UNHEALTHY = [{"type": "Ready", "status": "Unknown", "timeout": "5m"}]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        pytest.param(
            {"unhealthyRange": "[5-"}, "must look like [min-max]", id="unhealthyRange [5-"
        ),
        pytest.param(
            {"unhealthyRange": "1-3"}, "must look like [min-max]", id="unhealthyRange no brackets"
        ),
        pytest.param({"maxUnhealthy": "abc"}, "percentage", id="maxUnhealthy abc"),
        pytest.param({"maxUnhealthy": "140%"}, "percentage", id="maxUnhealthy over 100%"),
        pytest.param({"maxUnhealthy": -1}, "non-negative integer", id="maxUnhealthy negative"),
        pytest.param(
            {"unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "-5m"}]},
            "non-negative duration",
            id="negative condition timeout",
        ),
        pytest.param(
            {"nodeStartupTimeout": "-10m"},
            "non-negative duration",
            id="negative nodeStartupTimeout",
        ),
        pytest.param(
            {"nodeStartupTimeout": "10s"}, "at least 30s", id="nodeStartupTimeout below 30s"
        ),
    ],
)
def test_schema_rejects_malformed_health_checks(
    kube: Client, namespace: str, spec: dict[str, Any], says: str
) -> None:
    message = rejected(kube, namespace, mhc(**{"unhealthyConditions": UNHEALTHY, **spec}))
    assert says in message


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"maxUnhealthy": 2}, id="maxUnhealthy int"),
        pytest.param({"maxUnhealthy": "40%"}, id="maxUnhealthy percent"),
        pytest.param({"unhealthyRange": "[1-3]"}, id="unhealthyRange"),
        pytest.param({"unhealthyRange": "[3-1]"}, id="max below min is the controller's to report"),
        pytest.param({"nodeStartupTimeout": "0"}, id="nodeStartupTimeout disabled"),
        pytest.param({"nodeStartupTimeout": "1h30m"}, id="nodeStartupTimeout compound"),
    ],
)
def test_schema_accepts_well_formed_health_checks(
    kube: Client, namespace: str, spec: dict[str, Any]
) -> None:
    kube.create(mhc(unhealthyConditions=UNHEALTHY, **spec), namespace=namespace)


def test_remediation_defaults_and_rejections(kube: Client, namespace: str) -> None:
    kube.create(Metal3Remediation(metadata={"name": "m"}, spec={}), namespace=namespace)
    spec = kube.get(Metal3Remediation, "m", namespace=namespace)["spec"]
    assert spec == {
        "strategy": "reboot",
        "deleteAfterRetries": 3,
        "powerOffTimeoutSeconds": 120,
        "powerOnTimeoutSeconds": 600,
    }
    bad = Metal3Remediation(metadata={"name": "n"}, spec={"powerOnTimeoutSeconds": -1})
    assert "powerOnTimeoutSeconds" in rejected(kube, namespace, bad)
    bad = Metal3Remediation(metadata={"name": "n"}, spec={"strategy": "pray"})
    assert "strategy" in rejected(kube, namespace, bad)


def test_demo_manifests_apply(kube: Client, namespace: str) -> None:
    from lightkube.codecs import load_all_yaml

    for obj in load_all_yaml((EXAMPLES / "demo-cluster.yaml").read_text()):
        kube.create(obj, namespace=namespace)
    template = kube.get(Metal3RemediationTemplate, "workers", namespace=namespace)
    assert template["spec"]["template"]["spec"]["strategy"] == "escalate"
    assert kube.get(Machine, "worker-0", namespace=namespace)["spec"]["clusterName"] == "demo"
