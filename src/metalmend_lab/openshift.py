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
from typing import Any

import httpx
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource

from metalmend.api import names
from metalmend.kube.crds import install_crds as apply_crds
from metalmend_lab.assets import OpenShiftAssets
from metalmend_lab.controlplane import LOOPBACK, Component, free_port, start_component
from metalmend_lab.inventory import HostSpec

COMPONENT = "openshift-machine-healthcheck"
NODELINK = "openshift-nodelink-controller"
MACHINESET = "workers"  # the lab's one MachineSet, owner of every host's Machine
CLUSTER_LABEL = "machine.openshift.io/cluster-api-cluster"
MACHINESET_LABEL = "machine.openshift.io/cluster-api-machineset"
MACHINE_ROLE_LABEL = "machine.openshift.io/cluster-api-machine-role"
CLUSTER = "lab"
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


def provider_id(namespace: str, host: str, uid: str) -> str:
    """The providerID OpenShift's metal3 provider (cluster-api-provider-baremetal) writes on
    a Machine and its Node: ``baremetalhost:///<namespace>/<host>/<host uid>``."""
    return f"baremetalhost:///{namespace}/{host}/{uid}"


def machineset_object(namespace: str, labels: dict[str, str], replicas: int) -> dict[str, Any]:
    """The MachineSet that owns the lab's Machines (OpenShift's machineset controller does not
    run here: nothing scales it; it is the Machines' controller owner, as in a cluster)."""
    selector = {CLUSTER_LABEL: CLUSTER, MACHINESET_LABEL: MACHINESET}
    return {
        "apiVersion": API, "kind": "MachineSet",
        "metadata": {"name": MACHINESET, "namespace": namespace,
                     "labels": {CLUSTER_LABEL: CLUSTER}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": {**selector, **labels}},
                         "spec": {"providerSpec": {}}},
        },
    }  # fmt: skip


def machine_object(
    host: HostSpec, labels: dict[str, str], host_uid: str, machineset_uid: str
) -> dict[str, Any]:
    """A host's ``machine.openshift.io/v1beta1`` Machine as OpenShift's metal3 provider makes
    it: named after the host (the lab's hosts, Machines and Nodes share names), annotated
    ``metal3.io/BareMetalHost: <namespace>/<host>``, ``spec.providerID`` naming the host with
    its uid, a controller ownerReference to the MachineSet."""
    owner = {"apiVersion": API, "kind": "MachineSet", "name": MACHINESET,
             "uid": machineset_uid, "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    return {
        "apiVersion": API, "kind": "Machine",
        "metadata": {
            "name": host.name, "namespace": host.namespace,
            "labels": {**labels, CLUSTER_LABEL: CLUSTER, MACHINESET_LABEL: MACHINESET,
                       MACHINE_ROLE_LABEL: "worker"},
            "annotations": {names.MACHINE_HOST: f"{host.namespace}/{host.name}"},
            "ownerReferences": [owner],
        },
        "spec": {"providerID": provider_id(host.namespace, host.name, host_uid),
                 "providerSpec": {}},
    }  # fmt: skip


class NodeLink:
    """OpenShift's nodelink-controller (``cmd/nodelink-controller``): sets a Machine's
    ``status.nodeRef`` to the Node with its providerID, and annotates the Node
    ``machine.openshift.io/machine: <namespace>/<machine>``. It has no health endpoint and
    serves no metrics (``BindAddress: "0"`` in its main.go): it is ready once its log says
    controller-runtime started its workers."""

    READY_LINE = "Starting workers"

    def __init__(self, binary: Path, kubeconfig: Path, workdir: Path) -> None:
        self.binary, self.kubeconfig, self.workdir = binary, kubeconfig, workdir

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{NODELINK}.log"

    def argv(self) -> list[str]:
        return [str(self.binary), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false"]

    def start(self) -> Component:
        self.workdir.mkdir(parents=True, exist_ok=True)
        begun_at = self.log_path.stat().st_size if self.log_path.exists() else 0

        def ready() -> bool:
            try:
                with self.log_path.open("rb") as log:
                    log.seek(begun_at)
                    return self.READY_LINE.encode() in log.read()
            except OSError:
                return False

        return start_component(
            NODELINK, self.argv(), self.workdir, ready,
            waiting_for=f"OpenShift's nodelink-controller to log {self.READY_LINE!r}",
        )  # fmt: skip
