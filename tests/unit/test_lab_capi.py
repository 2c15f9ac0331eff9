"""The lab's Cluster API objects (metalmend_lab.capi): pure shapes, no cluster."""

from __future__ import annotations

import base64

from metalmend_lab import capi
from metalmend_lab.inventory import HostSpec


def crd(*versions: str) -> dict[str, object]:
    return {"metadata": {"name": "machines.cluster.x-k8s.io"},
            "spec": {"versions": [{"name": v} for v in versions]}}  # fmt: skip


def test_conversion_webhook_only_where_there_is_something_to_convert() -> None:
    url = "https://127.0.0.1:9443/convert"
    patched = capi.with_conversion_webhook(crd("v1beta1", "v1beta2"), url, b"CA")
    assert patched["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"url": url, "caBundle": base64.b64encode(b"CA").decode()},
        },
    }
    original = crd("v1beta1", "v1beta2")
    capi.with_conversion_webhook(original, url, b"CA")
    assert "conversion" not in original["spec"]  # type: ignore[operator]
    assert "conversion" not in capi.with_conversion_webhook(crd("v1beta2"), url, b"CA")["spec"]


def test_a_machine_satisfies_the_contract_with_the_least() -> None:
    host = HostSpec.__new__(HostSpec)  # only what the objects use
    host.name, host.namespace, host.provider_id = "worker-1", "ns", "metal3://ns/worker-1"
    secret, infra, machine = capi.machine_objects(
        host, {"role": "worker"}, {"metal3.io/BareMetalHost": "ns/worker-1"}, control_plane=True
    )
    assert machine["spec"]["bootstrap"] == {"dataSecretName": secret["metadata"]["name"]}
    assert machine["spec"]["infrastructureRef"] == {
        "apiGroup": capi.INFRA_GROUP, "kind": "LabMachine", "name": "worker-1"
    }  # fmt: skip
    assert infra["spec"] == {"providerID": "metal3://ns/worker-1"}
    assert infra["status"]["initialization"] == {"provisioned": True}
    labels = machine["metadata"]["labels"]
    assert labels[capi.CLUSTER_NAME_LABEL] == capi.CLUSTER
    assert capi.CONTROL_PLANE_LABEL in labels
    assert machine["metadata"]["annotations"] == {"metal3.io/BareMetalHost": "ns/worker-1"}
    assert capi.infra_crd("LabMachine")["metadata"]["labels"] == {
        capi.CONTRACT_LABEL: capi.INFRA_VERSION
    }
