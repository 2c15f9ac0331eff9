"""The service's database failing under a running ``metalmend serve`` (docs/design-store.md,
"When the database fails"): its SQLite file removed, made read-only, locked by another
writer, its PostgreSQL server stopped. Every route of Deckhand, Drydock and Shipyard (and
Promenade's, which read design revisions from the store) answers one 503 Status, the same
line, without the database's host, name, user or path; the workers keep looking, quietly;
the log says it once (at warning level without those details), never with a traceback, and
once more when the database is back.

Real parts: the API server (callers are ServiceAccount tokens bound to the narrowest
ClusterRole of deploy/rbac/serve.yaml that reaches each route), a SQLite file, a
PostgreSQL server of its own (tests/postgres.py) stopped under the service."""

from __future__ import annotations

import abc
import contextlib
import logging
import secrets
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from lightkube import AsyncClient, Client, KubeConfig
from sqlalchemy.engine import make_url

from metalmend.db import Database, DatabaseUnavailable
from metalmend.db import database as database_module
from metalmend.db.database import UNAVAILABLE
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.destroy.routes import Drydock
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.siteactions.routes import Shipyard
from metalmend.web import deps
from metalmend_lab.controlplane import ControlPlane
from tests.integration.test_drydock_destroy import Bmc, add_host, destroy
from tests.integration.test_serve_promenade import bearer, serve_kubeconfig, status_of, token
from tests.integration.test_shipyard_api import also
from tests.postgres import PostgresUnavailable, ThrowawayPostgres
from tests.support import until

__all__ = ["serve_kubeconfig"]

ACTION = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
TASK = "5c0f0000-0000-4000-8000-000000000000"
YAML = {"Content-Type": "application/x-yaml"}
DOCUMENT = "---\nschema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: x}\ndata: {}\n"

# (method, path, narrowest ClusterRole reaching it, body): every API's reads and writes.
READS = [
    ("GET", "/deckhand/api/v1.0/revisions", "metalmend-deckhand-viewer", None),
    ("GET", "/deckhand/api/v1.0/revisions/1/documents", "metalmend-deckhand-viewer", None),
    ("GET", "/drydock/api/v1.0/tasks", "metalmend-drydock-viewer", None),
    ("GET", f"/drydock/api/v1.0/tasks/{TASK}", "metalmend-drydock-viewer", None),
    ("GET", "/shipyard/api/v1.0/actions", "metalmend-shipyard-viewer", None),
    ("GET", f"/shipyard/api/v1.0/actions/{ACTION}", "metalmend-shipyard-viewer", None),
    ("GET", "/shipyard/api/v1.0/configdocs", "metalmend-shipyard-viewer", None),
]


def writes(node: str) -> list[tuple[str, str, str, Any]]:
    """Writes, each passing every check before the database's (the Node and its host
    exist: a destroy is refused 404 before it is stored otherwise)."""
    return [
        ("PUT", "/deckhand/api/v1.0/buckets/site/documents", "metalmend-deckhand-editor",
         DOCUMENT),
        ("POST", "/drydock/api/v1.0/tasks", "metalmend-drydock-admin", destroy([node])),
        ("POST", "/shipyard/api/v1.0/configdocs/site?buffermode=replace",
         "metalmend-shipyard-admin", DOCUMENT),
        ("POST", "/shipyard/api/v1.0/commitconfigdocs", "metalmend-shipyard-admin", None),
        ("POST", "/shipyard/api/v1.0/actions", "metalmend-shipyard-redeployer",
         {"name": "redeploy_server", "parameters": {"target_nodes": [node]}}),
        ("POST", "/deckhand/api/v1.0/revisions/1/tags/mytag", "metalmend-deckhand-editor", None),
        ("DELETE", "/deckhand/api/v1.0/revisions/1/tags/mytag", "metalmend-deckhand-editor",
         None),
        ("DELETE", "/deckhand/api/v1.0/revisions/1/tags", "metalmend-deckhand-editor", None),
        ("POST", "/deckhand/api/v1.0/rollback/1", "metalmend-deckhand-editor", None),
        ("DELETE", "/deckhand/api/v1.0/revisions", "metalmend-deckhand-admin", None),
    ]  # fmt: skip


def store_readers(node: str) -> list[tuple[str, str, str, Any]]:
    """Routes that read the store before they act (Shipyard's stop reads its action;
    Promenade's etcd routes read a design revision the reference names): a database that
    cannot be read answers 503 on them too. Called only while reads fail (a read that
    works would let a decommission act). Roles joined by ``+``: one account bound to
    each (a Promenade role and the Deckhand viewer, who may read the revision)."""
    href = "deckhand+https://deckhand/api/v1.0/revisions/1/rendered-documents"
    design = {"rel": "design", "href": href, "type": "application/x-yaml"}
    promenade = "/promenade/api/v1.0"
    return [
        ("POST", f"/shipyard/api/v1.0/actions/{ACTION}/control/stop",
         "metalmend-shipyard-redeployer", None),
        ("GET", f"{promenade}/etcd-cluster-health-statuses?design_ref={quote(href, safe='')}",
         "metalmend-promenade-viewer+metalmend-deckhand-viewer", None),
        ("POST", f"{promenade}/nodes/{node}/remove-etcd",
         "metalmend-promenade-etcd+metalmend-deckhand-viewer", design),
        ("POST", f"{promenade}/nodes/{node}/decommission",
         "metalmend-promenade-admin+metalmend-deckhand-viewer", design),
    ]  # fmt: skip


# What the writes above work on, put before the fault: a revision (1) to tag, roll back
# and delete, a tag to remove, a Shipyard buffer to commit. Without them, a database that
# is still read (read-only, locked) answers 404 or 409 before any write is tried.
SEED = [
    ("POST", "/shipyard/api/v1.0/configdocs/site", "metalmend-shipyard-admin",
     DOCUMENT.replace("name: x", "name: buffered")),
    ("POST", "/deckhand/api/v1.0/revisions/1/tags/mytag", "metalmend-deckhand-editor", None),
]  # fmt: skip


class Fault(abc.ABC):
    """A database and a way to break it (and mend it, where that is possible)."""

    url: str
    secrets: tuple[str, ...]  # what no answer and no warning may hold
    reads_fail = True
    mends = True

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @abc.abstractmethod
    def breaks(self) -> None:
        """Make the database fail as this fault does."""

    @abc.abstractmethod
    def mend(self) -> None:
        """Make it answer again."""


class SqliteRemoved(Fault):
    mends = False  # a new file would be another store (test_serve_store_guard.py)

    def __init__(self, root: Path) -> None:
        self.path = root / "serve.sqlite"
        self.url = f"sqlite:///{self.path}"
        self.secrets = (str(self.path), "serve.sqlite")

    def breaks(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)

    def mend(self) -> None:
        raise AssertionError("a removed store is not mended: a new file is another store")


class SqliteReadOnly(Fault):
    reads_fail = False  # a read-only file is still read

    def __init__(self, root: Path) -> None:
        self.path = root / "serve.sqlite"
        self.url = f"sqlite:///{self.path}"
        self.secrets = (str(self.path), "serve.sqlite")

    def _immutable(self, on: bool) -> None:
        # As root (the test machine's user) file modes do not stop writes: the immutable
        # attribute does, for root too.
        flag = "+i" if on else "-i"
        done = subprocess.run(["chattr", flag, str(self.path)], capture_output=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot make a file read-only here: {done.stderr.decode().strip()}")

    def breaks(self) -> None:
        self._immutable(True)

    def mend(self) -> None:
        self._immutable(False)

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["chattr", "-i", str(self.path)], capture_output=True, check=False)


class SqliteLocked(Fault):
    """Another process writing the file: a connection of its own holds SQLite's write
    lock (``BEGIN EXCLUSIVE``) past the busy timeout, made 1 s here (30 s in serve)."""

    reads_fail = False  # WAL: readers do not wait for a writer

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = root / "serve.sqlite"
        self.url = f"sqlite:///{self.path}"
        self.secrets = (str(self.path), "serve.sqlite")
        monkeypatch.setattr(database_module, "SQLITE_BUSY_TIMEOUT_MS", 1000)
        self.holder: sqlite3.Connection | None = None

    def breaks(self) -> None:
        self.holder = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self.holder.execute("BEGIN EXCLUSIVE")

    def mend(self) -> None:
        if self.holder is not None:
            self.holder.execute("ROLLBACK")
            self.holder.close()
            self.holder = None

    def __exit__(self, *exc: object) -> None:
        self.mend()


class PostgresStopped(Fault):
    def __init__(self) -> None:
        try:
            self.server = ThrowawayPostgres()
            self.server.start()
        except (PostgresUnavailable, OSError) as error:
            pytest.skip(f"PostgreSQL unavailable: {error}")
        # A user and a database of their own names: the answers must not hold them (the
        # cluster's superuser is called "metalmend", which every answer names).
        password = secrets.token_urlsafe(12)
        admin = self.server.url().replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE records_owner LOGIN PASSWORD '{password}'")
            conn.execute("CREATE DATABASE records_db OWNER records_owner")
        self.url = (
            make_url(self.server.url("records_db"))
            .set(username="records_owner", password=password)
            .render_as_string(hide_password=False)
        )
        parsed = make_url(self.url)
        self.secrets = (
            str(parsed.host), str(parsed.port), str(parsed.database), str(parsed.username),
            str(parsed.password),
        )  # fmt: skip

    def breaks(self) -> None:
        self.server.pause()

    def mend(self) -> None:
        self.server.resume()

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


@pytest.fixture(
    params=["sqlite-removed", "sqlite-read-only", "sqlite-locked", "postgresql-stopped"]
)
def fault(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fault]:
    made: Fault
    if request.param == "sqlite-removed":
        made = SqliteRemoved(tmp_path)
    elif request.param == "sqlite-read-only":
        made = SqliteReadOnly(tmp_path)
    elif request.param == "sqlite-locked":
        made = SqliteLocked(tmp_path, monkeypatch)
    else:
        made = PostgresStopped()
    with made:
        yield made


@contextlib.asynccontextmanager
async def serving(kubeconfig: Path, url: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """The service with its workers (its lifespan), on the database at ``url``."""
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    database = Database.open(url)
    database.upgrade()
    root = compose(
        client, database=database, drives=object(),  # type: ignore[arg-type]
        destroy=DestroySettings(lease_seconds=1.5),
    )  # fmt: skip
    app = create_app(root)
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as http,
        ):
            yield http, app
    finally:
        await client.close()
        database.dispose()


async def call(http: httpx.AsyncClient, route: tuple[str, str, str, Any], who: str) -> Any:
    method, path, _, body = route
    if body is None:
        return await http.request(method, path, headers=bearer(who))
    if isinstance(body, dict):
        return await http.request(method, path, json=body, headers=bearer(who))
    return await http.request(method, path, content=body, headers={**bearer(who), **YAML})


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info]


def said(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(start)]


async def test_every_route_answers_a_database_fault_with_one_clean_503_and_the_log_says_it_once(
    fault: Fault, serve_kubeconfig: Path, control_plane: ControlPlane, kube: Client,
    namespace: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG, logger="metalmend")
    node = add_host(kube, namespace, "h1", Bmc())
    WRITES, READERS = writes(node), store_readers(node)
    roles = sorted({route[2] for route in READS + WRITES + READERS})
    tokens = {}
    for index, role in enumerate(roles):
        first, *more = role.split("+")
        tokens[role] = token(control_plane, kube, namespace, f"caller-{index}", first)
        for other in more:
            also(kube, namespace, f"caller-{index}", other)
    async with serving(serve_kubeconfig, fault.url) as (http, app):
        for route in READS:  # the database answers: so does every route
            answer = await call(http, route, tokens[route[2]])
            assert answer.status_code in (200, 404), (route, answer.text)
        for route in SEED:
            answer = await call(http, route, tokens[route[2]])
            assert answer.status_code in (200, 201), (route, answer.text)
        fault.breaks()
        failing = (READS + READERS if fault.reads_fail else []) + WRITES
        wrong = []  # every route's answer, then one failure naming each wrong one
        for route in failing:
            answer = await call(http, route, tokens[route[2]])
            try:
                document = status_of(answer, 503, "ServiceUnavailable")
            except AssertionError:
                wrong.append(f"{route[0]} {route[1]}: {answer.status_code} {answer.text[:300]}")
                continue
            assert document["message"] == UNAVAILABLE, (route, document)
            for secret in fault.secrets:
                assert secret not in answer.text, (route, secret)
        assert not wrong, "\n".join(wrong)
        # The workers look again and again (woken here), quietly: the database's own
        # log says "still unavailable" at debug level each time.
        drydock, shipyard = deps.find(app, Drydock), deps.find(app, Shipyard)
        assert drydock is not None
        assert shipyard is not None
        workers = (drydock.worker, shipyard.worker)

        async def looked_again() -> bool:
            for worker in workers:
                worker.wake()
            return len(said(caplog, "the service's database is still unavailable")) >= 12

        if fault.reads_fail:
            await until(looked_again, 60)
        if fault.mends:
            fault.mend()
            for route in [*READS, WRITES[0]]:
                answer = await call(http, route, tokens[route[2]])
                assert answer.status_code in (200, 404), (route, answer.text)
    assert tracebacks(caplog) == []
    down = said(caplog, "the service's database is unavailable")
    assert len(down) == 1, [r.getMessage() for r in down]
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for secret in fault.secrets:
        assert not [line for line in loud if secret in line], secret
    back = said(caplog, "the service's database is available again")
    assert len(back) == (1 if fault.mends else 0)


def test_the_sqlite_file_and_its_wal_files_are_readable_by_their_owner_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "serve.sqlite"
    path.write_bytes(b"")
    path.chmod(0o644)  # an older serve's file: made private when opened
    database = Database.open(f"sqlite:///{path}")
    try:
        database.upgrade()
        with database.read() as conn:  # a reader open: the WAL files exist
            conn.exec_driver_sql("SELECT 1")
            files = [path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))]
            modes = {f.name: oct(f.stat().st_mode & 0o777) for f in files if f.exists()}
    finally:
        database.dispose()
    assert set(modes) >= {"serve.sqlite", "serve.sqlite-wal", "serve.sqlite-shm"}, modes
    assert set(modes.values()) == {"0o600"}, modes


def test_a_sqlite_file_removed_under_serve_is_not_created_again_empty(tmp_path: Path) -> None:
    path = tmp_path / "serve.sqlite"
    database = Database.open(f"sqlite:///{path}")
    try:
        database.upgrade()
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        with pytest.raises(DatabaseUnavailable), database.read() as conn:
            conn.exec_driver_sql("SELECT 1")
    finally:
        database.dispose()
    assert not path.exists()
