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


def test_the_reboot_annotation_example_applies_unchanged(kube: Client, namespace: str) -> None:
    manifest = yaml.safe_load((EXAMPLES / "reboot-annotation-example.yaml").read_text())
    kube.create(BareMetalHost(manifest), namespace=namespace)
    host = kube.get(BareMetalHost, "example", namespace=namespace)
    assert host.metadata.annotations == manifest["metadata"]["annotations"]
    assert host["spec"] == manifest["spec"]


def test_upstream_fields_we_do_not_model_are_preserved(kube: Client, namespace: str) -> None:
    manifest = yaml.safe_load((EXAMPLES / "reboot-annotation-example.yaml").read_text())
    manifest["spec"]["rootDeviceHints"] = {"deviceName": "/dev/sda"}
    manifest["spec"]["image"] = {"url": "http://127.0.0.1/image.qcow2", "checksum": "abc"}
    kube.create(BareMetalHost(manifest), namespace=namespace)
    host = kube.get(BareMetalHost, "example", namespace=namespace)
    assert host["spec"]["rootDeviceHints"] == {"deviceName": "/dev/sda"}
    assert host["spec"]["image"]["checksum"] == "abc"


def test_status_is_written_only_through_the_status_subresource(
    kube: Client, namespace: str
) -> None:
    manifest = yaml.safe_load((EXAMPLES / "reboot-annotation-example.yaml").read_text())
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


GO_MAX = "must be at most 2562047h (about 292 years)"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        pytest.param({"selector": {}}, "must not be empty", id="empty selector"),
        pytest.param({"selector": {"matchLabels": {}}}, "must not be empty", id="empty matchLabels"),
        pytest.param(
            {"selector": {"matchLabels": {}, "matchExpressions": []}}, "must not be empty",
            id="empty matchLabels and matchExpressions",
        ),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "role", "operator": "In"}]}},
            "In and NotIn need values", id="In without values",
        ),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "role", "operator": "Exists", "values": ["x"]}]}},
            "Exists and DoesNotExist take none", id="Exists with values",
        ),
        pytest.param(
            {"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "99999999h"}]},
            GO_MAX, id="condition timeout 99999999h",
        ),
        pytest.param(
            {"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "2562048h"}]},
            GO_MAX, id="condition timeout just past the longest duration",
        ),
        pytest.param({"nodeStartupTimeout": "99999999h"}, GO_MAX, id="nodeStartupTimeout 99999999h"),
        pytest.param(
            {"nodeStartupTimeout": "9" * 31 + "s"}, GO_MAX, id="nodeStartupTimeout 31 digits"
        ),
        pytest.param({"nodeStartupTimeout": "abc"}, "non-negative duration", id="nodeStartupTimeout abc"),
        pytest.param({"nodeStartupTimeout": "29s999ms"}, "at least 30s", id="nodeStartupTimeout just below 30s"),
        pytest.param({"nodeStartupTimeout": "500ms"}, "at least 30s", id="nodeStartupTimeout 500ms"),
        pytest.param(
            {"remediationTemplate": {"apiVersion": "/", "kind": "Metal3RemediationTemplate", "name": "t"}},
            "must be group/version", id="template apiVersion /",
        ),
        pytest.param(
            {"remediationTemplate": {"kind": "Metal3RemediationTemplate", "name": "t"}},
            "apiVersion", id="template without apiVersion",
        ),
        pytest.param(
            {"remediationTemplate": {"apiVersion": "remediation.metal3.io/v1alpha1", "kind": "no such kind", "name": "t"}},
            "must be a kind", id="template kind with spaces",
        ),
    ],
)  # fmt: skip
def test_schema_refuses_with_a_readable_message(
    kube: Client, namespace: str, spec: dict[str, Any], says: str
) -> None:
    """Issue 18: an empty selector was admitted (Cluster API refuses it); a huge duration
    was admitted and crashed the controller, or, for nodeStartupTimeout, was refused with
    "type conversion error from 'string' to 'google.protobuf.Duration'"."""
    message = rejected(kube, namespace, mhc(**{"unhealthyConditions": UNHEALTHY, **spec}))
    assert says in message
    assert "type conversion error" not in message
    assert "google.protobuf" not in message


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"maxUnhealthy": 2}, id="maxUnhealthy int"),
        pytest.param(
            {"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "0s"}]},
            id="condition timeout 0s: unhealthy when seen, as Cluster API",
        ),
        pytest.param(
            {"unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": "2562047h"}]},
            id="condition timeout: the longest duration",
        ),
        pytest.param({"nodeStartupTimeout": "30s"}, id="nodeStartupTimeout 30s"),
        pytest.param({"nodeStartupTimeout": "0s"}, id="nodeStartupTimeout 0s disabled"),
        pytest.param({"nodeStartupTimeout": "0.5m"}, id="nodeStartupTimeout fractional"),
        pytest.param({"nodeStartupTimeout": "1m500ms"}, id="nodeStartupTimeout mixed units"),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "role", "operator": "Exists"}]}},
            id="selector by expression only",
        ),
        pytest.param({"maxUnhealthy": "40%"}, id="maxUnhealthy percent"),
        pytest.param({"unhealthyRange": "[1-3]"}, id="unhealthyRange"),
        pytest.param({"unhealthyRange": "[3-1]"}, id="max below min is the controller's to report"),
        pytest.param({"nodeStartupTimeout": "0"}, id="nodeStartupTimeout disabled"),
        pytest.param({"nodeStartupTimeout": "1h30m"}, id="nodeStartupTimeout compound"),
    ],
)  # fmt: skip
def test_schema_accepts_well_formed_health_checks(
    kube: Client, namespace: str, spec: dict[str, Any]
) -> None:
    kube.create(mhc(**{"unhealthyConditions": UNHEALTHY, **spec}), namespace=namespace)


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
    # Larger timeouts overflowed the remediation's deadline arithmetic.
    bad = Metal3Remediation(metadata={"name": "n"}, spec={"powerOffTimeoutSeconds": 2**31})
    assert "powerOffTimeoutSeconds" in rejected(kube, namespace, bad)
    longest = Metal3Remediation(metadata={"name": "l"}, spec={"powerOnTimeoutSeconds": 2**31 - 1})
    kube.create(longest, namespace=namespace)


def test_demo_manifests_apply(kube: Client, namespace: str) -> None:
    from lightkube.codecs import load_all_yaml

    for obj in load_all_yaml((EXAMPLES / "demo-cluster.yaml").read_text()):
        kube.create(obj, namespace=namespace)
    template = kube.get(Metal3RemediationTemplate, "workers", namespace=namespace)
    assert template["spec"]["template"]["spec"]["strategy"] == "escalate"
    assert kube.get(Machine, "worker-0", namespace=namespace)["spec"]["clusterName"] == "demo"
