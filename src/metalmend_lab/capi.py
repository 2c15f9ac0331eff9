"""Cluster API in the lab: the real core manager (``sigs.k8s.io/cluster-api/core``, built
by tools/capi/build.sh) with its own CRDs, so that Cluster API's MachineHealthCheck
controller, not metalmend's, decides a Machine is unhealthy and creates the remediation
object from metalmend's FenceRemediationTemplate (``lab up`` with ``cluster_api``).

What the lab gives the manager, and why:

- **Its CRDs** (``cluster.x-k8s.io`` and the rest, as the module generates them) applied
  over metalmend's subset of Machine and MachineHealthCheck CRDs before any object exists,
  each with the conversion webhook Cluster API's own kustomize patches add
  (``config/crd/patches/webhook_in_*.yaml``), pointed at the manager on 127.0.0.1 with the
  lab CA's bundle: Cluster API stores ``v1beta2`` and converts to ``v1beta1``, which is
  what metalmend reads (``metalmend.api.resources.Machine``).
- **Its webhook server** (conversion, and the defaulting and validating webhooks, which
  the lab does not register with the API server) with a serving certificate from the lab
  CA. controller-runtime binds it on every interface (Cluster API has no flag for the
  address); its health and diagnostics endpoints are bound to 127.0.0.1.
- **A Cluster** ``lab`` without controlPlaneRef (Cluster API marks its control plane
  initialized once a Machine labelled ``cluster.x-k8s.io/control-plane`` has a Node) and
  with an infrastructureRef to a ``LabCluster`` created provisioned. Without an
  infrastructureRef Cluster API v1.14 marks the infrastructure provisioned but leaves the
  Cluster's ``InfrastructureReady`` condition Unknown, and its MachineHealthCheck then
  judges no Machine ("cluster infrastructure is not ready") while counting every one
  healthy (seen here the first time the manager ran). And the Secret ``lab-kubeconfig``
  whose kubeconfig is the lab's own API server: the workload cluster is the management
  cluster, as in a self-hosted Cluster API.
- **Per host, a Machine** (``v1beta2``) with ``spec.bootstrap.dataSecretName`` (bootstrap
  done: the lab's hosts start provisioned) and an infrastructure object, ``LabMachine``
  (group ``infrastructure.lab.metalmend.dev``, this module's CRD, labelled
  ``cluster.x-k8s.io/v1beta2: v1alpha1`` as the contract asks), that satisfies Cluster
  API's InfraMachine contract in the least way: ``spec.providerID`` the host's metal3
  providerID, ``status.initialization.provisioned: true``. The Machine controller copies
  the providerID and sets ``status.nodeRef`` to the Node with that providerID. The Machine
  also carries ``metal3.io/BareMetalHost``, and the BareMetalHost's consumerRef names it:
  how metalmend's fence-remediation finds the host (docs/remediation.md).
- **Or, as CAPM3 makes them** (``lab up --machine-api capi-metal3``), per host a
  ``Metal3Machine`` (upstream's CRD, cluster-api-provider-metal3
  ``config/crd/bases/infrastructure.cluster.x-k8s.io_metal3machines.yaml``, with the contract
  label ``cluster.x-k8s.io/v1beta2: v1beta2`` a provider's kustomization adds to its CRDs)
  named after the Machine, carrying ``metal3.io/BareMetalHost: <namespace>/<host>``
  (``HostAnnotation``) and ``spec.providerID: metal3://<namespace>/<host>/<metal3machine>``
  (``SetDefaultProviderID``), ``status.initialization.provisioned: true``; the Machine's
  ``spec.infrastructureRef`` names it and the Machine carries no host annotation; the host's
  consumerRef names the Metal3Machine. CAPM3's controller does not run (the Go module proxy
  refuses its module): these objects are made once, as it leaves them for a provisioned host.
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
from lightkube import ApiError, Client
from lightkube.codecs import load_all_yaml
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from metalmend.kube import errors
from metalmend.kube.crds import FIELD_MANAGER, crd_name, wait_established
from metalmend_lab.assets import CapiAssets
from metalmend_lab.controlplane import LOOPBACK, Component, ControlPlane, free_port, start_component
from metalmend_lab.inventory import HostSpec

COMPONENT = "capi-manager"
CLUSTER = "lab"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CONTRACT_LABEL = "cluster.x-k8s.io/v1beta2"
INFRA_GROUP = "infrastructure.lab.metalmend.dev"
INFRA_VERSION = "v1alpha1"
API = "cluster.x-k8s.io/v1beta2"

Cluster = create_namespaced_resource("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters")
MachineV1Beta2 = create_namespaced_resource("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
MachineHealthCheckV1Beta2 = create_namespaced_resource(
    "cluster.x-k8s.io", "v1beta2", "MachineHealthCheck", "machinehealthchecks"
)
LabMachine = create_namespaced_resource(INFRA_GROUP, INFRA_VERSION, "LabMachine", "labmachines")
LabCluster = create_namespaced_resource(INFRA_GROUP, INFRA_VERSION, "LabCluster", "labclusters")
METAL3_GROUP = "infrastructure.cluster.x-k8s.io"
METAL3_VERSION = "v1beta2"  # the storage version of the pinned Metal3Machine CRD
Metal3MachineV1Beta2 = create_namespaced_resource(
    METAL3_GROUP, METAL3_VERSION, "Metal3Machine", "metal3machines"
)
METAL3MACHINE_CRD = "infrastructure.cluster.x-k8s.io_metal3machines.yaml"


def metal3_provider_id(host: HostSpec, metal3machine: str) -> str:
    """CAPM3's providerID (``SetDefaultProviderID``): ``metal3://<ns>/<host>/<m3m>``."""
    return f"metal3://{host.namespace}/{host.name}/{metal3machine}"


def install_metal3machine_crd(client: Client, path: Path, timeout: float = 60.0) -> str:
    """Upstream's Metal3Machine CRD as a provider installs it: with Cluster API's contract
    label (what tells Cluster API which of its versions to read)."""
    objs = list(load_all_yaml(path.read_text()))
    if len(objs) != 1 or not isinstance(objs[0], CustomResourceDefinition):
        raise ValueError(f"{path} does not hold one CustomResourceDefinition")
    body = objs[0].to_dict()
    body["metadata"].setdefault("labels", {})[CONTRACT_LABEL] = METAL3_VERSION
    crd = cast(CustomResourceDefinition, CustomResourceDefinition.from_dict(body))
    name = crd_name(client.apply(crd, field_manager=FIELD_MANAGER, force=True))
    wait_established(client, [name], timeout)
    return name


def infra_crd(kind: str) -> dict[str, Any]:
    """LabMachine or LabCluster: an InfraMachine or InfraCluster by Cluster API's contract
    and nothing more (no controller: each is created provisioned)."""
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{INFRA_GROUP}",
            "labels": {CONTRACT_LABEL: INFRA_VERSION},
        },
        "spec": {
            "group": INFRA_GROUP,
            "names": {"kind": kind, "listKind": f"{kind}List",
                      "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{
                "name": INFRA_VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True,
                }},
            }],
        },
    }  # fmt: skip


class Manager:
    """Where the manager listens and what it trusts: fixed before the CRDs name its
    conversion webhook, so that a restarted manager serves it at the same address."""

    def __init__(self, plane: ControlPlane, assets: CapiAssets, kubeconfig: Path) -> None:
        self.plane, self.assets, self.kubeconfig = plane, assets, kubeconfig
        self.workdir = plane.workdir.parent / "capi"
        self.webhook_port, self.health_port, self.diagnostics_port = (
            free_port(), free_port(), free_port(),
        )  # fmt: skip

    @property
    def webhook_url(self) -> str:
        return f"https://{LOOPBACK}:{self.webhook_port}/convert"

    def certificates(self) -> Path:
        """The webhook server's serving pair, as controller-runtime looks for it."""
        serving = self.plane.ca.issue(
            "capi-webhook", "capi-webhook", ip_addresses=(LOOPBACK,), server=True
        )
        certs = self.workdir / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        (certs / "tls.crt").write_bytes(serving.cert.read_bytes())
        (certs / "tls.key").write_bytes(serving.key.read_bytes())
        (certs / "tls.key").chmod(0o600)
        return certs

    def argv(self, certs: Path) -> list[str]:
        return [
            str(self.assets.manager), f"--kubeconfig={self.kubeconfig}",
            f"--webhook-port={self.webhook_port}", f"--webhook-cert-dir={certs}",
            f"--health-addr={LOOPBACK}:{self.health_port}",
            f"--diagnostics-address={LOOPBACK}:{self.diagnostics_port}",
            "--insecure-diagnostics", "--leader-elect=false",
            # The lab's Nodes come and go within seconds; Cluster API's defaults are minutes.
            "--sync-period=1m",
        ]  # fmt: skip

    def ready(self) -> bool:
        try:
            url = f"http://{LOOPBACK}:{self.health_port}/readyz"
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> Component:
        self.workdir.mkdir(parents=True, exist_ok=True)
        certs = self.certificates()
        tries = 0

        def argv() -> list[str]:
            # After a port was taken (start_component): fresh health and diagnostics ports;
            # the webhook's stays, as the CRDs name it.
            nonlocal tries
            tries += 1
            if tries > 1:
                self.health_port, self.diagnostics_port = free_port(), free_port()
            return self.argv(certs)

        return start_component(
            COMPONENT, argv, self.workdir, self.ready,
            waiting_for="the Cluster API manager's GET /readyz (its --health-addr) to answer 200",
        )  # fmt: skip


def with_conversion_webhook(crd: dict[str, Any], url: str, ca_bundle: bytes) -> dict[str, Any]:
    """``crd`` with the conversion webhook Cluster API's kustomize patch adds, by URL."""
    patched = copy.deepcopy(crd)
    if len(patched["spec"]["versions"]) > 1:
        patched["spec"]["conversion"] = {
            "strategy": "Webhook",
            "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
            },
        }
    return patched


def install_crds(client: Client, manager: Manager, timeout: float = 60.0) -> list[str]:
    """Server-side apply Cluster API's CRDs (over metalmend's Machine and
    MachineHealthCheck) and the LabMachine CRD; return their names once Established."""
    ca = manager.plane.ca.pair.cert.read_bytes()
    bodies = [infra_crd("LabMachine"), infra_crd("LabCluster")]
    for path in sorted(manager.assets.crds.glob("*.yaml")):
        for obj in load_all_yaml(path.read_text()):
            if not isinstance(obj, CustomResourceDefinition):
                raise ValueError(f"{path} holds a {obj.kind}, not a CustomResourceDefinition")
            bodies.append(with_conversion_webhook(obj.to_dict(), manager.webhook_url, ca))
    names = []
    for body in bodies:
        crd = cast(CustomResourceDefinition, CustomResourceDefinition.from_dict(body))
        names.append(crd_name(client.apply(crd, field_manager=FIELD_MANAGER, force=True)))
    wait_established(client, names, timeout)
    return names


@dataclass(frozen=True)
class ClusterAccess:
    """What the Cluster's kubeconfig Secret holds: the lab's API server and credentials."""

    kubeconfig: bytes
    server: str  # https://127.0.0.1:PORT


def register_cluster(client: Client, namespace: str, kubeconfig: bytes, server: str) -> None:
    """The Cluster ``lab`` and its kubeconfig Secret (the lab's own API server)."""
    secret = Secret(
        metadata=ObjectMeta(
            name=f"{CLUSTER}-kubeconfig", namespace=namespace,
            labels={CLUSTER_NAME_LABEL: CLUSTER},
        ),
        type="cluster.x-k8s.io/secret",
        data={"value": base64.b64encode(kubeconfig).decode()},
    )  # fmt: skip
    _create(client, secret)
    host, _, port = server.removeprefix("https://").rpartition(":")
    endpoint = {"host": host, "port": int(port)}
    _create(
        client,
        LabCluster.from_dict({
            "apiVersion": f"{INFRA_GROUP}/{INFRA_VERSION}", "kind": "LabCluster",
            "metadata": {"name": CLUSTER, "namespace": namespace,
                         "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
            "spec": {"controlPlaneEndpoint": endpoint},
            "status": {"initialization": {"provisioned": True}, "ready": True},
        }),
    )  # fmt: skip
    _create(
        client,
        Cluster.from_dict({
            "apiVersion": API, "kind": "Cluster",
            "metadata": {"name": CLUSTER, "namespace": namespace},
            "spec": {
                "controlPlaneEndpoint": endpoint,
                "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "LabCluster",
                                      "name": CLUSTER},
            },
        }),
    )  # fmt: skip


def _create(client: Client, obj: Any) -> None:
    try:
        client.create(obj)
    except ApiError as error:
        if not errors.is_conflict(error):
            raise


def machine_objects(
    host: HostSpec, labels: dict[str, str], annotations: dict[str, str], control_plane: bool
) -> list[dict[str, Any]]:
    """The host's bootstrap Secret, LabMachine and Machine (``v1beta2``)."""
    meta = {"name": host.name, "namespace": host.namespace}
    machine_labels = {**labels, CLUSTER_NAME_LABEL: CLUSTER}
    if control_plane:
        machine_labels[CONTROL_PLANE_LABEL] = ""
    return [
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {**meta, "name": f"{host.name}-bootstrap",
                      "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
         "type": "cluster.x-k8s.io/secret", "stringData": {"value": "#lab: provisioned"}},
        {"apiVersion": f"{INFRA_GROUP}/{INFRA_VERSION}", "kind": "LabMachine",
         "metadata": {**meta, "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
         "spec": {"providerID": host.provider_id},
         "status": {"initialization": {"provisioned": True}, "ready": True}},
        {"apiVersion": API, "kind": "Machine",
         "metadata": {**meta, "labels": machine_labels, "annotations": annotations},
         "spec": {
             "clusterName": CLUSTER,
             "bootstrap": {"dataSecretName": f"{host.name}-bootstrap"},
             "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "LabMachine",
                                   "name": host.name},
         }},
    ]  # fmt: skip


def metal3_objects(
    host: HostSpec, labels: dict[str, str], host_annotation: str, control_plane: bool
) -> list[dict[str, Any]]:
    """The host's bootstrap Secret, Metal3Machine and Machine (``v1beta2``) as CAPM3 and
    Cluster API make them: the host annotation on the Metal3Machine, none on the Machine."""
    secret, _, machine = machine_objects(host, labels, {}, control_plane)
    m3m = host.name  # as Cluster API names an infrastructure object after its Machine
    machine["spec"]["infrastructureRef"] = {"apiGroup": METAL3_GROUP, "kind": "Metal3Machine",
                                            "name": m3m}  # fmt: skip
    infra = {
        "apiVersion": f"{METAL3_GROUP}/{METAL3_VERSION}", "kind": "Metal3Machine",
        "metadata": {"name": m3m, "namespace": host.namespace,
                     "labels": {CLUSTER_NAME_LABEL: CLUSTER},
                     "annotations": {"metal3.io/BareMetalHost": host_annotation}},
        "spec": {"providerID": metal3_provider_id(host, m3m)},
    }  # fmt: skip
    return [secret, infra, machine]


def create_machine(
    client: Client,
    host: HostSpec,
    design: dict[str, Any],
    control_plane: bool,
    metal3: bool = False,
) -> Any:
    """Create the host's Cluster API objects from its design Machine (``design``: the
    lab's v1beta1 Machine, for its labels and host annotation); return the Machine. With
    ``metal3``, a Metal3Machine as CAPM3 makes it (``metal3_objects``) instead of a
    LabMachine."""
    meta = design["metadata"]
    labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
    if not metal3:
        secret, infra, machine = machine_objects(host, labels, annotations, control_plane)
        _create(client, Secret.from_dict(secret))
        _create(client, LabMachine.from_dict(infra))
        return client.create(MachineV1Beta2.from_dict(machine))
    secret, infra, machine = metal3_objects(
        host, labels, annotations["metal3.io/BareMetalHost"], control_plane
    )
    _create(client, Secret.from_dict(secret))
    _create(client, Metal3MachineV1Beta2.from_dict(infra))
    client.patch(
        Metal3MachineV1Beta2.Status, host.name,
        {"status": {"initialization": {"provisioned": True}, "ready": True}},
        namespace=host.namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip
    return client.create(MachineV1Beta2.from_dict(machine))
