"""BMC credentials on the real API server: only labelled Secrets, read from a cache, used
only by the hosts they bind, never sent in cleartext; the shipped RBAC reads no other
Secret; ``metalmend credentials bind`` migrates existing clusters.

The BMC here is a recording listener: a TCP server on 127.0.0.1 that keeps every byte it
receives. Whatever metalmend refuses, the listener must receive nothing at all.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Secret
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL
from metalmend.controllers.hostpower import setup
from metalmend.kube.manager import Manager
from metalmend.settings import BmcSettings, PowerSettings, RuntimeSettings, Settings
from metalmend_lab.controlplane import ControlPlane, free_port
from tests.support import Deadline, bind_bmc_secrets, until

PASSWORD = "hunter2-bmc-password"
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac" / "metalmend.yaml"


class Listener:
    """A TCP server on 127.0.0.1 recording every connection and byte it receives."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while data := await reader.read(65536):
                self.received += data
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    server = Listener()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def host_power(aclient: AsyncClient, namespace: str) -> AsyncIterator[Manager]:
    """The host-power controller of ``metalmend run --namespace <namespace>``, in-process."""
    manager = Manager(aclient)
    settings = Settings(
        runtime=RuntimeSettings(namespace=namespace),
        # The system CAs trusted: a bound host does connect (the controls below; the
        # listener's TLS then fails, after the connection).
        bmc=BmcSettings(timeout=3.0, trust_system_cas=True),
        power=PowerSettings(poll_interval=2.0),
    )
    setup(manager, settings)
    task = asyncio.create_task(manager.run())
    yield manager
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await manager.controllers[0].reconcile.__self__.bmcs.close()  # type: ignore[attr-defined]


def bmc_secret(name: str, hosts: str | None = None, labelled: bool = True) -> Secret:
    return Secret(
        metadata=ObjectMeta(
            name=name,
            labels={SECRET_LABEL: "true"} if labelled else None,
            annotations={HOSTS_ANNOTATION: hosts} if hosts is not None else None,
        ),
        stringData={"username": "admin", "password": PASSWORD},
    )


def bmh(name: str, address: str, credentials: str) -> Any:
    return BareMetalHost(
        metadata=ObjectMeta(name=name),
        spec={"online": True, "bmc": {"address": address, "credentialsName": credentials}},
    )


async def error_message(client: AsyncClient, namespace: str, name: str) -> str:
    host: Any = await client.get(BareMetalHost, name, namespace=namespace)
    return str((host.get("status") or {}).get("errorMessage") or "")


async def says(client: AsyncClient, namespace: str, name: str, text: str) -> None:
    async def check() -> bool:
        return text in await error_message(client, namespace, name)

    await until(check)


async def warnings_about(client: AsyncClient, namespace: str, name: str) -> list[str]:
    events = [
        e
        async for e in client.list(Event, namespace=namespace)
        if e.involvedObject.name == name and e.type == "Warning"
    ]
    return [str(e.message) for e in events]


async def test_a_host_naming_a_secret_not_bound_to_it_sends_nothing(
    aclient: AsyncClient, namespace: str, listener: Listener, host_power: Manager
) -> None:
    await aclient.create(bmc_secret("bmc", hosts="worker-0"), namespace=namespace)
    address = f"redfish://127.0.0.1:{listener.port}/redfish/v1/Systems/1"
    await aclient.create(bmh("intruder", address, "bmc"), namespace=namespace)
    await says(aclient, namespace, "intruder", f"Secret {namespace}/bmc is not bound to host")

    async def warned() -> bool:  # the Event is recorded after the status, on its own
        return any("not bound to host 'intruder'" in m for m in await warnings_about(
            aclient, namespace, "intruder"
        ))  # fmt: skip

    await until(warned)
    host: Any = await aclient.get(BareMetalHost, "intruder", namespace=namespace)
    assert host["status"]["errorType"] == "registration error"
    assert PASSWORD not in str(host["status"])
    assert (listener.connections, bytes(listener.received)) == (0, b"")

    # Control: the same host, once the Secret's owner binds it, does reach the listener
    # (this test could see a send); the Secret change alone runs the host again.
    await aclient.patch(
        Secret, "bmc", {"metadata": {"annotations": {HOSTS_ANNOTATION: "worker-0,intruder"}}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: listener.connections > 0)


async def test_an_unlabelled_secret_is_not_read_at_all(
    aclient: AsyncClient, namespace: str, listener: Listener, host_power: Manager
) -> None:
    await aclient.create(bmc_secret("plain", hosts="h1", labelled=False), namespace=namespace)
    address = f"redfish://127.0.0.1:{listener.port}/redfish/v1/Systems/1"
    await aclient.create(bmh("h1", address, "plain"), namespace=namespace)
    await says(aclient, namespace, "h1", f"not labelled {SECRET_LABEL}=true")
    assert listener.connections == 0
    await aclient.patch(
        Secret, "plain", {"metadata": {"labels": {SECRET_LABEL: "true"}}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: listener.connections > 0)


async def test_a_cleartext_http_bmc_receives_nothing(
    aclient: AsyncClient, namespace: str, listener: Listener, host_power: Manager
) -> None:
    """Bound, labelled, everything in order, but plain http: the password would cross the
    network readable, so nothing is sent unless the operator allows it explicitly."""
    await aclient.create(bmc_secret("bmc", hosts="*"), namespace=namespace)
    address = f"redfish+http://127.0.0.1:{listener.port}/redfish/v1/Systems/1"
    await aclient.create(bmh("h1", address, "bmc"), namespace=namespace)
    await says(aclient, namespace, "h1", "cleartext")
    host: Any = await aclient.get(BareMetalHost, "h1", namespace=namespace)
    assert host["status"]["errorType"] == "registration error"
    assert (listener.connections, bytes(listener.received)) == (0, b"")


async def test_credentials_come_from_the_hosts_own_namespace_only(
    aclient: AsyncClient, namespace: str, listener: Listener, host_power: Manager
) -> None:
    address = f"redfish://127.0.0.1:{listener.port}/redfish/v1/Systems/1"
    await aclient.create(bmh("h1", address, "kube-system/bmc"), namespace=namespace)
    await aclient.create(bmh("h2", address, "missing"), namespace=namespace)
    await says(aclient, namespace, "h1", "points outside the host's namespace")
    await says(aclient, namespace, "h2", f"Secret {namespace}/missing not found")
    assert listener.connections == 0


def test_the_shipped_rbac_reads_bmc_secrets_only_where_bound(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    """The ClusterRole no longer reads Secrets; a RoleBinding per host namespace lets
    metalmend list and watch them there, and nowhere else, and never GET one by name."""
    for obj in codecs.load_all_yaml(RBAC.read_text()):
        kube.apply(obj, force=True)
    kube.create(bmc_secret("bmc", hosts="*"), namespace=namespace)
    account = Client(
        KubeConfig.from_file(
            control_plane.service_account_kubeconfig("metalmend-system", "metalmend")
        )
    )

    def forbidden(attempt: Any) -> bool:
        try:
            attempt()
        except ApiError as error:
            return error.status.code == 403
        return False

    assert forbidden(lambda: list(account.list(Secret, namespace=namespace)))
    assert forbidden(lambda: list(account.list(Secret, namespace="*")))
    bind_bmc_secrets(kube, namespace)
    labelled = {SECRET_LABEL: "true"}
    # The API server's RBAC authorizer learns of a new RoleBinding through its own watch,
    # so the first list may still be refused for a moment.
    deadline = Deadline(15)
    while forbidden(lambda: list(account.list(Secret, namespace=namespace, labels=labelled))):
        assert not deadline.expired(), "the RoleBinding never took effect"
        time.sleep(0.1)
    listed = list(account.list(Secret, namespace=namespace, labels=labelled))
    assert [s.metadata.name for s in listed if s.metadata] == ["bmc"]
    assert forbidden(lambda: account.get(Secret, "bmc", namespace=namespace))
    assert forbidden(lambda: list(account.list(Secret, namespace="kube-system")))
    assert forbidden(lambda: list(account.list(Secret, namespace="*", labels=labelled)))


def test_run_with_the_shipped_rbac_reads_bmc_secrets_of_the_bound_namespaces(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    """The deployment pattern of deploy/rbac/: the shipped RBAC, one RoleBinding per host
    namespace, and --secret-namespaces naming the same namespaces."""
    for obj in codecs.load_all_yaml(RBAC.read_text()):
        kube.apply(obj, force=True)
    bind_bmc_secrets(kube, namespace)
    other = f"{namespace}-x"
    kube.create(Namespace(metadata=ObjectMeta(name=other)))
    kube.create(bmc_secret("bmc", hosts="worker-0"), namespace=namespace)
    kube.create(bmh("worker-1", "ipmi://127.0.0.1:1", "bmc"), namespace=namespace)
    kube.create(bmh("worker-2", "ipmi://127.0.0.1:1", "bmc"), namespace=other)
    account = control_plane.service_account_kubeconfig("metalmend-system", "metalmend")
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "metalmend", "run", "--kubeconfig", str(account),
            "--controllers", "host-power", "--secret-namespaces", namespace,
            "--health-bind", f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def message(ns: str, name: str) -> str:
        host: Any = kube.get(BareMetalHost, name, namespace=ns)
        return str((host.get("status") or {}).get("errorMessage") or "")

    try:
        deadline = Deadline(60)
        while not deadline.expired() and not (
            message(namespace, "worker-1") and message(other, "worker-2")
        ):
            time.sleep(0.2)
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert (ready.status_code, ready.text) == (200, "ok")
        assert f"Secret {namespace}/bmc is not bound to host 'worker-1'" in message(
            namespace, "worker-1"
        )
        assert (
            f"metalmend reads BMC Secrets only in namespaces {namespace} (--secret-namespaces),"
            f" not in '{other}'"
        ) in message(other, "worker-2")
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=15)
        kube.delete(Namespace, other)
    assert "Traceback" not in stderr
    assert PASSWORD not in stderr


def run_bind(control_plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "metalmend", "credentials", "bind",
            "--kubeconfig", str(control_plane.kubeconfig), *args,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def two_hosts_sharing_a_secret(kube: Client, namespace: str) -> str:
    """Before this version: a shared Secret and an own one, neither labelled nor bound."""
    for name in ("shared", "own"):
        kube.create(
            Secret(metadata=ObjectMeta(name=name), stringData={"username": "u", "password": "p"}),
            namespace=namespace,
        )
    for host, secret in (("worker-0", "shared"), ("worker-1", "shared"), ("worker-2", "own")):
        kube.create(bmh(host, "ipmi://127.0.0.1:1", secret), namespace=namespace)
    return namespace


def test_bind_labels_and_binds_each_secret_to_the_hosts_naming_it(
    control_plane: ControlPlane, kube: Client, two_hosts_sharing_a_secret: str
) -> None:
    namespace = two_hosts_sharing_a_secret

    def state(name: str) -> tuple[str | None, str | None]:
        meta = kube.get(Secret, name, namespace=namespace).metadata
        assert meta is not None
        return (meta.labels or {}).get(SECRET_LABEL), (meta.annotations or {}).get(HOSTS_ANNOTATION)

    dry = run_bind(control_plane, "--namespace", namespace, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"{namespace}/own: would bind to worker-2, label {SECRET_LABEL}=true added",
        f"{namespace}/shared: would bind to worker-0,worker-1, label {SECRET_LABEL}=true added",
    ]
    assert state("shared") == (None, None), "a dry run changes nothing"

    done = run_bind(control_plane, "--namespace", namespace)
    assert done.returncode == 0, done.stderr
    assert f"{namespace}/shared: bound to worker-0,worker-1" in done.stdout
    assert state("shared") == ("true", "worker-0,worker-1")
    assert state("own") == ("true", "worker-2")

    again = run_bind(control_plane, "--namespace", namespace)
    assert again.stdout.splitlines() == [
        f"{namespace}/own: already labelled and bound to worker-2",
        f"{namespace}/shared: already labelled and bound to worker-0,worker-1",
    ]

    kube.create(bmh("worker-3", "ipmi://127.0.0.1:1", "lost"), namespace=namespace)
    missing = run_bind(control_plane, "--namespace", namespace)
    assert missing.returncode == 1
    assert f"{namespace}/lost: skipped, not found (named by worker-3)" in missing.stdout
    assert "Traceback" not in missing.stderr
