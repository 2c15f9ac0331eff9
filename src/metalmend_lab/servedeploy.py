"""``metalmend serve`` in the lab, as an operator would deploy it, and ``.lab/endpoints.json``,
the file that tells users and checks where it is and how to call it (docs/teardown.md,
"In the lab").

``lab up`` applies deploy/rbac/serve.yaml (the service's ServiceAccount and ClusterRole,
and the callers' ClusterRoles) and deploy/teardown/shutdown-kubelet.yaml (the DaemonSet
shutdown-kubelet relies on), issues the service a serving certificate from the lab's CA
for 127.0.0.1, starts ``metalmend serve`` on a free port with a token of its ServiceAccount
and nothing more, and writes ``endpoints.json``:

    {"url": "https://127.0.0.1:PORT", "ca": "<path of the CA file>",
     "token": "<bearer token of a lab admin allowed everything>",
     "design_ref": "<https URL answering the lab's design documents>"}

The lab admin is the ServiceAccount ``metalmend-system/lab-admin`` bound to
``cluster-admin`` (every permission of the promenade.metalmend.dev group included).
``design_ref`` is present once the lab serves design documents.
"""

from __future__ import annotations

import json
import ssl
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding, RoleBinding

from metalmend.kube import errors
from metalmend_lab import siteetcd
from metalmend_lab.controlplane import LOOPBACK, Component, ControlPlane, free_port, start_component
from metalmend_lab.hosts import NAMESPACE as HOSTS_NAMESPACE

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVE_RBAC = DEPLOY / "rbac" / "serve.yaml"
SHUTDOWN_KUBELET = DEPLOY / "teardown" / "shutdown-kubelet.yaml"
COMPONENT = "metalmend-serve"
ENDPOINTS = "endpoints.json"
NAMESPACE = "metalmend-system"
BMC_CREDENTIALS_ROLE = "metalmend-serve-bmc-credentials"
SERVICE_ACCOUNT = "metalmend-serve"
ADMIN_ACCOUNT = "lab-admin"
FIELD_MANAGER = "metalmend-lab"
# Tokens outlive any lab (its CA is valid for a year): a lab left running for days keeps
# working, where the TokenRequest default of an hour would not.
TOKEN_SECONDS = 365 * 24 * 3600
# The lab's kubelets renew their Lease every second (a real one: every 10 s), so a few
# seconds without renewal mean stopped; the lab's teardown steps take lab time (its site
# etcd settles in seconds, not the 30 s the spec polls at).
LAB_TEARDOWN = {"kubelet_stopped_after": 5, "shutdown_kubelet_timeout": 60, "etcd_poll_interval": 2}
# destroy_nodes at lab speed: host-power there polls every 5 s and erases take seconds; a
# task of a killed service is taken over after 6 s (docs/destroy.md).
LAB_DESTROY = {"poll_interval": 0.5, "bmc_retry": 1, "lease_seconds": 6, "release_timeout": 60}
# redeploy_server and deploy_site at lab speed: provisioning takes seconds, kubelets boot
# in seconds; the action worker shares destroy's lease (6 s).
LAB_REDEPLOY = {
    "destroy_timeout": 300, "provision_timeout": 120, "node_ready_timeout": 120,
    "etcd_timeout": 120, "poll_interval": 0.5,
}  # fmt: skip


@dataclass(frozen=True)
class Endpoints:
    """What ``.lab/endpoints.json`` holds."""

    url: str
    ca: str
    token: str
    design_ref: str | None = None
    metrics: str | None = None  # serve's /metrics (docs/observability.md)

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def write(self, lab_dir: Path) -> Path:
        """Atomically, readable by its owner only (it holds a token)."""
        path = lab_dir / ENDPOINTS
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.chmod(0o600)
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, lab_dir: Path) -> Endpoints | None:
        try:
            data = json.loads((lab_dir / ENDPOINTS).read_text())
            return cls(
                data["url"], data["ca"], data["token"], data.get("design_ref"),
                data.get("metrics"),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            return None


def remove_endpoints(lab_dir: Path) -> None:
    (lab_dir / ENDPOINTS).unlink(missing_ok=True)


def apply_manifests(client: Client, *paths: Path) -> None:
    for path in paths:
        for obj in codecs.load_all_yaml(path.read_text()):
            client.apply(obj, field_manager=FIELD_MANAGER, force=True)


def admin_token(plane: ControlPlane, client: Client) -> str:
    """A token of the lab admin: ServiceAccount metalmend-system/lab-admin, cluster-admin."""
    binding = ClusterRoleBinding(
        metadata=ObjectMeta(name=f"metalmend-lab-{ADMIN_ACCOUNT}"),
        roleRef=RoleRef(
            apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"
        ),
        subjects=[Subject(kind="ServiceAccount", name=ADMIN_ACCOUNT, namespace=NAMESPACE)],
    )
    try:
        client.create(binding)
    except ApiError as error:
        if not errors.is_conflict(error):  # already bound: a lab restarted on old state
            raise
    path = plane.service_account_kubeconfig(NAMESPACE, ADMIN_ACCOUNT, TOKEN_SECONDS)
    return token_of(path)


def grant_bmc_credentials(client: Client, namespace: str) -> None:
    """Let ``metalmend serve`` read the BMC credentials Secrets of ``namespace`` (destroy's
    wipes): a RoleBinding to deploy/rbac/serve.yaml's ClusterRole there, never a cluster-wide
    binding (docs/security.md: serve reads no Secret nobody granted it)."""
    client.apply(Namespace(metadata=ObjectMeta(name=namespace)), field_manager=FIELD_MANAGER)
    binding = RoleBinding(
        metadata=ObjectMeta(name=BMC_CREDENTIALS_ROLE, namespace=namespace),
        roleRef=RoleRef(
            apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=BMC_CREDENTIALS_ROLE
        ),
        subjects=[Subject(kind="ServiceAccount", name=SERVICE_ACCOUNT, namespace=NAMESPACE)],
    )
    client.apply(binding, field_manager=FIELD_MANAGER, force=True)


def token_of(kubeconfig: Path) -> str:
    token: str = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    return token


def serve_argv(kubeconfig: Path, port: int, cert: Path, key: Path, config: Path) -> list[str]:
    return [
        sys.executable, "-m", "metalmend", "serve", "--config", str(config),
        "--kubeconfig", str(kubeconfig), "--bind-address", LOOPBACK, "--port", str(port),
        "--tls-cert", str(cert), "--tls-key", str(key),
    ]  # fmt: skip


def start(plane: ControlPlane, client: Client, lab_dir: Path) -> tuple[Component, Endpoints]:
    """Start ``metalmend serve`` against the lab; return it (ready: its OpenAPI document is
    served over TLS the lab CA vouches for) and the endpoints to write."""
    apply_manifests(client, SERVE_RBAC, SHUTDOWN_KUBELET)
    grant_bmc_credentials(client, HOSTS_NAMESPACE)
    kubeconfig = plane.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, TOKEN_SECONDS)
    serving = plane.ca.issue(
        "metalmend-serve", "metalmend-serve", dns_names=("localhost",),
        ip_addresses=(LOOPBACK,), server=True,
    )  # fmt: skip
    config = lab_dir / "serve-settings.yaml"
    # The design store in the lab's directory: gone with the lab (docs/design-store.md).
    database = f"sqlite:///{(lab_dir / 'serve.sqlite').resolve()}"
    serve: dict[str, Any] = {"database_url": database, "site_namespaces": [HOSTS_NAMESPACE]}
    serve["metrics_bind"] = f"{LOOPBACK}:{free_port()}"  # its own /metrics, as in the chart
    site = siteetcd.SitePlan.read(siteetcd.plan_path(lab_dir))
    if site is not None:  # the lab's https design server: allowed, its CA trusted
        serve["design_url_prefixes"] = [site.design_prefix]
        serve["design_ca_bundle"] = str(plane.ca.pair.cert.resolve())
    settings = {
        "teardown": LAB_TEARDOWN,
        # site actions apply the lab design's hosts and machines in the hosts' namespace;
        # design references: the lab's design server (docs/teardown.md, "In the lab")
        "serve": serve,
        # destroy_nodes wipes through the lab's BMCs, whose certificates the lab CA signs
        "bmc": {"ca_bundle": str(plane.ca.pair.cert.resolve()), "timeout": 5},
        "destroy": LAB_DESTROY,
        "redeploy": LAB_REDEPLOY,
    }
    config.write_text(yaml.safe_dump(settings))
    url = ""
    ca = plane.ca.pair.cert.resolve()
    trusted = ssl.create_default_context(cafile=str(ca))

    def argv() -> list[str]:  # a fresh port for each try (start_component)
        nonlocal url
        port = free_port()
        url = f"https://{LOOPBACK}:{port}"
        return serve_argv(kubeconfig, port, serving.cert, serving.key, config)

    def ready() -> bool:
        try:
            answer = httpx.get(f"{url}/healthz", verify=trusted, timeout=5)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    component = start_component(
        COMPONENT, argv, lab_dir, ready,
        waiting_for="metalmend serve's GET /healthz to answer 200",
    )  # fmt: skip
    metrics = f"http://{serve['metrics_bind']}/metrics"
    return component, Endpoints(url, str(ca), admin_token(plane, client), metrics=metrics)
