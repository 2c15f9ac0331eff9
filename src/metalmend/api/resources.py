"""lightkube resource classes for the custom kinds in deploy/crds/.

One class per kind, named as the kind, so ``client.get(BareMetalHost, name, namespace=ns)``
reads like the kubectl command it replaces.
"""

from __future__ import annotations

from pathlib import Path

from lightkube.generic_resource import create_global_resource, create_namespaced_resource

# Inside the package so that a wheel carries them (in the repository it links to deploy/crds).
CRD_DIR = Path(__file__).resolve().parents[1] / "crds"

BareMetalHost = create_namespaced_resource(
    "metal3.io", "v1alpha1", "BareMetalHost", "baremetalhosts"
)
Machine = create_namespaced_resource("cluster.x-k8s.io", "v1beta1", "Machine", "machines")
MachineHealthCheck = create_namespaced_resource(
    "cluster.x-k8s.io", "v1beta1", "MachineHealthCheck", "machinehealthchecks"
)
Metal3Remediation = create_namespaced_resource(
    "remediation.metal3.io", "v1alpha1", "Metal3Remediation", "metal3remediations"
)
Metal3RemediationTemplate = create_namespaced_resource(
    "remediation.metal3.io",
    "v1alpha1",
    "Metal3RemediationTemplate",
    "metal3remediationtemplates",
)
# metalmend's own remediation kinds, for any health checker (docs/remediation.md, "As a
# remediation template"): never CAPM3's group.
FenceRemediation = create_namespaced_resource(
    "remediation.metalmend.dev", "v1alpha1", "FenceRemediation", "fenceremediations"
)
FenceRemediationTemplate = create_namespaced_resource(
    "remediation.metalmend.dev",
    "v1alpha1",
    "FenceRemediationTemplate",
    "fenceremediationtemplates",
)
NodeHealthCheck = create_global_resource(
    "healthcheck.metalmend.dev", "v1alpha1", "NodeHealthCheck", "nodehealthchecks"
)
# OpenShift's machine-api Machine (github.com/openshift/api machine/v1beta1): read wherever
# Cluster API's is, through controllers/machines.py.
OpenShiftMachine = create_namespaced_resource(
    "machine.openshift.io", "v1beta1", "Machine", "machines"
)
MACHINE_KINDS = (Machine, OpenShiftMachine)
# Cluster API Provider Metal3's infrastructure Machine (read only: the host CAPM3 linked a
# Cluster API Machine to, controllers/machines.py). v1beta1: served by every CAPM3 release
# that serves v1beta2 too (the same objects, no conversion webhook).
Metal3Machine = create_namespaced_resource(
    "infrastructure.cluster.x-k8s.io", "v1beta1", "Metal3Machine", "metal3machines"
)


def machine_resource(machine: object) -> type:
    """The resource class to write a Machine object back with: OpenShift's for an object
    of ``machine.openshift.io``, else Cluster API's."""
    api_version = str(getattr(machine, "apiVersion", None) or "")
    return OpenShiftMachine if api_version.startswith("machine.openshift.io/") else Machine
