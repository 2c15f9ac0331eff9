"""MachineHealthCheck admission on the real API server, as Cluster API's webhook refuses:
an empty selector, a change of clusterName, a selector naming another cluster (the CRD
schema), a remediation template of another namespace (the ValidatingAdmissionPolicy in
deploy/policies/machinehealthcheck-admission.yaml)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.types import PatchType

from metalmend.api.resources import MachineHealthCheck
from tests.support import Deadline

POLICY = (
    Path(__file__).resolve().parents[2]
    / "deploy"
    / "policies"
    / "machinehealthcheck-admission.yaml"
)
TEMPLATE = {
    "apiVersion": "remediation.metal3.io/v1alpha1",
    "kind": "Metal3RemediationTemplate",
    "name": "fence",
}


@pytest.fixture
def admission_policy(kube: Client, namespace: str) -> Iterator[None]:
    """The policy, its binding limited to ``namespace`` (the shared test cluster must not
    see it); removed after."""
    created: list[Any] = []
    for document in yaml.safe_load_all(POLICY.read_text()):
        document["metadata"]["name"] += f"-{namespace}"
        if document["kind"] == "ValidatingAdmissionPolicyBinding":
            document["spec"]["policyName"] += f"-{namespace}"
            selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            document["spec"]["matchResources"] = {"namespaceSelector": selector}
        created.append(kube.create(codecs.from_dict(document)))
    yield
    for obj in reversed(created):  # the binding before its policy
        kube.delete(type(obj), obj.metadata.name)


def check(name: str, **spec: Any) -> Any:
    body = {"clusterName": "c", "selector": {"matchLabels": {"role": "worker"}}, **spec}
    return MachineHealthCheck(metadata=ObjectMeta(name=name), spec=body)


def refused(attempt: Any, within: float = 30.0) -> ApiError:
    """The first refusal (a new policy takes a moment to be enforced)."""
    deadline = Deadline(within)
    while True:
        try:
            created = attempt()
        except ApiError as error:
            return error
        if deadline.expired():
            raise AssertionError(f"admitted: {created}")
        kube_delete = getattr(attempt, "undo", None)
        if kube_delete is not None:
            kube_delete()
        time.sleep(0.5)


@pytest.mark.parametrize(
    "selector",
    [
        pytest.param({}, id="no matchLabels nor matchExpressions"),
        pytest.param({"matchLabels": {}}, id="empty matchLabels"),
        pytest.param({"matchLabels": {}, "matchExpressions": []}, id="both empty"),
    ],
)
def test_an_empty_selector_is_refused(
    kube: Client, namespace: str, selector: dict[str, Any]
) -> None:
    with pytest.raises(ApiError) as caught:
        kube.create(check("empty", selector=selector), namespace=namespace)
    assert caught.value.status.code == 422
    assert "must not be empty" in str(caught.value.status.message)


def test_cluster_name_cannot_change(kube: Client, namespace: str) -> None:
    kube.create(check("workers"), namespace=namespace)
    with pytest.raises(ApiError) as caught:
        kube.patch(MachineHealthCheck, "workers", {"spec": {"clusterName": "other"}},
                   namespace=namespace, patch_type=PatchType.MERGE)  # fmt: skip
    assert "clusterName cannot be changed" in str(caught.value.status.message)
    kube.patch(MachineHealthCheck, "workers", {"spec": {"maxUnhealthy": 1}},
               namespace=namespace, patch_type=PatchType.MERGE)  # fmt: skip  # the rest may


def test_the_selectors_cluster_name_label_must_match_cluster_name(
    kube: Client, namespace: str
) -> None:
    other = {"matchLabels": {"role": "worker", "cluster.x-k8s.io/cluster-name": "other"}}
    with pytest.raises(ApiError) as caught:
        kube.create(check("other", selector=other), namespace=namespace)
    assert "cluster-name label must match clusterName" in str(caught.value.status.message)
    same = {"matchLabels": {"role": "worker", "cluster.x-k8s.io/cluster-name": "c"}}
    kube.create(check("same", selector=same), namespace=namespace)


def test_a_remediation_template_of_another_namespace_is_refused(
    kube: Client, namespace: str, admission_policy: None
) -> None:
    elsewhere = {**TEMPLATE, "namespace": "kube-system"}

    def create() -> Any:
        return kube.create(check("elsewhere", remediationTemplate=elsewhere), namespace=namespace)

    def undo() -> None:
        kube.delete(MachineHealthCheck, "elsewhere", namespace=namespace)

    create.undo = undo  # type: ignore[attr-defined]
    error = refused(create)
    assert "must be empty or the MachineHealthCheck's own namespace" in str(error.status.message)
    own = {**TEMPLATE, "namespace": namespace}
    kube.create(check("own", remediationTemplate=own), namespace=namespace)
    kube.create(check("implicit", remediationTemplate=TEMPLATE), namespace=namespace)
