"""What every CRD manifest must declare, checked without a cluster."""

from __future__ import annotations

import pytest

from metalmend.kube.crds import load_crds

CRDS = {crd.metadata.name: crd for crd in load_crds()}


def test_the_eight_kinds_are_defined() -> None:
    assert set(CRDS) == {
        "baremetalhosts.metal3.io",
        "machines.cluster.x-k8s.io",
        "machinehealthchecks.cluster.x-k8s.io",
        "metal3remediations.remediation.metal3.io",
        "metal3remediationtemplates.remediation.metal3.io",
        "fenceremediations.remediation.metalmend.dev",
        "fenceremediationtemplates.remediation.metalmend.dev",
        "nodehealthchecks.healthcheck.metalmend.dev",
    }


@pytest.mark.parametrize("name", sorted(CRDS))
def test_each_version_has_status_subresource_schema_and_columns(name: str) -> None:
    for version in CRDS[name].spec.versions:
        assert version.subresources is not None
        assert version.subresources.status is not None
        assert version.schema.openAPIV3Schema.type == "object"
        assert version.additionalPrinterColumns


def test_baremetalhost_keeps_upstream_fields_it_does_not_model() -> None:
    schema = CRDS["baremetalhosts.metal3.io"].spec.versions[0].schema.openAPIV3Schema
    spec, status = schema.properties["spec"], schema.properties["status"]
    assert spec["x-kubernetes-preserve-unknown-fields"] is True
    provisioning = status["properties"]["provisioning"]["properties"]
    assert {"state", "lastPoweredOn", "pendingRebootSince"} <= set(provisioning)


def test_no_kind_of_ours_is_served_in_capm3s_group() -> None:
    """CAPM3 always serves Metal3Remediation(Template) in infrastructure.cluster.x-k8s.io
    and cannot be switched off: a CRD of ours there would replace its."""
    groups = {crd.spec.group for crd in CRDS.values()}
    assert "infrastructure.cluster.x-k8s.io" not in groups
    fence = CRDS["fenceremediations.remediation.metalmend.dev"].spec
    template = CRDS["fenceremediationtemplates.remediation.metalmend.dev"].spec
    # the external remediation contract: the template's kind is the object's + "Template"
    assert template.names.kind == fence.names.kind + "Template"
    assert [v.name for v in fence.versions] == [v.name for v in template.versions]
    status = fence.versions[0].schema.openAPIV3Schema.properties["status"]
    assert "conditions" in status["properties"]
