"""The lab installs the chart's admission policies and they are in force (issue 27, point
11: "the lab installs the admission policies as the chart does"): the installer `metalmend
lab up` calls (``metalmend_lab.policies.install``), run against the real API server, puts
the ``spec.bmc`` policy and its binding in place (what ``metalmend run`` checks at start
finds nothing missing), and a caller who may patch hosts but is not a BMC writer is
refused a change of ``spec.bmc``, while the lab's admin (a listed writer) may make it.

This module has its own API server: the policies stay installed (cluster-wide) for the
rest of its tests, which a shared control plane's other tests must not feel."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.admissionregistration_v1 import ValidatingAdmissionPolicyBinding
from lightkube.resources.rbac_authorization_v1 import ClusterRole
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.kube import admission
from metalmend.kube.crds import install_crds
from metalmend_lab import policies as lab_policies
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig
from tests.integration.test_serve_promenade import token
from tests.support import until


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(ControlPlaneConfig(workdir=tmp_path_factory.mktemp("lab-policies")))
    plane.start()
    try:
        install_crds(Client(KubeConfig.from_file(plane.kubeconfig)))
        yield plane
    finally:
        plane.stop()


def _repoint(client: Client, namespace: str, name: str, port: int) -> str:
    """Patch the host's BMC address as ``client``: "" when it was written, else the API
    server's refusal."""
    try:
        client.patch(
            BareMetalHost, name, {"spec": {"bmc": {"address": f"ipmi://127.0.0.1:{port}"}}},
            namespace=namespace, patch_type=PatchType.MERGE,
        )  # fmt: skip
    except ApiError as error:
        return str(error.status.message)
    return ""


async def test_the_lab_installs_the_spec_bmc_policy_and_a_non_writer_cannot_repoint_a_host(
    control_plane: ControlPlane, kube: Client, aclient: AsyncClient, namespace: str
) -> None:
    assert await admission.missing(aclient) == (
        f"ValidatingAdmissionPolicy {admission.BMC_SPEC_POLICY} is not installed"
    )
    installed = lab_policies.install(kube)
    assert admission.BMC_SPEC_POLICY in installed
    assert lab_policies.BMC_SECRET_BINDING in installed
    # what `metalmend run` checks at start: installed and bound with Deny
    assert await admission.missing(aclient) is None
    binding = kube.get(ValidatingAdmissionPolicyBinding, admission.BMC_SPEC_POLICY)
    assert binding.spec is not None
    assert binding.spec.validationActions == ["Deny"]

    name = "worker-0"
    kube.create(
        BareMetalHost(
            metadata=ObjectMeta(name=name, namespace=namespace),
            spec={"online": True, "bmc": {"address": "ipmi://127.0.0.1:623",
                                          "credentialsName": f"{name}-bmc"}},
        )
    )  # fmt: skip
    # A tenant who may patch hosts (RBAC), not a BMC writer.
    kube.create(
        ClusterRole(
            metadata=ObjectMeta(name=f"{namespace}-host-patcher"),
            rules=[PolicyRule(apiGroups=["metal3.io"], resources=["baremetalhosts"],
                              verbs=["get", "patch"])],
        )
    )  # fmt: skip
    token(control_plane, kube, namespace, "tenant", f"{namespace}-host-patcher")
    tenant = Client(
        KubeConfig.from_file(control_plane.service_account_kubeconfig(namespace, "tenant"))
    )
    ports = count(1000)
    refusals: list[str] = []

    def refused() -> bool:  # the policy (and the binding) take effect within seconds
        refusals.append(_repoint(tenant, namespace, name, next(ports)))
        return "may not change spec.bmc" in refusals[-1]

    await until(refused, 60)
    assert (
        f"system:serviceaccount:{namespace}:tenant may not change spec.bmc of existing"
        f" BareMetalHost {name} (its BMC address and credentials); see ConfigMap"
        " metalmend-system/metalmend-bmc-writers"
    ) in refusals[-1], refusals[-1]
    before = kube.get(BareMetalHost, name, namespace=namespace).spec["bmc"]
    # The same tenant may still patch what the policy does not guard...
    tenant.patch(BareMetalHost, name, {"spec": {"online": False}}, namespace=namespace,
                 patch_type=PatchType.MERGE)  # fmt: skip
    assert kube.get(BareMetalHost, name, namespace=namespace).spec["bmc"] == before
    # ... and the lab's admin, a listed writer, may re-address the BMC.
    assert _repoint(kube, namespace, name, 623) == ""
    assert kube.get(BareMetalHost, name, namespace=namespace).spec["bmc"]["address"] == (
        "ipmi://127.0.0.1:623"
    )
