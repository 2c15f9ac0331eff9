"""Bare-metal hosts in the lab: what ``lab up --hosts N --bmc KIND`` plans, starts and
registers in the cluster.

For each host: BMC credentials (a Secret, labelled and bound to that host), a BareMetalHost
(online, provisioned with the lab's image, whose OS ``plan`` writes on the host's OS
drive) whose ``spec.bmc.address`` is the host's BMC on 127.0.0.1, and a Machine linked to
it (annotation ``metal3.io/BareMetalHost`` one way, ``spec.consumerRef`` the other): the
objects of the lab's site design (``lab.sitedesign``). Redfish hosts share one
sushy-tools emulator (fake driver, TLS, basic auth, with the lab's drives and their
secure erase added by ``lab.emulator``); IPMI hosts each get a pyghmi BMC. Every host
has drives (``lab.drives``): listed in the BareMetalHost's
``status.hardware.storage``, the OS drive named in its ``spec.rootDeviceHints``.
"""

from __future__ import annotations

import secrets
import sys
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bcrypt
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Secret
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import (
    BareMetalHost,
    Machine,
    MachineHealthCheck,
    Metal3RemediationTemplate,
    OpenShiftMachine,
)
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL, SECRET_LABEL_VALUE
from metalmend.kube import errors
from metalmend_lab import capi, drives, emulator, openshift, sitedesign
from metalmend_lab.controlplane import LOOPBACK, ControlPlane, free_port, free_udp_port
from metalmend_lab.inventory import HardwareConfig, HostSpec
from metalmend_lab.osdrive import OsDrive

NAMESPACE = "metalmend-lab"
BMC_KINDS = ("redfish", "ipmi", "mixed")


def plan(
    count: int,
    bmc: str,
    lab_dir: Path,
    plane: ControlPlane,
    *,
    emulator_port: int,
    boot_delay: float = 3.0,
    power_delay: float = 0.0,
    erase_seconds: float = drives.DEFAULT_ERASE_SECONDS,
) -> HardwareConfig:
    """Names, ports, credentials, node identities and drives for ``count`` hosts; each
    drive that has no content yet is seeded (``lab.drives``), the lab's OS written on each
    OS drive (``lab.osdrive``)."""
    hosts = []
    for index in range(count):
        kind = bmc if bmc != "mixed" else ("redfish", "ipmi")[index % 2]
        name = f"worker-{index}"
        node_kubeconfig = plane.user_kubeconfig(f"system:node:{name}", ["system:nodes"])
        hosts.append(
            HostSpec(
                name=name,
                namespace=NAMESPACE,
                bmc=kind,
                bmc_port=free_udp_port() if kind == "ipmi" else free_port(),
                internal_port=free_udp_port() if kind == "ipmi" else emulator_port,
                username=f"admin-{name}",
                password=secrets.token_urlsafe(12),
                provider_id=f"metal3://{NAMESPACE}/{name}",
                kubeconfig=str(node_kubeconfig),
                system_id=str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.metalmend.lab")),
                boot_delay=boot_delay,
                power_delay=power_delay,
                labels={sitedesign.HOST_LABEL: name, "kubernetes.io/hostname": name},
                drives=drives.plan(name, index),
                standin_password=secrets.token_urlsafe(12),
            )
        )
        drives.seed(lab_dir, name, hosts[-1].drives)
        # Every host starts provisioned: the OS is on its OS drive (lab.osdrive).
        OsDrive.of(lab_dir, name).install(sitedesign.LAB_IMAGE["url"], name)
    return HardwareConfig(str(lab_dir), hosts, str(plane.ca.pair.cert), erase_seconds)


def emulator_files(
    config: HardwareConfig,
    workdir: Path,
    plane: ControlPlane,
    port: int,
    power_delay: float | None = None,
) -> Path:
    """sushy-tools' configuration (a Python file), its htpasswd and TLS; returns the config."""
    serving = plane.ca.issue(
        "redfish-emulator", "redfish-emulator", dns_names=("localhost",),
        ip_addresses=(LOOPBACK,), server=True,
    )  # fmt: skip
    return emulator_config(config, workdir, serving.cert, serving.key, port, power_delay)


def emulator_config(
    config: HardwareConfig,
    workdir: Path,
    cert: Path,
    key: Path,
    port: int,
    power_delay: float | None = None,
) -> Path:
    """The emulator's configuration for the Redfish hosts of ``config``, served with the
    TLS pair ``cert``/``key``: systems, credentials, and each host's drives; with
    ``power_delay``, every power change lands that many seconds after its command instead
    of sushy-tools' random 1-11 s."""
    redfish = [h for h in config.hosts if h.bmc == "redfish"]
    workdir.mkdir(parents=True, exist_ok=True)
    auth = workdir / "htpasswd"
    # Each host's account, and the BMO stand-in's (lab.bmostandin) where it has one.
    accounts = [(h.username, h.password) for h in redfish]
    accounts += [(f"bmo-{h.name}", h.standin_password) for h in redfish if h.standin_password]
    auth.write_text(
        "".join(
            f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}\n"
            for user, password in accounts
        )
    )
    systems = [
        {"uuid": h.system_id, "name": h.name, "power_state": "On", "nics": []} for h in redfish
    ]
    settings = {
        "SUSHY_EMULATOR_LISTEN_IP": LOOPBACK,
        "SUSHY_EMULATOR_LISTEN_PORT": port,
        "SUSHY_EMULATOR_SSL_CERT": str(cert),
        "SUSHY_EMULATOR_SSL_KEY": str(key),
        "SUSHY_EMULATOR_AUTH_FILE": str(auth),
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_FAKE_SYSTEMS": systems,
        "SUSHY_EMULATOR_STATE_DIR": str(workdir / "state"),
        emulator.DRIVES_KEY: {
            h.system_id: {"host": h.name, "drives": [asdict(d) for d in h.drives]} for h in redfish
        },
        emulator.LAB_DIR_KEY: config.lab_dir,
        emulator.ERASE_SECONDS_KEY: config.erase_seconds,
    }
    if power_delay is not None:
        settings[emulator.POWER_DELAY_KEY] = power_delay
    path = workdir / "emulator.conf"
    path.write_text("".join(f"{key} = {value!r}\n" for key, value in settings.items()))
    return path


def emulator_argv(config_file: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "metalmend_lab.emulator",  # sushy-tools' emulator with the lab's drives
        "--config",
        str(config_file),
        "--fake",
    ]


def hardware_argv(config_file: Path) -> list[str]:
    return [sys.executable, "-m", "metalmend_lab.hardware", str(config_file)]


MACHINE_APIS = ("none", "capi", "capi-metal3", "openshift")


def register(
    client: Client,
    config: HardwareConfig,
    cluster_api: capi.ClusterAccess | None = None,
    machine_api: str = "none",
) -> None:
    """Create the namespace, and per host its Secret, BareMetalHost and Machine. With
    ``cluster_api`` (the lab runs Cluster API's manager, lab.capi): first the Cluster and
    its kubeconfig Secret, and each Machine as Cluster API's, with its infrastructure
    object (a Metal3Machine as CAPM3 makes it with ``machine_api`` "capi-metal3"); the
    first host's Machine is the Cluster's stand-alone control-plane Machine. With
    ``machine_api`` "openshift": a MachineSet and per host an OpenShift Machine as its
    metal3 provider makes it (lab.openshift), each host's ``provider_id`` set to the one
    naming its BareMetalHost's uid (register before the hosts' kubelets start)."""
    if machine_api not in MACHINE_APIS:
        raise ValueError(f"machine API {machine_api!r}: one of {', '.join(MACHINE_APIS)}")
    try:
        client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    except ApiError as error:
        if not errors.is_conflict(error):
            raise
    if cluster_api is not None:
        capi.register_cluster(client, NAMESPACE, cluster_api.kubeconfig, cluster_api.server)
    if machine_api == "openshift":
        labels = {"role": "worker"}
        body = openshift.machineset_object(NAMESPACE, labels, len(config.hosts))
        machineset: Any = client.create(openshift.MachineSet.from_dict(body))
        for host in config.hosts:
            register_openshift_host(client, host, str(machineset.metadata.uid))
        return
    for index, host in enumerate(config.hosts):
        control_plane = None if cluster_api is None else index == 0
        register_host(client, host, control_plane, metal3=machine_api == "capi-metal3")


def _bmc_secret(client: Client, host: HostSpec) -> None:
    client.create(
        Secret(
            # labelled as BMC credentials and bound to this host only, as an operator
            # would (docs/security.md): metalmend reads no other Secret
            metadata=ObjectMeta(
                name=f"{host.name}-bmc",
                labels={SECRET_LABEL: SECRET_LABEL_VALUE},
                annotations={HOSTS_ANNOTATION: host.name},
            ),
            stringData={"username": host.username, "password": host.password},
        ),
        namespace=host.namespace,
    )


def _host_body(host: HostSpec, consumer_ref: dict[str, str]) -> dict[str, Any]:
    body = sitedesign.host_object(host)
    body["spec"]["consumerRef"] = consumer_ref
    # The host names its Node (the lab's Nodes are named after their hosts), as an operator
    # does: the confirmation a NodeHealthCheck needs (api/links.node_host), which no kubelet
    # can write. Not in the site design: a design may not carry metalmend.dev/ annotations.
    body["metadata"].setdefault("annotations", {})[names.HOST_NODE] = host.name
    return body


def register_host(
    client: Client, host: HostSpec, control_plane: bool | None = None, metal3: bool = False
) -> None:
    """``control_plane``: None for the lab's own Machine (metalmend's CRD), else a Cluster
    API Machine (lab.capi), labelled control-plane when True; ``metal3``: its
    infrastructure a Metal3Machine, which the host's consumerRef names (CAPM3's links)."""
    _bmc_secret(client, host)
    # The objects of the lab's site design (lab.sitedesign), so that a host redeployed
    # from that design comes back as it was registered.
    design = sitedesign.machine_object(host)
    machine: Any = (
        client.create(Machine.from_dict(design))
        if control_plane is None
        else capi.create_machine(client, host, design, control_plane, metal3=metal3)
    )
    if metal3:
        api = f"{capi.METAL3_GROUP}/{capi.METAL3_VERSION}"
        consumer = {"apiVersion": api, "kind": "Metal3Machine", "name": host.name,
                    "namespace": host.namespace}  # fmt: skip
    else:
        consumer = {**sitedesign.consumer_ref(host), "uid": machine.metadata.uid}
    client.create(BareMetalHost.from_dict(_host_body(host, consumer)))
    _provisioned(client, host)


def register_openshift_host(client: Client, host: HostSpec, machineset_uid: str) -> None:
    """The host (its uid is in the providerID), then its OpenShift Machine, then the host's
    consumerRef naming that Machine by uid; ``host.provider_id`` becomes the Machine's, for
    the host's kubelet to register its Node with."""
    _bmc_secret(client, host)
    consumer = {"apiVersion": openshift.API, "kind": "Machine", "name": host.name,
                "namespace": host.namespace}  # fmt: skip
    made: Any = client.create(BareMetalHost.from_dict(_host_body(host, consumer)))
    labels = {"role": "worker", sitedesign.HOST_LABEL: host.name}
    body = openshift.machine_object(host, labels, str(made.metadata.uid), machineset_uid)
    machine: Any = client.create(OpenShiftMachine.from_dict(body))
    host.provider_id = body["spec"]["providerID"]
    client.patch(
        BareMetalHost, host.name, {"spec": {"consumerRef": {"uid": machine.metadata.uid}}},
        namespace=host.namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip
    _provisioned(client, host)


def _provisioned(client: Client, host: HostSpec) -> None:
    client.patch(
        BareMetalHost.Status,
        host.name,
        {
            "status": {
                "poweredOn": True,
                "operationalStatus": "OK",
                # required by upstream baremetal-operator's schema (lab --power-owner)
                "errorMessage": "",
                "errorCount": 0,
                # They start provisioned: lab.hosts.plan put the OS on their OS drives.
                "provisioning": {"state": "provisioned", "ID": "", "image": sitedesign.LAB_IMAGE},
                # What metal3's inspection would have found (metal3's HardwareDetails).
                "hardware": {"storage": [d.drive().to_metal3() for d in host.drives]},
            }
        },
        namespace=host.namespace,
        patch_type=PatchType.MERGE,
    )


def fence_health_check(
    client: Client, timeout: float, *, power_off: int, power_on: int, strategy: str = "reboot"
) -> None:
    """MachineHealthCheck 'workers' (Ready=Unknown for ``timeout`` s) with the template
    'fence': what the demo, the lab tests and the benchmark remediate with."""
    template = {
        "strategy": strategy,
        "powerOffTimeoutSeconds": power_off,
        "powerOnTimeoutSeconds": power_on,
    }
    client.create(
        Metal3RemediationTemplate(
            metadata=ObjectMeta(name="fence"), spec={"template": {"spec": template}}
        ),
        namespace=NAMESPACE,
    )
    spec = {
        "clusterName": "lab",
        "selector": {"matchLabels": {"role": "worker"}},
        "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": f"{timeout:g}s"}],
        "remediationTemplate": {
            "apiVersion": "remediation.metal3.io/v1alpha1",
            "kind": "Metal3RemediationTemplate",
            "name": "fence",
        },
    }
    client.create(
        MachineHealthCheck(metadata=ObjectMeta(name="workers"), spec=spec), namespace=NAMESPACE
    )
