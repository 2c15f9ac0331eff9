"""The lab's site design: what the lab's servers are, as documents a design store bucket
takes (docs/design-store.md) and redeploy_server reads (``policy.redeploy.host_documents``).

Per host, one ``metalmend/KubernetesObject/v1`` document for each of its BareMetalHost,
its Machine and its Node, holding the object as the design wants it (no status, nothing
the API server sets: a design is applied with server-side apply, and a uid or a
resourceVersion in it would be stale at once); then the site's ``promenade/EtcdClusters/v1``
document, the one the lab serves (``lab.siteetcd``). ``metalmend lab design`` prints them.

The objects are the very ones ``lab up`` registers (``lab.hosts`` builds them here), so a
host redeployed from this design comes back as the lab made it. Pure: no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from metalmend_lab.inventory import HostSpec

KUBERNETES_OBJECT = "metalmend/KubernetesObject/v1"  # policy.redeploy's design documents
BMH_API = "metal3.io/v1alpha1"
MACHINE_API = "cluster.x-k8s.io/v1beta1"
CLUSTER = "lab"  # the Machines' clusterName
# Not under metalmend.dev: a design never carries metalmend's own keys (policy.deploysite).
HOST_LABEL = "metalmend-lab/host"

# The OS every lab host runs. Nothing serves it: the lab's provisioner writes the OS it
# names without fetching anything (loopback only, as everything in the lab).
LAB_IMAGE: dict[str, str] = {
    "url": "http://127.0.0.1/images/metalmend-lab-host.qcow2",
    "checksum": "http://127.0.0.1/images/metalmend-lab-host.qcow2.sha256sum",
    "checksumType": "sha256",
    "format": "qcow2",
}


def mac_address(name: str) -> str:
    """A stable MAC for the host (QEMU's prefix)."""
    digest = uuid.uuid5(uuid.NAMESPACE_DNS, name).bytes
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def node_labels(host: HostSpec) -> dict[str, str]:
    """The labels the host's kubelet registers its Node with."""
    return {
        "kubernetes.io/hostname": host.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **host.labels,
    }


def consumer_ref(host: HostSpec) -> dict[str, str]:
    return {
        "apiVersion": MACHINE_API,
        "kind": "Machine",
        "name": host.name,
        "namespace": host.namespace,
    }


def host_object(host: HostSpec, image: Mapping[str, str] = LAB_IMAGE) -> dict[str, Any]:
    """The host's BareMetalHost: online and provisioned with ``image``, consumed by its
    Machine, its BMC and credentials, its OS drive named in ``rootDeviceHints``."""
    spec: dict[str, Any] = {
        "online": True,
        "bootMACAddress": mac_address(host.name),
        "bootMode": "UEFI",
        "externallyProvisioned": False,
        "bmc": {"address": host.address, "credentialsName": f"{host.name}-bmc"},
        "image": dict(image),
        "consumerRef": consumer_ref(host),
    }
    if host.drives:
        # The OS drive by its device name, as an operator sets it so that destroy with
        # preserve-local-storage knows which drive to wipe (docs/drives.md).
        spec["rootDeviceHints"] = {"deviceName": host.drives[0].name}
    return {
        "apiVersion": BMH_API,
        "kind": "BareMetalHost",
        "metadata": {
            "name": host.name,
            "namespace": host.namespace,
            "labels": {HOST_LABEL: host.name},
        },
        "spec": spec,
    }


def machine_object(host: HostSpec) -> dict[str, Any]:
    """The host's Machine, linked back to its BareMetalHost by metal3's annotation."""
    return {
        "apiVersion": MACHINE_API,
        "kind": "Machine",
        "metadata": {
            "name": host.name,
            "namespace": host.namespace,
            "labels": {"role": "worker", HOST_LABEL: host.name},
            "annotations": {"metal3.io/BareMetalHost": f"{host.namespace}/{host.name}"},
        },
        "spec": {"clusterName": CLUSTER, "providerID": host.provider_id},
    }


def design_node_labels(host: HostSpec) -> dict[str, str]:
    """The Node's labels as the design gives them: the kubelet's own (``kubernetes.io``:
    hostname, os, arch) are its to set, and a design does not carry them
    (policy.deploysite refuses the Kubernetes label domains)."""
    return {
        k: v
        for k, v in node_labels(host).items()
        if not k.partition("/")[0].endswith(("kubernetes.io", "k8s.io"))
    }


def node_object(host: HostSpec) -> dict[str, Any]:
    """Only what the design says of a Node: its name and labels (the kubelet creates it)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": host.name, "labels": design_node_labels(host)},
    }


def document_name(obj: Mapping[str, Any]) -> str:
    """``baremetalhost.metalmend-lab.worker-0``; a cluster-scoped object has no namespace
    part (``node.worker-0``)."""
    meta = obj["metadata"]
    parts = [str(obj["kind"]).lower(), meta.get("namespace"), meta["name"]]
    return ".".join(str(p) for p in parts if p)


def document(schema: str, name: str, data: Any) -> dict[str, Any]:
    return {
        "schema": schema,
        "metadata": {
            "schema": "metadata/Document/v1",
            "name": name,
            "layeringDefinition": {"abstract": False, "layer": "site"},
            "storagePolicy": "cleartext",
        },
        "data": data,
    }


def host_documents(host: HostSpec, image: Mapping[str, str] = LAB_IMAGE) -> list[dict[str, Any]]:
    objects = (host_object(host, image), machine_object(host), node_object(host))
    return [document(KUBERNETES_OBJECT, document_name(o), o) for o in objects]


def site_documents(
    hosts: Iterable[HostSpec], etcd_clusters: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Every host's documents, then the site's EtcdClusters document (as the lab serves
    it; None: the lab has no site etcd, fewer than three hosts)."""
    found = [d for host in hosts for d in host_documents(host)]
    if etcd_clusters is not None:
        found.append(dict(etcd_clusters))
    return found
