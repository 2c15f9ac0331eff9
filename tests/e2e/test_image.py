"""The container image (tools/image/build.sh) run against the lab exactly as a Pod would:
the chart's ServiceAccounts (deploy/chart), their token, CA and namespace mounted at
/var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT set, a
read-only root filesystem, host networking on loopback. ``metalmend run --leader-elect``
takes the Lease and reboots a host on request; ``metalmend serve`` answers over TLS.

podman here is Debian's, with Debian's runc, as root; the tests skip (saying why) only
where podman cannot run containers at all."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from metalmend.api.names import REBOOT
from metalmend.api.resources import BareMetalHost
from metalmend.api.stamps import parse_stamp
from metalmend.serve.storeguard import CONFIGMAP as STORE_RECORD
from metalmend_lab import lab
from metalmend_lab.controlplane import free_port
from metalmend_lab.hosts import NAMESPACE as HOSTS
from tests.e2e.conftest import host
from tests.support import STARTUP, Deadline, bind_bmc_secrets

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "metalmend-system"
PODMAN = ["podman", "--runtime", "/usr/sbin/runc", "--cgroup-manager", "cgroupfs"]
LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=1000:1000"]
ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def podman_cannot_run() -> str | None:
    """Why podman cannot run containers here, or None."""
    if os.geteuid() != 0:
        return "podman runs as root here (rootless needs subuids this machine lacks)"
    if not Path("/usr/sbin/runc").exists() and not os.access("/usr/bin/apt-get", os.X_OK):
        return "no runc and no apt-get to install it"
    return None


@pytest.fixture(scope="module")
def image() -> str:
    if reason := podman_cannot_run():
        pytest.skip(reason)
    # Built by `make test` (its target test-image) before the tests: a cold build takes
    # minutes, never here under a test's timeout.
    built = subprocess.run(
        ["bash", str(REPO / "tools" / "image" / "build.sh"), "--cached"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"the image is missing (sudo make image builds it):\n{built.stderr}")
    return built.stdout.strip().splitlines()[-1]


def helm() -> Path:
    built = subprocess.run(
        ["bash", str(REPO / "tools" / "helm" / "build.sh"), "--cached"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"helm missing (make helm builds it):\n{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


def apply_chart_rbac(kube: Client) -> None:
    """The chart's RBAC for both commands, rendered by helm and applied as the lab's admin."""
    rendered = subprocess.run(
        [str(helm()), "template", "metalmend", str(REPO / "deploy" / "chart"),
         "--namespace", SYSTEM, "--kube-version", "1.36.3",
         "--set", f"run.secretNamespaces={{{HOSTS}}}",
         "--set", "serve.database.persistentVolumeClaim.create=true",  # (else refused)
         "--show-only", "templates/rbac-run.yaml", "--show-only", "templates/rbac-serve.yaml"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for obj in codecs.load_all_yaml(rendered.stdout):
        kube.apply(obj, field_manager="metalmend-tests", force=True)


def service_account_volume(hosts_lab: lab.RunningLab, account: str, where: Path) -> Path:
    """What the kubelet mounts for a Pod of ``account``: token, ca.crt, namespace."""
    config = yaml.safe_load(hosts_lab.plane.service_account_kubeconfig(SYSTEM, account).read_text())
    where.mkdir(mode=0o755)
    (where / "token").write_text(config["users"][0]["user"]["token"])
    (where / "ca.crt").write_bytes(hosts_lab.plane.ca.pair.cert.read_bytes())
    (where / "namespace").write_text(SYSTEM)
    for path in where.iterdir():
        path.chmod(0o644)  # the image's user (10001) reads them, as from a Pod's volume
    return where


class Container:
    def __init__(self, image: str, volumes: dict[Path, str], env: dict[str, str], args: list[str]):
        self.name = f"metalmend-test-{uuid.uuid4().hex[:8]}"
        mounts = [f"--volume={src}:{dst}:ro" for src, dst in volumes.items()]
        environment = [f"--env={k}={v}" for k, v in env.items()]
        # What a Pod's emptyDir is: a fresh directory, writable by any user.
        self.data = data = Path(tempfile.mkdtemp(prefix="metalmend-data-"))
        data.chmod(0o777)
        subprocess.run(
            [*PODMAN, "run", "--detach", "--name", self.name, "--network", "host", "--read-only",
             "--tmpfs", "/tmp", f"--volume={data}:/var/lib/metalmend",
             *LIMITS, *mounts, *environment,
             image, *args],
            capture_output=True, text=True, check=True,
        )  # fmt: skip

    def running(self) -> bool:
        state = subprocess.run(
            [*PODMAN, "inspect", "--format", "{{json .State}}", self.name],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return state.returncode == 0 and bool(json.loads(state.stdout).get("Running"))

    def logs(self) -> str:
        return subprocess.run(
            [*PODMAN, "logs", self.name], capture_output=True, text=True, check=False
        ).stderr

    def stop(self) -> str:
        subprocess.run(
            [*PODMAN, "stop", "--time", "20", self.name], capture_output=True, check=False
        )
        logs = self.logs()
        subprocess.run([*PODMAN, "rm", "--force", self.name], capture_output=True, check=False)
        shutil.rmtree(self.data, ignore_errors=True)
        return logs


def in_cluster_env(hosts_lab: lab.RunningLab) -> dict[str, str]:
    return {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(hosts_lab.plane.ports.apiserver),
    }


def wait_for(
    url: str, container: Container, within: float = STARTUP, verify: ssl.SSLContext | bool = True
) -> None:
    deadline = Deadline(within)
    while True:
        try:
            if httpx.get(url, timeout=1, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert container.running(), container.logs()
        assert not deadline.expired(), (
            f"waited {within:.0f} s for {url} to answer 200:\n{container.logs()}"
        )
        time.sleep(0.3)


@pytest.fixture
def controller(
    image: str, hosts_lab: lab.RunningLab, tmp_path: Path
) -> Iterator[tuple[Container, int]]:
    kube = Client(KubeConfig.from_file(hosts_lab.kubeconfig), field_manager="metalmend-tests")
    apply_chart_rbac(kube)
    bind_bmc_secrets(kube, HOSTS)
    account = service_account_volume(hosts_lab, "metalmend", tmp_path / "account")
    port = free_port()
    ca = tmp_path / "bmc-ca.crt"
    ca.write_bytes(hosts_lab.plane.ca.pair.cert.read_bytes())
    ca.chmod(0o644)
    container = Container(
        image, {account: ACCOUNT_DIR, ca: "/etc/metalmend/bmc-ca.crt"}, in_cluster_env(hosts_lab),
        ["run", "--leader-elect", "--controllers", "host-power", "--secret-namespaces", HOSTS,
         "--health-bind", f"127.0.0.1:{port}", "--bmc-ca-bundle", "/etc/metalmend/bmc-ca.crt",
         "--soft-power-off-timeout", "3", "--power-poll-interval", "5", "--bmc-timeout", "5"],
    )  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", container)
        yield container, port
    finally:
        logs = container.stop()
        assert "Traceback" not in logs, logs


def rebooted_since(kube: Client, name: str, asked: float) -> bool:
    status = kube.get(BareMetalHost, name, namespace=HOSTS).get("status") or {}
    provisioning = status.get("provisioning") or {}
    pending = parse_stamp(provisioning.get("pendingRebootSince"))
    last = parse_stamp(provisioning.get("lastPoweredOn"))
    return (
        pending is not None and last is not None and asked <= pending.timestamp() < last.timestamp()
    )


def test_image_runs_as_a_pod_leads_and_reboots_a_host(
    hosts_lab: lab.RunningLab, controller: tuple[Container, int]
) -> None:
    container, port = controller
    kube = Client(KubeConfig.from_file(hosts_lab.kubeconfig), field_manager="metalmend-tests")
    deadline = Deadline(30)
    holder = None
    while not holder and not deadline.expired():
        try:
            lease = kube.get(Lease, "metalmend", namespace=SYSTEM)  # our own namespace's
            holder = lease.spec.holderIdentity if lease.spec else None
        except ApiError:
            time.sleep(0.3)
    assert holder, "the container never took the leader Lease"
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert 'metalmend_leader{lease="metalmend-system/metalmend"} 1.0' in metrics, metrics
    spec = host(hosts_lab, "ipmi")
    asked = time.time() - 1
    kube.patch(
        BareMetalHost, spec.name, {"metadata": {"annotations": {REBOOT: ""}}},
        namespace=HOSTS, patch_type=PatchType.MERGE,
    )  # fmt: skip
    deadline = Deadline(60)
    while not rebooted_since(kube, spec.name, asked):
        assert container.running(), container.logs()
        assert not deadline.expired(), f"no reboot within 60 s:\n{container.logs()}"
        time.sleep(0.5)
    assert "system:serviceaccount:metalmend-system:metalmend" in container.logs()


@contextlib.contextmanager
def store_record_aside(kube: Client) -> Iterator[None]:
    """The lab's own serve recorded its store in metalmend-system (docs/design-store.md,
    "When the store is replaced"); the image's serve, a fresh install with an empty
    database in that namespace, would rightly be refused. Its record is set aside for the
    test and put back after, so the lab's serve still finds its own."""
    lab_record = None
    with contextlib.suppress(ApiError):
        lab_record = kube.get(ConfigMap, STORE_RECORD, namespace="metalmend-system")
        kube.delete(ConfigMap, STORE_RECORD, namespace="metalmend-system")
    try:
        yield
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(ConfigMap, STORE_RECORD, namespace="metalmend-system")
        if lab_record is not None:
            lab_record.metadata.resourceVersion = None
            lab_record.metadata.uid = None
            kube.create(lab_record)


def test_image_serves_the_teardown_api_over_tls(
    image: str, hosts_lab: lab.RunningLab, tmp_path: Path
) -> None:
    kube = Client(KubeConfig.from_file(hosts_lab.kubeconfig), field_manager="metalmend-tests")
    apply_chart_rbac(kube)
    account = service_account_volume(hosts_lab, "metalmend-serve", tmp_path / "account")
    pair = hosts_lab.plane.ca.issue(
        "image-serve", "metalmend-serve", ip_addresses=("127.0.0.1",), server=True
    )
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o755)
    for name, source in (("tls.crt", pair.cert), ("tls.key", pair.key)):
        (tls / name).write_bytes(source.read_bytes())
        (tls / name).chmod(0o644)
    port = free_port()
    with store_record_aside(kube):
        container = Container(
            image, {account: ACCOUNT_DIR, tls: "/etc/metalmend/tls"}, in_cluster_env(hosts_lab),
            ["serve", "--bind-address", "127.0.0.1", "--port", str(port),
             "--tls-cert", "/etc/metalmend/tls/tls.crt", "--tls-key", "/etc/metalmend/tls/tls.key"],
        )  # fmt: skip
        try:
            ca = ssl.create_default_context(cafile=str(hosts_lab.plane.ca.pair.cert))
            wait_for(f"https://127.0.0.1:{port}/healthz", container, verify=ca)
            unauthenticated = httpx.post(
                f"https://127.0.0.1:{port}/promenade/api/v1.0/nodes/nowhere/drain", verify=ca
            )
            assert unauthenticated.status_code == 401
        finally:
            logs = container.stop()
    assert "system:serviceaccount:metalmend-system:metalmend-serve" in logs
    assert "Traceback" not in logs
