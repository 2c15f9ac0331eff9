"""The composition root of ``metalmend serve`` (``metalmend.serve.root``): every store and
worker built once, in one place, and each component given the others' parts directly (no
read back from the application's lookup). A real SQLite database; no API server is
contacted (nothing is started)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient, KubeConfig

from metalmend.db import Database
from metalmend.destroy.destroy import DestroyNodes
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.teardown.etcd.routes import EtcdAccess
from metalmend.web import deps

UNREACHABLE = "https://127.0.0.1:9"  # nothing listens there


@pytest.fixture
async def client() -> AsyncIterator[AsyncClient]:
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": UNREACHABLE}}],
        "users": [{"name": "u", "user": {"token": "unused"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    })  # fmt: skip
    made = AsyncClient(config)
    yield made
    await made.close()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(f"sqlite:///{tmp_path / 'serve.sqlite'}")
    opened.upgrade()
    yield opened
    opened.dispose()


class Drives:  # a DrivePool no test reaches (nothing is run)
    pass


@pytest.mark.parametrize(
    ("with_database", "with_drives", "drydock", "shipyard"),
    [
        (False, False, False, False),
        (False, True, False, False),  # the stores need the database
        (True, False, False, False),  # destroy needs the BMCs; site actions run destroys
        (True, True, True, True),
    ],
)
async def test_a_part_is_built_only_with_what_it_needs(
    client: AsyncClient,
    database: Database,
    with_database: bool,
    with_drives: bool,
    drydock: bool,
    shipyard: bool,
) -> None:
    root = compose(
        client,
        database=database if with_database else None,
        drives=Drives() if with_drives else None,  # type: ignore[arg-type]
    )
    assert (root.drydock is not None) == drydock
    assert (root.shipyard is not None) == shipyard


async def test_the_site_actions_get_the_destroy_tasks_store_and_worker_from_the_root(
    client: AsyncClient, database: Database
) -> None:
    settings = DestroySettings(lease_seconds=7.0)
    access = EtcdAccess.from_settings([], ["kube-system/etcd-any"])
    root = compose(
        client, database=database, drives=Drives(), destroy=settings,  # type: ignore[arg-type]
        etcd_access=access, site_namespaces=("site",),
    )  # fmt: skip
    assert root.drydock is not None
    assert root.shipyard is not None
    steps = root.shipyard.worker.services
    assert steps.task_store is root.drydock.store
    assert steps.task_worker is root.drydock.worker
    assert steps.interlock is root.services.interlock is root.drydock.interlock
    assert steps.etcd_credentials_secrets == ("kube-system/etcd-any",)
    assert steps.site_namespaces == root.shipyard.namespaces == ("site",)
    runner = root.drydock.worker.runner
    assert isinstance(runner, DestroyNodes)  # a named factory, not a closure
    assert runner.claims is root.services.interlock
    assert runner.settings is settings


async def test_the_application_provides_what_the_root_built(
    client: AsyncClient, database: Database
) -> None:
    root = compose(client, database=database, drives=Drives())  # type: ignore[arg-type]
    app = create_app(root)
    assert root.drydock is not None
    assert root.shipyard is not None
    assert deps.find(app, type(root.drydock)) is root.drydock
    assert deps.find(app, type(root.shipyard)) is root.shipyard
    assert deps.find(app, EtcdAccess) is root.services.etcd_access
    assert deps.find(app, Database) is database
