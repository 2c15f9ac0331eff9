"""At start, ``metalmend serve`` checks that its database holds the store it served before
(``metalmend.policy.store``): the id of the store it serves is recorded in the cluster,
in the ConfigMap ``metalmend-serve-store`` of its namespace (``serve.store_namespace``;
by default its own ServiceAccount's), which outlives the database. A database holding
another store stops the start, in one line saying both stores and how to confirm
(``serve.accept_store``). While it runs, the database checks now and then that it still
holds that store (``Database.expect``) and refuses to work on another one.

Needs ``get``, ``create`` and ``update`` of that ConfigMap (deploy/rbac/serve.yaml, Role
``metalmend-serve-store``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from metalmend.db import Database, DatabaseError, read_identity
from metalmend.kube import errors
from metalmend.policy.store import StoreId, Verdict, decide_store
from metalmend.web.settings import ServeSettings

log = logging.getLogger(__name__)

CONFIGMAP = "metalmend-serve-store"
DEFAULT_NAMESPACE = "metalmend-system"  # deploy/rbac/serve.yaml's, when serve is no SA
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
ATTEMPTS = 5  # replicas starting together: each write conditional, decided again on 409


class StoreRefused(DatabaseError):
    """metalmend serve must not start on this database (the message says why and what to
    do); or it cannot tell, because the cluster's record cannot be read or written."""


def namespace_of(settings: ServeSettings, username: str) -> str:
    """Where the record lives: the setting, else the namespace of serve's ServiceAccount
    (its identity, as the API server answered it), else metalmend-system."""
    if settings.store_namespace:
        return settings.store_namespace
    if username.startswith(SERVICE_ACCOUNT_PREFIX):
        parts = username[len(SERVICE_ACCOUNT_PREFIX) :].split(":")
        if len(parts) == 2 and parts[0]:
            return parts[0]
    return DEFAULT_NAMESPACE


def _current(database: Database) -> StoreId:
    with database.read() as conn:
        found = read_identity(conn)
    if found is None:
        raise StoreRefused(
            "the database has no store identity (table store_identity is empty): it was"
            " changed by hand; restore it from a backup"
        )
    return StoreId(found.id, found.created)


def _recorded(found: ConfigMap | None, where: str) -> StoreId | None:
    if found is None:
        return None
    data = found.data or {}
    try:
        return StoreId(str(data["storeId"]), _when(str(data["created"])))
    except (KeyError, ValueError):
        raise StoreRefused(
            f"{where} does not say which store metalmend serve served (keys storeId and"
            " created): it was changed by hand; delete it to record the database's store"
        ) from None


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(dt.UTC)


async def guard(
    client: AsyncClient, database: Database, settings: ServeSettings, username: str
) -> StoreId:
    """Decide (and record) the store to serve, or raise StoreRefused; then the database
    refuses any other store while serve runs."""
    namespace = namespace_of(settings, username)
    where = f"ConfigMap {namespace}/{CONFIGMAP}"
    current = await asyncio.to_thread(_current, database)
    for _ in range(ATTEMPTS):
        found = await _read(client, namespace, where)
        decision = decide_store(
            _recorded(found, where), current, settings.accept_store, where,
            settings.store_loss_accepted, database.created is not None,
        )  # fmt: skip
        if decision.verdict is Verdict.REFUSE:
            raise StoreRefused(decision.message)
        if decision.verdict is Verdict.RECORD and not await _write(
            client, namespace, where, found, current
        ):
            continue  # another replica wrote it meanwhile: decide again
        database.expect(current.id)
        log.log(logging.WARNING if decision.warn else logging.INFO, "%s", decision.message)
        return current
    raise StoreRefused(f"{where} keeps changing under metalmend serve: try again")


async def _read(client: AsyncClient, namespace: str, where: str) -> ConfigMap | None:
    try:
        found: ConfigMap = await client.get(ConfigMap, CONFIGMAP, namespace=namespace)
    except ApiError as error:
        if errors.is_not_found(error):
            return None
        raise StoreRefused(_unreadable(where, "read", error)) from None
    return found


async def _write(
    client: AsyncClient, namespace: str, where: str, found: ConfigMap | None, store: StoreId
) -> bool:
    """Record ``store``; False when another writer changed the record first."""
    data = {"storeId": store.id, "created": store.created.isoformat()}
    try:
        if found is None:
            meta = ObjectMeta(
                name=CONFIGMAP, namespace=namespace,
                labels={"app.kubernetes.io/name": "metalmend-serve"},
            )  # fmt: skip
            await client.create(ConfigMap(metadata=meta, data=data))
        else:
            found.data = data  # conditional on its resourceVersion, as read
            await client.replace(found)
    except ApiError as error:
        if errors.is_conflict(error):
            return False
        raise StoreRefused(_unreadable(where, "write", error)) from None
    return True


def _unreadable(where: str, verb: str, error: ApiError) -> str:
    return (
        f"cannot {verb} {where}, where metalmend serve records which store it serves:"
        f" {errors.code(error)} {error.status.message} (deploy/rbac/serve.yaml, Role"
        " metalmend-serve-store; or set serve.store_namespace)"
    )
