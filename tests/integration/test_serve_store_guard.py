"""``metalmend serve`` notices that its store was replaced (docs/design-store.md, "When the
store is replaced"): the store it served is recorded in the cluster (ConfigMap
metalmend-system/metalmend-serve-store, written with serve's own ServiceAccount and the
Role of deploy/rbac/serve.yaml); started on another store, it refuses in one line, until
an operator names the new store; a store swapped under a running serve stops every route
and worker with a 503 saying so. Real parts: the API server, SQLite files, the command."""

from __future__ import annotations

import logging
import re
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import ConfigMap

from metalmend.db import Database
from metalmend.db import database as database_module
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.serve.storeguard import CONFIGMAP, StoreRefused, guard
from metalmend.web.settings import ServeSettings
from metalmend_lab.controlplane import ControlPlane, free_port
from tests.integration.test_serve_cli import metalmend, wait_serving
from tests.integration.test_serve_promenade import bearer, serve_kubeconfig, status_of, token

__all__ = ["serve_kubeconfig"]

NAMESPACE = "metalmend-system"


@pytest.fixture
def no_record(kube: Client, serve_kubeconfig: Path) -> Iterator[None]:
    """No store recorded before the test (the record is the cluster's: one per session's
    cluster), none left after it."""

    def remove() -> None:
        try:
            kube.delete(ConfigMap, CONFIGMAP, namespace=NAMESPACE)
        except ApiError as error:
            if error.status.code != 404:
                raise

    remove()
    yield
    remove()


@pytest.fixture
async def serve_client(serve_kubeconfig: Path) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    yield client
    await client.close()


def opened(path: Path) -> Database:
    database = Database.open(f"sqlite:///{path}")
    database.upgrade()
    return database


def swap(path: Path, other: Path) -> None:
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    shutil.copyfile(other, path)


SERVE_SA = f"system:serviceaccount:{NAMESPACE}:metalmend-serve"


async def test_serve_records_its_store_and_refuses_another_until_an_operator_names_it(
    no_record: None, serve_client: AsyncClient, kube: Client, tmp_path: Path
) -> None:
    first = opened(tmp_path / "first.sqlite")
    served = await guard(serve_client, first, ServeSettings(), SERVE_SA)
    record = kube.get(ConfigMap, CONFIGMAP, namespace=NAMESPACE)
    assert (record.data or {})["storeId"] == served.id
    assert await guard(serve_client, first, ServeSettings(), SERVE_SA) == served  # restarted
    first.dispose()

    (tmp_path / "first.sqlite").unlink()  # lost, and another store made in its place
    opened(tmp_path / "first.sqlite").dispose()  # (a start on a missing file: below)
    second = opened(tmp_path / "first.sqlite")
    with pytest.raises(StoreRefused) as refused:
        await guard(serve_client, second, ServeSettings(), SERVE_SA)
    message = str(refused.value)
    assert f"not store {served.id}" in message
    assert f"ConfigMap {NAMESPACE}/{CONFIGMAP}" in message
    new = re.search(r"serve\.accept_store=([0-9a-f]{32})", message)
    assert new is not None, message
    assert "\n" not in message
    # an acceptance of some other store changes nothing
    with pytest.raises(StoreRefused):
        await guard(serve_client, second, ServeSettings(accept_store=served.id), SERVE_SA)

    accepted = await guard(serve_client, second, ServeSettings(accept_store=new[1]), SERVE_SA)
    assert accepted.id == new[1]
    assert (kube.get(ConfigMap, CONFIGMAP, namespace=NAMESPACE).data or {})["storeId"] == new[1]
    second.dispose()


async def test_a_store_swapped_under_a_running_serve_stops_every_route_with_a_503_saying_so(
    no_record: None, serve_client: AsyncClient, serve_kubeconfig: Path,
    control_plane: ControlPlane, kube: Client, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr(database_module, "IDENTITY_CHECK_SECONDS", 0.0)
    path, other = tmp_path / "serve.sqlite", tmp_path / "other.sqlite"
    database = opened(path)
    opened(other).dispose()
    served = await guard(serve_client, database, ServeSettings(), SERVE_SA)
    viewer = token(control_plane, kube, namespace, "viewer", "metalmend-drydock-viewer")
    app = create_app(compose(serve_client, database=database, drives=object()))  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
            tasks = "/drydock/api/v1.0/tasks"
            assert (await http.get(tasks, headers=bearer(viewer))).status_code == 200
            swap(path, other)  # another store behind the same file name
            for _ in range(2):
                document = status_of(
                    await http.get(tasks, headers=bearer(viewer)), 503, "ServiceUnavailable"
                )
                assert f"not store {served.id} it served" in document["message"]
    finally:
        database.dispose()
    replaced = [r for r in caplog.records if "was replaced while metalmend serve ran" in r.message]
    assert [r.levelno for r in replaced] == [logging.ERROR]  # said once
    assert not [r for r in caplog.records if r.exc_info]


def test_the_command_refuses_to_start_on_another_store_in_one_line_and_starts_once_named(
    no_record: None, serve_kubeconfig: Path, control_plane: ControlPlane, tmp_path: Path
) -> None:
    path = tmp_path / "serve.sqlite"
    serving = control_plane.ca.issue(
        "serve", "metalmend-serve", ip_addresses=("127.0.0.1",), server=True
    )
    trust = ssl.create_default_context(cafile=str(control_plane.ca.pair.cert))

    def serve(*extra: str) -> subprocess.Popen[str]:
        port = free_port()
        process = metalmend(
            "serve", "--kubeconfig", str(serve_kubeconfig), "--port", str(port),
            "--tls-cert", str(serving.cert), "--tls-key", str(serving.key),
            "--database-url", f"sqlite:///{path}", *extra,
        )  # fmt: skip
        process.port = port  # type: ignore[attr-defined]
        return process

    def runs(process: subprocess.Popen[str]) -> None:
        url = f"https://127.0.0.1:{process.port}/openapi.json"  # type: ignore[attr-defined]
        try:
            wait_serving(url, trust, process)
        finally:
            process.terminate()
            process.wait(10)

    runs(serve())
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    runs(serve())  # restarted on its own store

    def refusal() -> str:
        refused = serve()
        _, stderr = refused.communicate(timeout=60)
        assert refused.returncode == 2, stderr
        assert "Traceback" not in stderr
        lines = [line for line in stderr.splitlines() if line.startswith("metalmend: ")]
        assert len(lines) == 1, stderr  # the refusal; the rest is the log at info level
        return lines[0]

    other = tmp_path / "other.sqlite"
    opened(other).dispose()
    swap(path, other)  # another store behind the file name
    line = refusal()
    assert "that metalmend serve served before" in line
    new = re.search(r"--accept-store ([0-9a-f]{32})", line)
    assert new is not None, line
    runs(serve("--accept-store", new[1]))
    runs(serve())  # the new store is the recorded one now

    # Issue 36, point 8: the file removed, the refusal left an empty store behind (a new
    # file, which the next start would have offered to accept). Now it leaves nothing.
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    line = refusal()
    assert "the database file does not exist" in line
    assert "nothing was created" in line
    assert f"delete ConfigMap {NAMESPACE}/{CONFIGMAP}" in line
    assert not list(tmp_path.glob("serve.sqlite*")), list(tmp_path.glob("serve.sqlite*"))
    assert "nothing was created" in refusal(), "a second refusal: still nothing created"
    assert not list(tmp_path.glob("serve.sqlite*"))
