"""OpenShift's machine-api in the lab and in tests: the real MachineHealthCheck controller
(``github.com/openshift/machine-api-operator`` ``cmd/machine-healthcheck``, built by
tools/openshift/build.sh, ``make openshift``) against a lab's or a test's API server, with the
module's own machine-api CRDs (``install/0000_30_machine-api-operator_*.crd.yaml``,
unmodified).

What the controller needs, and what it does (``pkg/controller/machinehealthcheck``):

- ``machine.openshift.io/v1beta1`` Machines selected by a MachineHealthCheck of their
  namespace, each with ``status.nodeRef`` (OpenShift's nodelink-controller sets it; here
  metalmend's node-link, which reads OpenShift's Machines through controllers/machines.py).
- A Machine is unhealthy when its Node has one of the check's ``unhealthyConditions`` for
  longer than its timeout, or when the Node its nodeRef names does not exist.
- Then, with ``spec.remediationTemplate``, it creates an object of the template's kind
  without ``Template``, named after the Machine, owned by it, ``spec`` copied from the
  template's ``spec.template.spec``, and deletes it once the Machine is healthy again;
  without a template but with the check's annotation
  ``machine.openshift.io/remediation-strategy: external-baremetal``, it puts
  ``host.metal3.io/external-remediation`` on the Machine (metal3's baremetal-operator, or
  metalmend's machine-remediation, removes it); otherwise it deletes the Machine.
- ``maxUnhealthy``: with more unhealthy Machines, it does nothing (RemediationAllowed False).
"""

from __future__ import annotations

from pathlib import Path

import httpx
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource

from metalmend.kube.crds import install_crds as apply_crds
from metalmend_lab.assets import OpenShiftAssets
from metalmend_lab.controlplane import LOOPBACK, Component, free_port, start_component

COMPONENT = "openshift-machine-healthcheck"
API = "machine.openshift.io/v1beta1"
REMEDIATION_STRATEGY = "machine.openshift.io/remediation-strategy"
EXTERNAL_BAREMETAL = "external-baremetal"

MachineHealthCheck = create_namespaced_resource(
    "machine.openshift.io", "v1beta1", "MachineHealthCheck", "machinehealthchecks"
)
MachineSet = create_namespaced_resource(
    "machine.openshift.io", "v1beta1", "MachineSet", "machinesets"
)


def install_crds(client: Client, assets: OpenShiftAssets) -> list[str]:
    """The module's Machine, MachineSet and MachineHealthCheck CRDs, applied as they are."""
    return apply_crds(client, assets.crds)


class HealthCheck:
    """OpenShift's machine-healthcheck process: its health endpoint on a free loopback port
    (how start-up is awaited), its metrics on an ephemeral one, no leader election."""

    def __init__(
        self, assets: OpenShiftAssets, kubeconfig: Path, workdir: Path, namespace: str = ""
    ) -> None:
        self.assets, self.kubeconfig, self.workdir = assets, kubeconfig, workdir
        self.namespace = namespace  # "" : every namespace
        self.health_port = free_port()

    def argv(self) -> list[str]:
        argv = [
            str(self.assets.machine_healthcheck), f"--kubeconfig={self.kubeconfig}",
            f"--health-addr={LOOPBACK}:{self.health_port}",
            f"--metrics-bind-address={LOOPBACK}:0", "--leader-elect=false",
        ]  # fmt: skip
        if self.namespace:
            argv.append(f"--namespace={self.namespace}")
        return argv

    def ready(self) -> bool:
        try:
            url = f"http://{LOOPBACK}:{self.health_port}/readyz"
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> Component:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return start_component(
            COMPONENT, self.argv(), self.workdir, self.ready,
            waiting_for=f"OpenShift's machine-healthcheck's GET http://{LOOPBACK}:"
            f"{self.health_port}/readyz to answer 200",
        )  # fmt: skip
