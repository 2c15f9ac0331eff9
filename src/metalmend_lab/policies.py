"""The chart's admission policies in the lab, as `helm install` puts them with its default
values (deploy/chart/values.yaml ``policies``): MachineHealthCheck and NodeHealthCheck
admission, reboot annotation values, who may change ``spec.bmc`` of a host, and who may
name a host's Node (``metalmend.dev/node-name``: the lab admin). A lab
without them taught the wrong lesson: there, anyone who could patch a host could re-address
its BMC.

The ``spec.bmc`` writers are listed as an operator would list theirs: the identities that
legitimately set BMC addresses here, the lab admin (``lab up`` creating hosts, the lab's
provisioner, the demos, tests) and the lab's serve caller (``lab-admin``, whose design
actions may create or re-address hosts). ``metalmend serve``'s own ServiceAccount is not
listed: a design changes ``spec.bmc`` only as a caller who may.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from metalmend_lab.controlplane import ADMIN_USER

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
POLICIES = DEPLOY / "policies"
# The files of the chart's defaults (policies.machineHealthCheck, nodeHealthCheck,
# rebootAnnotationValues, bmcSpecWriters.enabled and nodeNameWriters.enabled: true;
# rebootAnnotationWriters is off by default).
CHART_DEFAULTS = (
    "machinehealthcheck-admission.yaml",
    "nodehealthcheck-admission.yaml",
    "reboot-annotation-values.yaml",
    "bmc-spec-writers.yaml",
    "node-name-writers.yaml",
)
BMC_WRITERS_CONFIGMAP = "metalmend-bmc-writers"
NODE_NAME_WRITERS = "metalmend-node-name-writers"  # its writers are in the policy itself
BMC_SECRET_BINDING = "metalmend-bmc-secret-binding"  # its writers are in the policy itself
PARAMS_NAMESPACE = "metalmend-system"  # where the chart's release (and its params) live
LAB_ADMIN_ACCOUNT = "lab-admin"  # servedeploy's caller token
FIELD_MANAGER = "metalmend-lab"


def bmc_writers() -> tuple[str, ...]:
    return (ADMIN_USER, f"system:serviceaccount:{PARAMS_NAMESPACE}:{LAB_ADMIN_ACCOUNT}")


def name_writers(policy: dict[str, Any], users: str) -> None:
    """Set the users of deploy/policies/node-name-writers.yaml's policy (as the chart
    renders ``policies.nodeNameWriters.users``)."""
    for variable in policy["spec"]["variables"]:
        if variable["name"] == "writers":
            variable["expression"] = f"'{users}'.split(',')"


def install(client: Client, writers: Sequence[str] | None = None) -> list[str]:
    """Apply the chart's default policies, their bindings and parameters; returns the
    names of the policies applied."""
    client.apply(Namespace(metadata=ObjectMeta(name=PARAMS_NAMESPACE)), field_manager=FIELD_MANAGER)
    names = []
    for file in CHART_DEFAULTS:
        for document in yaml.safe_load_all((POLICIES / file).read_text()):
            name = document["metadata"]["name"]
            users = ",".join(writers or bmc_writers())
            if document["kind"] == "ConfigMap" and name == BMC_WRITERS_CONFIGMAP:
                document["data"]["users"] = users
            if name == NODE_NAME_WRITERS and document["kind"] == "ValidatingAdmissionPolicy":
                # the lab admin names each host's Node (lab.hosts), as an operator does
                name_writers(document, ADMIN_USER)
            if name == BMC_SECRET_BINDING and document["kind"] == "ValidatingAdmissionPolicy":
                # The same writers, written into the policy as the chart renders them (its
                # one parameter kind is the Secrets): creating a host that names a Secret
                # bound to other hosts (the lab's shared chassis, '*' Secrets) is theirs.
                for variable in document["spec"]["variables"]:
                    if variable["name"] == "writers":
                        variable["expression"] = f"'{users}'.split(',')"
            if document["kind"] == "ValidatingAdmissionPolicy":
                names.append(name)
            client.apply(codecs.from_dict(document), field_manager=FIELD_MANAGER, force=True)
    return names
