"""Running ``metalmend serve``: uvicorn over the application, HTTPS when given a
certificate, against the cluster of the kubeconfig."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from metalmend.bmc import BmcPool
from metalmend.db import Database
from metalmend.kube.client import async_client, load_config, whoami
from metalmend.serve.app import create_app
from metalmend.serve.settings import check
from metalmend.settings import Settings

log = logging.getLogger(__name__)


async def serve(settings: Settings) -> None:
    """Serve until interrupted. Raises ServeSettingsError, ClusterUnavailable, OSError
    (the port is taken), DatabaseError before serving anything."""
    check(settings.serve)
    database = await asyncio.to_thread(open_database, settings.serve.database_url)
    config = load_config(settings.runtime.kubeconfig)
    client = async_client(config)
    pool = BmcPool(settings.bmc)  # drives only (destroy's wipe): power is host-power's
    options = settings.serve
    try:
        # Fails fast, in one line, when the cluster or our credentials do not work.
        current = config.get()
        identity = await whoami(client, current.cluster.server if current else "?")
        log.info("serving as %s", identity.username)
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(
                    client,
                    settings.teardown,
                    database=database,
                    drives=pool,
                    destroy=settings.destroy,
                    redeploy=settings.redeploy,
                    site_namespaces=options.site_namespaces,
                    site_label_prefixes=options.site_label_prefixes,
                ),
                host=options.bind_address,
                port=options.port,
                ssl_certfile=str(options.tls_cert) if options.tls_cert else None,
                ssl_keyfile=str(options.tls_key) if options.tls_key else None,
                log_config=None,  # ours (metalmend.log), not uvicorn's
                access_log=True,
                lifespan="on",  # starts and stops the task worker (serve/tasks.py)
            )
        )
        where = f"{options.bind_address}:{options.port}"
        try:
            await server.serve()
        except SystemExit:  # uvicorn's answer to a port it cannot bind (it logged why)
            raise OSError(f"cannot listen on {where}") from None
        if not server.started:
            raise OSError(f"cannot listen on {where}")
    finally:
        await client.close()
        await pool.close()
        database.dispose()


def open_database(url: str) -> Database:
    """Open the database and bring its schema to head (created if new)."""
    database = Database.open(url)
    try:
        database.upgrade()
    except BaseException:
        database.dispose()
        raise
    log.info("database ready: %s", database.where)
    return database
