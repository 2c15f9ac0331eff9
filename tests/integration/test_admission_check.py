"""`metalmend run`'s check of the spec.bmc admission policy (kube/admission.py) on the real
API server: missing, it is said (Warning Event in metalmend's namespace, gauge 1, once);
installed and bound with Deny, the gauge is 0; never a readiness matter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient, Client, codecs
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import Event

from metalmend.kube import admission
from metalmend.kube.events import EventRecorder

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "bmc-spec-writers.yaml"


def gauge() -> float | None:
    for metric in admission.MISSING.collect():
        for sample in metric.samples:
            if sample.labels.get("policy") == admission.BMC_SPEC_POLICY:
                return sample.value
    return None


@pytest.fixture
def installed(kube: Client, namespace: str) -> Iterator[None]:
    """deploy/policies/bmc-spec-writers.yaml under its own names, its binding limited to
    this test's namespace (the shared test cluster must not feel it)."""
    created: list[Any] = []
    for document in yaml.safe_load_all(POLICY.read_text()):
        if document["kind"] == "ConfigMap":
            document["metadata"]["namespace"] = namespace
        if document["kind"] == "ValidatingAdmissionPolicyBinding":
            selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            document["spec"]["matchResources"] = {"namespaceSelector": selector}
            document["spec"]["paramRef"]["namespace"] = namespace
        obj = kube.create(codecs.from_dict(document))
        if document["kind"] != "ConfigMap":
            created.append(obj)
    yield
    for obj in reversed(created):
        kube.delete(type(obj), obj.metadata.name)


async def events_here(aclient: AsyncClient, namespace: str) -> list[str]:
    return [
        str(e.message)
        async for e in aclient.list(Event, namespace=namespace)
        if e.reason == admission.REASON
    ]


async def test_a_missing_spec_bmc_policy_is_said_once_with_what_it_exposes(
    aclient: AsyncClient, namespace: str
) -> None:
    recorder = EventRecorder(aclient)
    told = await admission.check(aclient, recorder, namespace)
    assert told == f"ValidatingAdmissionPolicy {admission.BMC_SPEC_POLICY} is not installed"
    assert gauge() == 1
    (message,) = await events_here(aclient, namespace)
    assert "send the password of the Secret bound to that host" in message
    # Checked again, unchanged: no second Event.
    assert await admission.check(aclient, recorder, namespace, told) == told
    assert len(await events_here(aclient, namespace)) == 1


async def test_an_installed_and_bound_policy_is_in_force(
    aclient: AsyncClient, kube: Client, namespace: str, installed: None
) -> None:
    recorder = EventRecorder(aclient)
    assert await admission.check(aclient, recorder, namespace) is None
    assert gauge() == 0
    assert await events_here(aclient, namespace) == []
    # A binding that only warns guards nothing.
    kube.patch(
        ValidatingAdmissionPolicyBinding, admission.BMC_SPEC_POLICY,
        {"spec": {"validationActions": ["Warn"]}},
    )  # fmt: skip
    told = await admission.check(aclient, recorder, namespace)
    assert told is not None
    assert "does not Deny" in told
    assert gauge() == 1
    assert kube.get(ValidatingAdmissionPolicy, admission.BMC_SPEC_POLICY) is not None
